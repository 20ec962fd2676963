"""Oracle: the predicted cache equals the bytes transformers' cache really holds after a prefill.

For each family a tiny model is built from its catalog config (hidden 64, 3-4 layers, vocab 128, small sliding
windows and conv kernels so that every cap matters), run on CPU with ``use_cache=True``, and every tensor of the
returned cache is summed: ``keys``/``values`` of attention layers, ``conv_states``/``recurrent_states`` of
linear-attention and Mamba layers. The prediction is ``cache_tree`` of the same config with the dtypes transformers
uses (K/V and conv state in the model dtype, recurrent state in float32).
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.infer import CacheFormat, cache_tree  # noqa: E402
from trainmath.sources import catalog_entry  # noqa: E402

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")

SMALL = dict(hidden_size=64, intermediate_size=96, vocab_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, tie_word_embeddings=False)

# family → (catalog model, overrides on top of SMALL)
CASES = {
    "llama": ("meta-llama/Llama-3.1-8B", dict(num_hidden_layers=2)),
    "qwen3": ("Qwen/Qwen3-8B", dict(num_hidden_layers=2, num_key_value_heads=1)),
    "mistral": ("mistralai/Mistral-7B-v0.3", dict(num_hidden_layers=2, sliding_window=4)),
    "gemma2": ("google/gemma-2-9b", dict(num_hidden_layers=4, sliding_window=4)),
    "gemma3_text": ("google/gemma-3-1b-it", dict(num_hidden_layers=4, sliding_window=5, sliding_window_pattern=2)),
    "gpt_oss": ("openai/gpt-oss-20b", dict(num_hidden_layers=2, sliding_window=4, num_local_experts=4,
                                           num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"])),
    "phi3": ("microsoft/Phi-3.5-mini-instruct", dict(num_hidden_layers=2, head_dim=None, hidden_size=64, pad_token_id=0,
                                                     num_key_value_heads=4)),
    "qwen3_moe": ("Qwen/Qwen3-30B-A3B", dict(num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                                             moe_intermediate_size=32)),
    "deepseek_v3": ("deepseek-ai/DeepSeek-V3", dict(
        num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=32,
        q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, head_dim=None)),
    "deepseek_v2": ("deepseek-ai/DeepSeek-V2-Lite", dict(
        num_hidden_layers=2, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1, kv_lora_rank=32,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, head_dim=None)),
    "qwen3_next": ("Qwen/Qwen3-Next-80B-A3B-Thinking", dict(
        num_hidden_layers=4, full_attention_interval=2, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=None)),
    "nemotron_h": ("nvidia/Nemotron-H-56B-Base-8K", dict(
        hybrid_override_pattern="M*M-", mamba_num_heads=4, mamba_head_dim=16, n_groups=2, ssm_state_size=8,
        conv_kernel=4, layers_block_type=None, num_hidden_layers=4)),
    "starcoder2": ("bigcode/starcoder2-7b", dict(num_hidden_layers=2, sliding_window=6, head_dim=None)),
    "falcon": ("tiiuae/falcon-180B", dict(num_hidden_layers=2, num_kv_heads=2, num_key_value_heads=None,
                                           head_dim=None, intermediate_size=None)),  # new decoder architecture
    "falcon_mqa": ("tiiuae/falcon-7b", dict(num_hidden_layers=2, num_key_value_heads=None, head_dim=None,
                                            intermediate_size=None)),
    "gpt2": ("openai-community/gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)),
}

CONTEXT = 9  # longer than every sliding window above, shorter than the conv kernels' padding would hide nothing


def tiny_config(model_type: str) -> dict:
    repo, over = CASES[model_type]
    cfg = {k: v for k, v in catalog_entry(repo).config.items() if not k.startswith("_")}
    if model_type != "gpt2":
        cfg.update(SMALL)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "quantization_config", "rope_scaling"):
        cfg.pop(key, None)
    for k, v in over.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    return cfg


def run_prefill(cfg: dict, dtype, batch: int, context: int):
    data = dict(cfg)
    mt = data.pop("model_type")
    hf = AutoConfig.for_model(mt, **data)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=dtype).eval()
    ids = torch.randint(0, 128, (batch, context))
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    return model, ids, out.past_key_values


def cache_tensors(cache):
    """Every tensor the cache holds, as (field, tensor)."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.numel():
                yield name, t
        for name in ("conv_states", "recurrent_states"):
            for t in (getattr(layer, name, None) or {}).values():
                if isinstance(t, torch.Tensor):
                    yield name, t


def cache_bytes(cache) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, t in cache_tensors(cache):
        out[name] = out.get(name, 0) + t.numel() * t.element_size()
    return out


def predicted(cfg: dict, dtype_name: str, batch: int, context: int, **fmt) -> dict[str, int]:
    spec = spec_from_config(cfg, name=cfg["model_type"], source="test")
    tree = cache_tree(spec, batch=batch, context=context, tp=1,
                      fmt=CacheFormat(kv_dtype=dtype_name, conv_dtype=dtype_name, state_dtype="fp32", **fmt))
    out: dict[str, int] = {}
    rename = {"latent_kv": "keys", "rope_keys": "values", "conv_state": "conv_states",
              "recurrent_state": "recurrent_states"}  # transformers stores the MLA latent in keys, k_rot in values
    for group in tree.children:
        for c in group.children:
            out[rename.get(c.name, c.name)] = out.get(rename.get(c.name, c.name), 0) + c.value
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("model_type", sorted(CASES))
def test_cache_bytes_after_prefill_equal_transformers(model_type, dtype):
    cfg = tiny_config(model_type)
    batch = 2
    _, _, cache = run_prefill(cfg, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype], batch, CONTEXT)
    measured = cache_bytes(cache)
    assert predicted(cfg, dtype, batch, CONTEXT) == measured
    assert sum(measured.values()) > 0


@pytest.mark.parametrize("model_type", ["gemma2", "mistral"])
def test_sliding_layers_hold_window_minus_one_as_tensors_but_more_storage(model_type):
    """What transformers really keeps for a sliding layer: the cache *tensor* has min(C, W-1) tokens (our default
    ``window-1``), but after a prefill it is a view into the full C-token K/V, so the storage stays allocated
    until the first decode step; from then on each step's view sits in a W-token buffer (the ``window``
    convention)."""
    cfg = tiny_config(model_type)
    window = cfg["sliding_window"]
    model, ids, cache = run_prefill(cfg, torch.float32, 1, CONTEXT)
    sliding = [layer for layer in cache.layers if getattr(layer, "is_sliding", False)]
    assert sliding
    for layer in sliding:
        assert layer.keys.shape[-2] == window - 1
        per_token = layer.keys.element_size() * layer.keys[:, :, :1].numel()
        assert layer.keys.untyped_storage().nbytes() == per_token * CONTEXT
    with torch.no_grad():
        model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
    for layer in sliding:
        assert layer.keys.shape[-2] == window - 1
        per_token = layer.keys.element_size() * layer.keys[:, :, :1].numel()
        assert layer.keys.untyped_storage().nbytes() == per_token * window


def test_short_prefill_pads_conv_state_to_the_kernel():
    """A prefill shorter than the conv kernel still yields a kernel-wide conv state (transformers pads it)."""
    cfg = tiny_config("qwen3_next")
    _, _, cache = run_prefill(cfg, torch.float32, 1, 2)
    assert predicted(cfg, "fp32", 1, 2) == cache_bytes(cache)


def test_mla_expanded_is_per_head_k_and_v():
    """The expanded convention equals the per-head K/V transformers builds from the latent (``expand_kv``)."""
    cfg = tiny_config("deepseek_v3")
    heads, nope, rope, v = 4, 16, 8, 16
    got = predicted(cfg, "fp32", 1, CONTEXT, mla_cache="expanded")
    assert got == {"keys": 2 * CONTEXT * heads * (nope + rope) * 4, "values": 2 * CONTEXT * heads * v * 4}


def test_llama4_chunked_layers():
    c = dict(catalog_entry("meta-llama/Llama-4-Scout-17B-16E-Instruct").config["text_config"])
    for k in ("pad_token_id", "bos_token_id", "eos_token_id", "rope_scaling", "layer_types", "moe_layers",
              "no_rope_layers"):
        c.pop(k, None)
    c.update(SMALL, num_hidden_layers=4, attention_chunk_size=4, num_local_experts=4, num_experts_per_tok=1,
             intermediate_size_mlp=96, interleave_moe_layer_step=2, model_type="llama4_text")
    _, _, cache = run_prefill(c, torch.float32, 2, CONTEXT)
    assert predicted(c, "fp32", 2, CONTEXT) == cache_bytes(cache)
