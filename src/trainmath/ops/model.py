"""The model-level ops around the decoder layers: the embedding prologue, the rotary tables every layer shares,
and the head (final norm, LM head, loss), each driven by the family's ``Style`` row. Derived from transformers
5.24's modeling code (``*ForCausalLM.forward`` with labels, ``ForCausalLMLoss``), checked by ``tests/activations``.

- Embedding: the token ids (int64, b·s) the lookup keeps; learned positions (``Style.positions == "learned"``,
  GPT-2) keep their (1, s) ids too; Gemma's ``embed_scale`` (``Style.embed_scale``) is a 0-dim sqrt(d) tensor in
  the embedding dtype, kept by the scaling product; ``Family.embedding_dropout`` then keeps its mask or noise
  (``kernels.dropout``).
- Rotary: cos and sin, (1, s, rope_dim) in the embedding dtype (``rope_fp32``: fp32 whatever the dtype, OLMo-2;
  ``rope_half``: the h_d/2 frequencies, not concatenated, gpt-oss), computed once and kept by every layer's
  rotary product (one storage each); ``rope_sets_by_window``: one pair per kind of layer on the rank (Gemma-3:
  local and global bases). ``freqs_cis`` (DeepSeek-V2, Llama 4): (1, s, rope_dim/2) complex64. ``rope_layers ==
  "windowed"`` (Llama 4): only windowed (chunked) layers rotate, so a rank holding none keeps no table.
- Head: the final norm (``Style.norm``) on the last hidden states, the LM head (its input, its cast under
  autocast, and the autocast cast of its weight), Gemma-2's final soft-capping (the tanh output, c·T·V),
  ``logits.float()`` and ``cross_entropy`` = ``log_softmax`` (keeps its fp32 output, 4·T·V) + ``nll_loss`` (the
  shifted labels, int64 T: padded, not sliced, so all T positions count; with b = 1 ``labels[..., 1:]`` of the
  padded (1, s + 1) labels is already contiguous, so ``.contiguous()`` returns the view and nll_loss keeps the
  padded storage, 8 bytes more; and its fp32 total_weight). Not saved
  but alive: the logits in the compute dtype (held by the model output) and, when the compute dtype is not fp32,
  their fp32 upcast, freed once log_softmax has run. Cohere's ``logits * logit_scale`` multiplies by a Python
  float: nothing kept, the product replaces the head output.

Sharding: the vocabulary axis is ``vocab`` (÷tp with a vocabulary-parallel head and loss, Megatron's
``ColumnParallelLinear`` head with ``vocab_parallel_cross_entropy``); token axes follow ``Ctx.rows``; the ids,
labels and tables are whole on every rank of the tensor-parallel group.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmath.model.spec import AttentionDims, MLADims, ModelSpec, TensorSpec
from trainmath.ops.context import FP32, INT64, Ctx
from trainmath.ops.ir import Axis, Program, Tensor
from trainmath.ops.kernels.dropout import dropout
from trainmath.ops.kernels.linear import cast, gather_seq, linear
from trainmath.ops.kernels.norms import norm
from trainmath.ops.style import Style

COMPLEX64 = 8


def rope_dim(spec: ModelSpec, partial_rotary_factor: float = 1.0) -> int:
    """Width of cos/sin: the rotated part of a head (``int(head_dim · partial_rotary_factor)``, transformers'
    ``compute_default_rope_parameters``), or MLA's rope head dim; 0 without attention."""
    for layer in spec.layers:
        for bl in layer.blocks:
            if isinstance(bl.dims, AttentionDims):
                return int(bl.dims.head_dim * partial_rotary_factor)
            if isinstance(bl.dims, MLADims):
                return bl.dims.qk_rope_head_dim
    return 0


def embedding_ops(ctx: Ctx, style: Style) -> Program:
    """What the embedding of the first stage keeps."""
    prog = Program()
    ids = Tensor(name="input_ids", axes=(Axis(ctx.b), Axis(ctx.s, "seq")), dtype_bytes=INT64,
                 note="indices saved by the embedding")
    h = Tensor(name="embedding.out", axes=(*ctx.rows(), Axis(ctx.d)), dtype_bytes=ctx.p.residual_bytes)
    prog.emit("embedding", "embed_tokens", inputs=(ids,), outputs=(h,), saved=(ids,))
    if style.positions == "learned":
        pos = Tensor(name="position_ids", axes=(Axis(1), Axis(ctx.s, "seq")), dtype_bytes=INT64,
                     note="(1, s) arange saved by the position embedding")
        prog.emit("embedding", "position_embeddings", inputs=(pos,), saved=(pos,))
    if style.embed_scale:
        scale = Tensor(name="embed_scale", axes=(), dtype_bytes=ctx.p.weight_bytes,
                       note="sqrt(d) as a 0-dim tensor in the embedding dtype, saved by the scaling product")
        prog.emit("mul", "embed_scale", inputs=(h, scale), saved=(scale,))
    dropout(prog, ctx, h, ctx.family.embedding_dropout, "embedding.dropout")
    return prog


def windowed(spec: ModelSpec, layers: Sequence[int]) -> list[bool]:
    """Per attention block on ``layers``: does it attend through a window (sliding or chunked)?"""
    return [bl.dims.sliding_window is not None for i in layers for bl in spec.layers[i].blocks
            if isinstance(bl.dims, AttentionDims)]


def rotary_ops(ctx: Ctx, spec: ModelSpec, style: Style, layers: Sequence[int]) -> tuple[Program, str]:
    """The rotary tables the rank's ``layers`` share (none for learned or absent positions), with a note."""
    prog = Program()
    kinds = windowed(spec, layers)
    if not layers or style.positions in ("learned", "none") or \
            (style.rope_layers == "windowed" and not any(kinds)):
        return prog, ""
    rope = rope_dim(spec, ctx.family.partial_rotary_factor)
    if style.positions == "freqs_cis":
        f = Tensor(name="freqs_cis", axes=(Axis(1), Axis(ctx.s, "seq"), Axis(rope // 2)), dtype_bytes=COMPLEX64)
        prog.emit("rotary_embedding", "rotary_emb", outputs=(f,), saved=(f,))
        return prog, "(1, s, rope_dim/2) complex64 whatever the dtype, shared by every layer"
    if style.rope_half:
        rope //= 2
    sets = len(set(kinds)) if style.rope_sets_by_window else 1
    dtype = FP32 if style.rope_fp32 else ctx.p.residual_bytes
    axes = (Axis(1), Axis(ctx.s, "seq"), Axis(rope))
    cos, sin = (Tensor(name=n, axes=axes, dtype_bytes=dtype, count=sets) for n in ("cos", "sin"))
    prog.emit("rotary_embedding", "rotary_emb", outputs=(cos, sin), saved=(cos, sin))
    note = "(1, s, rope_dim) in the embedding dtype, shared by every layer"
    if sets > 1:
        note += f"; {sets} sets (sliding and full layers use different RoPE bases)"
    return prog, note


def _post(spec: ModelSpec, kind: str, default: TensorSpec) -> TensorSpec:
    """The final norm's weight (``kind="norm"``) or the LM head (``linear``) among the spec's tensors after the
    layers, else ``default``."""
    return next((t for t in spec.post if t.kind == kind and t.name.endswith(".weight")), default)


def head_ops(ctx: Ctx, spec: ModelSpec, style: Style) -> tuple[Program, list[tuple[str, Tensor, str]]]:
    """The head and loss of the last stage, and what is alive but not saved, as (name, tensor, note): the
    logits the model returns, then their fp32 upcast when there is one."""
    prog = Program()
    c, d, V = ctx.p.compute_bytes, ctx.d, spec.vocab_size
    x = Tensor(name="hidden_states", axes=(*ctx.rows(), Axis(d)), dtype_bytes=ctx.p.residual_bytes,
               note="the last layer's output")
    h = norm(prog, ctx, style.norm, "norm", x,
             _post(spec, "norm", TensorSpec(name="norm.weight", shape=(d,), component="norms", kind="norm")))
    w = TensorSpec(name="lm_head.weight", shape=(V, d), component="lm_head", shard="vocab")
    logits = linear(prog, ctx, "lm_head", gather_seq(prog, h, "lm_head.input"), Axis(V, "vocab"),
                    weight=_post(spec, "linear", w))
    fam = ctx.family
    note = "returned in the output"
    if fam.final_logit_softcapping is not None:
        t = Tensor(name="softcap_tanh", axes=logits.axes, dtype_bytes=c, note="tanh(logits / cap), saved by tanh")
        prog.emit("act", "final_logit_softcapping", inputs=(logits,), outputs=(t,), saved=(t,), kernel="tanh")
        logits = Tensor(name="logits.capped", axes=logits.axes, dtype_bytes=c)
        prog.emit("mul", "softcap_scale", inputs=(t,), outputs=(logits,), note="times cap: a Python float")
    if fam.logit_scale is not None:
        scaled = Tensor(name="logits.scaled", axes=logits.axes, dtype_bytes=c)
        prog.emit("mul", "logit_scale", inputs=(logits,), outputs=(scaled,), note="a Python float: nothing kept")
        logits = scaled
        note += f" (scaled by logit_scale={fam.logit_scale}: the product replaces the head output)"
    up = cast(prog, logits, FP32, "logits_fp32", "logits.float() in ForCausalLMLoss")
    logp = Tensor(name="log_softmax_fp32", axes=logits.axes, dtype_bytes=FP32)
    prog.emit("loss", "log_softmax", inputs=(up,), outputs=(logp,), saved=(logp,))
    labels = Tensor(name="labels", axes=(Axis(ctx.b), Axis(ctx.s, "seq")), dtype_bytes=INT64)
    total = Tensor(name="total_weight", axes=(), dtype_bytes=FP32)
    kept = (labels, total)
    if ctx.b == 1:  # labels[..., 1:] of the (1, s + 1) padded labels is contiguous: a view, not a copy
        kept += (Tensor(name="labels_pad", axes=(Axis(1),), dtype_bytes=INT64,
                        note="the pad column: with b = 1 the shifted labels are a view of the padded (1, s + 1) "
                             "storage"),)
    prog.emit("loss", "nll_loss", inputs=(logp, labels), saved=kept)
    held = [("logits", logits, note)]
    if up is not logits:
        held.append(("logits_fp32 (transient)", up, up.note))
    return prog, held
