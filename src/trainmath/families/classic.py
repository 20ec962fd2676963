"""The classic architectures of the first article of Jiang Yi's blog series: LayerNorm (2d) and a plain GELU MLP
with biases.

- gpt2: learned position embeddings (n_positions·d), Conv1D layers stored (in, out), fused c_attn of width 3d,
  MLP d_ff = n_inner or 4d, everything biased, tied lm_head.
- falcon: fused query_key_value whose width depends on the attention variant (MHA 3d; multi-query d + 2·h_d;
  the "new decoder architecture" of Falcon-40B/180B (h + 2·h_kv)·h_d), parallel attention/MLP with one or two
  LayerNorms, MLP d_ff = ffn_hidden_size or 4d, biases when ``bias``.

The op lists of the LayerNorm families with plain (non-gated) MLPs: StarCoder2, GPT-2 and Falcon, derived from
transformers 5.24's modeling code, checked by ``tests/activations``. Biases keep nothing. GPT-2 and StarCoder2 apply the
config's dropouts (``Family``: on the embedding, the attention probabilities and each sub-block's output before its
residual add; what each keeps: ``kernels.dropout``); Falcon's are not modelled (``Style.dropout``).
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.families.base import FamilyDef, TPPlan
from trainmath.families.common import (
    architecture,
    head,
    layer_parts,
    residual,
)
from trainmath.families.dense import builder
from trainmath.model import blocks
from trainmath.model.config import ConfigView
from trainmath.model.spec import AttentionDims, Block, LayerSpec, MLPDims, ModelSpec, TensorSpec
from trainmath.ops.context import Ctx
from trainmath.ops.ir import Program, Tensor
from trainmath.ops.kernels.attention import find, gqa_attention
from trainmath.ops.kernels.dropout import dropout
from trainmath.ops.kernels.fused_attention import fused_attention
from trainmath.ops.kernels.linear import reduce_seq
from trainmath.ops.kernels.mlp import plain_mlp
from trainmath.ops.kernels.norms import norm
from trainmath.ops.style import Style


def _conv1d(name: str, d_in: int, d_out: int, component: str, shard: str) -> tuple[TensorSpec, ...]:
    """GPT-2's Conv1D: weight stored (in, out), bias (out)."""
    return (TensorSpec(name=f"{name}.weight", shape=(d_in, d_out), component=component, shard=shard,
                       transposed=True),
            TensorSpec(name=f"{name}.bias", shape=(d_out,), component=component, kind="bias",
                       shard="column" if shard == "column" else "replicated"))


def _gpt2(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab, n = cfg.int("n_embd"), cfg.int("vocab_size"), cfg.int("n_layer")
    h, n_pos = cfg.int("n_head"), cfg.int("n_positions")
    cfg.require(d % h == 0, f"n_embd ({d}) must be divisible by n_head ({h})")
    d_ff = cfg.opt_int("n_inner") or 4 * d
    attn = Block(kind="attention", tensors=_conv1d("attn.c_attn", d, 3 * d, "attention", "column")
                 + _conv1d("attn.c_proj", d, d, "attention", "row"),
                 dims=AttentionDims(heads=h, kv_heads=h, head_dim=d // h, v_head_dim=d // h))
    mlp = blocks.dense_mlp_block(_conv1d("mlp.c_fc", d, d_ff, "mlp_dense", "column")
                                 + _conv1d("mlp.c_proj", d_ff, d, "mlp_dense", "row"), d=d, d_ff=d_ff, gated=False)
    norms = blocks.norm_block(("ln_1", d), ("ln_2", d), bias=True)
    layer = LayerSpec(label="full_attention + mlp", blocks=(attn, mlp, norms))
    tied = cfg.bool("tie_word_embeddings")
    cfg.check()
    pre = (TensorSpec(name="transformer.wte.weight", shape=(vocab, d), component="embed_tokens", kind="embedding",
                      shard="vocab"),
           TensorSpec(name="transformer.wpe.weight", shape=(n_pos, d), component="pos_embed", kind="embedding"))
    return ModelSpec(
        name=name, model_type="gpt2", architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=n_pos, layer_prefix="transformer.h.{i}.", pre=pre, layers=(layer,) * n,
        post=head(vocab, d, tied, final_norm="transformer.ln_f", norm_bias=True), tie_word_embeddings=tied,
        symbols=dict(N=n, V=vocab, d=d, d_ff=d_ff, h=h, h_kv=h, h_d=d // h),
    )


def _falcon(cfg: ConfigView, name: str) -> ModelSpec:
    d, vocab, n = cfg.int("hidden_size"), cfg.int("vocab_size"), cfg.int("num_hidden_layers")
    h = cfg.int("num_attention_heads")
    cfg.require(d % h == 0, f"hidden_size ({d}) must be divisible by num_attention_heads ({h})")
    hd = d // h
    new_arch = cfg.bool("new_decoder_architecture")
    if new_arch or not cfg.bool("multi_query"):
        hkv = cfg.opt_int("num_kv_heads") or h
    else:
        hkv = 1
    cfg.require(h % hkv == 0, f"num_kv_heads ({hkv}) must divide num_attention_heads ({h})")
    bias = cfg.bool("bias")
    qkv_out = (h + 2 * hkv) * hd if new_arch else (d + 2 * hd if hkv == 1 else 3 * d)
    attn = Block(kind="attention",
                 tensors=blocks.linear("self_attention.query_key_value", qkv_out, d, "attention", "column", bias=bias)
                 + blocks.linear("self_attention.dense", d, d, "attention", "row", bias=bias),
                 dims=AttentionDims(heads=h, kv_heads=hkv, head_dim=hd, v_head_dim=hd))
    d_ff = cfg.opt_int("ffn_hidden_size") or 4 * d
    mlp = blocks.dense_mlp_block(blocks.plain_mlp(d=d, d_ff=d_ff, bias=bias, names=("dense_h_to_4h", "dense_4h_to_h")),
                                 d=d, d_ff=d_ff, gated=False)
    n_ln = cfg.opt_int("num_ln_in_parallel_attn") or (2 if new_arch else 1)
    if not cfg.bool("parallel_attn") and not new_arch:
        norm_names = ("input_layernorm", "post_attention_layernorm")
    elif new_arch and n_ln == 2:
        norm_names = ("ln_attn", "ln_mlp")
    else:
        norm_names = ("input_layernorm",)
    norms = blocks.norm_block(*((nm, d) for nm in norm_names), bias=True)
    layer = LayerSpec(label="full_attention + mlp", blocks=(attn, mlp, norms))
    tied = cfg.bool("tie_word_embeddings")
    cfg.check()
    pre = (TensorSpec(name="transformer.word_embeddings.weight", shape=(vocab, d), component="embed_tokens",
                      kind="embedding", shard="vocab"),)
    return ModelSpec(
        name=name, model_type="falcon", architecture=architecture(cfg), vocab_size=vocab, hidden_size=d,
        max_position_embeddings=cfg.int("max_position_embeddings"), layer_prefix="transformer.h.{i}.", pre=pre,
        layers=(layer,) * n, post=head(vocab, d, tied, final_norm="transformer.ln_f", norm_bias=True),
        tie_word_embeddings=tied, symbols=dict(N=n, V=vocab, d=d, d_ff=d_ff, h=h, h_kv=hkv, h_d=hd),
    )


def _parts(layer: LayerSpec):
    """(attention block, plain MLP block, the norms' weight names without ``.weight``, the norm block)."""
    mixer, ffn, nb = layer_parts(layer)
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


STARCODER2 = FamilyDef(model_type="starcoder2",
                       build=builder(qkv_bias="use_bias", o_bias="use_bias", mlp_bias="use_bias", plain_mlp=True,
                                     norm_bias=True),
                       layer=starcoder2_layer, style=Style(norm="layer", act="gelu_tanh", dropout=True), tp=TPPlan())
GPT2 = FamilyDef(model_type="gpt2", build=_gpt2, layer=gpt2_layer,
                 style=Style(norm="layer", act="gelu_new", rotary="none", positions="learned", dropout=True,
                             config_defaults=(("attention_dropout", 0.1), ("residual_dropout", 0.1),
                                              ("embedding_dropout", 0.1)),
                             fused_projections=("c_attn",)),
                 checkpoint_position_ids=False)
FALCON = FamilyDef(model_type="falcon", build=_falcon, layer=falcon_layer,
                   style=Style(norm="layer", act="gelu", layer_mask="bool", fused_projections=("query_key_value",)))
