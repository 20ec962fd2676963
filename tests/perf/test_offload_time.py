"""Offloaded step time (``perf.offload``): hand-derived bytes and seconds, the calibration figure, estimate and plan
with ``--offload``, and bad input."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmath.cli import main
from trainmath.hardware import gpu
from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.params import count_params
from trainmath.perf import Job, estimate
from trainmath.perf.offload import (
    BREAKDOWN_OFFLOAD,
    cpu_adam_bytes_per_param,
    cpu_adam_params_per_s,
    offload_data,
    offload_time,
)
from trainmath.plan import plan
from trainmath.plan.bounds import memory_lower_bound
from trainmath.plan.offload import plan_offload
from trainmath.sources import load_spec

LLAMA8 = load_spec("meta-llama/Llama-3.1-8B")
LLAMA8_PARAMS = 8_030_261_248


def _terms(**kw):
    base = dict(shard_params=1000, ranks_per_node=2, micro_batches=4, grad_bytes=2, weight_bytes=2, passes=2,
                pcie_bytes_per_s=1000.0, host_bytes_per_s=10_000.0, backward_s=5.0, compute_s=20.0)
    return offload_time(**{**base, **kw})


def test_cpu_adam_bytes_by_hand():
    # reads fp32 grad, master, exp_avg, exp_avg_sq (4 · 4); writes master, exp_avg, exp_avg_sq (3 · 4); bf16 copy 2
    assert cpu_adam_bytes_per_param(2) == 16 + 12 + 2 == 30


def test_zero2_optimizer_offload_by_hand():
    t = _terms(offload="optimizer", zero=2)
    assert t.grad_d2h_bytes == 2 * 1000 * 4  # g · S per micro-batch (ZeRO-2 reduces each micro-batch)
    assert t.update_h2d_bytes == 2 * 1000 and t.param_h2d_bytes == 0
    assert t.cpu_step_bytes_per_node == 2 * 1000 * 30
    assert (t.grad_d2h_s, t.update_h2d_s, t.cpu_step_s) == (8.0, 2.0, 6.0)
    # ZeRO-1/2: the copies exposed; the bit16 copy back runs under the CPU step: max(6, 2)
    assert t.breakdown == {"offload_grad_d2h": 8.0, "cpu_optimizer_step": 6.0, "offload_param_h2d": 0.0}


def test_zero1_copies_once_per_step():
    assert _terms(offload="optimizer", zero=1).grad_d2h_bytes == 2 * 1000


def test_zero3_param_offload_by_hand():
    t = _terms(offload="params", zero=3, passes=3)
    assert t.param_h2d_bytes == 2 * 1000 * 3 * 4 and t.update_h2d_bytes == 0
    # D2H 8 s behind a 5 s backward: 3 s exposed; fetches 24 s behind 20 s of compute: 4 s exposed
    assert t.breakdown == {"offload_grad_d2h": 3.0, "cpu_optimizer_step": 6.0, "offload_param_h2d": 4.0}


def test_update_copy_longer_than_the_cpu_step_sets_the_term():
    t = _terms(offload="optimizer", zero=2, pcie_bytes_per_s=100.0)
    assert t.update_h2d_s == 20.0 and t.breakdown["cpu_optimizer_step"] == 20.0


def test_calibration_figure_in_sample():
    """DeepSpeed #6834 (hardware/offload.json 'cpu_adam'): Qwen2.5-72B, 4 nodes of 8 A100-80GB, ZeRO-3 with
    optimizer and parameter offload, ~10 s CPU step. In-sample: the rate is fitted to it; the test pins that the
    figure's parameter count is the catalog's and that estimate reproduces the 10 s through its own shard."""
    spec = load_spec("Qwen/Qwen2.5-72B")
    cal = offload_data()["cpu_adam"]
    assert cal["params"] == count_params(spec).total_params
    job = Job(global_batch=32, seq=8192, recompute="full", offload="params")
    e = estimate(spec, ParallelLayout(dp=32, zero=3), job, gpu("a100-80gb"), memory=False)
    assert e.offload["shard_params"] * 32 == cal["params"] == 72_706_203_648
    assert e.offload["ranks_per_node"] == cal["gpus_per_node"] == 8
    assert e.breakdown["cpu_optimizer_step"] == pytest.approx(cal["step_s"], rel=1e-12)


def test_estimate_offload_optimizer_one_h100():
    job = Job(global_batch=1, seq=4096, recompute="full", offload="optimizer", host_memory_bytes=256 * 10**9)
    e = estimate(LLAMA8, ParallelLayout(dp=1, zero=2), job, gpu("h100"))
    b = e.breakdown
    assert set(BREAKDOWN_OFFLOAD) <= set(b) and b["optimizer_step"] == 0.0
    assert sum(b.values()) == pytest.approx(e.step_time_s, rel=1e-12)
    rate = cpu_adam_params_per_s()
    assert b["cpu_optimizer_step"] == pytest.approx(LLAMA8_PARAMS / rate, rel=1e-12)  # one rank on the node
    assert b["offload_grad_d2h"] == pytest.approx(2 * LLAMA8_PARAMS / (64e9 * 0.8), rel=1e-12)
    # the host figure of `trainmath memory ... --zero 2 --offload optimizer` (docs/offload.md)
    assert e.offload["host_bytes"] == 145_595_375_616 and e.offload["host_fits"]
    setup = TrainingSetup(micro_batch=1, seq=4096, recompute="full", micro_batches=1, offload="optimizer",
                          profile="megatron")
    assert e.peak_bytes == training_memory(LLAMA8, setup, ParallelLayout(dp=1, zero=2)).peak_bytes
    assert e.fits


def test_host_exceeded_does_not_fit():
    job = Job(global_batch=1, seq=4096, recompute="full", offload="optimizer", host_memory_bytes=100 * 2**30)
    e = estimate(LLAMA8, ParallelLayout(dp=1, zero=2), job, gpu("h100"))
    assert not e.offload["host_fits"] and e.fits is False


@pytest.mark.parametrize("offload,zero", [("optimizer", 1), ("optimizer", 2), ("optimizer", 3), ("params", 3)])
def test_states_bound_stays_below_the_peak_with_offload(offload, zero):
    lay = ParallelLayout(dp=2, zero=zero)
    job = Job(global_batch=2, seq=2048, recompute="full", offload=offload)
    setup = TrainingSetup(micro_batch=1, seq=2048, recompute="full", micro_batches=1, offload=offload,
                          profile="megatron")
    assert memory_lower_bound(LLAMA8, lay, job) <= training_memory(LLAMA8, setup, lay).peak_bytes


def test_plan_offload_makes_8b_fit_one_h100():
    g, job = gpu("h100"), Job(global_batch=8, seq=4096)
    assert not plan(LLAMA8, gpus=1, gpu=g, job=job, top=3, fit_profiles=("megatron",)).layouts
    auto = plan_offload(LLAMA8, gpus=1, gpu=g, job=job, top=3, fit_profiles=("megatron",))
    assert auto.layouts and all(e.job.offload != "none" and e.offload["host_fits"] for e in auto.layouts)
    assert [e.step_time_s for e in auto.layouts] == sorted(e.step_time_s for e in auto.layouts)


def test_plan_rejects_what_the_host_cannot_hold():
    job = Job(global_batch=8, seq=4096, offload="optimizer", host_memory_bytes=100 * 2**30)
    r = plan(LLAMA8, gpus=1, gpu=gpu("h100"), job=job, top=3, fit_profiles=("megatron",))
    assert not r.layouts and r.rejected.get("host RAM exceeded", 0) > 0


BASE = ["estimate", "meta-llama/Llama-3.1-8B", "--gpus", "1", "--gpu", "h100", "--seq", "4096", "--global-batch", "1"]


def test_estimate_cli_json(capsys):
    assert main(BASE + ["--zero", "2", "--offload", "optimizer", "--recompute", "full", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["offload"]["host_bytes"] == 145_595_375_616 and out["breakdown"]["optimizer_step"] == 0.0


def test_estimate_cli_text(capsys):
    assert main(BASE + ["--zero", "2", "--offload", "optimizer", "--host-memory", "256GB"]) == 0
    text = capsys.readouterr().out
    assert "CPU optimizer step:" in text and "host RAM per node: 145,595,375,616 bytes" in text


@pytest.mark.parametrize("extra", [["--offload", "params", "--zero", "2"], ["--offload", "optimizer", "--zero", "0"],
                                   ["--host-memory", "1TB"], ["--offload", "optimizer", "--host-memory", "0"],
                                   ["--offload", "optimizer", "--host-bandwidth", "nan"],
                                   ["--offload", "optimizer", "--optimizer", "sgd"], ["--offload", "auto"]])
def test_bad_input_one_line(capsys, extra):
    assert main(BASE + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainmath: error:")


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 10**11), m=st.integers(1, 64), n=st.integers(1, 8), zero=st.sampled_from([1, 2, 3]),
       params=st.booleans(), bwd=st.floats(0, 100), extra=st.floats(0, 100))
def test_exposed_terms_are_bounded_by_their_copies(s, m, n, zero, params, bwd, extra):
    offload = "params" if params and zero == 3 else "optimizer"
    t = _terms(offload=offload, zero=zero, shard_params=s, micro_batches=m, ranks_per_node=n, backward_s=bwd,
               compute_s=bwd + extra)
    b = t.breakdown
    assert 0 <= b["offload_grad_d2h"] <= t.grad_d2h_s
    assert 0 <= b["offload_param_h2d"] <= t.param_h2d_s
    assert b["cpu_optimizer_step"] == max(t.cpu_step_s, t.update_h2d_s)
    assert t.cpu_step_bytes_per_node == n * s * 30  # the node's ranks share its DRAM
