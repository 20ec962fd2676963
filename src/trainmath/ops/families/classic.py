"""LayerNorm families with plain (non-gated) MLPs: StarCoder2, GPT-2 and Falcon. Derived from transformers
5.24's modeling code, checked by ``tests/activations``. Biases keep nothing. GPT-2 and StarCoder2 apply the
config's dropouts (``Family``: on the embedding, the attention probabilities and each sub-block's output before
its residual add; what each keeps: ``kernels.dropout``); Falcon's are not modelled (``Style.dropout``)."""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import LayerSpec, MLPDims
from trainmath.ops.context import Ctx
from trainmath.ops.families import LAYERS, Style
from trainmath.ops.families.dense import blocks, residual
from trainmath.ops.ir import Program, Tensor
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.dropout import dropout
from trainmath.ops.kernels.fused_attention import fused_attention
from trainmath.ops.kernels.linear import reduce_seq
from trainmath.ops.kernels.mlp import plain_mlp
from trainmath.ops.kernels.norms import norm


def _parts(layer: LayerSpec):
    """(attention block, plain MLP block, the norms' weight names without ``.weight``, the norm block)."""
    mixer, ffn, nb = blocks(layer)
    if mixer is None or mixer.kind != "attention" or not isinstance(getattr(ffn, "dims", None), MLPDims):
        raise TrainmathError(f"layer {layer.label!r} is not an attention + MLP layer (blocks "
                             f"{[bl.kind for bl in layer.blocks]})")
    names = [t.name.removesuffix(".weight") for t in nb.tensors if t.name.endswith(".weight")] if nb else []
    return mixer, ffn, names, nb


def _norm(prog, ctx, style, nb, name, x):
    return norm(prog, ctx, style.norm, name, x, find(nb, f"{name}.weight"))


def _residual_dropout(prog: Program, ctx: Ctx, y: Tensor, p: float, name: str) -> None:
    """Dropout of a row-parallel Linear's output before the residual add: on the reduced output (the residual
    stream's axes, cut on the sequence under sequence parallelism)."""
    if p:
        dropout(prog, ctx, reduce_seq(prog, ctx, y, name.rsplit(".", 1)[0] + ".out"), p, name)


def starcoder2_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """StarCoder2: pre-LayerNorm attention with q/k/v/o biases and RoPE, then ``c_proj(gelu_tanh(c_fc(x)))``:
    c_fc's input, the GELU's input and c_proj's input. Dropout: ``attention_dropout`` on the probabilities,
    ``residual_dropout`` after o_proj and after c_proj (``kernels.dropout``)."""
    mixer, ffn, names, nb = _parts(layer)
    if ffn.dims.gated or names != ["input_layernorm", "post_attention_layernorm"]:
        raise TrainmathError(f"layer {layer.label!r} is not a pre-LayerNorm layer with a plain MLP (norms {names})")
    fam = ctx.family
    h = _norm(prog, ctx, style, nb, "input_layernorm", residual(ctx, "layer.input"))
    a = gqa_attention(prog, ctx, mixer, h, rotary=style.rotary, dropout_p=fam.attention_dropout)
    _residual_dropout(prog, ctx, a, fam.residual_dropout, "self_attn.residual_dropout")
    h = _norm(prog, ctx, style, nb, "post_attention_layernorm", residual(ctx, "attention.residual"))
    m = plain_mlp(prog, ctx, ffn, h, width=ffn.dims.intermediate, up="c_fc", down="c_proj", act=style.act)
    _residual_dropout(prog, ctx, m, fam.residual_dropout, "mlp.residual_dropout")


def gpt2_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """GPT-2: pre-LayerNorm blocks of Conv1D layers (``addmm(bias, x, W)``, W stored (in, out): kept like a
    Linear, its input and under autocast the weight's cast; the bias cast is not kept). The fused ``c_attn``
    output is split into q, k, v views (no rotary: learned positions). Eager attention computes the softmax in
    the scores' dtype (no fp32 upcast). MLP: ``c_proj(gelu_new(c_fc(x)))`` with ``gelu_new`` as Python tensor ops.
    ``reorder_and_upcast_attn`` is not modelled. Dropout: ``attn_pdrop`` on the probabilities, ``resid_pdrop``
    after each ``c_proj`` (``kernels.dropout``)."""
    mixer, ffn, names, nb = _parts(layer)
    if ffn.dims.gated or names != ["ln_1", "ln_2"]:
        raise TrainmathError(f"layer {layer.label!r} is not a GPT-2 block (norms {names})")
    fam = ctx.family
    h = _norm(prog, ctx, style, nb, "ln_1", residual(ctx, "layer.input"))
    a = fused_attention(prog, ctx, mixer, h, qkv="attn.c_attn", o="attn.c_proj", prefix="attn", rotary=style.rotary,
                        softmax_fp32=False, dropout_p=fam.attention_dropout)
    _residual_dropout(prog, ctx, a, fam.residual_dropout, "attn.resid_dropout")
    h = _norm(prog, ctx, style, nb, "ln_2", residual(ctx, "attention.residual"))
    m = plain_mlp(prog, ctx, ffn, h, width=ffn.dims.intermediate, up="c_fc", down="c_proj", act=style.act)
    _residual_dropout(prog, ctx, m, fam.residual_dropout, "mlp.dropout")


FALCON_NORMS = (["ln_attn", "ln_mlp"], ["input_layernorm"], ["input_layernorm", "post_attention_layernorm"])


def falcon_layer(prog: Program, ctx: Ctx, layer: LayerSpec, style: Style) -> None:
    """Falcon (``FalconDecoderLayer``, rotary, SDPA, no bias): LayerNorms with bias, one fused
    ``query_key_value``, rotary, SDPA with the model's additive (b, 1, s, s) mask and no ``enable_gqa``,
    ``dense`` reading its output, and ``dense_4h_to_h(gelu(dense_h_to_4h(x)))``. The variant decides how
    ``_split_heads`` makes k and v (``fused_attention.SPLITS``):

    - multi-head (``multi_query=False``): views of the fused output, which the value keeps whole;
    - multi-query (Falcon-7B): index copies with one head, which SDPA without ``enable_gqa`` runs on its math
      fallback;
    - new decoder architecture (Falcon-40B/180B): index copies broadcast to h heads and flattened.

    Parallel attention: attention and MLP read one LayerNorm or, with two (``ln_attn``, ``ln_mlp``), two norms of
    one input (its storage kept once); sequential layers (``parallel_attn=False``) norm the residual after
    attention. The variant comes from ``Family.new_decoder_architecture`` when set, else from the spec: two norms
    or 1 < h_kv < h mean the new architecture; a single-norm new-architecture config with h_kv = h or h_kv = 1
    reads as multi-head/multi-query unless the flag is given. Eager attention computes the softmax in the hidden
    states' dtype (``tests/activations/test_eager_families``). Not modelled: Linear biases (under autocast a bf16
    product plus an fp32 bias is fp32, which changes every dtype after it), ALiBi, dropout."""
    mixer, ffn, names, nb = _parts(layer)
    if any(t.kind == "bias" for t in mixer.tensors + ffn.tensors):
        ctx.unmodelled("Falcon with bias=True is not yet modelled (an autocast bf16 product plus an fp32 bias "
                       "promotes to fp32): use --profile megatron")
    if names not in FALCON_NORMS:
        raise TrainmathError(f"Falcon layer norms {names} are not one of ln_attn/ln_mlp, input_layernorm, "
                             f"input_layernorm/post_attention_layernorm")
    h, hkv = mixer.dims.heads, mixer.dims.kv_heads
    new_arch = ctx.family.new_decoder_architecture
    if new_arch is None:
        new_arch = names == ["ln_attn", "ln_mlp"] or 1 < hkv < h
    x = residual(ctx, "layer.input")
    ha = _norm(prog, ctx, style, nb, names[0], x)
    hm = _norm(prog, ctx, style, nb, "ln_mlp", x) if names[0] == "ln_attn" else ha
    fused_attention(prog, ctx, mixer, ha, qkv="self_attention.query_key_value", o="self_attention.dense",
                    prefix="self_attention", split="broadcast" if new_arch else "index" if hkv == 1 else "view",
                    rotary=style.rotary, enable_gqa=False, mask=True, softmax_fp32=False)
    if names[-1] == "post_attention_layernorm":
        hm = _norm(prog, ctx, style, nb, "post_attention_layernorm", residual(ctx, "attention.residual"))
    plain_mlp(prog, ctx, ffn, hm, width=ffn.dims.intermediate, up="dense_h_to_4h", down="dense_4h_to_h",
              act=style.act)


LAYERS["starcoder2"] = starcoder2_layer
LAYERS["gpt2"] = gpt2_layer
LAYERS["falcon"] = falcon_layer
