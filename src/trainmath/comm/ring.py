"""The ring schedule, shared by the runtime (which follows it) and the cost model (which counts it).

Ring reduce-scatter then ring all-gather is the bandwidth-optimal all-reduce of Patarasuk & Yuan, "Bandwidth
optimal all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009, and the "ring" algorithm of
Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 19(1), 2005.

Uneven lengths: a buffer of L elements is cut into n chunks like ``torch.tensor_split``: the first ``L % n``
chunks hold ``ceil(L/n)`` elements, the rest ``floor(L/n)``. Chunk r is the one rank r owns after a
reduce-scatter and contributes to an all-gather.
"""

from __future__ import annotations

from fractions import Fraction

from trainmath.errors import TrainmathError


def chunk_bounds(length: int, n: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of the n chunks of a length-``length`` buffer (tensor_split convention)."""
    if n < 1:
        raise TrainmathError(f"number of ranks must be >= 1, got {n}")
    if length < 0:
        raise TrainmathError(f"length must be >= 0, got {length}")
    base, extra = divmod(length, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_reduce_scatter_schedule(rank: int, n: int) -> list[tuple[int, int]]:
    """Per step, ``(chunk sent to rank+1, chunk received from rank-1 and reduced into)`` for ``rank``.

    Step s sends chunk (rank-s-1) mod n and receives chunk (rank-s-2) mod n, so that after n-1 steps rank r
    holds the fully reduced chunk r (matching ``reduce_scatter_tensor``). Derived: the chunk rank r receives at
    step s is the one rank r-1 sends at step s, and rank r sends at step s+1 the chunk it reduced at step s.
    """
    return [((rank - s - 1) % n, (rank - s - 2) % n) for s in range(n - 1)]


def ring_all_gather_schedule(rank: int, n: int) -> list[tuple[int, int]]:
    """Per step, ``(chunk sent to rank+1, chunk received from rank-1)``: step s sends (rank-s), receives (rank-s-1)."""
    return [((rank - s) % n, (rank - s - 1) % n) for s in range(n - 1)]


def ring_bytes_sent(op: str, rank: int, n: int, length: int, element_bytes: int) -> int:
    """Exact bytes ``rank`` sends in the runtime's ring ``op`` on a buffer of ``length`` elements.

    ``op`` is ``reduce_scatter``, ``all_gather`` or ``all_reduce`` (= reduce_scatter + all_gather).
    """
    bounds = chunk_bounds(length, n)
    if op == "all_reduce":
        return ring_bytes_sent("reduce_scatter", rank, n, length, element_bytes) + ring_bytes_sent(
            "all_gather", rank, n, length, element_bytes
        )
    if op == "reduce_scatter":
        schedule = ring_reduce_scatter_schedule(rank, n)
    elif op == "all_gather":
        schedule = ring_all_gather_schedule(rank, n)
    else:
        raise TrainmathError(f"no ring schedule for {op!r}; ring ops: reduce_scatter, all_gather, all_reduce")
    return sum((bounds[c][1] - bounds[c][0]) * element_bytes for c, _ in schedule)


def ring_all_reduce_bytes_sent_per_rank(size_bytes: int, n: int) -> Fraction:
    """2(n-1)/n · S bytes: what each rank sends in a ring all-reduce of S bytes (Patarasuk & Yuan 2009, §3).

    Exact when n divides S's element count; with uneven chunks a rank's count differs by under 2(n-1) elements.
    """
    if n < 1:
        raise TrainmathError(f"number of ranks must be >= 1, got {n}")
    return Fraction(2 * (n - 1) * size_bytes, n)
