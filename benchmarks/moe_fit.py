"""Fit the MoE per-expert overhead (``trainmath.perf.moe.OVERHEAD``) per GPU generation on the MoE runs of
tests/perf/published_runs_more.json, and report the error before and after.

    python benchmarks/moe_fit.py

Model: predicted step = the step-time model without the overhead + e · local experts (experts / ep) · MoE layers
(busiest stage) · micro-batches · passes. e is chosen on a grid (0–2 ms by 5 µs) to minimise the median |speed − 1|
over a generation's MoE runs (speed = predicted / published throughput); rows flagged ``throughput_suspect`` (their
tokens/s and TFLOP/s columns disagree) are left out of the fit. Leave-one-source-out: for each source document, e
refitted on the generation's other sources predicts that one (each generation's MoE runs come from two sources).
"""

from __future__ import annotations

import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published_more import RUNS, estimate_run, spec, speed  # noqa: E402

from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.hardware import presets  # noqa: E402
from trainmath.perf import moe  # noqa: E402

E_GRID = [i * 5e-6 for i in range(401)]


def rows() -> list[dict]:
    """Each priced MoE run: source, generation, base step (no overhead), local experts·MoE layers·M·passes,
    published step."""
    hw = presets()
    saved = dict(moe.OVERHEAD)
    moe.OVERHEAD.clear()
    out = []
    try:
        for r in RUNS:
            if not r.get("moe"):
                continue
            try:
                e, job = estimate_run(r, hw)
            except TrainmathError:
                continue
            s = spec(r["id"])
            ratio = speed(r, e)  # predicted / published throughput
            busiest = max(range(len(e.stage_times_s)), key=lambda i: e.stage_times_s[i])
            layers = e.stage_layers[busiest]
            moe_layers = round(layers * sum(any(b.kind == "moe" for b in lay.blocks) for lay in s.layers)
                               / s.num_layers)
            block = next(b for lay in s.layers for b in lay.blocks if b.kind == "moe")
            local = block.dims.experts // r["layout"].get("ep", 1)
            units = local * moe_layers * e.micro_batches * (2 + (job["recompute"] == "full"))
            out.append({"id": r["id"], "source": r["paper"], "gen": hw.gpu(r["gpu"]).generation,
                        "step": e.step_time_s, "published_step": e.step_time_s * ratio, "units": units,
                        "suspect": bool(r.get("throughput_suspect"))})
    finally:
        moe.OVERHEAD.update(saved)
    return out


def errors(rs: list[dict], e: float) -> list[float]:
    return [abs(r["published_step"] / (r["step"] + e * r["units"]) - 1) for r in rs]


def fit(rs: list[dict]) -> float:
    use = [r for r in rs if not r["suspect"]]
    return min(E_GRID, key=lambda e: (statistics.median(errors(use, e)), e))


def main() -> None:
    data = rows()
    for gen in sorted({r["gen"] for r in data}):
        rs = [r for r in data if r["gen"] == gen]
        e = fit(rs)
        fitted = [r for r in rs if not r["suspect"]]
        print(f"{gen}: {len(fitted)} MoE runs fitted ({len(rs) - len(fitted)} throughput suspect, left out); "
              f"e = {1e3 * e:.3f} ms per local expert per MoE layer per micro-batch per pass (in the code: "
              f"{1e3 * moe.OVERHEAD.get(gen, 0.0):.3f} ms)")
        print(f"  {'source':24s} {'runs':>4s} {'no overhead':>11s} {'in-sample':>9s} {'left out':>8s}  fit without it")
        for src in sorted({r["source"] for r in fitted}) + ["all"]:
            te = fitted if src == "all" else [r for r in fitted if r["source"] == src]
            tr = [r for r in fitted if r["source"] != src]
            loso = ""
            if src != "all":
                loso = (f"{100 * statistics.median(errors(te, fit(tr))):7.1f}%  e {1e3 * fit(tr):.3f} ms" if tr
                        else "    n/a  (one source)")
            print(f"  {src:24s} {len(te):4d} {100 * statistics.median(errors(te, 0)):10.1f}% "
                  f"{100 * statistics.median(errors(te, e)):8.1f}% {loso}")
        for r in rs:
            mark = "  (throughput suspect, not fitted)" if r["suspect"] else ""
            print(f"  {r['id']:62s} speed {r['published_step'] / r['step']:6.3f} -> "
                  f"{r['published_step'] / (r['step'] + e * r['units']):6.3f}{mark}")


if __name__ == "__main__":
    main()
