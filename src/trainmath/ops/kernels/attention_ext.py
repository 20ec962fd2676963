"""Attention kernels beyond ``attention.gqa_attention``'s SDPA/eager pair, each a parameter of the module code
rather than a family (derived from the modeling code, checked by ``tests/activations``):

- ``sink_attention``: eager attention with learned sinks, ``cat([q·kᵀ·scale + mask, sinks])``, minus its row max,
  softmax over s + 1 columns, the sink column dropped, ``.to(v.dtype)``, times v. Keeps the rotary query (read
  in place by bmm), the key and value repeated to h heads, the row max's int64 indices, the softmax over s + 1
  columns (fp32 under autocast, whose fp32 mask promotes the scores; the compute dtype otherwise), under autocast
  its cast without the sink column, and o_proj's input (a contiguous copy of the transposed output). The cat, the
  sinks' expand and the scale keep nothing.
- ``sdpa_attention``: SDPA with the options the module code adds around it. ``project_gate``: q_proj emits the
  query and an output gate (T, 2q); the per-head q norm then reads a view, so in fp32 its "fp32 copy" is the
  whole q_proj output; after SDPA the gate's ``sigmoid`` and product keep the sigmoid and the attention output
  (a contiguous copy when the rotary ends in ``torch.cat``), and o_proj reads the product. ``qk_norm_after_rotary``
  (Llama 4's weightless L2 norm on RoPE layers): the norm reads the rotary outputs. ``rotary="complex"``: the
  rotary multiplies ``q.float()`` as complex numbers by the shared ``freqs_cis`` and casts back (nothing kept).
  ``query_scale`` (Llama 4's temperature tuning on no-RoPE layers): the query times an fp32 (1, s, 1, 1) scale,
  expanded over the batch, which the product keeps. ``mask``: SDPA gets an explicit mask (Llama 4's chunked mask,
  c·b·s², one per layer), and with fewer kv heads transformers then repeats k and v to h heads (``repeat_kv``
  copies) instead of native GQA.
"""

from __future__ import annotations

from trainmath.model.spec import Block
from trainmath.ops.cache import kv_cache
from trainmath.ops.context import FP32, INT64, Ctx
from trainmath.ops.ir import Axis, Program, Tensor, tensor
from trainmath.ops.kernels.attention import find, heads_axes, rotary_embed
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.ops.kernels.norms import norm


def _qkv(prog: Program, ctx: Ctx, block: Block, x: Tensor, prefix: str, q_mult: int = 1):
    """q/k/v projections reading ``x`` through the sequence gather; returns (q_proj output, k, v views)."""
    dims = block.dims
    h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
    xg = gather_seq(prog, x, f"{prefix}.input")
    qo = linear(prog, ctx, f"{prefix}.q_proj", xg, Axis(q_mult * h * hd, "tp"), weight=find(block, "q_proj", "linear"))
    k = linear(prog, ctx, f"{prefix}.k_proj", xg, Axis(hkv * hd, "tp"), weight=find(block, "k_proj", "linear"))
    v = linear(prog, ctx, f"{prefix}.v_proj", xg, Axis(hkv * hd, "tp"), weight=find(block, "v_proj", "linear"))
    return (qo, k.view(f"{prefix}.key", *heads_axes(ctx, hkv, hd)),
            v.view(f"{prefix}.value", *heads_axes(ctx, hkv, hd), note="v_proj output"))


def _o_proj(prog: Program, ctx: Ctx, block: Block, o_in: Tensor, prefix: str) -> Tensor:
    dims = block.dims
    flat = o_in.view(f"{prefix}.o_proj.in", *ctx.rows(sp=False), Axis(dims.heads * dims.head_dim, "tp"))
    return linear(prog, ctx, f"{prefix}.o_proj", flat, Axis(ctx.d), weight=find(block, "o_proj", "linear"))


def sink_attention(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, prefix: str = "self_attn") -> Tensor:
    """q/k/v, rotary, eager attention with sinks, o_proj; returns o_proj's output."""
    dims = block.dims
    c = ctx.p.compute_bytes
    h, hd = dims.heads, dims.head_dim
    qo, k, v = _qkv(prog, ctx, block, x, prefix)
    q = qo.view(f"{prefix}.query", *heads_axes(ctx, h, hd))
    q, k = rotary_embed(prog, prefix, q, k, c, "rotate_half_cat")
    o_axes = heads_axes(ctx, h, hd)
    rows = (Axis(ctx.b), Axis(h, "tp"), Axis(ctx.s, "seq"))
    soft = FP32 if ctx.p.autocast else c
    saved = [q, tensor("eager.key", o_axes, c, "repeated to h heads"),
             tensor("eager.row_max_indices", rows, INT64, "max(dim=-1) of the scores with the sink column"),
             tensor("eager.softmax_with_sink", (*rows, Axis(ctx.s + 1)), soft, "s + 1 columns: the sink's included")]
    if ctx.p.autocast:
        saved.append(tensor("eager.probs", (*rows, Axis(ctx.s)), c, "bf16 cast without the sink column"))
    o_in = tensor(f"{prefix}.o_proj.input", o_axes, c, "transpose(1, 2).contiguous() of the output")
    saved += [tensor("eager.value", o_axes, c, "repeated to h heads"), o_in]
    prog.emit("attention", "eager_sinks", inputs=(q, k, v), outputs=(o_in,), saved=saved, kernel="eager_sinks",
              window=dims.sliding_window, cache=kv_cache(ctx, dims.kv_heads, hd, dims.v_head_dim))
    return _o_proj(prog, ctx, block, o_in, prefix)


def sdpa_attention(prog: Program, ctx: Ctx, block: Block, x: Tensor, *, rotary: str = "rotate_half",
                   qk_norm: str | None = None, qk_norm_after_rotary: bool = False, project_gate: bool = False,
                   query_scale: bool = False, mask: bool = False, prefix: str = "self_attn") -> Tensor:
    """SDPA attention with the module options above; ``qk_norm`` is a norm kind (``kernels.norms.NORMS``) or
    None. Returns o_proj's output."""
    dims = block.dims
    c = ctx.p.compute_bytes
    h, hkv, hd = dims.heads, dims.kv_heads, dims.head_dim
    qo, k, v = _qkv(prog, ctx, block, x, prefix, q_mult=2 if project_gate else 1)
    q = qo.view(f"{prefix}.query", *heads_axes(ctx, h, hd), note="a view of q_proj's output")

    def qk_norms(q, k):
        return (norm(prog, ctx, qk_norm, f"{prefix}.q_norm", q, find(block, "q_norm")),
                norm(prog, ctx, qk_norm, f"{prefix}.k_norm", k, find(block, "k_norm")))

    if qk_norm is not None and not qk_norm_after_rotary:
        q, k = qk_norms(q, k)
    if rotary == "complex":  # q.float() · freqs_cis, .type_as(q)
        q, k = rotary_embed(prog, prefix, q, k, q.dtype_bytes, rotary)
    elif rotary != "none":
        q, k = rotary_embed(prog, prefix, q, k, max(q.dtype_bytes, ctx.p.residual_bytes), rotary)
    if qk_norm is not None and qk_norm_after_rotary:
        q, k = qk_norms(q, k)
    if query_scale:
        scale = tensor(f"{prefix}.attn_scales", (Axis(ctx.s, "seq"),), FP32,
                       "(1, s, 1, 1) fp32, expanded over the batch")
        scaled = tensor(f"{prefix}.query_scaled", q.axes, FP32)
        prog.emit("mul", f"{prefix}.temperature", inputs=(q, scale), outputs=(scaled,), saved=(scale,))
        q = scaled
    o_axes = heads_axes(ctx, h, hd)
    qs = q if q.dtype_bytes == c else tensor("sdpa.query", q.axes, c, "the query's cast")
    ks = k if k.dtype_bytes == c else tensor("sdpa.key", k.axes, c)
    vs = v
    extra = []
    if mask:
        extra.append(tensor("sdpa.mask", (Axis(ctx.b), Axis(ctx.s, "seq"), Axis(ctx.s)), c, "the explicit mask, "
                                                                                       "one per layer"))
        if hkv < h:
            ks = tensor("sdpa.key", o_axes, c, "repeat_kv copy to h heads")
            vs = tensor("sdpa.value", o_axes, c, "repeat_kv copy to h heads")
    out = tensor("sdpa.output", o_axes, c, "also o_proj's input")
    lse = tensor("sdpa.logsumexp", (Axis(ctx.b), Axis(h, "tp"), Axis(ctx.s, "seq")), FP32)
    prog.emit("attention", "sdpa", inputs=(q, k, v), outputs=(out,), saved=(qs, ks, vs, *extra, out, lse),
              kernel="sdpa", window=dims.sliding_window, cache=kv_cache(ctx, hkv, hd, dims.v_head_dim))
    o_in = out
    if rotary == "rotate_half_cat":
        o_in = tensor(f"{prefix}.attn_output", o_axes, c,
                      "contiguous copy: the query (hence the output) is (b, h, s, h_d)")
        prog.emit("copy", "transpose_contiguous", inputs=(out,), outputs=(o_in,))
    if project_gate:
        gate = qo.view(f"{prefix}.gate", *o_axes, note="a view of q_proj's output")
        sig = tensor(f"{prefix}.gate.sigmoid", o_axes, c)
        prog.emit("act", f"{prefix}.gate.sigmoid", inputs=(gate,), outputs=(sig,), saved=(sig,), kernel="sigmoid")
        prod = tensor(f"{prefix}.o_proj.input", o_axes, c, "the gated output")
        prog.emit("mul", f"{prefix}.gate_mul", inputs=(o_in, sig), outputs=(prod,), saved=(o_in, sig))
        o_in = prod
    return _o_proj(prog, ctx, block, o_in, prefix)
