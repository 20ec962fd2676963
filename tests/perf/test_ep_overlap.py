"""The EP all-to-all under Megatron-Core's combined 1F1B schedule (``Job.ep_overlap``), against its derivation:
per layer three phases (combine_bwd beside attn_fwd, dispatch_fwd + dispatch_bwd beside mlp_bwd + mlp_fwd,
combine_fwd beside attn_bwd), each exposing what its compute cannot cover or the compute the communication's SMs
slow, one micro-batch unpaired; never more hidden than the whole other micro-batch's compute; nothing else moves;
and DeepEP's dispatch (``Job.ep_dispatcher``): one RDMA copy per token per destination node, at DeepEP's measured
NIC rate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainmath.errors import TrainmathError
from trainmath.hardware import presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate
from trainmath.sources import load_spec

SPEC = load_spec("Qwen/Qwen3-30B-A3B")
H100 = presets().gpu("h100")
LAYOUT = ParallelLayout(dp=16, ep=16, zero=1)
JOB = Job(global_batch=128, seq=4096)


def _ep(est):
    (it,) = [c for c in est.comm if c.name == "ep_comm"]
    return it


@pytest.mark.parametrize("gpu", [H100, replace(H100, nic_gbps=H100.nic_gbps / 8)])
def test_overlapped_all_to_all_is_what_the_other_micro_batch_cannot_cover(gpu):
    off = estimate(SPEC, LAYOUT, JOB, gpu, memory=False)
    on = estimate(SPEC, LAYOUT, replace(JOB, ep_overlap=True), gpu, memory=False)
    M = off.micro_batches
    assert M == 8
    compute = (off.breakdown["forward"] + off.breakdown["backward"] + off.breakdown["recompute"]) / M
    total = _ep(off).time_s
    assert _ep(off).exposed_s == pytest.approx(total)
    assert _ep(on).time_s == pytest.approx(total)
    # the phases hide no more than the whole other micro-batch's compute would
    assert max(total / M, total - (M - 1) * compute) - 1e-12 <= _ep(on).exposed_s <= total
    assert on.breakdown["ep_comm"] == pytest.approx(_ep(on).exposed_s)
    assert {k: v for k, v in on.breakdown.items() if k != "ep_comm"} == pytest.approx(
        {k: v for k, v in off.breakdown.items() if k != "ep_comm"})
    assert off.step_time_s - on.step_time_s == pytest.approx(total - _ep(on).exposed_s)
    assert any("combined 1F1B" in c for c in on.conventions)
    assert not any("combined 1F1B" in c for c in off.conventions)


def test_across_nodes_the_excess_stays_exposed_and_inside_a_node_one_micro_batch():
    slow = estimate(SPEC, LAYOUT, replace(JOB, ep_overlap=True), H100, memory=False)
    fast = estimate(SPEC, ParallelLayout(dp=16, ep=8, zero=1), replace(JOB, ep_overlap=True), H100, memory=False)
    assert _ep(slow).link == "both" and _ep(fast).link == "intra"
    # inside a node every phase is covered: one micro-batch unpaired, the others pay the SMs the
    # communication holds (moe.overlap_sm_share) on all of their all-to-all time
    from trainmath.perf.moe import overlap_sm_share

    t = _ep(fast).time_s
    assert _ep(fast).exposed_s == pytest.approx(t / 8 + 7 / 8 * t * overlap_sm_share('hopper'))
    assert _ep(slow).exposed_s > _ep(slow).time_s / 8


def test_the_three_phases_by_hand():
    """One MoE layer, an all-to-all of a seconds, attn_fwd 1, mlp_fwd 2, attn_bwd 2, mlp_bwd 4, M = 5: a pair
    exposes max(0, a − 1) + max(0, 2a − 6) + max(0, a − 2); one micro-batch's 4a is exposed whole."""
    from trainmath.perf import comm as cm
    from trainmath.perf.step import _overlapped_ep

    def exposed(a, passes=2):
        it = cm.CommItem(name="ep_comm", op="all_to_all", group="ep", group_size=8, link="intra", size_bytes=1.0,
                         count=5 * 2 * passes, time_s=5 * 2 * passes * a, exposed_s=5 * 2 * passes * a)
        return _overlapped_ep(it, 5, [(1.0, 2.0, 2.0, 4.0)], passes).exposed_s

    assert exposed(1.0) == pytest.approx(4.0)  # every phase covered: the unpaired micro-batch only
    assert exposed(2.0) == pytest.approx(8.0 + 4 * 1.0)  # combine_bwd 2 beside attn_fwd 1: 1 per pair
    assert exposed(3.0) == pytest.approx(min(60.0, 12.0 + 4 * (2.0 + 0.0 + 1.0)))
    assert exposed(10.0) == pytest.approx(40.0 + 4 * (9.0 + 14.0 + 8.0))  # the compute still hides 9 of 40
    assert exposed(1.0, passes=3) == pytest.approx(6.0 + 4 * 2.0)  # the recompute's forward pair is not paired


def test_one_micro_batch_has_nothing_to_overlap_with():
    job = Job(global_batch=16, seq=4096, ep_overlap=True)
    on = estimate(SPEC, LAYOUT, job, H100, memory=False)
    assert on.micro_batches == 1 and _ep(on).exposed_s == pytest.approx(_ep(on).time_s)


def test_a_non_boolean_overlap_is_refused():
    with pytest.raises(TrainmathError, match="ep overlap must be true or false"):
        estimate(SPEC, LAYOUT, replace(JOB, ep_overlap="yes"), H100, memory=False)


def test_deepep_share_is_the_distinct_nodes_a_token_reaches_over_its_remote_copies():
    from math import comb

    from trainmath.perf.moe import deepep_node_share

    E, k, N = 128, 8, 4
    hit = 1 - comb(E - E // N, k) / comb(E, k)
    assert deepep_node_share(E, k, N) == pytest.approx((N - 1) * hit / (k * (N - 1) / N))
    assert deepep_node_share(E, k, 1) == 1.0
    assert deepep_node_share(8, 1, 4) == pytest.approx(1.0)  # top-1: one copy either way
    assert deepep_node_share(E, k, 8) < 1.0


def test_deepep_scales_the_cross_node_all_to_all_and_nothing_inside_a_node():
    from trainmath.perf.moe import deepep_node_share

    (dims,) = [b.dims for b in SPEC.layers[0].blocks if b.kind == "moe"]
    plain = estimate(SPEC, LAYOUT, JOB, H100, memory=False)
    deep = estimate(SPEC, LAYOUT, replace(JOB, ep_dispatcher="deepep"), H100, memory=False)
    assert _ep(deep).size_bytes == pytest.approx(_ep(plain).size_bytes * deepep_node_share(dims.experts, dims.top_k, 2))
    assert _ep(deep).time_s < _ep(plain).time_s
    assert any("DeepEP" in c for c in deep.conventions)
    inside = ParallelLayout(dp=16, ep=8, zero=1)
    a = estimate(SPEC, inside, JOB, H100, memory=False)
    b = estimate(SPEC, inside, replace(JOB, ep_dispatcher="deepep"), H100, memory=False)
    assert _ep(a).size_bytes == _ep(b).size_bytes and a.step_time_s == b.step_time_s


def test_an_unknown_dispatcher_is_refused():
    with pytest.raises(TrainmathError, match="ep dispatcher must be one of alltoall, deepep"):
        estimate(SPEC, LAYOUT, replace(JOB, ep_dispatcher="nccl"), H100, memory=False)


def test_deepep_prices_the_cross_node_part_at_its_measured_nic_rate():
    """DeepEP's README (EP 32 on H800, CX7 ~50 GB/s: dispatch 58, combine 57 GB/s, its own node's copies counted)
    gives 3/4 of that on the NIC; the cross-node all-to-all is priced there, not at NCCL's link fraction."""
    from trainmath.comm.twolevel import Group
    from trainmath.perf import moe

    readme = [58e9 * 3 / 4 / 50e9, 57e9 * 3 / 4 / 50e9]
    assert moe.DEEPEP_NIC_FRACTION["hopper"] == pytest.approx(sum(readme) / 2, abs=0.005)
    deep = estimate(SPEC, LAYOUT, replace(JOB, ep_dispatcher="deepep"), H100, memory=False)
    it = _ep(deep)
    group, one = Group(size=16, local=8), it.time_s / it.count
    beta = 1 / (H100.inter_node_bytes_per_s * moe.DEEPEP_NIC_FRACTION["hopper"])
    off = (group.size - group.local) * (H100.inter_node_latency_s + it.size_bytes / group.size * beta)
    assert one == pytest.approx(off)  # the NICs, not NVLink, set the pace at 2 nodes
    nccl_beta = 1 / (H100.inter_node_bytes_per_s * presets().efficiency(H100).link_fraction)
    assert one < (group.size - group.local) * (H100.inter_node_latency_s + it.size_bytes / group.size * nccl_beta)
    plain = estimate(SPEC, LAYOUT, JOB, H100, memory=False)  # the plain all-to-all keeps NCCL's fraction
    p = _ep(plain)
    assert p.time_s / p.count == pytest.approx(
        (group.size - group.local) * (H100.inter_node_latency_s + p.size_bytes / group.size * nccl_beta))


def test_overlap_contention_is_the_reserved_sms_over_the_gpus():
    from trainmath.perf import moe

    assert moe.overlap_sm_share("hopper") == pytest.approx(20 / 132)
    assert moe.overlap_sm_share("ampere") == 0.0


def test_the_three_phases_with_the_communication_holding_sms():
    """Share s of the SMs held by the communication: a phase of communication c beside compute x exposes
    max(c − x, s·c). One MoE layer, attn_fwd 1, mlp_fwd 2, attn_bwd 2, mlp_bwd 4, M = 5, s = 1/4."""
    from trainmath.perf import comm as cm
    from trainmath.perf.step import _overlapped_ep

    def exposed(a, share):
        it = cm.CommItem(name="ep_comm", op="all_to_all", group="ep", group_size=8, link="intra", size_bytes=1.0,
                         count=20, time_s=20 * a, exposed_s=20 * a)
        return _overlapped_ep(it, 5, [(1.0, 2.0, 2.0, 4.0)], 2, share).exposed_s

    assert exposed(1.0, 0.25) == pytest.approx(4.0 + 4 * (0.25 + 0.5 + 0.25))  # covered, but the compute slows
    assert exposed(1.0, 0.0) == pytest.approx(4.0)
    assert exposed(10.0, 0.25) == pytest.approx(exposed(10.0, 0.0))  # communication-bound: the excess as before
    assert exposed(2.0, 0.25) == pytest.approx(8.0 + 4 * (1.0 + 1.0 + 0.5))  # c − x in the first phase


def test_hopper_overlap_pays_the_contention_and_without_overlap_nothing_changes(monkeypatch):
    from trainmath.perf import moe

    inside = ParallelLayout(dp=16, ep=8, zero=1)  # NVLink: every phase covered, the contention is what remains
    with_share = estimate(SPEC, inside, replace(JOB, ep_overlap=True), H100, memory=False)
    off = estimate(SPEC, inside, JOB, H100, memory=False)
    monkeypatch.setitem(moe.SMS, "hopper", None)
    without = estimate(SPEC, inside, replace(JOB, ep_overlap=True), H100, memory=False)
    off_without = estimate(SPEC, inside, JOB, H100, memory=False)
    assert _ep(without).exposed_s == pytest.approx(_ep(without).time_s / 8)
    assert _ep(with_share).exposed_s > _ep(without).exposed_s
    assert off.step_time_s == off_without.step_time_s
