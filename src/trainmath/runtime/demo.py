"""The torch.distributed examples of Jiang Yi's blog series, one function per primitive, with the tensors each rank
holds.

Each demo runs on every rank with an explicit :class:`RankContext` and returns one record per rank:
``{"rank", "before", "after", ...}`` with tensors as plain lists (so they print, serialise to JSON and
compare in tests). The records are all-gathered at the end so any launcher (any node) can show every rank
in rank order. Tensors follow the blog series: rank r holds ``[r+1]*5``; rank 0 sends ``[1, 2, 3, 4, 5]``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainmath.comm.layout import even_ranks
from trainmath.errors import TrainmathError
from trainmath.runtime.launch import RankContext

REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


def _v(t: torch.Tensor) -> list:
    return t.tolist()


def _seed(ctx: RankContext) -> torch.Tensor:
    # The blog series' per-rank tensor: [rank+1] * 5.
    return torch.full((5,), float(ctx.rank + 1), dtype=torch.float32, device=ctx.device)


def send_recv(ctx: RankContext, opts: dict) -> dict:
    """Rank 0 sends [1, 2, 3, 4, 5] to rank 1 with blocking send/recv; other ranks take no part."""
    if ctx.rank == 0:
        t = torch.tensor([1, 2, 3, 4, 5], dtype=torch.float32, device=ctx.device)
        before = _v(t)
        dist.send(t, dst=1, group=ctx.group)
        return {"before": before, "after": _v(t), "note": "sent to rank 1"}
    if ctx.rank == 1:
        t = torch.zeros(5, dtype=torch.float32, device=ctx.device)
        before = _v(t)
        dist.recv(t, src=0, group=ctx.group)
        return {"before": before, "after": _v(t), "note": "received from rank 0"}
    return {"before": None, "after": None, "note": "not involved"}


def isend_irecv(ctx: RankContext, opts: dict) -> dict:
    """As send_recv, with isend/irecv returning a Work handle; ``wait()`` before the tensor is touched."""
    events = []
    if ctx.rank == 0:
        t = torch.tensor([1, 2, 3, 4, 5], dtype=torch.float32, device=ctx.device)
        before = _v(t)
        req = dist.isend(t, dst=1, group=ctx.group)
        events.append("isend returned (sending)")
    elif ctx.rank == 1:
        t = torch.zeros(5, dtype=torch.float32, device=ctx.device)
        before = _v(t)
        req = dist.irecv(t, src=0, group=ctx.group)
        events.append("irecv returned (receiving)")
    else:
        return {"before": None, "after": None, "note": "not involved"}
    req.wait()
    events.append("wait() returned")
    return {"before": before, "after": _v(t), "note": "; ".join(events)}


def scatter(ctx: RankContext, opts: dict) -> dict:
    """Rank 0 holds [[1]*5, [2]*5, ...]; rank r receives slice r."""
    scatter_list = None
    if ctx.rank == 0:
        scatter_list = [torch.full((5,), float(i + 1), device=ctx.device) for i in range(ctx.world_size)]
    t = torch.zeros(5, dtype=torch.float32, device=ctx.device)
    before = _v(t)
    dist.scatter(t, scatter_list, src=0, group=ctx.group)
    rec = {"before": before, "after": _v(t)}
    if scatter_list is not None:
        rec["scatter_list"] = [_v(x) for x in scatter_list]
    return rec


def broadcast(ctx: RankContext, opts: dict) -> dict:
    """Rank 0 holds [1, 2, 3, 4, 5], the others zeros; afterwards everyone holds rank 0's tensor."""
    if ctx.rank == 0:
        t = torch.tensor([1, 2, 3, 4, 5], dtype=torch.float32, device=ctx.device)
    else:
        t = torch.zeros(5, dtype=torch.float32, device=ctx.device)
    before = _v(t)
    dist.broadcast(t, src=0, group=ctx.group)
    return {"before": before, "after": _v(t)}


def gather(ctx: RankContext, opts: dict) -> dict:
    """Each rank holds [rank+1]*5; rank 0 ends with the list of all of them."""
    t = _seed(ctx)
    gather_list = [torch.zeros(5, device=ctx.device) for _ in range(ctx.world_size)] if ctx.rank == 0 else None
    before = _v(t)
    dist.gather(t, gather_list, dst=0, group=ctx.group)
    return {"before": before, "after": [_v(x) for x in gather_list] if gather_list is not None else None}


def reduce(ctx: RankContext, opts: dict) -> dict:
    """Each rank holds [rank+1]*5; rank 0 ends with their reduction (sum: [n(n+1)/2]*5).

    Non-destination ranks' tensors are unspecified afterwards (torch docs), so only rank 0 shows one.
    """
    t = _seed(ctx)
    before = _v(t)
    dist.reduce(t, dst=0, op=REDUCE_OPS[opts["reduce_op"]], group=ctx.group)
    return {"before": before, "after": _v(t) if ctx.rank == 0 else None}


def all_gather(ctx: RankContext, opts: dict) -> dict:
    """Each rank holds [rank+1]*5; every rank ends with the list of all of them."""
    t = _seed(ctx)
    out = [torch.zeros(5, device=ctx.device) for _ in range(ctx.world_size)]
    before = _v(t)
    dist.all_gather(out, t, group=ctx.group)
    return {"before": before, "after": [_v(x) for x in out]}


def all_reduce(ctx: RankContext, opts: dict) -> dict:
    """Each rank holds [rank+1]*5; every rank ends with their reduction (sum: [n(n+1)/2]*5)."""
    t = _seed(ctx)
    before = _v(t)
    dist.all_reduce(t, op=REDUCE_OPS[opts["reduce_op"]], group=ctx.group)
    return {"before": before, "after": _v(t)}


def reduce_scatter(ctx: RankContext, opts: dict) -> dict:
    """Rank r holds (r+1)·[1, 2, ..., n]; rank j ends with element j of the reduction (sum: (j+1)·n(n+1)/2)."""
    n = ctx.world_size
    inp = torch.arange(1, n + 1, dtype=torch.float32, device=ctx.device) * (ctx.rank + 1)
    out = torch.zeros(1, dtype=torch.float32, device=ctx.device)
    before = _v(inp)
    dist.reduce_scatter_tensor(out, inp, op=REDUCE_OPS[opts["reduce_op"]], group=ctx.group)
    return {"before": before, "after": _v(out)}


def all_to_all(ctx: RankContext, opts: dict) -> dict:
    """Rank r holds [r·n, ..., r·n + n-1]; element j goes to rank j, so rank r ends with [r, n + r, 2n + r, ...]."""
    n = ctx.world_size
    inp = torch.arange(ctx.rank * n, ctx.rank * n + n, dtype=torch.float32, device=ctx.device)
    out = torch.zeros(n, dtype=torch.float32, device=ctx.device)
    before = _v(inp)
    dist.all_to_all_single(out, inp, group=ctx.group)
    return {"before": before, "after": _v(out)}


def barrier(ctx: RankContext, opts: dict) -> dict:
    """Rank r sleeps r·sleep_s, then waits at the barrier; all are released when the last one arrives.

    Times are seconds since a common start: rank 0's wall clock broadcast after a first barrier (exact on one
    machine; across machines only as good as their clock sync).
    """
    sleep_s = float(opts.get("sleep_s", 1.0))
    dist.barrier(group=ctx.group)
    t0 = torch.tensor([time.time()], dtype=torch.float64, device=ctx.device)
    dist.broadcast(t0, src=0, group=ctx.group)
    start = float(t0.item())
    time.sleep(ctx.rank * sleep_s)
    arrival = time.time() - start
    dist.barrier(group=ctx.group)
    release = time.time() - start
    return {"before": None, "after": None, "sleep_s": ctx.rank * sleep_s, "arrival_s": arrival, "release_s": release}


def subgroup(ctx: RankContext, opts: dict) -> dict:
    """A group of the even ranks: each member's group rank vs global rank, and an all-reduce inside the group.

    ``new_group`` is collective: every rank calls it, members or not.
    """
    members = even_ranks(ctx.world_size)
    group = dist.new_group(ranks=members)
    if ctx.rank not in members:
        return {"before": None, "after": None, "group_rank": None, "note": "not in the group"}
    t = _seed(ctx)
    before = _v(t)
    dist.all_reduce(t, group=group)
    return {"before": before, "after": _v(t), "group_rank": dist.get_rank(group),
            "group_size": dist.get_world_size(group), "note": f"all_reduce over global ranks {members}"}


# name -> (function, minimum world size, one-line description)
DEMOS: dict[str, tuple[Callable[[RankContext, dict], dict], int, str]] = {
    "send_recv": (send_recv, 2, "blocking send from rank 0 to rank 1"),
    "isend_irecv": (isend_irecv, 2, "non-blocking isend/irecv, then wait()"),
    "scatter": (scatter, 1, "rank 0's list, one slice to each rank"),
    "broadcast": (broadcast, 1, "rank 0's tensor copied to every rank"),
    "gather": (gather, 1, "every rank's tensor collected on rank 0"),
    "reduce": (reduce, 1, "every rank's tensor reduced onto rank 0 (--reduce-op)"),
    "all_gather": (all_gather, 1, "every rank's tensor collected on every rank"),
    "all_reduce": (all_reduce, 1, "every rank's tensor reduced onto every rank (--reduce-op)"),
    "reduce_scatter": (reduce_scatter, 1, "reduce, then rank j keeps slice j (--reduce-op)"),
    "all_to_all": (all_to_all, 1, "slice j of every rank goes to rank j"),
    "barrier": (barrier, 1, "rank r sleeps r·--sleep s; all leave when the last arrives"),
    "subgroup": (subgroup, 1, "a process group of the even ranks: group rank vs global rank"),
}


def run_demo(ctx: RankContext, name: str, opts: dict) -> list[dict[str, Any]]:
    """Worker entry: run demo ``name`` on this rank; return every rank's record (all-gathered), in rank order."""
    fn, min_ranks, _ = DEMOS[name]
    if ctx.world_size < min_ranks:
        raise TrainmathError(f"{name} needs at least {min_ranks} ranks, got {ctx.world_size}")
    record = {"rank": ctx.rank, "node": ctx.node_rank, "local_rank": ctx.local_rank, **fn(ctx, opts)}
    records: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(records, record, group=ctx.group)
    return records
