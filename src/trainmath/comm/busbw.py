"""nccl-tests' algorithm and bus bandwidth.

Source: NVIDIA nccl-tests, ``doc/PERFORMANCE.md``. ``algbw = S / t`` where S is the size column (the whole
buffer: for all-gather the gathered output, for reduce-scatter the full input). ``busbw = algbw · factor(n)``,
where the factor turns algbw into the rate each link must carry under a bandwidth-optimal algorithm, so that
busbw is comparable with the hardware's peak link bandwidth whatever the rank count.
"""

from __future__ import annotations

from fractions import Fraction

from trainmath.errors import TrainmathError

# Ops the benchmark and cost model know, in the order help texts list them.
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all", "send_recv")


def _check_n(n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise TrainmathError(f"number of ranks must be an integer >= 1, got {n!r}")


def busbw_factor(op: str, n: int) -> Fraction:
    """busbw / algbw for ``op`` on ``n`` ranks, exact (nccl-tests PERFORMANCE.md, "Bus bandwidth").

    all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce, send_recv 1.
    n = 1 gives 0 for the (n-1)/n family: nothing crosses a link.
    """
    _check_n(n)
    if op == "all_reduce":
        return Fraction(2 * (n - 1), n)
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return Fraction(n - 1, n)
    if op in ("broadcast", "reduce", "send_recv"):
        return Fraction(1)
    raise TrainmathError(f"unknown collective {op!r}; known: {', '.join(OPS)}")


def algbw_bytes_per_s(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth S / t in bytes per second (nccl-tests PERFORMANCE.md, "Algorithm bandwidth")."""
    if time_s <= 0:
        raise TrainmathError(f"time must be positive, got {time_s!r} s")
    return size_bytes / time_s


def busbw_bytes_per_s(op: str, size_bytes: int, time_s: float, n: int) -> float:
    """Bus bandwidth algbw · busbw_factor(op, n) in bytes per second (nccl-tests PERFORMANCE.md)."""
    return algbw_bytes_per_s(size_bytes, time_s) * float(busbw_factor(op, n))
