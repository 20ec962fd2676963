"""Fit the FSDP overhead constants (``trainmath.perf.fsdp.OVERHEAD``) per GPU generation on the FSDP runs of
tests/perf/published_runs_more.json, and report the error in-sample and leave-one-source-out.

    python benchmarks/fsdp_fit.py

Model: predicted step = the step-time model without the overhead + c + d · units · micro-batches · passes. (c, d)
is chosen on a grid (c 0–0.5 s by 0.01, d 0–5 ms by 0.1 ms) to minimise the median |speed − 1| over a
generation's FSDP runs (speed = predicted / published throughput). Leave-one-source-out: for each source document,
fit on the generation's other sources and predict that one.
"""

from __future__ import annotations

import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published_more import RUNS, estimate_run, spec, speed  # noqa: E402

from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.hardware import presets  # noqa: E402
from trainmath.perf import fsdp  # noqa: E402

C_GRID = [i * 0.01 for i in range(51)]
D_GRID = [i * 1e-4 for i in range(51)]


def rows() -> list[dict]:
    """Each priced FSDP run: source, generation, base step (no overhead), units·M·passes, published step."""
    hw = presets()
    saved = dict(fsdp.OVERHEAD)
    fsdp.OVERHEAD.clear()
    out = []
    try:
        for r in RUNS:
            if not r.get("fsdp") or not (r["layout"].get("zero") == 3 or r["job"].get("fsdp")):
                continue
            try:
                e, job = estimate_run(r, hw)
            except TrainmathError:
                continue
            s = spec(r["id"])
            ratio = speed(r, e)  # predicted / published throughput
            units = (s.num_layers // r["layout"]["pp"] + 1) * e.micro_batches * (2 + (job["recompute"] == "full"))
            out.append({"source": r["paper"], "gen": hw.gpu(r["gpu"]).generation, "step": e.step_time_s,
                        "published_step": e.step_time_s * ratio, "units": units})
    finally:
        fsdp.OVERHEAD.update(saved)
    return out


def errors(rs: list[dict], c: float, d: float) -> list[float]:
    return [abs(r["published_step"] / (r["step"] + c + d * r["units"]) - 1) for r in rs]


def fit(rs: list[dict]) -> tuple[float, float]:
    return min(((c, d) for c in C_GRID for d in D_GRID), key=lambda cd: (statistics.median(errors(rs, *cd)), cd))


def main() -> None:
    data = rows()
    for gen in sorted({r["gen"] for r in data}):
        rs = [r for r in data if r["gen"] == gen]
        c, d = fit(rs)
        print(f"{gen}: {len(rs)} FSDP runs; fitted c = {c:.2f} s/step, d = {1e3 * d:.1f} ms per unit pass "
              f"(in the code: {fsdp.OVERHEAD.get(gen, (0.0, 0.0))})")
        print(f"  {'source':24s} {'runs':>4s} {'no overhead':>11s} {'in-sample':>9s} {'left out':>8s}  fit without it")
        sources = sorted({r["source"] for r in rs})
        for src in sources + ["all"]:
            te = rs if src == "all" else [r for r in rs if r["source"] == src]
            tr = [r for r in rs if r["source"] != src]
            loso = ""
            if src != "all" and tr:
                lc, ld = fit(tr)
                loso = f"{100 * statistics.median(errors(te, lc, ld)):7.1f}%  c {lc:.2f} d {1e3 * ld:.1f} ms"
            elif src != "all":
                loso = "    n/a  (one source)"
            print(f"  {src:24s} {len(te):4d} {100 * statistics.median(errors(te, 0, 0)):10.1f}% "
                  f"{100 * statistics.median(errors(te, c, d)):8.1f}% {loso}")


if __name__ == "__main__":
    main()
