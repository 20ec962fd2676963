"""Dense decoder families built like Llama: llama, mistral, qwen2, qwen3, olmo2, gemma2, gemma3_text, phi3,
cohere, starcoder2. They differ in biases, q/k norms, which norms a layer has, fused projections and the MLP.

Parameters per layer (Jiang Yi's blog series, first article, generalised): attention 2·h·h_d·d + 2·h_kv·h_d·d
(+ biases, q/k norms) + MLP 3·d·d_ff (gated) or 2·d·d_ff + d_ff + d (plain, with biases) + the layer's norms.
"""

from __future__ import annotations

from trainmath.model import blocks
from trainmath.model.config import ConfigView, show
from trainmath.model.families.common import embeddings, head, head_dim, kv_heads, layer_types, window_for
from trainmath.model.spec import LayerSpec, ModelSpec

# Per family: which biases exist (a config key, True or False), the q/k norm kind, the layer's norms, and
# whether the MLP is plain (two matrices with biases), fused (Phi-3) or LayerNorm has a bias.
_LAYER_NORMS_2 = ("input_layernorm", "post_attention_layernorm")
_LAYER_NORMS_4 = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm")
FAMILIES: dict[str, dict] = {
    "llama": dict(qkv_bias="attention_bias", o_bias="attention_bias", mlp_bias="mlp_bias"),
    "mistral": dict(),
    "qwen2": dict(qkv_bias=True),
    "qwen3": dict(qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="head"),
    "olmo2": dict(qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="full",
                  norms=("post_attention_layernorm", "post_feedforward_layernorm")),
    "gemma2": dict(qkv_bias="attention_bias", o_bias="attention_bias", norms=_LAYER_NORMS_4),
    "gemma3_text": dict(qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="head", norms=_LAYER_NORMS_4),
    "phi3": dict(fused_qkv="qkv_proj", fused_mlp="gate_up_proj"),
    "cohere": dict(qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="per_head:use_qk_norm",
                   norms=("input_layernorm",)),
    "starcoder2": dict(qkv_bias="use_bias", o_bias="use_bias", mlp_bias="use_bias", plain_mlp=True,
                       norm_bias=True),
}


def _flag(cfg: ConfigView, spec) -> bool:
    if isinstance(spec, str):
        return cfg.bool(spec)
    return bool(spec)


def default_layer_types(cfg: ConfigView, model_type: str, n: int) -> list[str]:
    """How each family's config class derives ``layer_types`` when the config does not list them."""
    window = _window(cfg, model_type)
    if model_type == "gemma2":
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if model_type == "gemma3_text":
        pattern = cfg.int("sliding_window_pattern", 6)
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if model_type in ("qwen2", "qwen3"):
        if cfg.bool("use_sliding_window", False) and window is not None:
            first = cfg.int("max_window_layers", n, minimum=0)
            return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
        return ["full_attention"] * n
    if model_type in ("mistral", "starcoder2", "phi3") and window is not None:
        return ["sliding_attention"] * n
    return ["full_attention"] * n


def _window(cfg: ConfigView, model_type: str) -> int | None:
    """The sliding window, validated where it is used: Qwen's configs read it only with use_sliding_window
    (transformers' own Qwen2-MoE config writes sliding_window 0 when it is off)."""
    if model_type in ("qwen2", "qwen3") and not cfg.bool("use_sliding_window", False):
        return None
    return cfg.window()


def attention_block(cfg: ConfigView, model_type: str, d: int, window: int | None = None) -> blocks.Block:
    opts = FAMILIES[model_type]
    h = cfg.int("num_attention_heads")
    hkv = kv_heads(cfg, h)
    hd = head_dim(cfg, d, h)
    qk = opts.get("qk_norm")
    if qk and ":" in qk:  # enabled by a config flag
        kind, flag = qk.split(":")
        qk = kind if cfg.bool(flag) else None
    return blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=hd, q_bias=_flag(cfg, opts.get("qkv_bias", False)),
                            kv_bias=_flag(cfg, opts.get("qkv_bias", False)),
                            o_bias=_flag(cfg, opts.get("o_bias", False)), qk_norm=qk,
                            fused_qkv=opts.get("fused_qkv"), sliding_window=window)


def build(cfg: ConfigView, name: str) -> ModelSpec:
    mt = cfg.model_type
    opts = FAMILIES[mt]
    d = cfg.int("hidden_size")
    vocab = cfg.int("vocab_size")
    n = cfg.int("num_hidden_layers")
    d_ff = cfg.int("intermediate_size")
    tied = cfg.bool("tie_word_embeddings")
    mlp_bias = _flag(cfg, opts.get("mlp_bias", False))
    norm_bias = bool(opts.get("norm_bias", False))
    if opts.get("plain_mlp"):
        mlp = blocks.dense_mlp_block(blocks.plain_mlp(d=d, d_ff=d_ff, bias=mlp_bias), d=d, d_ff=d_ff, gated=False)
    else:
        mlp = blocks.dense_mlp_block(blocks.gated_mlp(d=d, d_ff=d_ff, bias=mlp_bias, fused=opts.get("fused_mlp")),
                                     d=d, d_ff=d_ff, gated=True)
    norms = blocks.norm_block(*((nm, d) for nm in opts.get("norms", _LAYER_NORMS_2)), bias=norm_bias)
    types = layer_types(cfg, n, default_layer_types(cfg, mt, n), ("full_attention", "sliding_attention"))
    window = _window(cfg, mt)
    by_type: dict[str, LayerSpec] = {}
    for t in dict.fromkeys(types):
        attn = attention_block(cfg, mt, d, window_for(t, window if isinstance(window, int) else None))
        by_type[t] = LayerSpec(label=f"{t} + mlp", blocks=(attn, mlp, norms))
    h = cfg.int("num_attention_heads")
    symbols = dict(N=n, V=vocab, d=d, d_ff=d_ff, h=h, h_kv=kv_heads(cfg, h), h_d=head_dim(cfg, d, h))
    cfg.check()
    return ModelSpec(
        name=name, model_type=mt, architecture=_arch(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="model.layers.{i}.",
        pre=embeddings(vocab, d), layers=tuple(by_type[t] for t in types),
        post=head(vocab, d, tied, norm_bias=norm_bias), tie_word_embeddings=tied, symbols=symbols,
    )


def _arch(cfg: ConfigView) -> str:
    archs = cfg.data.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        cfg.invalid.append(f"architectures must be a list of class names, got {show(archs)}")
        return cfg.model_type
    return archs[0] if archs else cfg.model_type
