"""GEMM FLOPs as a fold over an op list, on one rank of a layout: the linears, the attention cores, the depthwise
convs and the chunked scans.

Each ``linear`` op with a weight is one GEMM (``ops.gemm.Gemm``): m = the rows of its input (the product of the
input's axes but the last, on the rank: the tokens, or the routed rows of an expert op, whole under expert
parallelism, whose ranks each bring their own micro-batch, see ``ir.SHARDS``), and k, n = the weight's in and out
features (``ops.gemm.in_out``), each divided as the op's tensors are: n by the rule of the output's last axis
(``tp``: a column-parallel Linear), k by the input's (``tp``: a row-parallel one). Names and components are the
weight's, as ``ops.gemm.linear_gemms`` gives them, so the FLOPs trees keep their names. A fused expert projection
whose gate and up are stored apart is one op per weight, the later ones without an output of their own: they produce
the other columns of the first one's output, under its rule.

Experts (``experts``): ``active`` (default, the convention of ``trainmath flops``: each token runs its top_k
experts) counts an ``all_tokens`` op (Llama 4, ``kernels.experts.all_tokens_experts``: every expert over every
token, n·T rows) as T·top_k rows; ``executed`` counts the rows the kernel runs, n / top_k times more, which is
what FlopCounterMode reports for Llama 4 (``tests/flops/test_oracle_hybrid.py``). Every other expert path runs
exactly T·top_k rows, so both conventions agree there.

The other GEMMs (``core_gemms_from_ops``) read the per-head shapes of the ``attention`` ops (every kernel: SDPA,
eager, the math fallback, sinks), the ``conv`` ops' outputs and weights, and the ``scan`` ops' padded inputs and
chunk; heads and channels are divided by their rule (``tp``), so a rank's core FLOPs are its heads' share.
FlopCounterMode checks the sums on tiny models (``tests/flops``); ``tests/ops/test_flops_fold.py`` checks the
per-rank split.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.ops.emit import layer_ops, layer_top_k  # noqa: F401  (the op lists these folds read)
from trainmath.ops.gemm import Gemm, attended_pairs, in_out, module_name
from trainmath.ops.ir import SINGLE, Degrees, Op
from trainmath.ops.kernels.scans import UNREACHED

EXPERT_COUNTS = ("active", "executed")


def _rows(op: Op, deg: Degrees, experts: str, top_k: int | None) -> int:
    """m: the rows of the op's input on the rank (active rows of an ``all_tokens`` op, see the module doc)."""
    axes = op.inputs[0].axes[:-1]
    if op.kernel == "all_tokens" and experts == "active":
        if not top_k or len(axes) != 1 or op.weight is None or not op.weight.experts:
            raise TrainmathError(f"{op.name}: counting active experts needs the block's top_k (got {top_k!r}) "
                                 "and one routed-row axis")
        full = axes[0].size // op.weight.experts * top_k
        return ceil_div(full, deg.split(axes[0].shard))
    m = 1
    for a in axes:
        m *= a.on(deg)
    return m


def linear_gemms_from_ops(ops: Iterable[Op], deg: Degrees = SINGLE, *, experts: str = "active",
                          top_k: int | None = None) -> list[Gemm]:
    """One GEMM per ``linear`` op with a weight, with its (m, k, n) on one rank of ``deg``. ``top_k``: the routed
    experts per token, needed only to count an ``all_tokens`` op's active rows."""
    if experts not in EXPERT_COUNTS:
        raise TrainmathError(f"experts must be one of {', '.join(EXPERT_COUNTS)}; got {experts!r}")
    out = []
    rule = None
    for op in ops:
        if op.kind != "linear" or op.weight is None:
            continue
        if op.outputs:
            rule = op.outputs[0].axes[-1].shard
        elif rule is None:
            raise TrainmathError(f"linear op {op.name} has no output and follows no fused projection")
        k, n = in_out(op.weight)
        out.append(Gemm(name=module_name(op.weight.name), component=op.weight.component,
                        m=_rows(op, deg, experts, top_k), k=ceil_div(k, deg.split(op.inputs[0].axes[-1].shard)),
                        n=ceil_div(n, deg.split(rule))))
    return out


def _core_rank(op: Op, deg: Degrees) -> None:
    if deg.cp > 1:
        raise TrainmathError(f"{op.name}: attention-core and scan FLOPs per context-parallel rank are not modelled "
                             f"(cp {deg.cp}); fold them at cp 1")


def attention_gemms(op: Op, deg: Degrees = SINGLE, *, causal: str = "executed") -> list[Gemm]:
    """Q·Kᵀ and P·V of an ``attention`` op over its per-head (b, s, h, ·) query, key and value, ``count`` = b·h on
    the rank (K/V heads are repeated to the query heads first, so GQA runs h products): m = s, k = the q/k head
    dim, n = the keys; ``causal="half"`` counts the attended pairs (``ops.gemm.attended_pairs``, with the op's
    window) as m = pairs, n = 1."""
    _core_rank(op, deg)
    q, k, v = op.inputs[:3]
    b, s, h, qk = q.axes
    s_kv, vd = k.axes[1].size, v.axes[3].size
    count = b.on(deg) * h.on(deg)
    pairs = attended_pairs(s.size, s_kv, causal=causal, window=op.window)
    if causal == "executed":
        shapes = ((s.size, qk.size, s_kv), (s.size, s_kv, vd))
    else:
        shapes = ((pairs, qk.size, 1), (pairs, 1, vd))
    return [Gemm(name=f"attention.{part}", component="attention_core", m=m, k=kk, n=n, count=count, weighted=False)
            for part, (m, kk, n) in zip(("scores", "values"), shapes)]


def conv_gemm(op: Op, deg: Degrees = SINGLE) -> Gemm:
    """A depthwise causal Conv1d (padding K − 1, output trimmed to s afterwards), counted as FlopCounterMode's
    ``conv_flop_count`` does: 2 · b · (s + K − 1) output positions · K taps per channel (its (b, channels, s + K − 1)
    output, K its weight's last axis), channels on the rank."""
    _core_rank(op, deg)
    b, channels, padded = op.outputs[0].axes
    if op.weight is None:
        raise TrainmathError(f"{op.name}: a conv op without its weight")
    return Gemm(name=op.name, component=op.weight.component, m=b.on(deg) * padded.size, k=op.weight.shape[-1], n=1,
                count=channels.on(deg))


def scan_gemms(op: Op, deg: Degrees = SINGLE) -> list[Gemm]:
    """The chunked scans' matrix products, per chunk of C = ``op.chunk`` tokens and head, over their inputs' padded
    length L (c = L / C chunks):

    - ``chunk_gated_delta_rule`` (Yang et al. 2024, "Gated Delta Networks", §3; transformers'
      ``torch_chunk_gated_delta_rule``), inputs (b, h_v, L, d_k) query and key, (b, h_v, L, d_v) value: intra-chunk
      (β⊙K)·Kᵀ and Q·Kᵀ (C × d_k × C), then in the scan over chunks K_cum·S and Q·S (C × d_k × d_v), A·V_new
      (C × C × d_v) and the state update Kᵀ·V_new (d_k × C × d_v); the two triangular solves are not matrix
      products and FlopCounterMode does not count them;
    - ``mamba2_chunk_scan`` (Dao & Gu 2024, "Transformers are SSMs", §6; transformers' ``torch_forward``), inputs
      (b, L, H, P) x and (b, L, H, N) B (repeated from groups to heads): C·Bᵀ (C × N × C), the diagonal block
      (C × C × P), chunk states Xᵀ·B (P × C × N), the state passing across c + 1 chunk boundaries ((c+1) × (c+1) ×
      P·N per head) and C·states (C × N × P)."""
    _core_rank(op, deg)
    C, pre = op.chunk, op.name.rsplit(".", 1)[0]
    if op.kernel == "chunk_gated_delta_rule":
        q, _, v = op.inputs
        b, h, L, dk = q.axes
        dk, dv, n = dk.size, v.axes[3].size, b.on(deg) * h.on(deg) * (L.size // C)
        return [Gemm(name=f"{pre}.core.{name}", component="linear_attention", m=m, k=k, n=nn, count=n,
                     weighted=False)
                for name, m, k, nn in (("kbeta_kT", C, dk, C), ("q_kT", C, dk, C), ("kcum_state", C, dk, dv),
                                       ("q_state", C, dk, dv), ("attn_vnew", C, C, dv), ("state_update", dk, C, dv))]
    if op.kernel == "mamba2_chunk_scan":
        x, bh = op.inputs
        b, L, h, p = x.axes
        c, p, N = L.size // C, p.size, bh.axes[3].size
        per_chunk, heads = b.on(deg) * c * h.on(deg), b.on(deg) * h.on(deg)
        shapes = (("C_Bt", C, N, C, per_chunk), ("y_diag", C, C, p, per_chunk), ("chunk_states", p, C, N, per_chunk),
                  ("state_passing", c + 1, c + 1, p * N, heads), ("C_states", C, N, p, per_chunk))
        return [Gemm(name=f"{pre}.ssd.{name}", component="mamba", m=m, k=k, n=nn, count=cnt, weighted=False)
                for name, m, k, nn, cnt in shapes]
    raise TrainmathError(f"{op.name}: no FLOPs rule for scan kernel {op.kernel!r}")


def core_gemms_from_ops(ops: Iterable[Op], deg: Degrees = SINGLE, *, causal: str = "executed") -> list[Gemm]:
    """The GEMMs of ``ops`` that are not linears, in op order: attention cores, depthwise convs, chunked scans
    (not an ``UNREACHED`` scan op: saved-bytes bookkeeping of a product ``scan_gemms`` already counts)."""
    out: list[Gemm] = []
    for op in ops:
        if op.kernel == UNREACHED:
            continue
        if op.kind == "attention":
            out += attention_gemms(op, deg, causal=causal)
        elif op.kind == "conv":
            out.append(conv_gemm(op, deg))
        elif op.kind == "scan":
            out += scan_gemms(op, deg)
    return out
