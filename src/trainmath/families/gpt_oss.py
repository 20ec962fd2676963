"""gpt-oss: GQA with biases and learned attention sinks, alternating sliding/full attention, MoE whose experts
and router carry biases (OpenAI 2025 model card §2).

Experts are stored fused, as transformers and the bf16 checkpoints hold them: gate_up (n, d, 2·f) with bias
(n, 2·f), down (n, f, d) with bias (n, d). The published checkpoints store them MXFP4-quantised
(``*_blocks`` + ``*_scales``); ``check-checkpoint`` reports that as quantised storage.

The op list (``GptOssDecoderLayer``): RMSNorms whose weight multiplies in fp32, biased q/k/v/o, half-width cos/sin,
eager attention with learned sinks (transformers has no SDPA path for it: ``attention_ext.sink_attention``), and the
biased MoE: a biased router, top-k on the logits and a softmax over the k values, the clamped interleaved SwiGLU experts
(``experts.clamped_swiglu_experts``, the eager loop; ``grouped_experts(..., clamped=True)``, transformers'
``grouped_mm`` path). Sliding and full layers keep the same (the window only changes the mask). A bf16 model is
``model.to(bfloat16)``: ``from_pretrained`` with a bf16 dtype keeps the norms in fp32 (``_keep_in_fp32_modules``), which
is not modelled.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.families.base import FamilyDef
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
from trainmath.families.moe import router_weight
from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.spec import LayerSpec, ModelSpec, MoEDims, TensorSpec
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Axis, Program
from trainmath.ops.kernels.attention import find
from trainmath.ops.kernels.attention_ext import sink_attention
from trainmath.ops.kernels.experts import EXPERT_PATHS, clamped_swiglu_experts, grouped_experts
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.norms import norm
from trainmath.ops.kernels.router import topk_softmax
from trainmath.ops.style import Style


def build(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    h = cfg.int("num_attention_heads")
    hkv, hd = kv_heads(cfg, h), head_dim(cfg, d, h)
    tied = cfg.bool("tie_word_embeddings")
    bias = cfg.bool("attention_bias")
    n_exp, k, f = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok"), cfg.int("intermediate_size")
    cfg.require(k <= n_exp, f"num_experts_per_tok ({k}) must not exceed num_local_experts ({n_exp})")
    experts = (
        TensorSpec(name="mlp.experts.gate_up_proj", shape=(d, 2 * f), component="experts", shard="column",
                   experts=n_exp, transposed=True),
        TensorSpec(name="mlp.experts.gate_up_proj_bias", shape=(2 * f,), component="experts", kind="bias",
                   shard="column", experts=n_exp),
        TensorSpec(name="mlp.experts.down_proj", shape=(f, d), component="experts", shard="row", experts=n_exp,
                   transposed=True),
        TensorSpec(name="mlp.experts.down_proj_bias", shape=(d,), component="experts", kind="bias",
                   shard="replicated", experts=n_exp),
    )
    router = blocks.linear("mlp.router", n_exp, d, "router", "replicated", bias=True, bias_shard="replicated")
    moe = blocks.moe_block(d=d, dims=MoEDims(experts=n_exp, top_k=k, expert_intermediate=f, shared_intermediate=0,
                                                    activation_clamp=True),
                           expert_tensors=experts, router=router)
    norms = blocks.norm_block(("input_layernorm", d), ("post_attention_layernorm", d))
    window = cfg.window()
    types = layer_types(cfg, n, ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)],
                        ("full_attention", "sliding_attention"))
    by_type = {}
    for t in dict.fromkeys(types):
        attn = blocks.attention(d=d, heads=h, kv_heads=hkv, head_dim=hd, q_bias=bias, kv_bias=bias, o_bias=bias,
                                sinks=True, sliding_window=window_for(t, window if isinstance(window, int) else None))
        by_type[t] = LayerSpec(label=f"{t} + moe", blocks=(attn, moe, norms))
    cfg.check()
    return ModelSpec(
        name=name, model_type="gpt_oss", architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="model.layers.{i}.",
        pre=embeddings(vocab, d), layers=tuple(by_type[t] for t in types), post=head(vocab, d, tied),
        tie_word_embeddings=tied,
        symbols=dict(N=n, V=vocab, d=d, h=h, h_kv=hkv, h_d=hd, n=n_exp, k=k, d_ff=f),
    )

def gpt_oss_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    mixer, ffn, norms = layer_parts(layer)
    if mixer is None or mixer.kind != "attention" or ffn is None or not isinstance(ffn.dims, MoEDims):
        raise TrainmathError(f"gpt_oss layer {layer.label!r} is not attention + MoE "
                             f"({[bl.kind for bl in layer.blocks]})")
    if ctx.experts not in EXPERT_PATHS:
        raise TrainmathError(f"experts path {ctx.experts!r} is not one of {', '.join(EXPERT_PATHS)}")
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "input_layernorm", x, find(norms, "input_layernorm"))
    sink_attention(prog, ctx, mixer, h)
    h = norm(prog, ctx, style.norm, "post_attention_layernorm", residual(ctx, "attention.residual"),
             find(norms, "post_attention_layernorm"))
    xg = gather_seq(prog, h, "mlp.input")
    w, prefix = router_weight(ffn)
    dims = ffn.dims
    logits = linear(prog, ctx, f"{prefix}.router", xg, Axis(dims.experts), weight=w)
    weights = topk_softmax(prog, ctx, f"{prefix}.router", logits, dims.top_k)
    kw = dict(k=dims.top_k, f=dims.expert_intermediate, prefix=f"{prefix}.experts")
    if ctx.experts == "grouped":
        grouped_experts(prog, ctx, ffn, xg, weights, clamped=True, **kw)
    else:
        clamped_swiglu_experts(prog, ctx, ffn, xg, weights, **kw)


GPT_OSS = FamilyDef(model_type="gpt_oss", build=build, layer=gpt_oss_layer,
                    style=Style(norm="rms_fp32_weight", rope_half=True, attention="eager", router="topk_softmax"))
