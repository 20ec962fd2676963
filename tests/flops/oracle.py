"""The oracle: ``torch.utils.flop_counter.FlopCounterMode`` over transformers' own modeling code, run on CPU on
tiny models with eager attention and eager (per-expert loop) MoE experts.

Tiny configs start from a catalog config of the family and shrink it with explicit overrides, so every switch the
family's code reads (biases, q/k norms, MLA ranks, shared experts, windows) keeps its published value unless the
case overrides it.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from trainmath.sources import catalog_entry  # noqa: E402

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")

# Sizes every tiny model shares; a case adds or replaces keys.
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=128, max_position_embeddings=64)


def tiny_config(repo_id: str, **overrides) -> dict:
    """The catalog config of ``repo_id`` with SMALL and ``overrides`` applied (llama4: to its text_config)."""
    cfg = {k: v for k, v in catalog_entry(repo_id).config.items() if not k.startswith("_")}
    text = cfg["text_config"] if cfg["model_type"] == "llama4" else cfg
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "layer_types", "rope_scaling", "rope_parameters"):
        cfg.pop(key, None), text.pop(key, None)
    text.update(SMALL)
    text.update(overrides)
    text["pad_token_id"] = 0
    return cfg


def build_model(data: dict):
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    mt = data.pop("model_type")
    cfg = AutoConfig.for_model("deepseek_v3" if mt == "kimi_k2" else mt, **data)
    if mt == "llama4":
        cfg = cfg.text_config
    torch.manual_seed(0)
    # eager attention: two bmm the counter sees; eager experts: a per-expert loop of linears (the default
    # grouped_mm is invisible to the counter, see test_counter_behaviour). Dense families ignore the switch.
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", experts_implementation="eager")
    if model.config._experts_implementation != "eager":
        raise RuntimeError(f"experts_implementation is {model.config._experts_implementation!r}, not eager")
    return model.float()


def measured_flops(model, *, batch: int, seq: int) -> tuple[int, int]:
    """(forward, forward + backward) FLOPs FlopCounterMode counts for one step on random token ids."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
    with FlopCounterMode(display=False) as fc:
        model(input_ids=ids)
    fwd = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        out = model(input_ids=ids)
        out.logits.sum().backward()
    return fwd, fc.get_total_flops()
