"""Grouped-query attention after its input norm: q/k/v projections, optional q/k norms, rotary, the attention
kernel, o_proj. Derived from transformers' ``LlamaAttention``-style modules, checked by ``tests/activations``.

SDPA (the CPU flash kernel, or CUDA flash) keeps query and key (the rotary outputs, their compute-dtype casts
under autocast), value (v_proj's output), the output (which o_proj reads: it is laid out (b, s, h, h_d), so the
transpose is free) and the logsumexp (fp32, b·h·s). CUDA's memory-efficient kernel pads logsumexp to a multiple of
32 queries and both CUDA kernels add an 8-byte RNG seed and offset: not counted.

Eager (``attn_implementation="eager"``): contiguous copies of q, k, v at h heads (``repeat_kv`` / bmm), the fp32
softmax (4·b·h·s²) and its compute-dtype cast (the same tensor in fp32), a contiguous o_proj input; with logit
soft-capping the tanh output too.

Rotary styles (``Style.rotary``): ``rotate_half`` (``q·cos + rotate_half(q)·sin``) keeps the projection's
(b, s, h, h_d) layout; ``rotate_half_cat`` (partial rotary: ``torch.cat([rotated, passed])``) makes the query
contiguous in (b, h, s, h_d), SDPA's output follows it and ``transpose(1, 2).contiguous()`` before o_proj is a
copy (c·T·q); ``interleaved_fp32`` (Cohere: ``q.float()`` times cos/sin) saves nothing beyond the shared cos/sin;
``none``. Rotary multiplies by cos/sin, which need no gradient: only the shared cos/sin are kept (counted once
per model, ``model.rotary_ops``).

Fused ``qkv_proj`` (Phi-3): one Linear; q, k, v are views of its output, so what SDPA keeps as the value is the
whole (T, q + 2·kv) output.

Sharding (plain tensor parallelism: ``parallelize_module`` with column-wise q/k/v, row-wise o): heads are ÷tp,
the projections' input is the whole sequence of the group (all-gathered under sequence parallelism, see
``linear.gather_seq``), the o_proj output is reduced whole.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import AttentionDims, Block, TensorSpec
from trainmath.ops.cache import kv_cache
from trainmath.ops.context import FP32, Ctx
from trainmath.ops.ir import Axis, Program, Tensor, tensor
from trainmath.ops.kernels.dropout import dropout, sdpa_math_dropout
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.norms import norm

ROTARY = ("rotate_half", "rotate_half_cat", "interleaved_fp32", "none")
QK_NORM = (None, "head", "full")


def find(block: Block, fragment: str, kind: str | None = None) -> TensorSpec | None:
    """The tensor of ``block`` whose name contains ``fragment`` (and of ``kind``), or None."""
    return next((t for t in block.tensors if fragment in t.name and (kind is None or t.kind == kind)), None)


def heads_axes(ctx: Ctx, heads: int, head_dim: int) -> tuple[Axis, ...]:
    """(b, s, heads, head_dim) inside a tensor-parallel region: heads ÷tp."""
    return (*ctx.rows(sp=False), Axis(heads, "tp"), Axis(head_dim))


def rotary_embed(prog: Program, prefix: str, q: Tensor, k: Tensor, dtype: int, kind: str) -> tuple[Tensor, Tensor]:
    """Rotary embedding of q and k (``ROTARY``; cos/sin need no gradient, so it keeps nothing): new q and k of
    ``dtype`` (the wider of theirs and cos/sin's)."""
    qr, kr = tensor(f"{prefix}.q_rot", q.axes, dtype), tensor(f"{prefix}.k_rot", k.axes, dtype)
    prog.emit("rotary", f"{prefix}.rotary", inputs=(q, k), outputs=(qr, kr), kernel=kind)
    return qr, kr


def gqa_attention(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, rotary: str = "rotate_half",
                  qk_norm: str | None = None, qk_norm_kind: str = "rms", softcap: bool = False,
                  prefix: str = "self_attn", dropout_p: float = 0.0) -> Tensor:
    """Append the attention of ``block`` reading ``x`` (the input norm's output); returns o_proj's output.
    ``dropout_p``: dropout on the attention probabilities (``kernels.dropout``: eager keeps its mask or noise and
    its output instead of the probabilities' cast; SDPA on the CPU takes the math fallback, whose (b, h, s, h_d)
    output makes o_proj's input a copy)."""
    dims = block.dims
    if not isinstance(dims, AttentionDims):
        raise TrainmathError(f"attention block without AttentionDims: {block.kind}")
    if rotary not in ROTARY or qk_norm not in QK_NORM:
        raise TrainmathError(f"unknown rotary {rotary!r} or q/k norm {qk_norm!r}")
    c = ctx.p.compute_bytes
    b, s = ctx.b, ctx.s
    h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
    xg = gather_seq(prog, x, f"{prefix}.input")
    fused = find(block, "qkv_proj", "linear")
    rows = ctx.rows(sp=False)
    if fused is not None:
        qkv = linear(prog, ctx, f"{prefix}.qkv_proj", xg, Axis((h + 2 * hkv) * hd, "tp"), weight=fused)
        q = qkv.view(f"{prefix}.query", *heads_axes(ctx, h, hd))
        k = qkv.view(f"{prefix}.key", *heads_axes(ctx, hkv, hd))
        v = qkv.view(f"{prefix}.value", *heads_axes(ctx, hkv, hd), note="the whole fused qkv_proj output")
    else:
        q = linear(prog, ctx, f"{prefix}.q_proj", xg, Axis(h * hd, "tp"), weight=find(block, "q_proj", "linear"))
        k = linear(prog, ctx, f"{prefix}.k_proj", xg, Axis(hkv * hd, "tp"), weight=find(block, "k_proj", "linear"))
        v = linear(prog, ctx, f"{prefix}.v_proj", xg, Axis(hkv * hd, "tp"), weight=find(block, "v_proj", "linear"))
        if qk_norm != "full":
            q = q.view(f"{prefix}.query", *heads_axes(ctx, h, hd))
            k = k.view(f"{prefix}.key", *heads_axes(ctx, hkv, hd))
        v = v.view(f"{prefix}.value", *heads_axes(ctx, hkv, hd), note="v_proj output")
    if qk_norm is not None:
        q = norm(prog, ctx, qk_norm_kind, f"{prefix}.q_norm", q, find(block, "q_norm"))
        k = norm(prog, ctx, qk_norm_kind, f"{prefix}.k_norm", k, find(block, "k_norm"))
        if qk_norm == "full":
            q, k = (tensor(t.name, heads_axes(ctx, n, hd), t.dtype_bytes) for t, n in ((q, h), (k, hkv)))
    if rotary != "none":
        q, k = rotary_embed(prog, prefix, q, k, max(q.dtype_bytes, ctx.p.residual_bytes), rotary)
    o_axes = heads_axes(ctx, h, hd)
    at = dict(window=dims.sliding_window, cache=kv_cache(ctx, hkv, hd, dims.v_head_dim))
    scores = (Axis(b), Axis(h, "tp"), Axis(s, "seq"), Axis(s))
    if not ctx.eager and dropout_p and ctx.device == "cpu":
        out = sdpa_math_dropout(prog, ctx, q, k, v, dropout_p, o_axes, scores, **at)
        o_in = tensor(f"{prefix}.o_proj.input", o_axes, c, "transpose(1, 2).contiguous() copy of the output")
        prog.emit("copy", "transpose_contiguous", inputs=(out,), outputs=(o_in,))
    elif not ctx.eager:
        qs = q if q.dtype_bytes == c else tensor("sdpa.query", q.axes, c, "rotary output (its cast under autocast)")
        ks = k if k.dtype_bytes == c else tensor("sdpa.key", k.axes, c)
        out = tensor("sdpa.output", o_axes, c, "also o_proj's input")
        lse = tensor("sdpa.logsumexp", (Axis(b), Axis(h, "tp"), Axis(s, "seq")), FP32)
        prog.emit("attention", "sdpa", inputs=(q, k, v), outputs=(out,), saved=(qs, ks, v, out, lse), kernel="sdpa",
                  **at)
        o_in = out
        if rotary == "rotate_half_cat":
            o_in = tensor(f"{prefix}.o_proj.input", o_axes, c,
                        "contiguous copy: the query (hence the output) is (b, h, s, h_d)")
            prog.emit("copy", "transpose_contiguous", inputs=(out,), outputs=(o_in,))
    else:
        saved = [tensor("eager.query", o_axes, c, "contiguous copy for bmm"),
                 tensor("eager.key", o_axes, c, "repeated to h heads")]
        if softcap:
            saved.append(tensor("eager.softcap_tanh", scores, c, "attention logit soft-capping"))
        sm = tensor("eager.softmax_fp32", scores, FP32)
        saved.append(sm)
        # softmax(..., dtype=fp32).to(query.dtype) (the rotary output's: fp32 under autocast), the dropout, and
        # autocast's cast of the probabilities for the bmm when they are still wider than the compute dtype
        probs = sm if q.dtype_bytes == FP32 else tensor("eager.probs", scores, q.dtype_bytes,
                                                          "softmax cast to the query's dtype")
        probs = dropout(prog, ctx, probs, dropout_p, "eager.dropout")
        if probs.dtype_bytes != c:
            probs = tensor("eager.probs" if probs is sm else "eager.probs_autocast", scores, c,
                           "softmax cast to compute dtype")
        if probs is not sm:
            saved.append(probs)
        o_in = tensor(f"{prefix}.o_proj.input", o_axes, c, "transpose(1, 2).contiguous() of the output")
        saved += [tensor("eager.value", o_axes, c, "repeated to h heads"), o_in]
        prog.emit("attention", "eager_attention", inputs=(q, k, v), outputs=(o_in,), saved=saved, kernel="eager",
                  **at)
    flat = o_in.view(f"{prefix}.o_proj.in", *rows, Axis(h * hd, "tp"))
    return linear(prog, ctx, f"{prefix}.o_proj", flat, Axis(ctx.d), weight=find(block, "o_proj", "linear"))
