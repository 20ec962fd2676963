"""Uneven pipeline stages as Megatron-LM runs them (--decoder-first/last-pipeline-num-layers): the split, each
stage's time, the bubble from the slowest stage, and memory per stage (the heaviest decides the fit)."""

import subprocess
import sys

import pytest

from trainmath.hardware import gpu, presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate, job_problems
from trainmath.perf.compute import layer_times
from trainmath.placement import stage_layers
from trainmath.sources import load_spec

L405 = load_spec("meta-llama/Llama-3.1-405B")  # 126 layers
H100 = gpu("h100")
EFF = presets().efficiency(H100)


def _layout(first=None, last=None, pp=16):
    return ParallelLayout(dp=16, tp=8, pp=pp, sp=True, zero=1, first_stage_layers=first, last_stage_layers=last)


def test_the_split_is_megatrons():
    stages = stage_layers(126, 16, 7, 7)
    assert [len(r) for r in stages] == [7] + [8] * 14 + [7]
    assert [i for r in stages for i in r] == list(range(126))  # contiguous, every layer once
    assert [len(r) for r in stage_layers(126, 16, None, 6)] == [8] * 15 + [6]
    assert [len(r) for r in stage_layers(126, 16, 6, None)] == [6] + [8] * 15
    assert [len(r) for r in stage_layers(10, 2, 4, 6)] == [4, 6]
    assert stage_layers(126, 16) == stage_layers(126, 16, None, None)


def test_stage_times_and_the_bubble_from_the_slowest_stage():
    job = Job(global_batch=1024, seq=8192)
    e = estimate(L405, _layout(7, 7), job, H100, memory=False)
    per_layer, head = layer_times(L405, micro_batch=1, seq=8192, layout=_layout(7, 7), gpu=H100, eff=EFF,
                                  recompute="none")
    one = per_layer[0].forward_s + per_layer[0].backward_s
    assert e.stage_layers == (7,) + (8,) * 14 + (7,)
    assert e.stage_times_s[0] == pytest.approx(7 * one, rel=1e-12)
    assert e.stage_times_s[5] == pytest.approx(8 * one, rel=1e-12)
    assert e.stage_times_s[-1] == pytest.approx(7 * one + head.forward_s + head.backward_s, rel=1e-12)
    slowest = max(e.stage_times_s)
    M = e.micro_batches
    per_mb_comm = sum(e.breakdown[k] for k in ("tp_comm", "cp_comm", "ep_comm", "zero3_comm")) / M
    assert e.breakdown["pipeline_bubble"] == pytest.approx(15 * (slowest + per_mb_comm), rel=1e-12)
    assert e.breakdown["forward"] + e.breakdown["backward"] == pytest.approx(M * slowest, rel=1e-12)


def test_memory_per_stage_the_heaviest_decides():
    """The even split gives the first stage (which holds pp micro-batches in flight, 1F1B) 8 layers; Megatron's
    7 + 8·14 + 7 gives it 7: its peak is lower, and the peak reported is the heaviest stage's."""
    from trainmath.memory.training import TrainingSetup, training_memory

    setup = TrainingSetup(micro_batch=1, seq=8192, precision="mixed-bf16", optimizer="adamw", recompute="none",
                          profile="megatron", attention="sdpa", micro_batches=64)
    split = training_memory(L405, setup, _layout(7, 7))
    even = training_memory(L405, setup, _layout())
    assert [len(s.layers) for s in split.stages] == [7] + [8] * 14 + [7]
    assert split.stages[0].layers == range(0, 7)
    assert split.peak_bytes == max(s.breakdown.value for s in split.stages)
    assert split.peak_bytes < even.peak_bytes
    job = Job(global_batch=1024, seq=8192)
    assert estimate(L405, _layout(7, 7), job, H100).peak_bytes == split.peak_bytes


@pytest.mark.parametrize("first,last,pp,v,needle", [
    (6, 6, 16, 1, "must split evenly"), (5, None, 16, 1, "must split evenly"), (7, 7, 1, 1, "pp >= 2"),
    (0, None, 16, 1, "positive integer"), (7, 7, 16, 2, "not modelled"), (60, 60, 2, 1, "must equal"),
])
def test_bad_splits_are_named(first, last, pp, v, needle):
    lay = ParallelLayout(dp=1, tp=1, pp=pp, first_stage_layers=first, last_stage_layers=last)
    bad = job_problems(L405, lay, Job(global_batch=pp * 2, seq=4096, virtual_stages=v))
    assert any(needle in b for b in bad), bad


def test_cli_flags_and_one_line_error():
    base = [sys.executable, "-m", "trainmath", "estimate", "meta-llama/Llama-3.1-405B", "--gpus", "2048", "--gpu",
            "h100", "--seq", "8192", "--global-batch", "1024", "--tp", "8", "--pp", "16", "--sp"]
    ok = subprocess.run(base + ["--decoder-first-pipeline-num-layers", "7", "--decoder-last-pipeline-num-layers",
                                "7"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "pipeline stages" in ok.stdout and "7/8/8" in ok.stdout
    bad = subprocess.run(base + ["--decoder-first-pipeline-num-layers", "5"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("trainmath: error:") and len(bad.stderr.splitlines()) == 1


def test_planner_tries_megatrons_split_when_pp_does_not_divide():
    from trainmath.plan.search import _structures, megatron_split

    assert megatron_split(126, 16) == (7, 7)  # 7 + 8·14 + 7
    assert megatron_split(126, 8) == (15, 15)  # ⌈126/8⌉ = 16 on the 6 inner stages, 126 − 96 = 30 → 15 + 15
    assert megatron_split(80, 16) is None  # pp divides the layers
    small = load_spec("Qwen/Qwen3-0.6B")  # 28 layers
    assert megatron_split(28, 8) == (2, 2)  # 2 + 4·6 + 2
    with_split = [lay for lay in _structures(small, 8, 8, 4096, uneven=True) if lay.stage_split != (None, None)]
    assert {(lay.pp, lay.stage_split) for lay in with_split} == {(8, (2, 2))}
    assert not [lay for lay in _structures(small, 8, 8, 4096) if lay.stage_split != (None, None)]
    for lay in with_split:
        assert not job_problems(small, lay, Job(global_batch=8, seq=4096), 8)


@pytest.mark.parametrize("precision", ["mixed-bf16", "fp8"])
def test_time_lower_bound_holds_with_fp8_and_megatron_splits(precision):
    """The planner's best-first search needs its bound below every estimate, FP8 casts and uneven splits too."""
    from trainmath.plan.bounds import time_lower_bound
    from trainmath.plan.search import _options, _structures

    small = load_spec("Qwen/Qwen3-0.6B")
    job = Job(global_batch=32, seq=2048, precision=precision, uneven_stages=True)
    n = 0
    for lay in _structures(small, 8, 8, job.seq, uneven=True):
        for jb in _options(lay, job):
            if job_problems(small, lay, jb, 8):
                continue
            bound = time_lower_bound(small, lay, jb, H100, EFF, jb.micro_batch, jb.recompute, jb.virtual_stages)
            assert bound <= estimate(small, lay, jb, H100, memory=False).step_time_s * (1 + 1e-12)
            n += 1
    assert n > 100
