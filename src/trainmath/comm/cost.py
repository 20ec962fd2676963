"""α–β–γ time of each collective: the math twins of the runtime's ops.

Model (Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH", IJHPCA
19(1), 2005, §3): sending an m-byte message between two ranks takes α + m·β; reducing m bytes locally takes
m·γ. Here β = 1 / ``bandwidth_bytes_per_s`` and γ = 1 / ``reduce_bytes_per_s``. Links are full duplex and
each rank sends and receives at once (a ring step costs one message time, not two). Contention on a shared
host (several ranks on few cores) is not modelled; calibrating α and β on the same machine absorbs part of it.

All sizes are the nccl-tests size column: the whole buffer S in bytes (all-gather: the gathered output;
reduce-scatter: the full input). All times are seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainmath.errors import TrainmathError

ALGORITHMS = ("ring", "naive", "tree")


@dataclass(frozen=True, kw_only=True)
class Link:
    """A point-to-point link between any two ranks."""

    alpha_s: float
    """Latency α: seconds per message, whatever its size."""
    bandwidth_bytes_per_s: float
    """1/β: bytes per second one way, per rank, while the rank also receives at the same rate."""
    reduce_bytes_per_s: float | None = None
    """1/γ: bytes per second a rank reduces (e.g. adds) locally; None means reduction is free."""

    def __post_init__(self) -> None:
        if self.alpha_s < 0:
            raise TrainmathError(f"latency must be >= 0 s, got {self.alpha_s}")
        if self.bandwidth_bytes_per_s <= 0:
            raise TrainmathError(f"link bandwidth must be > 0 bytes/s, got {self.bandwidth_bytes_per_s}")
        if self.reduce_bytes_per_s is not None and self.reduce_bytes_per_s <= 0:
            raise TrainmathError(f"reduce throughput must be > 0 bytes/s, got {self.reduce_bytes_per_s}")

    @property
    def beta_s_per_byte(self) -> float:
        return 1.0 / self.bandwidth_bytes_per_s

    @property
    def gamma_s_per_byte(self) -> float:
        return 0.0 if self.reduce_bytes_per_s is None else 1.0 / self.reduce_bytes_per_s


def _check(size_bytes: int, n: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise TrainmathError(f"number of ranks must be an integer >= 1, got {n!r}")
    if size_bytes < 0:
        raise TrainmathError(f"message size must be >= 0 bytes, got {size_bytes}")


def send_recv(size_bytes: int, n: int, link: Link, algorithm: str = "ring") -> float:
    """α + S·β: one message between two ranks (Thakur et al. 2005, §3). ``n`` and ``algorithm`` are ignored."""
    _check(size_bytes, n)
    return link.alpha_s + size_bytes * link.beta_s_per_byte


def ring_all_gather_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)α + (n-1)/n·S·β (Thakur et al. 2005, §4.1, ring all-gather)."""
    return (n - 1) * link.alpha_s + (n - 1) / n * size_bytes * link.beta_s_per_byte


def ring_reduce_scatter_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)α + (n-1)/n·S·(β+γ) (Thakur et al. 2005, §4.5, ring/pairwise reduce-scatter)."""
    return (n - 1) * link.alpha_s + (n - 1) / n * size_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte)


def ring_all_reduce_time_s(size_bytes: int, n: int, link: Link) -> float:
    """2(n-1)α + 2(n-1)/n·S·β + (n-1)/n·S·γ: ring reduce-scatter then ring all-gather.

    Patarasuk & Yuan, JPDC 69(2), 2009 (bandwidth-optimal); Thakur et al. 2005, §4.4.
    """
    return ring_reduce_scatter_time_s(size_bytes, n, link) + ring_all_gather_time_s(size_bytes, n, link)


def naive_all_reduce_time_s(size_bytes: int, n: int, link: Link) -> float:
    """2(n-1)(α + S·β) + (n-1)·S·γ: every rank sends S to the root, which reduces and sends S back to each.

    Derived: the root's one link carries n-1 full messages in and n-1 out, one after another.
    """
    return (2 * (n - 1) * (link.alpha_s + size_bytes * link.beta_s_per_byte)
            + (n - 1) * size_bytes * link.gamma_s_per_byte)


def tree_broadcast_time_s(size_bytes: int, n: int, link: Link) -> float:
    """⌈log2 n⌉(α + S·β) (Thakur et al. 2005, §4.1, binomial-tree broadcast)."""
    return math.ceil(math.log2(n)) * (link.alpha_s + size_bytes * link.beta_s_per_byte)


def ring_broadcast_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)α + S·β: a pipelined chain, bandwidth term of the scatter + all-gather broadcast.

    Derived as the large-message limit of Patarasuk & Yuan 2009 (busbw factor 1 in nccl-tests).
    """
    return (n - 1) * link.alpha_s + size_bytes * link.beta_s_per_byte


def naive_broadcast_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)(α + S·β): the root sends the whole buffer to each rank in turn (derived)."""
    return (n - 1) * (link.alpha_s + size_bytes * link.beta_s_per_byte)


def tree_reduce_time_s(size_bytes: int, n: int, link: Link) -> float:
    """⌈log2 n⌉(α + S·β + S·γ) (Thakur et al. 2005, §4.3, binomial-tree reduce)."""
    return math.ceil(math.log2(n)) * (link.alpha_s + size_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte))


def ring_reduce_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)α + S·(β+γ): pipelined chain reduce, large-message limit (derived, mirror of ring broadcast)."""
    return (n - 1) * link.alpha_s + size_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte)


def naive_reduce_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)(α + S·β + S·γ): the root receives and reduces each rank's whole buffer in turn (derived)."""
    return (n - 1) * (link.alpha_s + size_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte))


def linear_scatter_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)(α + S/n·β): the root sends each rank its 1/n share in turn (Thakur et al. 2005, §4.2, linear)."""
    return (n - 1) * (link.alpha_s + size_bytes / n * link.beta_s_per_byte)


def pairwise_all_to_all_time_s(size_bytes: int, n: int, link: Link) -> float:
    """(n-1)(α + S/n·β): n-1 pairwise exchange steps of S/n bytes each (Thakur et al. 2005, §4.6)."""
    return (n - 1) * (link.alpha_s + size_bytes / n * link.beta_s_per_byte)


_TABLE = {
    ("all_reduce", "ring"): ring_all_reduce_time_s,
    ("all_reduce", "naive"): naive_all_reduce_time_s,
    ("reduce_scatter", "ring"): ring_reduce_scatter_time_s,
    ("all_gather", "ring"): ring_all_gather_time_s,
    ("broadcast", "ring"): ring_broadcast_time_s,
    ("broadcast", "tree"): tree_broadcast_time_s,
    ("broadcast", "naive"): naive_broadcast_time_s,
    ("reduce", "ring"): ring_reduce_time_s,
    ("reduce", "tree"): tree_reduce_time_s,
    ("reduce", "naive"): naive_reduce_time_s,
    ("scatter", "naive"): linear_scatter_time_s,
    ("gather", "naive"): linear_scatter_time_s,  # gather is scatter reversed: same messages
    ("all_to_all", "ring"): pairwise_all_to_all_time_s,
    ("all_to_all", "naive"): pairwise_all_to_all_time_s,
}


def _time(op: str, size_bytes: int, n: int, link: Link, algorithm: str) -> float:
    _check(size_bytes, n)
    if n == 1:
        return 0.0  # nothing leaves the rank
    try:
        formula = _TABLE[(op, algorithm)]
    except KeyError:
        known = sorted(a for o, a in _TABLE if o == op)
        raise TrainmathError(f"no {algorithm!r} model for {op}; known: {', '.join(known)}") from None
    return formula(size_bytes, n, link)


def all_reduce(size_bytes: int, n: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for an all-reduce of S bytes on n ranks: ``ring`` or ``naive`` (gather to root + broadcast)."""
    return _time("all_reduce", size_bytes, n, link, algorithm)


def reduce_scatter(size_bytes: int, n: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for a reduce-scatter of an S-byte input on n ranks (``ring``)."""
    return _time("reduce_scatter", size_bytes, n, link, algorithm)


def all_gather(size_bytes: int, n: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for an all-gather into an S-byte output on n ranks (``ring``)."""
    return _time("all_gather", size_bytes, n, link, algorithm)


def broadcast(size_bytes: int, n: int, link: Link, algorithm: str = "tree") -> float:
    """Seconds for a broadcast of S bytes from one rank to n-1 others (``tree``, ``ring``, ``naive``)."""
    return _time("broadcast", size_bytes, n, link, algorithm)


def reduce(size_bytes: int, n: int, link: Link, algorithm: str = "tree") -> float:
    """Seconds for a reduce of S bytes from n ranks to one (``tree``, ``ring``, ``naive``)."""
    return _time("reduce", size_bytes, n, link, algorithm)


def scatter(size_bytes: int, n: int, link: Link, algorithm: str = "naive") -> float:
    """Seconds for a scatter of an S-byte buffer, S/n to each rank (linear from the root)."""
    return _time("scatter", size_bytes, n, link, algorithm)


def gather(size_bytes: int, n: int, link: Link, algorithm: str = "naive") -> float:
    """Seconds for a gather into an S-byte buffer, S/n from each rank (linear into the root)."""
    return _time("gather", size_bytes, n, link, algorithm)


def all_to_all(size_bytes: int, n: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds for an all-to-all of an S-byte buffer per rank (pairwise exchange)."""
    return _time("all_to_all", size_bytes, n, link, algorithm)


# Which algorithm models a backend's own ("native") collective. gloo's reduce_scatter is an all-reduce plus a
# copy (measured on torch 2.13), so it is predicted as a ring all-reduce of the same buffer.
_NATIVE = {
    "gloo": {"all_reduce": ("all_reduce", "ring"), "reduce_scatter": ("all_reduce", "ring"),
             "all_gather": ("all_gather", "ring"), "broadcast": ("broadcast", "tree"),
             "reduce": ("reduce", "tree"), "all_to_all": ("all_to_all", "ring")},
    "nccl": {"all_reduce": ("all_reduce", "ring"), "reduce_scatter": ("reduce_scatter", "ring"),
             "all_gather": ("all_gather", "ring"), "broadcast": ("broadcast", "ring"),
             "reduce": ("reduce", "ring"), "all_to_all": ("all_to_all", "ring")},
}


def predict_time_s(op: str, impl: str, size_bytes: int, n: int, link: Link, backend: str = "gloo") -> float:
    """Predicted seconds for ``op`` run as ``impl`` (native | ring | naive) on ``backend``."""
    if op == "send_recv":
        return send_recv(size_bytes, n, link)
    if impl == "native":
        model_op, algorithm = _NATIVE.get(backend, _NATIVE["nccl"]).get(op, (op, "ring"))
        return _time(model_op, size_bytes, n, link, algorithm)
    return _time(op, size_bytes, n, link, impl)


def fit_link(points: list[tuple[int, float]], reduce_bytes_per_s: float | None = None) -> Link:
    """Least-squares α and 1/β from one-way point-to-point times ``[(size_bytes, seconds), ...]``.

    t = α + S·β is a straight line in S; ordinary least squares, with α clamped at 0.
    """
    if len({s for s, _ in points}) < 2:
        raise TrainmathError("fitting a link needs timings at two or more different sizes")
    k = len(points)
    mean_s = sum(s for s, _ in points) / k
    mean_t = sum(t for _, t in points) / k
    var = sum((s - mean_s) ** 2 for s, _ in points)
    beta = sum((s - mean_s) * (t - mean_t) for s, t in points) / var
    if beta <= 0:
        raise TrainmathError("point-to-point times did not grow with size; cannot fit a bandwidth")
    alpha = max(0.0, mean_t - beta * mean_s)
    return Link(alpha_s=alpha, bandwidth_bytes_per_s=1.0 / beta, reduce_bytes_per_s=reduce_bytes_per_s)
