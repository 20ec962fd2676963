"""The fine-tune's step under ZeRO-3 / FSDP2 and with routed-expert targets (``perf.peft``, ``perf.peft_fsdp``),
each term derived here from the ledger and the collective cost model independently of the step assembly:

- FSDP2 gathers every layer's frozen base and adapters twice per micro-batch (forward, backward), the root once,
  and reduce-scatters the adapters alone; the exposed part follows the prefetch chain;
- no data-parallel gradient sync beside it; the optimizer steps the trainable parameters' shard;
- the fitted FSDP overhead as full training's; at dp 1 ZeRO-3 is the one-device step;
- the frozen base runs no weight-gradient GEMM, except the experts peft's ``ParamWrapper`` adapts, whose wgrad
  equals their forward's FLOPs; the wrapper's product is an adapter GEMM."""

import pytest

from trainmath.adapter_params import hf_parameters
from trainmath.adapters import PeftJob, adapter_report
from trainmath.comm.twolevel import Topology
from trainmath.flops.peft import delta_evaluations, delta_gemm, peft_rows
from trainmath.hardware import presets
from trainmath.layout import ParallelLayout
from trainmath.memory.peft import PeftRun
from trainmath.perf import Job, estimate
from trainmath.perf import comm as cm
from trainmath.perf.fsdp import overhead_s
from trainmath.perf.peft_fsdp import layer_adapter_params
from trainmath.perf.placement import place_groups
from trainmath.sources import load_spec

HW = presets()
GPU = HW.gpu("h100")
SPEC = load_spec("meta-llama/Llama-3.1-8B")
SEQ, G = 2048, 16


def _job(spec=SPEC, targets="all-linear", params=(), rank=16, mb=1, recompute="none"):
    run = PeftRun(job=PeftJob(method="lora", rank=rank, targets=targets, target_parameters=params))
    return Job(global_batch=G, seq=SEQ, micro_batch=mb, precision="bf16", profile="hf", recompute=recompute,
               peft=run)


def _est(job, dp, zero, spec=SPEC):
    return estimate(spec, ParallelLayout(dp=dp, zero=zero, world_size=dp), job, GPU, hardware=HW, memory=False)


@pytest.mark.parametrize("targets,recompute", [("all-linear", "none"), (("q_proj", "v_proj"), "full")])
def test_zero3_collectives_derived(targets, recompute):
    job = _job(targets=targets, mb=1, recompute=recompute)
    e = _est(job, dp=8, zero=3)
    (item,) = [c for c in e.comm if c.name == "zero3_comm"]
    group = place_groups(e.layout, GPU.gpus_per_node).dp
    topo = Topology.of_gpu(GPU, HW.efficiency(GPU).link_fraction)
    trainable = adapter_report(SPEC, job.peft.job, 0).trainable_params
    per_layer_adapters = trainable // SPEC.num_layers  # Llama: every layer alike
    assert layer_adapter_params(SPEC, job.peft.job) == (per_layer_adapters,) * SPEC.num_layers
    from trainmath.params import count_params

    total = count_params(SPEC).total_params
    layer = sum(t.numel for t in SPEC.layers[0].tensors)
    root = total - SPEC.num_layers * layer
    ag = cm.time_s("all_gather", layer * 2 + per_layer_adapters * 4, group, topo)
    rs = cm.time_s("reduce_scatter", per_layer_adapters * 4, group, topo)
    ag_root = cm.time_s("all_gather", root * 2, group, topo)
    # two micro-batches: the root once each, every layer gathered forward and backward, adapters reduced
    want = e.micro_batches * (ag_root + SPEC.num_layers * (2 * ag + rs))
    assert e.micro_batches == 2 and item.time_s == pytest.approx(want, rel=1e-12)
    assert 0 < item.exposed_s < item.time_s
    assert e.breakdown["zero3_comm"] == item.exposed_s
    assert e.breakdown["dp_grad_sync"] == e.breakdown["zero_param_gather"] == 0.0
    assert e.breakdown["fsdp_overhead"] == overhead_s(GPU.generation, SPEC.num_layers + 1, 2,
                                                      2 + (recompute == "full"))


def test_zero3_at_dp1_is_the_one_device_step_and_compute_is_layout_free():
    one, z3 = _est(_job(), dp=1, zero=0), _est(_job(), dp=1, zero=3)
    assert z3.step_time_s == one.step_time_s
    z8, d8 = _est(_job(), dp=8, zero=3), _est(_job(), dp=8, zero=0)
    for k in ("forward", "backward", "recompute"):
        assert z8.breakdown[k] == d8.breakdown[k]
    # the optimizer steps an eighth of the adapters
    assert z8.breakdown["optimizer_step"] == pytest.approx(d8.breakdown["optimizer_step"] / 8, rel=1e-12)


def test_collective_counts():
    """down_proj only, no input gradients: layer 0's attention runs no backward, but its down_proj adapter does,
    so every layer is gathered twice (2L + 1 gathers with the root) and reduce-scattered once, per micro-batch."""
    e = _est(_job(targets=("down_proj",)), dp=8, zero=3)
    (item,) = [c for c in e.comm if c.name == "zero3_comm"]
    assert item.count == e.micro_batches * (1 + 2 * SPEC.num_layers + SPEC.num_layers)


MOE = load_spec("Qwen/Qwen3-30B-A3B")
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


def test_expert_targets_time_their_weight_gradients_and_the_wrapper_product():
    job = _job(spec=MOE, targets="none", params=EXPERTS, rank=8)
    e = estimate(MOE, ParallelLayout(), job, GPU, hardware=HW, memory=False)
    groups, _ = peft_rows(MOE, job.peft.job, batch=1, seq=SEQ, causal="half", input_grads=False)
    experts_fwd = sum(lr.count * r.forward_flops for lr in groups for r in lr.rows if r.gemm.component == "experts")
    M = e.micro_batches
    assert e.peft["compute"]["base_wgrad"]["flops"] == M * experts_fwd  # each wrapped GEMM's wgrad = its forward
    delta = sum(delta_evaluations(p) * delta_gemm(p, 8).flops for p in hf_parameters(MOE).values()
                if p.name.endswith(EXPERTS)) * MOE.num_layers
    assert e.peft["compute"]["adapter_forward"]["flops"] == M * delta
    assert e.peft["compute"]["adapter_backward"]["flops"] == M * delta  # 4·E·a·b·r = the two evaluations' 2 × 2
    frozen = estimate(MOE, ParallelLayout(), _job(spec=MOE, targets=("q_proj",), rank=8), GPU, hardware=HW,
                      memory=False)
    assert frozen.peft["compute"]["base_wgrad"]["flops"] == 0
    assert e.step_time_s > frozen.step_time_s
