"""Fitting α and β to a collective's own times (trainmath.comm.calibrate): arithmetic on synthetic data only —
no timing is asserted."""

import random

import pytest

from trainmath.comm.calibrate import coefficients, fit_collective_link, ratios
from trainmath.comm.cost import Link, predict_time_s
from trainmath.errors import TrainmathError

SIZES = [2**k for k in range(16, 25)]  # 64 KiB .. 16 MiB
TRUE = Link(alpha_s=37e-6, bandwidth_bytes_per_s=1.7e9, reduce_bytes_per_s=6e9)


def test_coefficients_are_the_ring_all_reduce_formula():
    n, s = 4, 1 << 20
    c0, ca, cb = coefficients("all_reduce", "ring", s, n, reduce_bytes_per_s=6e9)
    assert ca == pytest.approx(2 * (n - 1))
    assert cb == pytest.approx(2 * (n - 1) / n * s, rel=1e-9)
    assert c0 == pytest.approx((n - 1) / n * s / 6e9, rel=1e-9)


@pytest.mark.parametrize("op,impl,n", [("all_reduce", "native", 2), ("all_reduce", "native", 4),
                                       ("all_gather", "native", 4), ("reduce_scatter", "native", 2),
                                       ("all_reduce", "naive", 3), ("broadcast", "native", 4)])
def test_exact_model_times_give_back_the_link(op, impl, n):
    points = [(s, predict_time_s(op, impl, s, n, TRUE, "gloo")) for s in SIZES]
    link = fit_collective_link(op, impl, n, points, reduce_bytes_per_s=TRUE.reduce_bytes_per_s)
    assert link.alpha_s == pytest.approx(TRUE.alpha_s, rel=1e-6)
    assert link.bandwidth_bytes_per_s == pytest.approx(TRUE.bandwidth_bytes_per_s, rel=1e-6)
    assert ratios(op, impl, n, points, link) == pytest.approx([1.0] * len(SIZES), rel=1e-6)


def test_noisy_times_fit_within_the_noise_and_two_points_suffice():
    rng = random.Random(7)
    exact = [(s, predict_time_s("all_reduce", "native", s, 2, TRUE, "gloo")) for s in SIZES]
    noisy = [(s, t * (1 + rng.uniform(-0.1, 0.1))) for s, t in exact]
    link = fit_collective_link("all_reduce", "native", 2, noisy, reduce_bytes_per_s=TRUE.reduce_bytes_per_s)
    assert all(0.85 < r < 1.15 for r in ratios("all_reduce", "native", 2, noisy, link))
    ends = fit_collective_link("all_reduce", "native", 2, [exact[0], exact[-1]],
                               reduce_bytes_per_s=TRUE.reduce_bytes_per_s)
    assert ends.alpha_s == pytest.approx(TRUE.alpha_s, rel=1e-6)
    assert ends.bandwidth_bytes_per_s == pytest.approx(TRUE.bandwidth_bytes_per_s, rel=1e-6)


def test_negative_latency_is_clamped_and_beta_refitted():
    # times proportional to size with a deficit at small sizes: the unconstrained α would be < 0
    points = [(s, 2e-10 * s - 5e-6) for s in SIZES]
    link = fit_collective_link("all_gather", "native", 2, points)
    assert link.alpha_s == 0.0
    rel = ratios("all_gather", "native", 2, points, link)
    assert max(rel) > 1 > min(rel)  # one β, no α: over at small sizes, under at large


@pytest.mark.parametrize("points,n,needle", [
    ([(1024, 1e-3), (1024, 2e-3)], 2, "two or more different sizes"),
    ([(1024, 1e-3), (2048, 1e-3)], 1, "at least 2 ranks"),
    ([(1024, 0.0), (2048, 1e-3)], 2, "positive times"),
    ([(1024, 2e-3), (1 << 20, 1e-3)], 2, "did not grow with size"),
])
def test_bad_data_is_one_error(points, n, needle):
    with pytest.raises(TrainmathError, match=needle):
        fit_collective_link("all_reduce", "native", n, points)


def test_comm_bench_reports_the_link_fitted_to_its_own_times():
    """`comm bench --json` rows carry the in-run fit; it is the fit of the rows' own (size, time) pairs, and its
    prediction is the model's for that link (arithmetic on whatever was measured — no timing asserted)."""
    pytest.importorskip("torch")
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "trainmath", "comm", "bench", "--nproc", "2", "--sizes", "64K,1M",
                          "--iters", "2", "--warmup", "1", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    if "fitted_time_s" not in rows[0]:  # left out only when the times did not grow with size (a noisy machine)
        assert rows[1]["time_s"] <= rows[0]["time_s"]
        return
    link = fit_collective_link("all_reduce", "native", 2, [(r["size_bytes"], r["time_s"]) for r in rows],
                               reduce_bytes_per_s=rows[0]["reduce_bytes_per_s"])
    for r in rows:
        assert r["fitted_alpha_s"] == pytest.approx(link.alpha_s)
        assert r["fitted_link_bytes_per_s"] == pytest.approx(link.bandwidth_bytes_per_s)
        assert r["fitted_time_s"] == pytest.approx(predict_time_s("all_reduce", "native", r["size_bytes"], 2, link))
