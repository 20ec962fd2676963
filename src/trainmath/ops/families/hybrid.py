"""Hybrid layers whose mixer is not always attention: Qwen3-Next and Nemotron-H (derived from the code, checked by
``tests/activations``).

Qwen3-Next (``Qwen3NextDecoderLayer``): (1 + w) RMSNorms; the mixer is a Gated DeltaNet (``scans.gated_deltanet``)
or gated full attention (q_proj emits query and gate, per-head q/k norms, partial rotary ending in ``torch.cat``:
``attention_ext.sdpa_attention`` with ``project_gate``); then a Qwen2-MoE-style sparse block (softmax router, routed
experts, sigmoid-gated shared expert, ``moe.moe_block``) or a gated MLP.

Nemotron-H (``NemotronHBlock``): each layer is one Nemotron RMSNorm and one mixer: Mamba-2 (``scans.mamba2``),
attention without rotary (SDPA), a relu² MLP, or a MoE with DeepSeek-V3's sigmoid router (fp32 linear, group
selection, renormalised top-k) over non-gated relu² experts (eager loop) plus a relu² shared expert.
``moe_latent_size`` raises. Neither family's eager attention is modelled, nor Nemotron-H's grouped_mm expert
path (Qwen3-Next's is the standard one, ``experts.grouped_experts``).
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import LayerSpec, MoEDims
from trainmath.ops.context import Ctx
from trainmath.ops.families import LAYERS, Style
from trainmath.ops.families.dense import blocks, residual
from trainmath.ops.families.moe import check_experts_path, ffn, moe_block
from trainmath.ops.ir import Program
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.attention_ext import sdpa_attention
from trainmath.ops.kernels.mlp import plain_mlp
from trainmath.ops.kernels.norms import norm
from trainmath.ops.kernels.scans import gated_deltanet, mamba2


def qwen3_next_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    if ctx.eager:
        raise TrainmathError("qwen3_next: the eager profile is not modelled; use profile='hf' (SDPA)")
    mixer, block, norms = blocks(layer)
    if mixer is None or mixer.kind not in ("attention", "linear_attention") or block is None:
        raise TrainmathError(f"qwen3_next layer {layer.label!r} has blocks {[bl.kind for bl in layer.blocks]}")
    if isinstance(block.dims, MoEDims):
        check_experts_path(ctx, "qwen3_next")
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "input_layernorm", x, find(norms, "input_layernorm"))
    if mixer.kind == "linear_attention":
        gated_deltanet(prog, ctx, mixer, h)
    else:
        sdpa_attention(prog, ctx, mixer, h, rotary=style.rotary, qk_norm=style.qk_norm_kind or style.norm,
                       project_gate=True)
    h = norm(prog, ctx, style.norm, "post_attention_layernorm", residual(ctx, "attention.residual"),
             find(norms, "post_attention_layernorm"))
    ffn(prog, ctx, block, h, style)


def nemotron_h_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    if ctx.eager:
        raise TrainmathError("nemotron_h: the eager profile is not modelled; use profile='hf' (SDPA)")
    mixer = next(bl for bl in layer.blocks if bl.kind != "norm")
    norms = next((bl for bl in layer.blocks if bl.kind == "norm"), None)
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "norm", x, find(norms, "norm.weight") if norms else None)
    if mixer.kind == "mamba":
        mamba2(prog, ctx, mixer, h)
    elif mixer.kind == "attention":
        gqa_attention(prog, ctx, mixer, h, rotary=style.rotary, prefix="mixer")
    elif mixer.kind == "mlp":
        plain_mlp(prog, ctx, mixer, h, width=mixer.dims.intermediate, up="up_proj", down="down_proj",
                  prefix="mixer", act=style.act)
    elif mixer.kind == "moe":
        latent = any("latent" in t.name for t in mixer.tensors)
        if latent:
            ctx.unmodelled("nemotron_h with moe_latent_size is not yet modelled (use --profile megatron)")
        check_experts_path(ctx, "nemotron_h")
        moe_block(prog, ctx, mixer, h, style, latent=latent)
    else:
        raise TrainmathError(f"nemotron_h layer {layer.label!r} has an unknown mixer {mixer.kind!r}")


LAYERS["qwen3_next"] = qwen3_next_layer
LAYERS["nemotron_h"] = nemotron_h_layer
