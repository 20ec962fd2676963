"""Pre-norm decoder layers: input norm → attention → residual → post-attention norm → MLP → residual (Llama,
Mistral, Qwen2, Qwen3, Phi-3). Residual adds save nothing; the input norm's fp32 x is the layer input itself
when the residual stream is fp32."""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import LayerSpec, MLPDims
from trainmath.ops.context import Ctx
from trainmath.ops.families import LAYERS, Style
from trainmath.ops.ir import Axis, Program, Tensor
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.mlp import gated_mlp
from trainmath.ops.kernels.norms import norm


def blocks(layer: LayerSpec):
    """(mixer, ffn, norm block) of a layer (None where absent)."""
    mixer = next((bl for bl in layer.blocks if bl.kind in ("attention", "mla", "linear_attention", "mamba")), None)
    ffn = next((bl for bl in layer.blocks if bl.kind in ("mlp", "moe")), None)
    norms = next((bl for bl in layer.blocks if bl.kind == "norm"), None)
    return mixer, ffn, norms


def residual(ctx: Ctx, name: str) -> Tensor:
    """A (b, s, d) tensor of the residual stream (in the embedding's dtype: fp32 under autocast)."""
    return Tensor(name=name, axes=(*ctx.rows(), Axis(ctx.d)), dtype_bytes=ctx.p.residual)


def prenorm_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """The standard pre-norm layer with a gated MLP."""
    mixer, ffn, norms = blocks(layer)
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


for _family in ("llama", "mistral", "qwen2", "qwen3", "phi3"):
    LAYERS[_family] = prenorm_layer
