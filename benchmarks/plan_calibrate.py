"""How the efficiency curves in gpus.json 'generations' were obtained: a grid search per GPU generation.

For each generation with published runs, every combination of the grid below is tried on all of that
generation's fit runs at once, and the one with the smallest worst-case |log(predicted / published)| wins
(minimax: no run is sacrificed for the average). One set of numbers per generation, never per run. Fit runs:

- hopper ← Dubey et al. 2024 on H100 (tests/perf/published_runs.json);
- blackwell ← the dense B200/GB200 rows of tests/perf/published_runs_more.json (three documents; the GEMM
  plateau only);
- ampere ← Narayanan et al. 2021 and Korthikanti et al. 2022 on A100 (published_runs.json) and the single-node
  A100 rows of tests/perf/published_runs_more.json (FlashAttention's GPT3 table, InternLM-7B on 8 GPUs): one node,
  so no inter-node network enters (InternLM's data-parallel scaling gap across nodes is a separate term, not a
  chip efficiency). A combination that puts any published_runs.json run beyond 10% (tests/perf/
  test_published.py's target) is refused.

``attention_peak_fraction`` is searched within the range Dao 2023 (FlashAttention-2, arXiv:2307.08691, §1
Introduction) reports for flash kernels on A100: FlashAttention's backward at 25-35% of peak up to
FlashAttention-2's forward at up to 73%. Prints the winner and its per-run ratios; paste the winner into
gpus.json by hand.

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
from trainmath.hardware import Efficiency, Hardware, presets  # noqa: E402

GRID = {
    "gemm_peak_fraction": [x / 100 for x in range(60, 86, 1)],
    "elementwise_bytes_per_token_per_hidden": [0, 8, 16, 24, 32, 48],
    "attention_peak_fraction": [0.35, 0.4, 0.45, 0.5, 0.55, 0.6],
    "link_fraction": [0.7, 0.8, 0.9],
}
GRID_FOR = {"ampere": {"attention_peak_fraction": [0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7]},
            "blackwell": {"gemm_peak_fraction": [x / 100 for x in range(40, 86, 1)]}}
"""Per generation, grids that differ from GRID: ampere's attention over Dao 2023's A100 range (above); blackwell's
GEMM plateau from 0.40 (its FP8 runs sit below Hopper's)."""
# hopper: three runs cannot pin four numbers, so the memory-bound traffic and the link fraction (software and
# NCCL, not the chip) stay at the values gpus.json sets (32 bytes, 0.7: ampere's before its flash-attention rows).
FIXED = {"hopper": ("elementwise_bytes_per_token_per_hidden", "link_fraction"),
         "blackwell": ("elementwise_bytes_per_token_per_hidden", "link_fraction", "attention_peak_fraction")}
# blackwell: only the GEMM plateau is fitted, on the dense Blackwell runs of published_runs_more.json (FP8 B200/GB200
# rows of three documents: Megatron-Bridge's performance summary, the NeMo Framework performance page, MLPerf
# Training logs): the rest stays Hopper's, as gpus.json set it before any Blackwell run was priced.
CALIBRATION_BOUND = 0.10
"""No published_runs.json run may move beyond this |predicted / published − 1| (tests/perf/test_published.py)."""


def fit_runs(gen: str, hw: Hardware, exclude_source: str | None = None) -> list[dict]:
    """The runs ``gen`` is fitted on: its published_runs.json runs, and for ampere also the single-node rows of
    published_runs_more.json; ``exclude_source`` (a ``paper``) left out, for leave-one-source-out."""
    runs = [dict(r, _old=True) for r in RUNS if hw.gpu(r["gpu"]).generation == gen and not r.get("holdout")]
    if gen == "ampere":
        from published_more import RUNS as MORE
        from published_more import gpus

        runs += [r for r in MORE if hw.gpu(r["gpu"]).generation == gen
                 and gpus(r) <= hw.gpu(r["gpu"]).gpus_per_node]
    if gen == "blackwell":
        from published_more import RUNS as MORE
        from published_more import try_predict

        runs += [r for r in MORE if hw.gpu(r["gpu"]).generation == gen and not r["moe"]
                 and try_predict(r)[0] is not None]
    return [r for r in runs if r["paper"] != exclude_source]


def ratios(run: dict, hw: Hardware) -> tuple[float, float]:
    """(predicted / published of the run's own metric, predicted / published speed: above 1 too fast)."""
    if run.get("_old"):
        x = predict(run, hw) / run["published"]
    else:
        from published_more import predict as predict_more

        x = predict_more(run, hw) / run["published"]
    return x, (1 / x if run["metric"] == "step_time_s" else x)


def fit(gen: str, runs: list[dict], hw0: Hardware | None = None) -> tuple[float, Efficiency, list[float]]:
    """(worst |log speed|, the winning curve, its per-run speeds) over the grid for ``gen`` on ``runs``."""
    hw0 = hw0 or presets()
    base = hw0.generations[gen]
    grid = {**GRID, **GRID_FOR.get(gen, {})}
    keys = [k for k in grid if k not in FIXED.get(gen, ())]
    best = None
    for values in itertools.product(*(grid[k] for k in keys)):
        eff = replace(base, **dict(zip(keys, values)))
        hw = Hardware(hw0.gpus, {**hw0.generations, gen: eff})
        speeds = []
        for r in runs:
            own, x = ratios(r, hw)
            if r.get("_old") and abs(own - 1) > CALIBRATION_BOUND:
                break
            speeds.append(x)
        else:
            s = max(abs(math.log(x)) for x in speeds)
            if best is None or s < best[0]:
                best = (s, eff, speeds)
    if best is None:
        raise SystemExit(f"{gen}: no combination keeps every published_runs.json run within 10%")
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--generation", choices=("ampere", "hopper", "blackwell"), action="append")
    args = ap.parse_args()
    hw0 = presets()
    for gen in args.generation or ("ampere", "hopper"):
        runs = fit_runs(gen, hw0)
        s, eff, ratios = fit(gen, runs, hw0)
        keys = [k for k in GRID if k not in FIXED.get(gen, ())]
        print(f"{gen}: worst |log ratio| {s:.4f} over {len(runs)} runs")
        print("  " + ", ".join(f"{k}={getattr(eff, k)}" for k in keys))
        for r, x in zip(runs, ratios):
            print(f"  {r['id']:44s} predicted/published (speed) {x:.3f}")


if __name__ == "__main__":
    main()
