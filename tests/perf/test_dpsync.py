"""Gradient buckets as a timeline and hybrid ZeRO (``trainmath.perf.dpsync``), against hand derivations and
InternLM's code as ``published_runs_more.json`` records it (hybrid_zero_optim.py@fa7337b)."""

from dataclasses import replace

import pytest

from trainmath.errors import TrainmathError
from trainmath.families import spec_from_config
from trainmath.hardware import presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate
from trainmath.perf import comm as cm
from trainmath.perf.dpsync import bucket_timeline
from trainmath.perf.job import job_problems

HW = presets()
A100 = replace(HW.gpu("a100"), nics_per_gpu=0.5, nic_gbps=100)  # InternLM's 4 x 100 Gb RoCE per node
INTERNLM_7B = spec_from_config({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                                "num_attention_heads": 32, "num_key_value_heads": 32, "intermediate_size": 11008,
                                "vocab_size": 103168, "max_position_embeddings": 2048,
                                "tie_word_embeddings": False}, name="internlm-7b",
                               source="InternLM/InternLM configs/7B_sft.py@fa7337b37b0024e70bee3c638f969451dc4d7351")
HYBRID = dict(zero_group=8, grad_bucket_elements=512 * 1024 * 1024, blocking_buckets=True, param_sync_overlap=False)


def _at(t):
    return lambda elements: elements * t


def test_one_bucket_is_reduced_after_the_backward():
    tl = bucket_timeline([(10, 1.0), (10, 1.0)], 100, _at(0.01))
    assert tl.buckets == 1 and tl.exposed_s == pytest.approx(0.2) and tl.comm_s == pytest.approx(0.2)


def test_fast_buckets_leave_only_the_last_partial_one():
    # 4 units of 10 elements and 1 s; buckets of 10: three reduced during backward (0.1 s each, ready at 1, 2, 3 s),
    # the fourth (it ends with the last gradient) after the backward ends at 4 s
    tl = bucket_timeline([(10, 1.0)] * 4, 10, _at(0.01))
    assert tl.buckets == 4 and tl.exposed_s == pytest.approx(0.1)


def test_slow_buckets_queue_one_after_another():
    # 2 s per bucket, ready at 1, 2, 3: they run 1-3, 3-5, 5-7; the last starts at 7 and ends at 9, backward at 4
    tl = bucket_timeline([(10, 1.0)] * 4, 10, _at(0.2))
    assert tl.exposed_s == pytest.approx(5.0) and tl.comm_s == pytest.approx(8.0)


def test_a_blocking_bucket_stalls_the_backward():
    # units of 1, 0.1, 3, 0.1 s; buckets of 1.5 s. Queued: ready at 1, 1.1, 4.1 -> run 1-2.5, 2.5-4, 4.1-5.6; the
    # last after max(4.2, 5.6): ends 7.1, exposed 2.9. Blocking: at 1.1 the backward waits to 2.5 (bucket 1 done),
    # so the third boundary comes at 2.5 + 3 = 5.5: bucket 3 runs 5.5-7.0, the backward ends 5.6, the last bucket
    # 7.0-8.5: exposed 8.5 - 4.2 = 4.3
    units = [(10, 1.0), (10, 0.1), (10, 3.0), (10, 0.1)]
    assert bucket_timeline(units, 10, _at(0.15)).exposed_s == pytest.approx(2.9)
    assert bucket_timeline(units, 10, _at(0.15), blocking=True).exposed_s == pytest.approx(4.3)


def test_a_boundary_inside_a_unit_falls_at_its_share_of_the_unit():
    # one 20-element, 2 s unit then an empty-compute 10-element one: the bucket of 10 is ready at 1 s
    tl = bucket_timeline([(20, 2.0), (10, 0.0)], 10, _at(0.1))
    # buckets ready at 1 and 2 s, 1 s each: 1-2, 2-3; the last (the embedding-like unit) 3-4; backward ends at 2
    assert tl.buckets == 3 and tl.exposed_s == pytest.approx(2.0)


def _internlm(gpus, **job):
    layout = ParallelLayout(dp=gpus, zero=1)
    return estimate(INTERNLM_7B, layout, Job(global_batch=2 * gpus, seq=2048, micro_batch=2, **job), A100,
                    memory=False)


def test_internlm_hybrid_zero_all_reduces_in_14_buckets_and_broadcasts_inside_the_node():
    est = _internlm(1024, **HYBRID)
    grad = next(c for c in est.comm if c.name == "dp_grad_sync")
    bcast = next(c for c in est.comm if c.name == "zero_param_gather")
    params = 7_321_423_872  # 2 x 103168 x 4096 + 32 x 202,383,360 + the final norm
    # 512 Mi elements per bucket (configs/7B_sft.py reduce_bucket_size): 13 full buckets and the rest
    assert grad.op == "all_reduce" and grad.group_size == 1024 and grad.count == 14
    assert grad.size_bytes * grad.count == pytest.approx(2 * params)
    # broadcast_params: 8 partitions, each from its owner, inside the 8-GPU ZERO1 group; the step waits for it
    assert (bcast.op, bcast.group_size, bcast.link, bcast.count) == ("broadcast", 8, "intra", 8)
    assert bcast.exposed_s == bcast.time_s
    # the optimizer steps 1/8 of the parameters, not 1/1024
    assert est.breakdown["optimizer_step"] == pytest.approx(_internlm(8, **HYBRID).breakdown["optimizer_step"])
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s)


def test_the_hybrid_scheme_costs_more_than_the_default_overlap_and_grows_with_the_nodes():
    default = _internlm(1024)
    hybrid = _internlm(1024, **HYBRID)
    assert hybrid.step_time_s > default.step_time_s
    assert _internlm(16, **HYBRID).breakdown["dp_grad_sync"] < hybrid.breakdown["dp_grad_sync"]


def test_a_group_as_large_as_dp_is_plain_zero_one():
    one_node = _internlm(8, zero_group=8)
    assert next(c for c in one_node.comm if c.name == "dp_grad_sync").op == "reduce_scatter"
    assert one_node.step_time_s == pytest.approx(_internlm(8).step_time_s)


def test_the_default_scheme_is_the_last_backward_overlap():
    est = _internlm(64)
    grad = next(c for c in est.comm if c.name == "dp_grad_sync")
    per_layer_bwd = est.breakdown["backward"] / est.micro_batches
    size = grad.size_bytes
    from trainmath.comm.twolevel import Topology

    topo = Topology.of_gpu(A100, HW.efficiency(A100).link_fraction)
    group = est.groups.dp
    want = max(cm.bucket_floor_s("reduce_scatter", size, group, topo),
               cm.time_s("reduce_scatter", size, group, topo) - per_layer_bwd)
    assert grad.exposed_s == pytest.approx(min(grad.time_s, want))


@pytest.mark.parametrize(("layout", "job", "words"), [
    (ParallelLayout(dp=16), dict(zero_group=8), "needs ZeRO 1 or 2"),
    (ParallelLayout(dp=16, zero=1), dict(zero_group=3), "must divide"),
    (ParallelLayout(dp=16, zero=1), dict(grad_bucket_elements=-1), "non-negative integer"),
    (ParallelLayout(dp=16, zero=1), dict(blocking_buckets="yes"), "true or false"),
])
def test_job_problems_name_the_bad_values(layout, job, words):
    bad = job_problems(INTERNLM_7B, layout, Job(global_batch=32, seq=2048, **job))
    assert any(words in b for b in bad), bad
    with pytest.raises(TrainmathError):
        estimate(INTERNLM_7B, layout, Job(global_batch=32, seq=2048, **job), A100, memory=False)


def test_autograd_accumulation_adds_three_gradient_passes_per_later_micro_batch():
    gpus, M = 16, 4
    layout = ParallelLayout(dp=gpus, zero=1)
    job = Job(global_batch=2 * gpus * M, seq=2048, micro_batch=2, **HYBRID)
    plain = estimate(INTERNLM_7B, layout, job, A100, memory=False)
    summed = estimate(INTERNLM_7B, layout, replace(job, autograd_grad_accumulation=True), A100, memory=False)
    eff = HW.efficiency(A100)
    want = (M - 1) * 3 * 7_321_423_872 * 2 / (A100.hbm_bytes_per_s * eff.hbm_fraction)  # bf16 .grad
    assert summed.breakdown["backward"] - plain.breakdown["backward"] == pytest.approx(want)
    assert summed.step_time_s - plain.step_time_s == pytest.approx(want)
    # one micro-batch, or ZeRO-2 (gradient shards, reduced every micro-batch): nothing to accumulate
    one = Job(global_batch=2 * gpus, seq=2048, micro_batch=2, autograd_grad_accumulation=True)
    assert estimate(INTERNLM_7B, layout, one, A100, memory=False).step_time_s == pytest.approx(
        estimate(INTERNLM_7B, layout, replace(one, autograd_grad_accumulation=False), A100, memory=False).step_time_s)
    z2 = ParallelLayout(dp=gpus, zero=2)
    four = Job(global_batch=2 * gpus * M, seq=2048, micro_batch=2)
    assert estimate(INTERNLM_7B, z2, replace(four, autograd_grad_accumulation=True), A100,
                    memory=False).step_time_s == pytest.approx(estimate(INTERNLM_7B, z2, four, A100,
                                                                        memory=False).step_time_s)
