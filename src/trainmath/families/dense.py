"""Dense decoder families built like Llama: llama, mistral, qwen2, qwen3, phi3 here; the dense builder
(``builder``) also reads olmo2, gemma2, gemma3_text, cohere (``families.postnorm``) and starcoder2
(``families.classic``). They differ in biases, q/k norms, which norms a layer has, fused projections and the MLP.

Parameters per layer (Jiang Yi's blog series, first article, generalised): attention 2·h·h_d·d + 2·h_kv·h_d·d
(+ biases, q/k norms) + MLP 3·d·d_ff (gated) or 2·d·d_ff + d_ff + d (plain, with biases) + the layer's norms.

The op list (``prenorm_layer``): input norm → attention → residual → post-attention norm → gated MLP → residual.
Residual adds save nothing; the input norm's fp32 x is the layer input itself when the residual stream is fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from trainmath.errors import TrainmathError
from trainmath.families.base import FamilyDef, TPPlan
from trainmath.families.common import (
    architecture,
    embeddings,
    head,
    head_dim,
    kv_heads,
    layer_parts,
    layer_types,
    residual,
    window_for,
)
from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.spec import LayerSpec, MLPDims, ModelSpec
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Program
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.mlp import gated_mlp
from trainmath.ops.kernels.norms import norm
from trainmath.ops.style import Style

LAYER_NORMS_2 = ("input_layernorm", "post_attention_layernorm")
LAYER_NORMS_4 = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm")


def builder(**opts) -> Callable[[ConfigView, str], ModelSpec]:
    """The dense builder for one family's row: which biases exist (``qkv_bias``, ``o_bias``, ``mlp_bias``: a
    config key, True or False), the q/k norm kind (``qk_norm``: ``head``, ``full``, or ``kind:flag`` when a config
    flag enables it), the layer's norms (``norms``), and whether the MLP is plain (``plain_mlp``, two matrices
    with biases), fused (``fused_qkv``/``fused_mlp``, Phi-3) or LayerNorm has a bias (``norm_bias``)."""
    return partial(build, opts=opts)


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


def attention_block(cfg: ConfigView, opts: dict, d: int, window: int | None = None) -> blocks.Block:
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


def build(cfg: ConfigView, name: str, *, opts: dict) -> ModelSpec:
    """``config.json`` → ``ModelSpec`` of a dense family whose row is ``opts`` (``builder``)."""
    mt = cfg.model_type
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
    norms = blocks.norm_block(*((nm, d) for nm in opts.get("norms", LAYER_NORMS_2)), bias=norm_bias)
    types = layer_types(cfg, n, default_layer_types(cfg, mt, n), ("full_attention", "sliding_attention"))
    window = _window(cfg, mt)
    by_type: dict[str, LayerSpec] = {}
    for t in dict.fromkeys(types):
        attn = attention_block(cfg, opts, d, window_for(t, window if isinstance(window, int) else None))
        by_type[t] = LayerSpec(label=f"{t} + mlp", blocks=(attn, mlp, norms))
    h = cfg.int("num_attention_heads")
    symbols = dict(N=n, V=vocab, d=d, d_ff=d_ff, h=h, h_kv=kv_heads(cfg, h), h_d=head_dim(cfg, d, h))
    cfg.check()
    return ModelSpec(
        name=name, model_type=mt, architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="model.layers.{i}.",
        pre=embeddings(vocab, d), layers=tuple(by_type[t] for t in types),
        post=head(vocab, d, tied, norm_bias=norm_bias), tie_word_embeddings=tied, symbols=symbols,
    )


def prenorm_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """The standard pre-norm layer with a gated MLP."""
    mixer, ffn, norms = layer_parts(layer)
    names = [t.name for t in norms.tensors] if norms else []
    if mixer is None or mixer.kind != "attention" or not isinstance(getattr(ffn, "dims", None), MLPDims) \
            or not ffn.dims.gated or names != ["input_layernorm.weight", "post_attention_layernorm.weight"]:
        raise TrainmathError(f"layer {layer.label!r} is not a pre-norm attention + gated MLP layer (blocks "
                             f"{[bl.kind for bl in layer.blocks]}, norms {names})")
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "input_layernorm", x, find(norms, "input_layernorm"))
    qk = style.qk_norm if find(mixer, "q_norm") is not None else None
    gqa_attention(prog, ctx, mixer, h, rotary=style.rotary, qk_norm=qk, qk_norm_kind=style.qk_norm_kind or style.norm)
    h = norm(prog, ctx, style.norm, "post_attention_layernorm", residual(ctx, "attention.residual"),
             find(norms, "post_attention_layernorm"))
    gated_mlp(prog, ctx, ffn, h, width=ffn.dims.intermediate, act=style.act)




LLAMA = FamilyDef(model_type="llama", build=builder(qkv_bias="attention_bias", o_bias="attention_bias",
                                                    mlp_bias="mlp_bias"),
                  layer=prenorm_layer, style=Style(), tp=TPPlan())
MISTRAL = FamilyDef(model_type="mistral", build=builder(), layer=prenorm_layer, style=Style(), tp=TPPlan())
QWEN2 = FamilyDef(model_type="qwen2", build=builder(qkv_bias=True), layer=prenorm_layer, style=Style(), tp=TPPlan())
QWEN3 = FamilyDef(model_type="qwen3", build=builder(qkv_bias="attention_bias", o_bias="attention_bias",
                                                    qk_norm="head"),
                  layer=prenorm_layer, style=Style(), tp=TPPlan(head_norm_dim=2), blog_formulas=("closed_form",))
PHI3 = FamilyDef(model_type="phi3", build=builder(fused_qkv="qkv_proj", fused_mlp="gate_up_proj"),
                 layer=prenorm_layer, style=Style(rotary="rotate_half_cat"), tp=TPPlan())
