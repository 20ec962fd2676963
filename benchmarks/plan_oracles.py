"""Predicted vs published: every run of tests/perf/published_runs.json through the step-time model.

    python benchmarks/plan_oracles.py

Columns: the run, its GPU, the figure the paper reports (its own FLOP convention: Megatron-LM's Eq. 3 counts
recompute, Llama 3's TFLOPs/GPU 6N + causal attention; Korthikanti et al. report seconds), the prediction, and
predicted / published. The efficiency curves are per GPU generation (gpus.json 'generations',
benchmarks/plan_calibrate.py), never per run.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published import RUNS, predict  # noqa: E402

UNIT = {"step_time_s": "s/step", "tflops_per_gpu": "TFLOP/s/GPU (model)",
        "hardware_tflops_per_gpu": "TFLOP/s/GPU (with recompute)"}


def main() -> None:
    print(f"{'run':36s} {'GPU':14s} {'metric':30s} {'published':>9s} {'predicted':>9s} {'ratio':>6s}")
    worst, fitted = 0.0, 0
    for r in RUNS:
        p = predict(r)
        ratio = p / r["published"]
        if not r.get("holdout"):
            worst, fitted = max(worst, abs(ratio - 1)), fitted + 1
        mark = "  (holdout)" if r.get("holdout") else ""
        print(f"{r['id']:36s} {r['gpu']:14s} {UNIT[r['metric']]:30s} {r['published']:9.2f} {p:9.2f} {ratio:6.3f}{mark}")
    print(f"worst |predicted / published - 1| = {100 * worst:.1f}% over the {fitted} calibration runs")


if __name__ == "__main__":
    main()
