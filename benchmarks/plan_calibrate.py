"""How the efficiency curves in gpus.json 'generations' were obtained: a grid search per GPU generation.

For each generation with published runs (tests/perf/published_runs.json: ampere ← Narayanan et al. 2021 and
Korthikanti et al. 2022 on A100; hopper ← Dubey et al. 2024 on H100), every combination of the grid below is
tried on all of that generation's runs at once, and the one with the smallest worst-case |log(predicted /
published)| wins (minimax: no run is sacrificed for the average). One set of numbers per generation, never per
run. Prints the winner and its per-run ratios; paste the winner into gpus.json by hand.

    python benchmarks/plan_calibrate.py [--generation ampere|hopper]
"""

from __future__ import annotations

import argparse
import itertools
import math
import pathlib
import sys
from dataclasses import replace

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "perf"))

from published import RUNS, predict  # noqa: E402
from trainmath.hardware import Hardware, presets  # noqa: E402

GRID = {
    "gemm_peak_fraction": [x / 100 for x in range(60, 96, 1)],
    "elementwise_bytes_per_token_per_hidden": [0, 8, 16, 24, 32, 48],
    "attention_peak_fraction": [0.35, 0.4, 0.45, 0.5, 0.55, 0.6],
    "link_fraction": [0.7, 0.8, 0.9],
}
# ampere: no flash attention in the A100 runs, so that knob is unused there. hopper: three runs cannot pin four
# numbers, so the memory-bound traffic and the link fraction (software and NCCL, not the chip) stay ampere's.
FIXED = {"ampere": ("attention_peak_fraction",),
         "hopper": ("elementwise_bytes_per_token_per_hidden", "link_fraction")}


def score(hw: Hardware, runs: list[dict]) -> tuple[float, list[float]]:
    ratios = [predict(r, hw) / r["published"] for r in runs]
    ratios = [1 / x if r["metric"] == "step_time_s" else x for x, r in zip(ratios, runs)]  # all: >1 = too fast
    return max(abs(math.log(x)) for x in ratios), ratios


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generation", choices=("ampere", "hopper"), action="append")
    args = ap.parse_args()
    hw0 = presets()
    for gen in args.generation or ("ampere", "hopper"):
        runs = [r for r in RUNS if hw0.gpu(r["gpu"]).generation == gen and not r.get("holdout")]
        base = hw0.generations[gen]
        keys = [k for k in GRID if k not in FIXED.get(gen, ())]
        best = None
        for values in itertools.product(*(GRID[k] for k in keys)):
            eff = replace(base, **dict(zip(keys, values)))
            s, ratios = score(Hardware(hw0.gpus, {**hw0.generations, gen: eff}), runs)
            if best is None or s < best[0]:
                best = (s, eff, ratios)
        s, eff, ratios = best
        print(f"{gen}: worst |log ratio| {s:.4f} over {len(runs)} runs")
        print("  " + ", ".join(f"{k}={getattr(eff, k)}" for k in keys))
        for r, x in zip(runs, ratios):
            print(f"  {r['id']:36s} predicted/published (speed) {x:.3f}")


if __name__ == "__main__":
    main()
