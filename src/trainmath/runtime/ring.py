"""Ring collectives built from point-to-point ``isend``/``irecv``, and the naive all-reduce they beat.

Every function takes the process group explicitly; ranks in it are numbered by their group rank and a ring
sends to group rank r+1 and receives from r-1. The schedule (which chunk moves at which step) is the pure
:mod:`trainmath.comm.ring`, which also counts the bytes each rank sends; the time these take is modelled by
the twins of the same names in :mod:`trainmath.comm.cost`.

Buffers are flat views of contiguous tensors; a buffer of L elements is cut into n chunks like
``torch.tensor_split`` (first L % n chunks one element longer), so any length works, including L < n.
Reduce-scatter therefore gives rank r chunk r of that split: for L divisible by n it equals
``reduce_scatter_tensor``; otherwise it equals ``all_reduce`` followed by ``tensor_split(n)[r]``. The hot loop
allocates no tensor storage: chunks are views, and one receive buffer of the largest chunk is reused.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from trainmath.comm.ring import chunk_bounds, ring_all_gather_schedule, ring_reduce_scatter_schedule
from trainmath.errors import TrainmathError

RING_OPS = ("sum", "avg", "max", "min", "product")


def _reduce_into(acc: torch.Tensor, other: torch.Tensor, op: str) -> None:
    """acc <- acc (op) other, in place."""
    if op in ("sum", "avg"):
        acc.add_(other)
    elif op == "product":
        acc.mul_(other)
    elif op == "max":
        torch.maximum(acc, other, out=acc)
    elif op == "min":
        torch.minimum(acc, other, out=acc)
    else:
        raise TrainmathError(f"unknown reduce op {op!r}; known: {', '.join(RING_OPS)}")


def _check(tensor: torch.Tensor, op: str | None = None) -> None:
    if not tensor.is_contiguous():
        raise TrainmathError("ring collectives need contiguous tensors; call .contiguous() first")
    if op is not None and op not in RING_OPS:
        raise TrainmathError(f"unknown reduce op {op!r}; known: {', '.join(RING_OPS)}")
    if op == "avg" and not tensor.is_floating_point():
        raise TrainmathError(f"avg needs a floating-point tensor, got {tensor.dtype}")


def _ring(group: dist.ProcessGroup) -> tuple[int, int, int, int]:
    """(group rank, group size, global rank of the right neighbour, global rank of the left neighbour)."""
    n = dist.get_world_size(group)
    r = dist.get_rank(group)
    return r, n, dist.get_global_rank(group, (r + 1) % n), dist.get_global_rank(group, (r - 1) % n)


def _exchange(send: torch.Tensor, right: int, recv: torch.Tensor, left: int, group, pending: list) -> None:
    """Send ``send`` to ``right`` while receiving ``recv`` from ``left``; empty tensors are skipped on both ends.

    Only the receive is waited for here: the next step needs its data, but not the send's completion. Send
    requests go to ``pending`` and are waited for once at the end of the phase (a chunk being sent is never
    written again within the phase), which saves one blocking wait, and one chance of a scheduler stall, per step.
    """
    req = dist.irecv(recv, src=left, group=group) if recv.numel() else None
    if send.numel():
        pending.append(dist.isend(send, dst=right, group=group))
    if req is not None:
        req.wait()


# A reduce-scatter step is cut into segments of about this many bytes (at most _MAX_SEGMENTS), so that the
# reduction of one segment overlaps the arrival of the next. Sender and receiver cut the same chunk the same way.
_SEGMENT_BYTES = 1 << 20
_MAX_SEGMENTS = 8


def _segments(t: torch.Tensor) -> list[torch.Tensor]:
    k = max(1, min(_MAX_SEGMENTS, t.numel() * t.element_size() // _SEGMENT_BYTES))
    return [t[a:b] for a, b in chunk_bounds(t.numel(), k) if b > a]


def _exchange_reduce(send: torch.Tensor, right: int, acc: torch.Tensor, incoming: torch.Tensor, left: int,
                     group, op: str, pending: list) -> None:
    """Send ``send`` while receiving into ``incoming`` segment by segment, reducing each into ``acc`` on arrival.
    Sends are left in ``pending`` (see ``_exchange``)."""
    recvs = [(dist.irecv(seg, src=left, group=group), a) for seg, a in zip(_segments(incoming), _segments(acc))]
    pending.extend(dist.isend(seg, dst=right, group=group) for seg in _segments(send))
    for (req, acc_seg), seg in zip(recvs, _segments(incoming)):
        req.wait()
        _reduce_into(acc_seg, seg, op)


def _reduce_scatter_inplace(chunks: list[torch.Tensor], recv: torch.Tensor, group, op: str) -> None:
    r, n, right, left = _ring(group)
    pending: list = []
    for send_c, recv_c in ring_reduce_scatter_schedule(r, n):
        incoming = recv[: chunks[recv_c].numel()]
        _exchange_reduce(chunks[send_c], right, chunks[recv_c], incoming, left, group, op, pending)
    for req in pending:
        req.wait()


def _all_gather_inplace(chunks: list[torch.Tensor], group) -> None:
    r, n, right, left = _ring(group)
    pending: list = []
    for send_c, recv_c in ring_all_gather_schedule(r, n):
        _exchange(chunks[send_c], right, chunks[recv_c], left, group, pending)
    for req in pending:
        req.wait()


def _views(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    return [flat[a:b] for a, b in chunk_bounds(flat.numel(), n)]


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup, op: str = "sum") -> None:
    """In-place all-reduce: ring reduce-scatter then ring all-gather (Patarasuk & Yuan 2009).

    Each rank sends 2(n-1) chunks, 2(n-1)/n of the buffer (``trainmath.comm.ring_bytes_sent``).
    """
    _check(tensor, op)
    n = dist.get_world_size(group)
    flat = tensor.view(-1)
    chunks = _views(flat, n)
    recv = torch.empty(max(c.numel() for c in chunks), dtype=tensor.dtype, device=tensor.device)
    _reduce_scatter_inplace(chunks, recv, group, op)
    if op == "avg":
        chunks[dist.get_rank(group)].div_(n)
    _all_gather_inplace(chunks, group)


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup, op: str = "sum") -> None:
    """``output`` <- chunk r of the reduction of every rank's ``input`` (tensor_split chunking).

    ``input`` is left unchanged (the ring works in a copy); ``output`` must have chunk r's length.
    """
    _check(input, op)
    _check(output)
    r, n = dist.get_rank(group), dist.get_world_size(group)
    a, b = chunk_bounds(input.numel(), n)[r]
    if output.numel() != b - a:
        raise TrainmathError(
            f"reduce-scatter output on group rank {r} must hold {b - a} elements (chunk {r} of {input.numel()} "
            f"split {n} ways), got {output.numel()}"
        )
    work = input.reshape(-1).clone()
    chunks = _views(work, n)
    recv = torch.empty(max(c.numel() for c in chunks), dtype=input.dtype, device=input.device)
    _reduce_scatter_inplace(chunks, recv, group, op)
    if op == "avg":
        chunks[r].div_(n)
    output.view(-1).copy_(chunks[r])


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup) -> None:
    """``output`` <- every rank's ``input`` concatenated in group-rank order; input r is chunk r of output."""
    _check(input)
    _check(output)
    r, n = dist.get_rank(group), dist.get_world_size(group)
    chunks = _views(output.view(-1), n)
    if input.numel() != chunks[r].numel():
        raise TrainmathError(
            f"all-gather input on group rank {r} must hold {chunks[r].numel()} elements (chunk {r} of "
            f"{output.numel()} split {n} ways), got {input.numel()}"
        )
    chunks[r].copy_(input.view(-1))
    _all_gather_inplace(chunks, group)


def naive_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup, op: str = "sum") -> None:
    """In-place all-reduce the slow way: everyone sends to group rank 0, which reduces and sends back to each.

    The root's link carries 2(n-1) whole buffers, against 2(n-1)/n for the ring (cost model:
    ``trainmath.comm.cost.naive_all_reduce_time_s``).
    """
    _check(tensor, op)
    r, n = dist.get_rank(group), dist.get_world_size(group)
    root = dist.get_global_rank(group, 0)
    if n == 1:
        return
    if r != 0:
        dist.send(tensor, dst=root, group=group)
        dist.recv(tensor, src=root, group=group)
        return
    incoming = torch.empty_like(tensor)
    for peer in range(1, n):
        dist.recv(incoming, src=dist.get_global_rank(group, peer), group=group)
        _reduce_into(tensor, incoming, op)
    if op == "avg":
        tensor.div_(n)
    reqs = [dist.isend(tensor, dst=dist.get_global_rank(group, peer), group=group) for peer in range(1, n)]
    for req in reqs:
        req.wait()


RING_IMPLS = {
    ("all_reduce", "ring"): ring_all_reduce,
    ("all_reduce", "naive"): naive_all_reduce,
    ("reduce_scatter", "ring"): ring_reduce_scatter,
    ("all_gather", "ring"): ring_all_gather,
}
