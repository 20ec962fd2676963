"""Attention from one fused projection (a single Linear or Conv1D producing q, k and v), with the ways a model
splits its output, and the attention kernels PyTorch then runs. Derived from the modeling code, checked by
``tests/activations``.

Splits (``SPLITS``):

- ``view``: q, k, v are views of the (b, s, (h + 2·h_kv)·h_d) output. Whatever keeps k or v keeps that whole
  storage (without rotary SDPA keeps the query, key and value as one storage, c·T·(q + 2·kv)).
- ``index``: k and v are ``fused[..., [-2], :]``/``[..., [-1], :]`` advanced-index copies of h_kv heads; each
  index node keeps its one-element int64 index (8 bytes).
- ``broadcast``: as ``index``, then broadcast to h heads and flattened: a copy of h heads when 1 < h_kv, a
  stride-0 view of the index copy when h_kv = 1 (rotary then makes the key h heads wide either way). The KV cache
  then holds h heads, not h_kv (``FalconAttention.forward`` caches ``num_heads`` heads under
  ``new_decoder_architecture``).

Kernels: ``sdpa`` as in ``attention.gqa_attention`` (query, key, value, output, logsumexp) plus, with ``mask``, the
additive (b, 1, s, s) mask SDPA was given, in the compute dtype, one storage per layer. SDPA without
``enable_gqa`` and fewer key than query heads takes no fused kernel: PyTorch's math fallback (``sdpa_math``; on
CPU it computes in fp32 whatever the dtype) keeps the scaled query, the key and value expanded to h heads
(4·T·q each) and the fp32 softmax (4·b·h·s²); its (b, h, s, h_d) output makes the output projection's input a
copy; the mask is added there, not kept. ``eager`` (``attn_implementation="eager"``): contiguous copies of q, k, v
at h heads, the softmax (fp32 with ``softmax_fp32``, else in the scores' dtype, which autocast makes fp32) and its
compute-dtype cast when the two differ, and a contiguous copy as the output projection's input.

Sharding as in ``attention``: the fused output's features and every head axis are ÷tp (column-parallel fused
projection, row-parallel output projection); the index tensors are replicated.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError
from trainmath.model.spec import AttentionDims, Block
from trainmath.ops.cache import kv_cache
from trainmath.ops.context import FP32, INT64, Ctx
from trainmath.ops.ir import Axis, Program, Tensor, tensor
from trainmath.ops.kernels.attention import ROTARY, find, heads_axes, rotary_embed
from trainmath.ops.kernels.dropout import dropout, sdpa_math_dropout
from trainmath.ops.kernels.linear import gather_seq, linear

SPLITS = ("view", "index", "broadcast")


def _split(prog: Program, ctx: Ctx, fused: Tensor, split: str, prefix: str, h: int, hkv: int, hd: int):
    """(q, k, v) of the fused output under ``split``."""
    c = fused.dtype_bytes
    q = fused.view(f"{prefix}.query", *heads_axes(ctx, h, hd))
    if split == "view":
        k = fused.view(f"{prefix}.key", *heads_axes(ctx, hkv, hd))
        v = fused.view(f"{prefix}.value", *heads_axes(ctx, hkv, hd),
                       note="a view of the fused output, which it keeps whole")
        return q, k, v
    idx = tensor(f"{prefix}.kv_index", (Axis(2),), INT64, "the [-2] and [-1] index tensors, one int64 each")
    k = tensor(f"{prefix}.key_index_copy", heads_axes(ctx, hkv, hd), c)
    v = tensor(f"{prefix}.value_index_copy", heads_axes(ctx, hkv, hd), c)
    prog.emit("index", f"{prefix}.split_heads", inputs=(fused,), outputs=(k, v), saved=(idx,))
    if split == "broadcast":
        k = k.view(f"{prefix}.key", *heads_axes(ctx, h, hd), note="broadcast to h heads")
        if hkv > 1:
            flat = tensor(f"{prefix}.value", heads_axes(ctx, h, hd), c, "index copy broadcast to h heads and flattened")
            prog.emit("copy", f"{prefix}.value_flatten", inputs=(v,), outputs=(flat,))
            v = flat
        else:
            v = v.view(f"{prefix}.value", *heads_axes(ctx, h, hd), note="flattening a stride-0 broadcast of one "
                                                                          "head is a view of the index copy")
    return q, k, v


def fused_attention(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, qkv: str, o: str, prefix: str,
                    split: str = "view", rotary: str = "none", enable_gqa: bool = True, mask: bool = False,
                    softmax_fp32: bool = True, dropout_p: float = 0.0) -> Tensor:
    """Append the attention of ``block`` reading ``x`` (its input norm's output) through the fused projection
    ``qkv`` and the output projection ``o`` (module paths); returns ``o``'s output. ``dropout_p``: dropout on
    the attention probabilities (``kernels.dropout``: eager keeps its mask or noise and its output instead of the
    probabilities; SDPA on the CPU takes the math fallback)."""
    dims = block.dims
    if not isinstance(dims, AttentionDims):
        raise TrainmathError(f"attention block without AttentionDims: {block.kind}")
    if split not in SPLITS or rotary not in ROTARY:
        raise TrainmathError(f"unknown split {split!r} (one of {', '.join(SPLITS)}) or rotary {rotary!r}")
    c = ctx.p.compute_bytes
    b, s = ctx.b, ctx.s
    h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
    xg = gather_seq(prog, x, f"{prefix}.input")
    fused = linear(prog, ctx, qkv, xg, Axis((h + 2 * hkv) * hd, "tp"), weight=find(block, qkv, "linear"))
    q, k, v = _split(prog, ctx, fused, split, prefix, h, hkv, hd)
    if rotary != "none":
        q, k = rotary_embed(prog, prefix, q, k, max(c, ctx.p.residual_bytes), rotary)  # times cos/sin (embedding dtype)
    key_heads = k.axes[2].size
    o_axes = heads_axes(ctx, h, hd)
    scores = (Axis(b), Axis(h, "tp"), Axis(s, "seq"), Axis(s))
    # the cache holds the key and value as attention reads them: broadcast to h heads under ``broadcast``
    # (transformers' FalconAttention caches num_heads heads with new_decoder_architecture)
    cache_heads = h if split == "broadcast" else hkv
    at = dict(window=dims.sliding_window, cache=kv_cache(ctx, cache_heads, hd, dims.v_head_dim))
    if ctx.eager:
        sm = FP32 if softmax_fp32 or ctx.p.autocast else c
        saved = [tensor("eager.query", o_axes, c, "contiguous copy for bmm"),
                 tensor("eager.key", o_axes, c, "contiguous copy of the transposed key for bmm"),
                 tensor("eager.softmax", scores, sm, "fp32" if sm == FP32 else "in the scores' dtype")]
        probs = saved[-1] if sm == c else tensor("eager.probs", scores, c, "softmax cast to the compute dtype")
        probs = dropout(prog, ctx, probs, dropout_p, "eager.dropout")
        if probs is not saved[-1]:
            saved.append(probs)
        o_in = tensor(f"{o}.input", o_axes, c, "contiguous copy of the (b, h, s, h_d) output")
        saved += [tensor("eager.value", o_axes, c, "contiguous copy for bmm"), o_in]
        prog.emit("attention", "eager_attention", inputs=(q, k, v), outputs=(o_in,), saved=saved, kernel="eager",
                  **at)
    elif dropout_p and ctx.device == "cpu":
        out = sdpa_math_dropout(prog, ctx, q, k, v, dropout_p, o_axes, scores, **at)
        o_in = tensor(f"{o}.input", o_axes, c, "transpose + reshape copy of the (b, h, s, h_d) output")
        prog.emit("copy", "transpose_reshape", inputs=(out,), outputs=(o_in,))
    elif key_heads < h and not enable_gqa:
        o_in = tensor(f"{o}.input", o_axes, c, "permute + reshape copy of the (b, h, s, h_d) output")
        saved = [tensor("sdpa_math.query_scaled", o_axes, FP32, "fp32 on CPU"),
                 tensor("sdpa_math.key", o_axes, FP32, "expanded to h heads"),
                 tensor("sdpa_math.softmax_fp32", scores, FP32),
                 tensor("sdpa_math.value", o_axes, FP32, "expanded to h heads"), o_in]
        prog.emit("attention", "sdpa_math", inputs=(q, k, v), outputs=(o_in,), saved=saved, kernel="sdpa_math", **at,
                  note=f"{key_heads} key heads for {h} query heads without enable_gqa: no fused kernel")
    else:
        qs = q if q.dtype_bytes == c else tensor("sdpa.query", q.axes, c, "rotary output (its cast under autocast)")
        ks = k if k.dtype_bytes == c else tensor("sdpa.key", k.axes, c)
        out = tensor("sdpa.output", o_axes, c, f"also {o}'s input")
        saved = [qs, ks, v, out, tensor("sdpa.logsumexp", (Axis(b), Axis(h, "tp"), Axis(s, "seq")), FP32)]
        if mask:
            saved.append(tensor("sdpa.attn_mask", (Axis(b), Axis(1), Axis(s, "seq"), Axis(s)), c,
                            "the (b, 1, s, s) additive mask as SDPA keeps it, one per layer"))
        prog.emit("attention", "sdpa", inputs=(q, k, v), outputs=(out,), saved=saved, kernel="sdpa", **at)
        o_in = out
    flat = o_in.view(f"{o}.in", *ctx.rows(sp=False), Axis(h * hd, "tp"))
    return linear(prog, ctx, o, flat, Axis(ctx.d), weight=find(block, o, "linear"))
