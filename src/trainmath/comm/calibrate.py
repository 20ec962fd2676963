"""α and β of a link fitted to a collective's own measured times, through the collective's own model.

``trainmath comm bench`` predicts a collective from a link calibrated on a point-to-point ring exchange
(``trainmath.runtime.bench.calibrate``); on loopback gloo that link says little about how gloo runs the collective
itself (its own threads, copies and reductions), and the prediction is off by 2.6–4.9×. Here the same α–β–γ model
(``trainmath.comm.cost.predict_time_s``) is instead fitted to the run's collective times: for one op, algorithm
and rank count the model is affine in α and β,

    t(S) = c0(S) + cα(S)·α + cβ(S)·β        (c0: the γ term; e.g. ring all-reduce cα = 2(n-1), cβ = 2(n-1)/n·S)

so α, β follow from weighted least squares over the measured sizes, each weighted by 1/t² (the relative error is
what is minimised: sizes span three decades). α is clamped at 0 (then β is refitted alone). Derived; pure.
"""

from __future__ import annotations

from trainmath.comm.cost import Link, predict_time_s
from trainmath.errors import TrainmathError

_FREE = 1e30
"""A bandwidth (bytes/s) standing for β = 0, which ``Link`` does not accept."""


def coefficients(op: str, impl: str, size_bytes: int, n: int, *, backend: str = "gloo",
                 reduce_bytes_per_s: float | None = None) -> tuple[float, float, float]:
    """(c0 s, cα messages, cβ bytes) with ``predict_time_s = c0 + cα·α + cβ·β``, read off the model itself by
    evaluating it at three links (so it stays true to whatever formula the op and backend use)."""
    def t(alpha: float, bandwidth: float) -> float:
        return predict_time_s(op, impl, size_bytes, n, Link(alpha_s=alpha, bandwidth_bytes_per_s=bandwidth,
                                                            reduce_bytes_per_s=reduce_bytes_per_s), backend)

    c0 = t(0.0, _FREE)
    return c0, t(1.0, _FREE) - c0, t(0.0, 1.0) - c0


def fit_collective_link(op: str, impl: str, n: int, points: list[tuple[int, float]], *, backend: str = "gloo",
                        reduce_bytes_per_s: float | None = None) -> Link:
    """The link (α, 1/β; γ kept as given) whose model prediction of ``op`` best matches the measured
    ``[(size_bytes, seconds), ...]`` in relative terms (see the module docstring)."""
    if n < 2:
        raise TrainmathError(f"fitting a link to a collective needs at least 2 ranks, got {n}")
    if len({s for s, _ in points}) < 2:
        raise TrainmathError("fitting a link needs timings at two or more different sizes")
    if any(t <= 0 for _, t in points):
        raise TrainmathError("fitting a link needs positive times")
    rows = []
    for size, secs in points:
        c0, ca, cb = coefficients(op, impl, size, n, backend=backend, reduce_bytes_per_s=reduce_bytes_per_s)
        rows.append((ca / secs, cb / secs, 1.0 - c0 / secs))  # relative residual: (prediction − t) / t
    saa = sum(a * a for a, _, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    say = sum(a * y for a, _, y in rows)
    sby = sum(b * y for _, b, y in rows)
    det = saa * sbb - sab * sab
    alpha = (say * sbb - sby * sab) / det if det > 0 else -1.0
    beta = (saa * sby - sab * say) / det if det > 0 else 0.0
    if alpha < 0:  # no latency term helps: fit β alone
        alpha, beta = 0.0, sby / sbb
    if beta <= 0:
        raise TrainmathError(f"{op} times did not grow with size; cannot fit a bandwidth")
    return Link(alpha_s=alpha, bandwidth_bytes_per_s=1.0 / beta, reduce_bytes_per_s=reduce_bytes_per_s)


def ratios(op: str, impl: str, n: int, points: list[tuple[int, float]], link: Link, *,
           backend: str = "gloo") -> list[float]:
    """predicted / measured per point, for ``link``."""
    return [predict_time_s(op, impl, s, n, link, backend) / t for s, t in points]
