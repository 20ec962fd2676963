"""gpt-oss (``GptOssDecoderLayer``): RMSNorms whose weight multiplies in fp32, biased q/k/v/o, half-width cos/sin,
eager attention with learned sinks (transformers has no SDPA path for it: ``attention_ext.sink_attention``), and
the biased MoE: a biased router, top-k on the logits and a softmax over the k values, the clamped interleaved
SwiGLU experts (``experts.clamped_swiglu_experts``, the eager loop; ``grouped_experts(..., clamped=True)``,
transformers' ``grouped_mm`` path). Sliding and full layers keep the same (the
window only changes the mask). A bf16 model is ``model.to(bfloat16)``: ``from_pretrained`` with a bf16 dtype keeps
the norms in fp32 (``_keep_in_fp32_modules``), which is not modelled."""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import LayerSpec, MoEDims
from trainmath.ops.context import Ctx
from trainmath.ops.families import LAYERS, Style
from trainmath.ops.families.dense import blocks, residual
from trainmath.ops.families.moe import router_weight
from trainmath.ops.ir import Axis, Program
from trainmath.ops.kernels.attention import find
from trainmath.ops.kernels.attention_ext import sink_attention
from trainmath.ops.kernels.experts import EXPERT_PATHS, clamped_swiglu_experts, grouped_experts
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.norms import norm
from trainmath.ops.kernels.router import topk_softmax


def gpt_oss_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    mixer, ffn, norms = blocks(layer)
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


LAYERS["gpt_oss"] = gpt_oss_layer
