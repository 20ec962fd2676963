"""Dense families whose norms are not the standard pre-norm pair: OLMo-2 (post-norms), Gemma-2/3 (sandwich norms)
and Cohere (one norm feeding attention and MLP in parallel); their configs read as the dense builder's rows. The
layers are derived from transformers 5.24's modeling code, checked by ``tests/activations``. Residual adds keep
nothing."""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.families.base import FamilyDef, TPPlan
from trainmath.families.common import layer_parts, residual
from trainmath.families.dense import LAYER_NORMS_4, builder
from trainmath.model.spec import LayerSpec, MLPDims
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Program
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.linear import reduce_seq
from trainmath.ops.kernels.mlp import gated_mlp
from trainmath.ops.kernels.norms import norm
from trainmath.ops.style import Style


def _parts(layer: LayerSpec, norms: list[str]):
    """(attention block, gated MLP block, norm block) of ``layer``, checking it has ``norms`` (weights)."""
    mixer, ffn, nb = layer_parts(layer)
    names = [t.name.removesuffix(".weight") for t in nb.tensors if t.name.endswith(".weight")] if nb else []
    if mixer is None or mixer.kind != "attention" or not isinstance(getattr(ffn, "dims", None), MLPDims) \
            or not ffn.dims.gated or names != norms:
        raise TrainmathError(f"layer {layer.label!r} is not an attention + gated MLP layer with norms {norms} "
                             f"(blocks {[bl.kind for bl in layer.blocks]}, norms {names})")
    return mixer, ffn, nb


def _qk(style: Style, mixer) -> str | None:
    return style.qk_norm if find(mixer, "q_norm") is not None else None


def olmo2_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """OLMo-2: ``h = x + post_attention_layernorm(attn(x))``, ``h + post_feedforward_layernorm(mlp(h))``. No input
    norms: q/k/v and gate/up read the residual stream (their casts under autocast); the q/k norms run over the
    whole projections; the two norms act on the attention and MLP outputs."""
    mixer, ffn, nb = _parts(layer, ["post_attention_layernorm", "post_feedforward_layernorm"])
    a = gqa_attention(prog, ctx, mixer, residual(ctx, "layer.input"), rotary=style.rotary, qk_norm=_qk(style, mixer),
                      qk_norm_kind=style.qk_norm_kind or style.norm)
    norm(prog, ctx, style.norm, "post_attention_layernorm", reduce_seq(prog, ctx, a, "self_attn.o_proj"),
         find(nb, "post_attention_layernorm"))
    m = gated_mlp(prog, ctx, ffn, residual(ctx, "attention.residual"), width=ffn.dims.intermediate, act=style.act)
    norm(prog, ctx, style.norm, "post_feedforward_layernorm", reduce_seq(prog, ctx, m, "mlp.down_proj"),
         find(nb, "post_feedforward_layernorm"))


def gemma_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """Gemma-2/3 ("sandwich" norms): ``h = x + post_attention_layernorm(attn(input_layernorm(x)))``, ``h +
    post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``: four norms, the two post-norms on the
    attention and MLP outputs; Gemma-3's per-head q/k norms. Under eager attention (Gemma-2's default,
    ``Style.attention``) ``attn_logit_softcapping`` keeps the tanh of the capped scores."""
    mixer, ffn, nb = _parts(layer, ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                    "post_feedforward_layernorm"])
    h = norm(prog, ctx, style.norm, "input_layernorm", residual(ctx, "layer.input"), find(nb, "input_layernorm"))
    a = gqa_attention(prog, ctx, mixer, h, rotary=style.rotary, qk_norm=_qk(style, mixer),
                      qk_norm_kind=style.qk_norm_kind or style.norm,
                      softcap=ctx.family.attn_logit_softcapping is not None)
    norm(prog, ctx, style.norm, "post_attention_layernorm", reduce_seq(prog, ctx, a, "self_attn.o_proj"),
         find(nb, "post_attention_layernorm"))
    h = norm(prog, ctx, style.norm, "pre_feedforward_layernorm", residual(ctx, "attention.residual"),
             find(nb, "pre_feedforward_layernorm"))
    m = gated_mlp(prog, ctx, ffn, h, width=ffn.dims.intermediate, act=style.act)
    norm(prog, ctx, style.norm, "post_feedforward_layernorm", reduce_seq(prog, ctx, m, "mlp.down_proj"),
         find(nb, "post_feedforward_layernorm"))


def parallel_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """Cohere (Command-R): ``x + attn(ln(x)) + mlp(ln(x))``: attention and MLP read one norm's output. Each block
    gathers it on entering the tensor-parallel region, so on one device (or without sequence parallelism) q/k/v
    and gate/up keep one storage, and under autocast each of the five Linears its own cast; per-head q/k norms
    when the spec has them (``use_qk_norm``)."""
    mixer, ffn, nb = _parts(layer, ["input_layernorm"])
    h = norm(prog, ctx, style.norm, "input_layernorm", residual(ctx, "layer.input"), find(nb, "input_layernorm"))
    gqa_attention(prog, ctx, mixer, h, rotary=style.rotary, qk_norm=_qk(style, mixer),
                  qk_norm_kind=style.qk_norm_kind or style.norm)
    gated_mlp(prog, ctx, ffn, h, width=ffn.dims.intermediate, act=style.act)


OLMO2 = FamilyDef(model_type="olmo2", build=builder(qkv_bias="attention_bias", o_bias="attention_bias", qk_norm="full",
                                                    norms=("post_attention_layernorm", "post_feedforward_layernorm")),
                  layer=olmo2_layer, style=Style(norm="rms_fp32_weight", qk_norm="full", rope_fp32=True),
                  tp=TPPlan(feature_norms=True))
GEMMA2 = FamilyDef(model_type="gemma2", build=builder(qkv_bias="attention_bias", o_bias="attention_bias",
                                                      norms=LAYER_NORMS_4),
                   layer=gemma_layer,
                   style=Style(norm="gemma", act="gelu_tanh", embed_scale=True, attention="eager",
                               config_defaults=(("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0))))
GEMMA3_TEXT = FamilyDef(model_type="gemma3_text", build=builder(qkv_bias="attention_bias", o_bias="attention_bias",
                                                                qk_norm="head", norms=LAYER_NORMS_4),
                        layer=gemma_layer,
                        style=Style(norm="gemma", act="gelu_tanh", embed_scale=True, rope_sets_by_window=True),
                        tp=TPPlan(head_norm_dim=1))
COHERE = FamilyDef(model_type="cohere", build=builder(qkv_bias="attention_bias", o_bias="attention_bias",
                                                      qk_norm="per_head:use_qk_norm", norms=("input_layernorm",)),
                   layer=parallel_layer,
                   style=Style(norm="cohere", rotary="interleaved_fp32", config_defaults=(("logit_scale", 0.0625),)),
                   tp=TPPlan(refused_with="use_qk_norm",
                             refused_why="its (heads, head_dim) q/k norm weights are not split here"))
