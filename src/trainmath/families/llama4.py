"""Llama 4: the multimodal wrapper (``llama4``, whose text model is counted) and its text decoder layer
(``Llama4TextDecoderLayer``, SDPA), derived from the code, checked by ``tests/activations``. The config reads as
the MoE builder's (``families.moe``).

Attention: RoPE layers are the chunked ones (``attention_chunk_size``, carried as the sliding window); the others
(every ``no_rope_layer_interval``-th) use no RoPE and full causal attention. RoPE multiplies ``q.float()`` as
complex numbers by the shared ``freqs_cis`` and casts back; ``use_qk_norm`` (``Family``, RoPE layers) adds the
weightless L2 norm on the rotary outputs; ``attn_temperature_tuning`` (no-RoPE layers) scales the query by an fp32
per-position factor. When s ≥ chunk the chunked mask exists and k/v are repeated to h heads (``attention_ext``).

MoE (``Llama4TextMoe``): the router keeps its top-k indices and the fp32 sigmoid of the scattered scores; every
routed expert runs over all T tokens (``experts.all_tokens_experts``), so expert activations scale with n, not
top-k, and the autocast expert weight copies are all n. The shared expert is a gated MLP on the MoE input; its
output is added in place (nothing kept). Dense layers: a gated MLP of width ``intermediate_size_mlp``. The eager
kernel and the grouped_mm expert path are not modelled."""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.families import moe
from trainmath.families.base import FamilyDef
from trainmath.families.common import layer_parts, residual
from trainmath.families.moe import check_experts_path, router_weight, shared_prefix
from trainmath.model.spec import AttentionDims, LayerSpec, MoEDims
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Axis, Program
from trainmath.ops.kernels.attention import find
from trainmath.ops.kernels.attention_ext import sdpa_attention
from trainmath.ops.kernels.experts import all_tokens_experts
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.mlp import gated_mlp
from trainmath.ops.kernels.norms import norm
from trainmath.ops.kernels.router import sigmoid_scatter
from trainmath.ops.style import Style


def llama4_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    if ctx.eager:
        raise TrainmathError("llama4_text: the eager profile is not modelled; use profile='hf' (SDPA)")
    mixer, ffn, norms = layer_parts(layer)
    if mixer is None or not isinstance(mixer.dims, AttentionDims) or ffn is None:
        raise TrainmathError(f"llama4_text layer {layer.label!r} is not attention + MLP/MoE")
    moe = isinstance(ffn.dims, MoEDims)
    if moe:
        check_experts_path(ctx, style, "llama4_text")
    chunk = mixer.dims.sliding_window
    rope = chunk is not None
    fam = ctx.family
    x = residual(ctx, "layer.input")
    h = norm(prog, ctx, style.norm, "input_layernorm", x, find(norms, "input_layernorm"))
    sdpa_attention(prog, ctx, mixer, h, rotary="complex" if rope else "none",
                   qk_norm=style.qk_norm_kind if rope and fam.use_qk_norm else None, qk_norm_after_rotary=True,
                   query_scale=not rope and fam.attn_temperature_tuning, mask=rope and ctx.s >= chunk)
    h = norm(prog, ctx, style.norm, "post_attention_layernorm", residual(ctx, "attention.residual"),
             find(norms, "post_attention_layernorm"))
    if not moe:
        gated_mlp(prog, ctx, ffn, h, width=ffn.dims.intermediate, prefix="feed_forward", act=style.act)
        return
    dims = ffn.dims
    xg = gather_seq(prog, h, "feed_forward.input")
    w, prefix = router_weight(ffn)
    logits = linear(prog, ctx, f"{prefix}.router", xg, Axis(dims.experts), weight=w)
    scores = sigmoid_scatter(prog, ctx, f"{prefix}.router", logits, dims.top_k)
    all_tokens_experts(prog, ctx, ffn, xg, scores, f=dims.expert_intermediate, prefix=f"{prefix}.experts",
                       act=style.act)
    gated_mlp(prog, ctx, ffn, xg, width=dims.shared_intermediate, prefix=shared_prefix(ffn), act=style.act,
              gather=False)


def text_config(data: dict, source: str) -> dict:
    """The text model's config inside the multimodal wrapper (``text_config``), with the wrapper's architectures
    and tying."""
    text = data.get("text_config")
    if not isinstance(text, dict):
        raise TrainmathError(f"{source}: model_type llama4 needs a text_config object")
    return {**text, "architectures": data.get("architectures"), "model_type": "llama4_text",
            "tie_word_embeddings": text.get("tie_word_embeddings", data.get("tie_word_embeddings", False))}


LLAMA4_TEXT = FamilyDef(model_type="llama4_text", build=moe.build, layer=llama4_layer,
                        style=Style(positions="freqs_cis", rope_layers="windowed", router="sigmoid_scatter",
                                    qk_norm_kind="l2", experts_grouped=False, layer_mask="bool_chunked",
                                    expert_slices=False),
                        linear_router=True)
LLAMA4 = FamilyDef(model_type="llama4", unwrap=text_config, linear_router=True,
                   note="llama4: the text model (Llama4ForCausalLM) is counted; the vision tower and projector are not")
