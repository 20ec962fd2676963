"""Fit the flash kernels' attention shares (``trainmath.perf.attention``) per GPU generation and kernel on the
attention-dominated runs of tests/perf/published_runs_more.json, and report in-sample and leave-one-source-out.

    python benchmarks/attention_fit.py

A run enters the fit of (its generation, its ``job.flash_kernel``) when its attention cores are at least
``attention.FIT_SHARE`` of its predicted step (share = 2·(T(a) − T(2a)) / T(a), T the step at attention share a:
the step is X + Y/a). The share is chosen on a grid (0.10 to 0.70 by 0.01) to minimise the median |speed − 1|
(speed = predicted / published throughput) over those runs. ``te`` is ``attention.TE_PEAK_FRACTION``, ``fa2``
``attention.FA2_PEAK_FRACTION``; paste the winners there by hand. ``native`` (gpus.json's
``attention_peak_fraction``) is plan_calibrate.py's and is not refitted here. Leave-one-source-out refits without
each source; a (generation, kernel) left with no runs falls back to native.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published_more import RUNS, estimate_run, speed  # noqa: E402

from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.hardware import presets  # noqa: E402
from trainmath.perf import attention  # noqa: E402

GRID = [i / 100 for i in range(10, 71)]
TABLES = {"te": attention.TE_PEAK_FRACTION, "fa2": attention.FA2_PEAK_FRACTION}


def kernel(run: dict) -> str:
    return run["job"].get("flash_kernel", "native")


def _step(run: dict, hw, gen: str, a: float) -> float:
    """The run's predicted speed with its kernel's share on ``gen`` set to ``a``."""
    k = kernel(run)
    if k == "native":
        saved_g = hw.generations[gen]
        hw.generations[gen] = replace(saved_g, attention_peak_fraction=a)
        try:
            return speed(run, estimate_run(run, hw)[0])
        finally:
            hw.generations[gen] = saved_g
    table = TABLES[k]
    saved = dict(table)
    table[gen] = a
    try:
        return speed(run, estimate_run(run, hw)[0])
    finally:
        table.clear()
        table.update(saved)


def rows() -> list[dict]:
    """The fit runs: source, generation, kernel, and their speed at every grid share."""
    hw = presets()
    out = []
    for r in RUNS:
        if r["job"].get("attention", "flash") != "flash":
            continue
        gen = hw.gpu(r["gpu"]).generation
        try:
            e, _ = estimate_run(r, hw)
        except TrainmathError:
            continue
        a = attention.fraction(hw.generations[gen], kernel(r))
        s1, s2 = speed(r, e), _step(r, hw, gen, 2 * a)  # speeds: step times are published / speed
        share = 2 * (1 / s1 - 1 / s2) / (1 / s1)
        if share < attention.FIT_SHARE or kernel(r) == "native":
            continue
        out.append({"id": r["id"], "source": r["paper"], "gen": gen, "kernel": kernel(r), "share": share,
                    "speeds": {g: _step(r, hw, gen, g) for g in GRID}})
    return out


def fit(rs: list[dict]) -> float:
    return min(GRID, key=lambda g: (statistics.median(abs(r["speeds"][g] - 1) for r in rs), g))


def fitted(rs: list[dict], exclude_source: str | None = None) -> dict[tuple[str, str], float]:
    """(generation, kernel) → the fitted share, without ``exclude_source``'s runs."""
    keep = [r for r in rs if r["source"] != exclude_source]
    return {(g, k): fit([r for r in keep if (r["gen"], r["kernel"]) == (g, k)])
            for g, k in {(r["gen"], r["kernel"]) for r in keep}}


def apply(shares: dict[tuple[str, str], float]) -> None:
    """Set the kernel tables to ``shares`` (a generation without a share falls back to native)."""
    for k, table in TABLES.items():
        table.clear()
        table.update({g: a for (g, kk), a in shares.items() if kk == k})


def main() -> None:
    rs = rows()
    hw = presets()
    shares = fitted(rs)

    for (gen, k), a in sorted(shares.items()):
        now = attention.fraction(hw.generations[gen], k)
        group = [r for r in rs if (r["gen"], r["kernel"]) == (gen, k)]
        print(f"{gen} {k}: {len(group)} runs with attention >= {attention.FIT_SHARE:.0%} of the step; fitted share "
              f"{a:.2f} (in the code: {now:.2f})")
        for src in sorted({r["source"] for r in group}):
            te = [r for r in group if r["source"] == src]
            left = fitted(rs, src).get((gen, k))
            held = (f"{100 * statistics.median(abs(r['speeds'][left] - 1) for r in te):6.1f}% at {left:.2f}"
                    if left is not None else "n/a (no other source: native in leave-one-source-out)")
            inside = 100 * statistics.median(abs(r["speeds"][a] - 1) for r in te)
            print(f"  {src:24s} {len(te):3d} runs  in-sample {inside:5.1f}%  left out {held}")
        for r in group:
            print(f"    {r['id']:60s} share {r['share']:.2f} speed at fit {r['speeds'][a]:.3f}")


if __name__ == "__main__":
    main()
