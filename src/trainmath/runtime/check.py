"""The correctness matrix behind ``trainmath comm check``: every primitive and every ring algorithm, checked.

Oracles: the demos of Jiang Yi's blog series against values computed by hand (``expected_demo``); ring and naive
algorithms against torch's native collectives (the trusted reference), bitwise for integers and within the
tolerance of a different summation order for floats (``torch.testing.assert_close`` defaults scaled by the rank count).
Uneven lengths use the tensor_split chunking of :mod:`trainmath.runtime.ring`; their reference is the native
all-reduce followed by ``tensor_split`` (reduce-scatter) or a padded native all-gather (all-gather).
Every rank checks its own result; ranks agree through an all-reduce MIN of the pass flags.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from trainmath.comm.ring import chunk_bounds
from trainmath.runtime import demo
from trainmath.runtime.launch import RankContext
from trainmath.runtime.ring import (
    SEGMENT_BYTES,
    naive_all_reduce,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)

DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64, torch.bfloat16)
REDUCE_OPS = ("sum", "avg", "max", "min", "product")


def padded_all_gather(local: torch.Tensor, group: dist.ProcessGroup) -> list[torch.Tensor]:
    """All-gather tensors of different lengths per rank: gloo's ``all_gather`` rejects unequal sizes, so
    exchange the lengths, pad every tensor to the longest, gather, and cut the padding off again."""
    n = dist.get_world_size(group)
    length = torch.tensor([local.numel()], dtype=torch.int64, device=local.device)
    lengths = torch.empty(n, dtype=torch.int64, device=local.device)
    dist.all_gather_into_tensor(lengths, length, group=group)
    longest = int(lengths.max().item())
    padded = torch.zeros(longest, dtype=local.dtype, device=local.device)
    padded[: local.numel()] = local.view(-1)
    out = torch.empty(n * longest, dtype=local.dtype, device=local.device)
    dist.all_gather_into_tensor(out, padded, group=group)
    return [out[i * longest: i * longest + int(lengths[i])] for i in range(n)]


def expected_demo(name: str, rank: int, n: int, reduce_op: str = "sum") -> tuple[Any, Any]:
    """(before, after) that rank ``rank`` of ``n`` must show for demo ``name``: the blog series' values, by hand."""
    seed = [float(rank + 1)] * 5
    ranks = [float(r + 1) for r in range(n)]
    red = {"sum": sum(ranks), "avg": sum(ranks) / n, "max": max(ranks), "min": min(ranks),
           "product": float(torch.tensor(ranks, dtype=torch.float64).prod().item())}[reduce_op]
    one_to_five = [1.0, 2.0, 3.0, 4.0, 5.0]
    if name in ("send_recv", "isend_irecv"):
        return {0: (one_to_five, one_to_five), 1: ([0.0] * 5, one_to_five)}.get(rank, (None, None))
    if name == "scatter":
        return [0.0] * 5, seed
    if name == "broadcast":
        return (one_to_five if rank == 0 else [0.0] * 5), one_to_five
    if name == "gather":
        return seed, ([[r] * 5 for r in ranks] if rank == 0 else None)
    if name == "reduce":
        return seed, ([red] * 5 if rank == 0 else None)
    if name == "all_gather":
        return seed, [[r] * 5 for r in ranks]
    if name == "all_reduce":
        return seed, [red] * 5
    if name == "reduce_scatter":
        before = [float((rank + 1) * (j + 1)) for j in range(n)]
        per = {"sum": sum(ranks), "avg": sum(ranks) / n, "max": float(n), "min": 1.0,
               "product": float(torch.tensor(ranks, dtype=torch.float64).prod().item())}[reduce_op]
        scale = float(rank + 1)
        after = per * scale if reduce_op in ("sum", "avg", "max", "min") else per * scale**n
        return before, [after]
    if name == "all_to_all":
        return [float(rank * n + j) for j in range(n)], [float(j * n + rank) for j in range(n)]
    if name == "subgroup":
        evens = [float(r + 1) for r in range(0, n, 2)]
        return (seed, [sum(evens)] * 5) if rank % 2 == 0 else (None, None)
    if name == "barrier":
        return None, None
    raise KeyError(name)


def _inputs(ctx: RankContext, length: int, dtype: torch.dtype, reduce_op: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1009 + ctx.rank)
    if dtype.is_floating_point:
        lo, hi = (0.5, 1.5) if reduce_op == "product" else (-2.0, 2.0)
        t = torch.rand(length, generator=g, dtype=torch.float64) * (hi - lo) + lo
    else:
        lo, hi = (1, 4) if reduce_op == "product" else (-50, 50)
        t = torch.randint(lo, hi, (length,), generator=g, dtype=torch.int64)
    return t.to(dtype).to(ctx.device)


def _same(got: torch.Tensor, want: torch.Tensor, n: int) -> str:
    """'' when equal (bitwise for integers, scaled default tolerance for floats), else why not."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not got.dtype.is_floating_point:
        return "" if torch.equal(got, want) else f"max |diff| {(got.long() - want.long()).abs().max().item()}"
    rtol = {torch.float32: 1.3e-6, torch.float64: 1e-7, torch.bfloat16: 1.6e-2, torch.float16: 1e-3}[got.dtype] * n
    atol = {torch.float32: 1e-5, torch.float64: 1e-7, torch.bfloat16: 1e-2, torch.float16: 1e-3}[got.dtype] * n
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    except AssertionError as e:
        return str(e).splitlines()[0] + " " + next((ln.strip() for ln in str(e).splitlines() if "Greatest" in ln), "")
    return ""


# The longest case also runs with 16-byte segments, so that every chunk is cut into the most segments
# (MAX_SEGMENTS, some of them empty when a chunk is short) and the segment pipeline is exercised.
_SMALL_SEGMENT_BYTES = 16


def _segmentings(length: int) -> list[tuple[str, int]]:
    """(impl label, segment bytes) to run a ring case with."""
    plain = [("ring", SEGMENT_BYTES)]
    return plain + [("ring/16B-seg", _SMALL_SEGMENT_BYTES)] if length > 1000 else plain


def _ring_cases(ctx: RankContext) -> list[dict]:
    n, g, rows = ctx.world_size, ctx.group, []
    lengths = sorted({1, n + 1, 5 * n, 1000 * n + 3})
    native_ops = {k: v for k, v in demo.REDUCE_OPS.items()}
    case = 0
    for dtype in DTYPES:
        for reduce_op in REDUCE_OPS:
            if reduce_op == "avg" and not dtype.is_floating_point:
                continue  # averaging integers has no exact answer; the ring refuses it
            for length in lengths:
                case += 1
                x = _inputs(ctx, length, dtype, reduce_op, case)
                ref = x.clone()
                dist.all_reduce(ref, op=native_ops[reduce_op], group=g)
                a, b = chunk_bounds(length, n)[ctx.rank]
                for impl, seg in _segmentings(length):
                    got = x.clone()
                    ring_all_reduce(got, g, reduce_op, segment_bytes=seg)
                    rows.append(dict(op="all_reduce", impl=impl, dtype=str(dtype)[6:], length=length,
                                     reduce_op=reduce_op, why=_same(got, ref, n)))
                got = x.clone()
                naive_all_reduce(got, g, reduce_op)
                rows.append(dict(op="all_reduce", impl="naive", dtype=str(dtype)[6:], length=length,
                                 reduce_op=reduce_op, why=_same(got, ref, n)))
                if length % n == 0:
                    want = torch.empty(length // n, dtype=dtype, device=ctx.device)
                    dist.reduce_scatter_tensor(want, x, op=native_ops[reduce_op], group=g)
                else:
                    want = ref[a:b]
                for impl, seg in _segmentings(length):
                    out = torch.empty(b - a, dtype=dtype, device=ctx.device)
                    ring_reduce_scatter(out, x, g, reduce_op, segment_bytes=seg)
                    rows.append(dict(op="reduce_scatter", impl=impl, dtype=str(dtype)[6:], length=length,
                                     reduce_op=reduce_op, why=_same(out, want, n)))
                    out = torch.empty(b - a, dtype=dtype, device=ctx.device)  # reducing in a scratch input
                    ring_reduce_scatter(out, x.clone(), g, reduce_op, segment_bytes=seg, inplace=True)
                    rows.append(dict(op="reduce_scatter", impl=f"{impl} in place", dtype=str(dtype)[6:],
                                     length=length, reduce_op=reduce_op, why=_same(out, want, n)))
            if reduce_op != "sum":
                continue
            for length in lengths:  # all-gather has no reduce op: once per dtype
                case += 1
                full_ref = _inputs(ctx, length, dtype, "sum", case)  # differs per rank
                a, b = chunk_bounds(length, n)[ctx.rank]
                mine = full_ref[a:b].clone()
                if length % n == 0:
                    want = torch.empty(length, dtype=dtype, device=ctx.device)
                    dist.all_gather_into_tensor(want, mine, group=g)
                else:
                    want = torch.cat(padded_all_gather(mine, g))
                for impl, seg in _segmentings(length):
                    got = torch.empty(length, dtype=dtype, device=ctx.device)
                    ring_all_gather(got, mine, g, segment_bytes=seg)
                    rows.append(dict(op="all_gather", impl=impl, dtype=str(dtype)[6:], length=length,
                                     reduce_op="-", why=_same(got, want, n)))
    return rows


def _native_cases(ctx: RankContext) -> list[dict]:
    """The demos of Jiang Yi's blog series against hand-computed values, plus gloo's gaps and their workarounds."""
    n, rows = ctx.world_size, []
    for name, (fn, min_n, _) in demo.DEMOS.items():
        if n < min_n or name == "barrier":
            continue
        for reduce_op in (REDUCE_OPS if name in ("reduce", "all_reduce", "reduce_scatter") else ("sum",)):
            rec = fn(ctx, {"reduce_op": reduce_op})
            want = expected_demo(name, ctx.rank, n, reduce_op)
            got = (rec["before"], rec["after"])
            why = "" if _close(got, want) else f"got {got}, want {want}"
            rows.append(dict(op=name, impl="native", dtype="float32", length=5, reduce_op=reduce_op, why=why))
    # all_to_all_single with uneven splits: rank r sends j+1 elements valued 100·r + j to rank j.
    send = [j + 1 for j in range(n)]
    recv = [ctx.rank + 1] * n
    inp = torch.cat([torch.full((send[j],), 100 * ctx.rank + j, dtype=torch.int64) for j in range(n)]).to(ctx.device)
    out = torch.empty(sum(recv), dtype=torch.int64, device=ctx.device)
    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send, group=ctx.group)
    want = torch.cat([torch.full((ctx.rank + 1,), 100 * j + ctx.rank, dtype=torch.int64) for j in range(n)])
    rows.append(dict(op="all_to_all_uneven", impl="native", dtype="int64", length=sum(send), reduce_op="-",
                     why=_same(out.cpu(), want, n)))
    # all_gather with a different length per rank fails on gloo; the padded workaround must match.
    mine = torch.arange(ctx.rank + 1, dtype=torch.int64, device=ctx.device) + 10 * ctx.rank
    got = padded_all_gather(mine, ctx.group)
    ok = all(torch.equal(got[r].cpu(), torch.arange(r + 1, dtype=torch.int64) + 10 * r) for r in range(n))
    rows.append(dict(op="all_gather_uneven", impl="padded", dtype="int64", length=ctx.rank + 1, reduce_op="-",
                     why="" if ok else f"got {[t.tolist() for t in got]}"))
    return rows


def _close(got, want) -> bool:
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        return all(_close(a, b) for a, b in zip(got, want))
    if isinstance(want, float) and isinstance(got, float):
        return abs(got - want) <= 1e-5 * max(1.0, abs(want))
    if isinstance(want, tuple):
        return len(got) == len(want) and all(_close(a, b) for a, b in zip(got, want))
    return got == want


def run_check(ctx: RankContext, only: str | None = None) -> list[dict] | None:
    """Worker entry: run the matrix; rank 0 returns the rows with ``ok`` agreed by all ranks."""
    rows = []
    if only in (None, "native"):
        rows += _native_cases(ctx)
    if only in (None, "ring"):
        rows += _ring_cases(ctx)
    flags = torch.tensor([0 if r["why"] else 1 for r in rows], dtype=torch.int32, device=ctx.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=ctx.group)
    whys: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(whys, [r["why"] for r in rows], group=ctx.group)
    if ctx.rank != 0:
        return None
    for i, row in enumerate(rows):
        row["nproc"] = ctx.world_size
        row["ok"] = bool(flags[i].item())
        row["why"] = next((f"rank {r}: {w[i]}" for r, w in enumerate(whys) if w[i]), "")
    return rows
