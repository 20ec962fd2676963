"""Ring collectives built from point-to-point ``isend``/``irecv``, and the naive all-reduce they beat.

Every function takes the process group explicitly; ranks in it are numbered by their group rank and a ring
sends to group rank r+1 and receives from r-1. The schedule (which chunk moves at which step) is the pure
:mod:`trainmath.comm.ring`, which also counts the bytes each rank sends; the time these take is modelled by
the twins of the same names in :mod:`trainmath.comm.cost`.

Buffers are flat views of contiguous tensors; a buffer of L elements is cut into n chunks like
``torch.tensor_split`` (first L % n chunks one element longer), so any length works, including L < n.
Reduce-scatter therefore gives rank r chunk r of that split: for L divisible by n it equals
``reduce_scatter_tensor``; otherwise it equals ``all_reduce`` followed by ``tensor_split(n)[r]``. The hot loop
allocates no tensor storage: chunks and segments are views, and scratch space comes from a workspace kept
between calls.
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


# A ring collective is a sequence of steps; at step s every rank sends one chunk to its right neighbour and
# receives one chunk from its left neighbour (reduce-scatter steps then add it into its own copy; all-gather
# steps store it). The chunk a rank sends at step s+1 is always the one it received at step s, so each chunk
# is cut into k segments and segment j moves on as soon as it has arrived (and been reduced): the steps
# overlap, segment by segment, as in gloo's and NCCL's rings.
#
# Under gloo every receive is posted before the data it waits for can arrive, because a gloo send is a
# rendezvous: its bytes move only after the receiver's "ready" notice reaches the sender. All-gather receives
# go straight into their final chunks and are all posted at the start. That is safe although those chunks
# are still being reduced into: the fully reduced chunk c includes this rank's part of c, which this rank
# sends exactly once (reduce-scatter step s for c = r-s-1), after its last write to c and never reads c in
# the reduce-scatter again; so c can only come back once this rank is done with it. Reduce-scatter receives
# land in a window of scratch segments, posted _RS_WINDOW_STEPS steps ahead and reused as they are reduced.
# Scratch memory comes from a per-(use, device, dtype) workspace kept between calls (``release_workspace``):
# a fresh CPU buffer of a few MiB costs a page fault per 4 KiB on first touch, ~0.2 ms of a 4 MiB all-reduce.

SEGMENT_BYTES = 4 << 20
"""Default segment size: a chunk of C bytes is cut into clamp(C // SEGMENT_BYTES, 1, MAX_SEGMENTS) segments.
Measured on gloo over loopback, 2 and 4 ranks, 1-8 MiB buffers (docs/benchmarks.md): every segment costs a
rendezvous and two Python calls, so fewer, larger messages won; 128 KiB-1 MiB segments were 5-50% slower than
4 MiB, and forcing two segments per chunk (gloo's own rule) was slower too."""
MAX_SEGMENTS = 8
_RS_WINDOW_STEPS = 2

_WORKSPACE: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = {}


def _workspace(use: str, numel: int, dtype: torch.dtype, device: torch.device, keep: bool = True) -> torch.Tensor:
    """A scratch buffer of at least ``numel`` elements for ``use``, reused between calls (grown, never shrunk);
    buffers for different uses never overlap. ``keep=False``: a fresh one, freed when the caller drops it."""
    if not keep:
        return torch.empty(numel, dtype=dtype, device=device)
    key = (use, device, dtype)
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[key] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def release_workspace() -> None:
    """Free the scratch buffers the ring collectives keep between calls."""
    _WORKSPACE.clear()


def _segment_count(chunks: list[torch.Tensor], segment_bytes: int) -> int:
    if segment_bytes < 1:
        raise TrainmathError(f"segment size must be >= 1 byte, got {segment_bytes}")
    largest = max(c.numel() for c in chunks) * chunks[0].element_size()
    return max(1, min(MAX_SEGMENTS, largest // segment_bytes))


def _split(flat: torch.Tensor, k: int) -> list[torch.Tensor]:
    """k views of a 1-D tensor, cut like ``torch.tensor_split`` (rank chunks of a buffer, segments of a chunk)."""
    return [flat[a:b] for a, b in chunk_bounds(flat.numel(), k)]


def _run_ring(chunks: list[torch.Tensor], group, op: str | None, *, reduce: bool, gather: bool,
              segment_bytes: int, keep: bool = True) -> None:
    """In place over ``chunks`` (this rank's n views of one buffer): the ring's n-1 reduce-scatter steps (if
    ``reduce``, combining with ``op``) then its n-1 all-gather steps (if ``gather``); receive scratch from the
    kept workspace, or fresh for this call (``keep=False``)."""
    r, n, right, left = _ring(group)
    if n == 1:
        return
    schedule = ((ring_reduce_scatter_schedule(r, n) if reduce else [])
                + (ring_all_gather_schedule(r, n) if gather else []))
    n_reduce = n - 1 if reduce else 0
    if not _pipelined(group):
        _run_stepwise(chunks, group, op, schedule, n_reduce, r, n, right, left, keep)
        return
    k = _segment_count(chunks, segment_bytes)
    segs = [_split(c, k) for c in chunks]
    window = min(_RS_WINDOW_STEPS, n_reduce) * k
    slot_len = max(s.numel() for c in segs for s in c)
    slots = _workspace("receive", window * slot_len, chunks[0].dtype, chunks[0].device, keep) if window else None
    total, n_red_msgs = len(schedule) * k, n_reduce * k
    recvs: dict[int, tuple] = {}
    sends: list = []

    def post_recv(m: int) -> None:
        step, j = divmod(m, k)
        dest = segs[schedule[step][1]][j]
        if dest.numel() == 0:
            return
        buf = slots[(m % window) * slot_len:][: dest.numel()] if m < n_red_msgs else dest
        recvs[m] = (dist.irecv(buf, src=left, group=group, tag=m), buf)

    def post_send(m: int) -> None:
        step, j = divmod(m, k)
        seg = segs[schedule[step][0]][j]
        if seg.numel():
            sends.append(dist.isend(seg, dst=right, group=group, tag=m))

    for m in range(k):  # local data first: the peer's "ready" notice may not be here yet, and then gloo's
        post_send(m)    # I/O thread writes it when the notice comes, instead of this thread in the loop below
    for m in list(range(window)) + list(range(n_red_msgs, total)):
        post_recv(m)
    for m in range(total):
        step, j = divmod(m, k)
        dest = segs[schedule[step][1]][j]
        got = recvs.pop(m, None)
        if got is not None:
            got[0].wait()
            if m < n_red_msgs:
                _reduce_into(dest, got[1], op)
        if m + window < n_red_msgs:
            post_recv(m + window)
        if step + 1 == n_reduce and op == "avg":
            dest.div_(n)  # chunk r is complete: average it before it travels on
        if step + 1 < len(schedule):
            post_send(m + k)
    for req in sends:
        req.wait()


def _pipelined(group) -> bool:
    """The pipelined engine for gloo; NCCL takes the grouped step-by-step one (tests force it on gloo)."""
    return dist.get_backend(group) != "nccl"


def _run_stepwise(chunks, group, op, schedule, n_reduce, r, n, right, left, keep: bool = True) -> None:
    """NCCL: one grouped send+receive per step (``batch_isend_irecv``), as NCCL needs a send and a receive
    between the same two ranks to be in one group to progress; not pipelined. Checked on gloo by the tests
    (``_pipelined`` forced off); not run on GPUs here."""
    scratch = _workspace("receive", max(c.numel() for c in chunks), chunks[0].dtype, chunks[0].device, keep)
    for step, (send_c, recv_c) in enumerate(schedule):
        reduce = step < n_reduce
        dest = scratch[: chunks[recv_c].numel()] if reduce else chunks[recv_c]
        ops = []
        if chunks[send_c].numel():
            ops.append(dist.P2POp(dist.isend, chunks[send_c], right, group))
        if dest.numel():
            ops.append(dist.P2POp(dist.irecv, dest, left, group))
        for req in dist.batch_isend_irecv(ops) if ops else []:
            req.wait()
        if reduce:
            _reduce_into(chunks[recv_c], dest, op)
            if step + 1 == n_reduce and op == "avg":
                chunks[r].div_(n)


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup, op: str = "sum", *,
                    segment_bytes: int = SEGMENT_BYTES) -> None:
    """In-place all-reduce: ring reduce-scatter then ring all-gather (Patarasuk & Yuan 2009), pipelined by segment.

    Each rank sends 2(n-1) chunks, 2(n-1)/n of the buffer (``trainmath.comm.ring_bytes_sent``).
    """
    _check(tensor, op)
    chunks = _split(tensor.view(-1), dist.get_world_size(group))
    _run_ring(chunks, group, op, reduce=True, gather=True, segment_bytes=segment_bytes)


def ring_reduce_scatter(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup, op: str = "sum", *,
                        segment_bytes: int = SEGMENT_BYTES, inplace: bool = False) -> None:
    """``output`` <- chunk r of the reduction of every rank's ``input`` (tensor_split chunking).

    ``input`` is left unchanged (the ring works in a copy kept in the workspace), unless ``inplace``: then the
    ring reduces in ``input`` itself (its contents are undefined afterwards) and needs no copy of it, and its
    receive window (min(2, n-1) chunks, ``_RS_WINDOW_STEPS``) is allocated for this call only instead of being
    kept between calls — what a caller whose input is scratch and who calls once per training step (our ZeRO's
    packed gradients) wants: the kept copy was as large as the input. ``output`` must have chunk r's length.
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
    if inplace:
        work = input.view(-1)
    else:
        work = _workspace("reduce-scatter copy", input.numel(), input.dtype, input.device)
        work.copy_(input.view(-1))
    chunks = _split(work, n)
    _run_ring(chunks, group, op, reduce=True, gather=False, segment_bytes=segment_bytes, keep=not inplace)
    output.view(-1).copy_(chunks[r])


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group: dist.ProcessGroup, *,
                    segment_bytes: int = SEGMENT_BYTES) -> None:
    """``output`` <- every rank's ``input`` concatenated in group-rank order; input r is chunk r of output."""
    _check(input)
    _check(output)
    r, n = dist.get_rank(group), dist.get_world_size(group)
    chunks = _split(output.view(-1), n)
    if input.numel() != chunks[r].numel():
        raise TrainmathError(
            f"all-gather input on group rank {r} must hold {chunks[r].numel()} elements (chunk {r} of "
            f"{output.numel()} split {n} ways), got {input.numel()}"
        )
    chunks[r].copy_(input.view(-1))
    _run_ring(chunks, group, None, reduce=False, gather=True, segment_bytes=segment_bytes)


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
