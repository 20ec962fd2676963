"""The generation curves fitted on published_runs_more.json rows are the fit script's answers."""

import pathlib
import sys

from trainmath.hardware import presets

ROOT = pathlib.Path(__file__).resolve().parents[2]
HW = presets()


def test_the_blackwell_gemm_plateau_is_plan_calibrates_fit_on_the_dense_blackwell_runs():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests" / "perf"))
    import plan_calibrate

    runs = plan_calibrate.fit_runs("blackwell", HW)
    assert len(runs) == 11 and {r["paper"] for r in runs} == {"megatron-bridge-perf"}
    worst, eff, speeds = plan_calibrate.fit("blackwell", runs, HW)
    assert eff == HW.generations["blackwell"]  # the curve in gpus.json is the fit's answer
    assert worst <= 0.12  # every fit run within 12% (|log speed|)
    # only the plateau was fitted: the rest is Hopper's
    hop = HW.generations["hopper"]
    assert (eff.attention_peak_fraction, eff.link_fraction) == (hop.attention_peak_fraction, hop.link_fraction)
