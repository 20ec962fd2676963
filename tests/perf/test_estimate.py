"""Step-time model: sums, pinned arithmetic, conventions, and properties (links, degrees, ZeRO)."""

import math
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmath.errors import TrainmathError
from trainmath.flops import count_flops
from trainmath.hardware import Hardware, gpu, presets
from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.perf import BREAKDOWN, Job, estimate, job_problems
from trainmath.plan.bounds import memory_lower_bound
from trainmath.sources import load_spec

SMALL = load_spec("Qwen/Qwen3-0.6B")  # 28 layers, 16 heads, 8 KV heads
H100 = gpu("h100")


def test_breakdown_sums_to_step_and_conventions_are_stated():
    e = estimate(SMALL, ParallelLayout(dp=2, tp=2, pp=2, sp=True, zero=1), Job(global_batch=16, seq=2048,
                 recompute="selective", virtual_stages=2), H100)
    assert list(e.breakdown) == list(BREAKDOWN) and all(v >= 0 for v in e.breakdown.values())
    assert math.isclose(sum(e.breakdown.values()), e.step_time_s, rel_tol=1e-12)
    assert e.tokens_per_s == pytest.approx(16 * 2048 / e.step_time_s)
    text = " ".join(e.conventions)
    assert "MFU: model FLOPs" in text and "no recompute" in text and "HFU: executed FLOPs" in text
    assert e.peak_bytes > 0 and e.fits is True


def test_one_gpu_is_compute_plus_optimizer_and_flops_are_the_ledger():
    job = Job(global_batch=4, seq=1024)
    e = estimate(SMALL, ParallelLayout(), job, H100)
    comm = {k: v for k, v in e.breakdown.items() if k not in ("forward", "backward", "recompute", "optimizer_step")}
    assert all(v == 0 for v in comm.values()) and e.comm[0].time_s == 0  # degree 1: nothing leaves the GPU
    ledger = count_flops(SMALL, batch=4, seq=1024).training_flops
    assert e.model_flops == e.hardware_flops == ledger
    assert e.mfu == pytest.approx(ledger / (e.step_time_s * H100.bf16_flops_per_s))
    assert e.tflops_per_gpu == pytest.approx(ledger / e.step_time_s / 1e12)


def test_hfu_counts_recompute_mfu_does_not():
    job = Job(global_batch=4, seq=1024, recompute="full")
    e = estimate(SMALL, ParallelLayout(), job, H100, memory=False)
    assert e.model_flops == count_flops(SMALL, batch=4, seq=1024).training_flops
    assert e.hardware_flops == count_flops(SMALL, batch=4, seq=1024, recompute="full").training_flops
    assert e.hfu > e.mfu and e.breakdown["recompute"] > 0


def test_budget_is_tokens_over_rate():
    e = estimate(SMALL, ParallelLayout(dp=8), Job(global_batch=64, seq=2048), H100, memory=False)
    b = e.budget(10**12, price_per_gpu_hour=2.0)
    assert b["time_s"] == pytest.approx(1e12 / e.tokens_per_s)
    assert b["gpu_hours"] == pytest.approx(b["time_s"] * 8 / 3600) and b["cost"] == pytest.approx(2 * b["gpu_hours"])


@pytest.mark.parametrize("layout,job,match", [
    (ParallelLayout(dp=3), Job(global_batch=16, seq=512), r"global batch \(16\) must be divisible by dp × "
                                                          r"micro-batch \(3 × 1 = 3\)"),
    (ParallelLayout(tp=3), Job(global_batch=4, seq=512), r"tp \(3\) must divide attention heads \(16\)"),
    (ParallelLayout(pp=3), Job(global_batch=6, seq=512), r"pp × virtual stages \(3 × 1 = 3\) must divide the "
                                                         r"layers \(28\)"),
    (ParallelLayout(dp=2, ep=2), Job(global_batch=4, seq=512), r"has no routed experts"),
    (ParallelLayout(pp=2), Job(global_batch=5, seq=512, virtual_stages=2),
     r"micro-batches \(5\) to be a multiple of pp \(2\)"),
])
def test_bad_jobs_are_one_line(layout, job, match):
    with pytest.raises(TrainmathError, match=match):
        estimate(SMALL, layout, job, H100, memory=False)


def _slower(g, what: str, factor: float):
    if what == "nvlink":
        return replace(g, interconnect_bidirectional_bytes_per_s=int(g.interconnect_bidirectional_bytes_per_s / factor))
    if what == "nic":
        return replace(g, nic_gbps=g.nic_gbps / factor)
    if what == "intra_latency":
        return replace(g, intra_node_latency_s=g.intra_node_latency_s * factor)
    return replace(g, inter_node_latency_s=g.inter_node_latency_s * factor)


layouts = st.sampled_from([
    ParallelLayout(dp=16), ParallelLayout(dp=2, tp=8, sp=True, zero=1), ParallelLayout(dp=4, tp=2, pp=2, zero=3),
    ParallelLayout(dp=2, tp=2, pp=2, cp=2, sp=True, zero=2), ParallelLayout(dp=8, cp=2, zero=1),
    ParallelLayout(dp=1, tp=4, pp=4), ParallelLayout(dp=4, tp=4, zero=0),
])


@settings(max_examples=40, deadline=None)
@given(layout=layouts, what=st.sampled_from(["nvlink", "nic", "intra_latency", "inter_latency"]),
       factor=st.floats(1.0, 20.0), mb=st.sampled_from([1, 2]), rc=st.sampled_from(["none", "selective", "full"]))
def test_step_time_never_falls_when_a_link_gets_slower(layout, what, factor, mb, rc):
    job = Job(global_batch=16 * mb * 2, seq=2048, micro_batch=mb, recompute=rc)
    fast = estimate(SMALL, layout, job, H100, memory=False)
    slow = estimate(SMALL, layout, job, _slower(H100, what, factor), memory=False)
    assert slow.step_time_s >= fast.step_time_s * (1 - 1e-12)


MEM_JOB = dict(micro_batch=1, seq=512, profile="megatron")


def _peak(layout, **over):
    return training_memory(SMALL, TrainingSetup(**{**MEM_JOB, **over}), layout).peak_bytes


@settings(max_examples=15, deadline=None)
@given(base=st.sampled_from([dict(dp=2), dict(tp=2, sp=True), dict(pp=2), dict(dp=2, cp=2), dict()]),
       degree=st.sampled_from(["dp", "tp", "pp", "cp"]), zero=st.sampled_from([1, 2, 3]))
def test_per_rank_memory_never_grows_with_a_degree_or_zero_stage(base, degree, zero):
    """Except ZeRO-3 on pipeline stages: FSDP2 there holds the stage's units unsharded, with fp32 gradients, for
    the whole step (memory/fsdp2_pipeline.py; the next test)."""
    lay = ParallelLayout(**base, zero=zero)
    bigger = replace(lay, **{degree: getattr(lay, degree) * 2})
    if not (zero == 3 and bigger.pp > 1):
        assert _peak(bigger) <= _peak(lay)
    if not (zero == 3 and lay.pp > 1):
        assert _peak(replace(lay, zero=zero - 1)) >= _peak(lay)


def test_zero3_on_pipeline_stages_holds_the_stage_unsharded():
    """FSDP2 under a pipeline schedule (torchtitan: no reshard after forward under PP; torch's pipeline stage:
    backwards without gradient sync) keeps a stage's parameters unsharded and its gradients unsharded in fp32 all
    step: a second stage of the small model raises the per-rank peak that halving the layers would lower."""
    lay = ParallelLayout(dp=2, cp=2, zero=3)
    piped = replace(lay, pp=2)
    assert _peak(piped) > _peak(lay)
    mem = training_memory(SMALL, TrainingSetup(**MEM_JOB), piped)
    terms = {c.name: c.value for c in mem.stages[-1].breakdown.children}
    # fp32 gradients of the bf16 parameters (these padded to a multiple of the FSDP degree, those not)
    assert terms["gradients_bytes"] >= 1.99 * terms["zero3_gather_bytes"] > 0


def test_degree_one_is_the_unsharded_case():
    one = ParallelLayout(dp=1, tp=1, pp=1, cp=1, ep=1, zero=3)
    assert _peak(one) == _peak(ParallelLayout(zero=0))  # ZeRO over one rank shards nothing
    job = Job(global_batch=2, seq=512)
    a = estimate(SMALL, one, job, H100, memory=False)
    b = estimate(SMALL, ParallelLayout(), job, H100, memory=False)
    assert a.step_time_s == b.step_time_s and all(c.time_s == 0 for c in a.comm)


BOUND_MODELS = {name: load_spec(name) for name in ("Qwen/Qwen3-0.6B", "openai-community/gpt2",
                                                   "deepseek-ai/DeepSeek-V2-Lite", "Qwen/Qwen1.5-MoE-A2.7B")}


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(sorted(BOUND_MODELS)),
       layout=st.sampled_from([ParallelLayout(dp=2, zero=z) for z in range(4)] + [
           ParallelLayout(tp=2, sp=True), ParallelLayout(pp=2, zero=1), ParallelLayout(dp=2, cp=2, zero=2),
           ParallelLayout(tp=2, pp=2, sp=True, zero=3), ParallelLayout(tp=2, sp=False, dp=2, zero=1)]),
       mb=st.sampled_from([1, 2]), rc=st.sampled_from(["none", "selective", "full"]),
       precision=st.sampled_from(["mixed-bf16", "bf16", "fp32"]))
def test_planner_memory_bound_never_exceeds_the_memory_model(model, layout, mb, rc, precision):
    spec = BOUND_MODELS[model]
    job = Job(global_batch=8 * mb, seq=512, micro_batch=mb, recompute=rc, precision=precision)
    if job_problems(spec, layout, job):
        return
    peak = training_memory(spec, TrainingSetup(micro_batch=mb, seq=512, recompute=rc, precision=precision,
                                               profile="megatron", micro_batches=8 // layout.dp), layout).peak_bytes
    assert memory_lower_bound(spec, layout, job) <= peak


def test_user_hardware_changes_the_estimate():
    slow = replace(H100, name="H100-slow", aliases=(), bf16_flops_per_s=H100.bf16_flops_per_s // 2)
    hw = Hardware(presets().gpus + (slow,), presets().generations)
    job = Job(global_batch=4, seq=1024)
    assert estimate(SMALL, ParallelLayout(), job, hw.gpu("h100-slow"), hardware=hw, memory=False).step_time_s > \
        estimate(SMALL, ParallelLayout(), job, H100, memory=False).step_time_s


def test_calculator_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import trainmath.perf, trainmath.plan, trainmath.cli.estimate, "
            "trainmath.cli.plan; from trainmath.cli import main; "
            "main(['estimate', 'qwen3-0.6b', '--gpus', '2', '--gpu', 'h100', '--seq', '512', '--global-batch', '2',"
            " '--json'])")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=60)


MOE = load_spec("Qwen/Qwen1.5-MoE-A2.7B")  # 60 routed experts


@settings(max_examples=8, deadline=None)
@given(base=st.sampled_from([dict(dp=2), dict(dp=4, ep=2), dict(dp=2, tp=2, sp=True)]), zero=st.sampled_from([0, 1, 3]))
def test_per_rank_memory_never_grows_with_expert_parallelism(base, zero):
    """The degree the dense-model property above cannot reach: ep (routed experts split over the DP ranks)."""
    setup = TrainingSetup(**MEM_JOB)
    lay = ParallelLayout(**base, zero=zero)
    bigger = replace(lay, ep=lay.ep * 2)
    assert training_memory(MOE, setup, bigger).peak_bytes <= training_memory(MOE, setup, lay).peak_bytes


@settings(max_examples=15, deadline=None)
@given(layout=st.sampled_from([ParallelLayout(dp=2, zero=1), ParallelLayout(tp=2, sp=True, dp=2, zero=3),
                               ParallelLayout(pp=2, dp=2, zero=2), ParallelLayout(dp=2, cp=2, zero=0)]),
       mb=st.sampled_from([1, 2]), rc=st.sampled_from([("full", "selective"), ("selective", "none"), ("full", "none")]))
def test_per_rank_memory_never_falls_with_a_larger_micro_batch_or_less_recompute(layout, mb, rc):
    """What the planner's dominance pruning (plan/search.py, _FitFailures) relies on: a layout needing no less
    memory than one that failed — larger micro-batch, less recomputation — is rejected without asking."""
    heavier, lighter = rc
    assert _peak(layout, micro_batch=2 * mb) >= _peak(layout, micro_batch=mb)
    assert _peak(layout, micro_batch=mb, recompute=lighter) >= _peak(layout, micro_batch=mb, recompute=heavier)
