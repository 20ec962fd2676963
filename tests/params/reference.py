"""The oracle: transformers' own modeling code on the meta device, classified into our components.

The classification below is written independently of the ledger (regexes over transformers' parameter names),
so a wrong count on either side shows up as a mismatch.
"""

from __future__ import annotations

import re
import warnings

torch = __import__("pytest").importorskip("torch")
transformers = __import__("pytest").importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")

# transformers parameter name → component, first match wins
RULES = [
    (r"(^|\.)(embed_tokens|wte|word_embeddings|embeddings)\.weight$", "embed_tokens"),
    (r"(^|\.)wpe\.weight$", "pos_embed"),
    (r"^lm_head\.", "lm_head"),
    (r"\.(experts)\.", "experts"),
    (r"\.(shared_experts?|shared_expert_gate)\.", "shared_experts"),
    (r"(fc1_latent_proj|fc2_latent_proj)", "experts"),
    (r"\.(mlp|feed_forward|mixer)\.(gate|router)\.", "router"),
    (r"\.linear_attn\.", "linear_attention"),
    (r"\.mixer\.(in_proj|out_proj|conv1d|dt_bias|A_log|D|norm)\b", "mamba"),
    (r"\.(self_attn|attn|self_attention)\.", "attention"),
    (r"\.mixer\.(q_proj|k_proj|v_proj|o_proj)\.", "attention"),
    (r"\.(mlp|feed_forward|mixer)\.", "mlp_dense"),
    (r"(norm|ln_\d|ln_f|ln_attn|ln_mlp|layernorm)", "norms"),
]


def component_of(name: str) -> str:
    for pattern, comp in RULES:
        if re.search(pattern, name):
            return comp
    raise AssertionError(f"unclassified parameter {name}")


def hf_config(data: dict):
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    mt = data.pop("model_type")
    cfg = AutoConfig.for_model("deepseek_v3" if mt == "kimi_k2" else mt, **data)
    return cfg.text_config if mt == "llama4" else cfg


def meta_model(data: dict):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config(data))


def reference_counts(model) -> tuple[int, dict[str, int], int]:
    """(total, per component, activated) from the real module tree. transformers stores routed experts fused,
    with the expert index first, so a token activates top_k / num_experts of each expert tensor."""
    top_k = getattr(model.config, "num_experts_per_tok", None)
    comps: dict[str, int] = {}
    total = activated = 0
    for name, p in model.named_parameters():
        c = component_of(name)
        comps[c] = comps.get(c, 0) + p.numel()
        total += p.numel()
        if c == "experts" and ".experts." in name:
            activated += p.numel() // p.shape[0] * top_k
        else:
            activated += p.numel()
    return total, comps, activated
