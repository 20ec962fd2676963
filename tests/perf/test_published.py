"""Published training runs, each reproduced with its own FLOP convention, predicted within 10%.

Tolerance 10% (the issue's target) for every run: the model is calibrated once per GPU generation
(gpus.json 'generations', benchmarks/plan_calibrate.py), so a run is off by what one set of numbers cannot capture
across software versions (Megatron-LM 2021 vs 2022 on the same A100s differ by ~10% at equal layouts) and by
what the papers leave unstated (micro-batch, interleaving; each run's 'assumptions'). The pinned ratios catch any
drift in the model: a change that moves a prediction by more than 1% must update them (and docs/benchmarks.md).
"""

import pytest

from published import RUNS, predict

# predicted / published of each run's metric (benchmarks/plan_oracles.py prints them)
PINNED = {
    "narayanan2021-1.7B": 1.005, "narayanan2021-3.6B": 1.003, "narayanan2021-7.5B": 0.981,
    "narayanan2021-18.4B": 0.959, "narayanan2021-39.1B": 1.028, "narayanan2021-76.1B": 1.052,
    "narayanan2021-145.6B": 1.033, "narayanan2021-310.1B": 1.024, "narayanan2021-529.6B": 0.999,
    "narayanan2021-1008.0B": 1.025,
    "korthikanti2022-22B-full": 1.073, "korthikanti2022-22B-selective": 0.975,
    "korthikanti2022-175B-full": 1.080, "korthikanti2022-175B-selective": 1.013,
    "korthikanti2022-530B-full": 1.099, "korthikanti2022-530B-selective": 1.039,
    "korthikanti2022-1T-full": 1.058, "korthikanti2022-1T-selective": 1.030,
    "dubey2024-405B-8K-gpus": 1.021, "dubey2024-405B-16K-gpus": 0.984, "dubey2024-405B-16K-gpus-cp16": 0.982,
    # holdout (not calibrated on): MT-NLG's DeepSpeed pipeline ran ~25% slower than Megatron-LM's own 530B run on
    # the same A100s, which one A100 curve cannot know; pinned so that the miss stays visible
    "smith2022-mtnlg-530B-2240-gpus": 0.785, "smith2022-mtnlg-530B-2800-gpus": 0.776,
    "smith2022-mtnlg-530B-3360-gpus": 0.754,
}
CALIBRATION = [r for r in RUNS if not r.get("holdout")]


def test_every_run_is_pinned_and_sourced():
    assert {r["id"] for r in RUNS} == set(PINNED)
    for r in RUNS:
        assert r["source"] and r["assumptions"] and r["metric"] in ("step_time_s", "tflops_per_gpu",
                                                                    "hardware_tflops_per_gpu")


@pytest.mark.parametrize("run", CALIBRATION, ids=[r["id"] for r in CALIBRATION])
def test_published_run_within_ten_percent(run):
    ratio = predict(run) / run["published"]
    assert abs(ratio - 1) <= 0.10, f"{run['id']}: predicted {ratio:.3f}× the published {run['published']}"
    assert ratio == pytest.approx(PINNED[run["id"]], rel=0.01)


@pytest.mark.parametrize("run", [r for r in RUNS if r.get("holdout")], ids=lambda r: r["id"])
def test_holdout_runs_are_pinned(run):
    assert predict(run) / run["published"] == pytest.approx(PINNED[run["id"]], rel=0.01)


def test_selective_recompute_gain_matches_korthikanti():
    """Table 5's headline: SP + selective recompute is ~29-32% faster than full recompute, for every model."""
    by = {r["id"]: predict(r) for r in RUNS if r["paper"] == "korthikanti2022"}
    for name in ("22B", "175B", "530B", "1T"):
        gain = by[f"korthikanti2022-{name}-full"] / by[f"korthikanti2022-{name}-selective"] - 1
        assert 0.20 <= gain <= 0.45, (name, gain)
