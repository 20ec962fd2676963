"""Cheap bounds that let the planner skip work without changing its answer.

- ``memory_lower_bound``: never above the memory model's peak, so a layout it rules out would not have fit;
- ``time_lower_bound``: never above the step-time model's step, so a layout it puts behind the K-th result
  would not have beaten it.
"""

from __future__ import annotations

from dataclasses import replace

from trainmath.layout import ParallelLayout
from trainmath.model.spec import ModelSpec
from trainmath.perf.compute import layer_times, memo
from trainmath.perf.job import Job
from trainmath.perf.step import _TP_BLOCKS, stage_params
from trainmath.placement import stage_layers
from trainmath.vocabulary import get_precision


def states(spec: ModelSpec, layout: ParallelLayout, job: Job, stage: int) -> int:
    """Model-state bytes of one rank of ``stage`` after ZeRO (no activations)."""
    return memo(spec, ("states", _states_key(layout), job.precision, job.optimizer, job.offload, stage),
                lambda: _states_bytes(spec, layout, job, stage))


def _states_key(layout: ParallelLayout) -> tuple:
    """What model states read of a layout: every dp × cp split of the same tp, pp (dp·cp = N / (tp·pp)) holds the
    same states, so they are computed once."""
    return (layout.tp, layout.pp, layout.ep, layout.zero, layout.zero_degree, layout.expert_zero_degree,
            layout.stage_split)


def _states_bytes(spec: ModelSpec, layout: ParallelLayout, job: Job, stage: int) -> int:
    prec = get_precision(job.precision)
    states = {"sgd": 0, "sgd-momentum": 1, "lion": 1, "adafactor": 0}.get(job.optimizer, 2)
    dense, expert, _ = stage_params(spec, layout.tp, layout.pp, layout.ep, stage, layout.stage_split)
    total = 0
    for params, degree in ((dense, layout.zero_degree), (expert, layout.expert_zero_degree)):
        z = layout.zero
        if job.offload != "params":  # parameter offload: the shards live on the host
            total += prec.weight_bytes * params // (degree if z >= 3 else 1)
        total += prec.grad_bytes * params // (degree if z >= 2 else 1)
        if job.offload == "none":  # offload: master weights and optimizer states on the host
            total += (prec.master_bytes + states * prec.state_bytes) * params // (degree if z >= 1 else 1)
    return total


def _ledger1(spec: ModelSpec, seq: int):
    from trainmath.flops import count_flops

    return memo(spec, ("ledger1", seq), lambda: count_flops(spec, batch=1, seq=seq, causal="half"))


def _dropouts(spec: ModelSpec) -> dict:
    from trainmath.ops.context import Family

    fam = Family.from_config(spec.options, spec.family.config_defaults)
    return {"attention_dropout": fam.attention_dropout, "residual_dropout": fam.residual_dropout}


def _saved_inputs_bytes(spec: ModelSpec, layout: ParallelLayout, job: Job, layer: int,
                        exact_megatron: bool = False) -> int:
    """Bytes one micro-batch must keep for the backward of ``layer``, at least: the distinct inputs of its
    weight GEMMs (every profile saves a linear's input; q, k, v share one; routers and shared experts read the
    same tensor as the routed experts' gather, so they are left out) and the outputs of its widening GEMMs
    (k < n: column-parallel projections such as gate/up or fused QKV, whose outputs feed the activation function
    or attention, which save them — Korthikanti et al. 2022 §4.1 count them), or only the layer's input under
    full recomputation and under the hf profile's selective one. Sharded by cp (tokens) and by tp where tp
    splits it (the smaller figure when unsure). ``exact_megatron``: under the megatron profile, the layer's whole
    saved set instead (closed-form; sound when the gradients persist through the forward, i.e. with more than one
    micro-batch per step, so the last forward event holds the states, the gradients and all of it)."""
    c = get_precision(job.precision).compute_bytes
    tokens = job.micro_batch * job.seq // layout.cp
    sp = layout.tp if layout.sp else 1
    if job.profile == "megatron" and job.recompute != "full" and exact_megatron:
        # the megatron profile's per-layer saved bytes are closed-form (memory.megatron.layer_terms): exact
        from trainmath.memory.megatron import layer_terms

        kept, core = layer_terms(spec.layers[layer], b=job.micro_batch, s=job.seq, d=spec.hidden_size, t=layout.tp,
                                 sp=layout.sp, cp=layout.cp, x=c, flash=job.attention != "eager",
                                 **_dropouts(spec))
        return sum(n.value for n in kept) + (sum(n.value for n in core) if job.recompute == "none" else 0)
    if job.recompute == "full" or (job.recompute == "selective" and job.profile == "hf"):
        # (torchtitan's op-level policy keeps the layer input and some mm outputs, not every linear's input)
        return tokens * spec.hidden_size * c // sp
    lt = next(t for t in _ledger1(spec, job.seq).layer_types if layer in t.layers)
    seen, total = set(), 0
    for g in lt.gemms:
        if not g.weighted or g.component in ("router", "shared_experts") or (g.component, g.k) in seen:
            continue
        seen.add((g.component, g.k))
        k = g.k // layout.tp if g.k >= g.n else g.k // sp
        m = g.m * job.micro_batch // layout.cp
        total += m * k * c * g.count
        if g.k < g.n and g.component != "experts":  # a widening (column-parallel) GEMM: its output is saved too
            total += m * (g.n // layout.tp) * c * g.count
    return total


def memory_lower_bound(spec: ModelSpec, layout: ParallelLayout, job: Job) -> int:
    """A cheap lower bound of the memory model's peak: the busiest rank's model states after ZeRO (Rajbhandari
    et al. 2020, §5: ZeRO 1 shards master weights and optimizer states, 2 gradients, 3 weights), and on the first
    stage those plus the saved GEMM inputs of its min(pp, M) in-flight micro-batches (1F1B). Never above
    ``training_memory(...).peak_bytes`` (tests/perf check it on many layouts)."""
    return memory_lb(spec, layout, job, job.micro_batch, job.recompute)


def states_max(spec: ModelSpec, layout: ParallelLayout, job: Job) -> int:
    """Model-state bytes of the busiest rank after ZeRO."""
    return memo(spec, ("states_max", _states_key(layout), job.precision, job.optimizer, job.offload),
                lambda: max(states(spec, layout, job, s) for s in range(layout.pp)))


def memory_lb(spec: ModelSpec, layout: ParallelLayout, job: Job, mb: int, rc: str) -> int:
    worst = states_max(spec, layout, job)
    micro_batches = job.global_batch // (layout.dp * mb)
    in_flight = min(layout.pp, micro_batches)

    def first_stage() -> int:
        jb = replace(job, micro_batch=mb, recompute=rc)
        first = stage_layers(spec.num_layers, layout.pp, *layout.stage_split)[0]
        total = 0
        for lt in _ledger1(spec, job.seq).layer_types:  # layers of one type save the same
            n = sum(1 for i in lt.layers if i in first)
            if n:
                total += n * _saved_inputs_bytes(spec, layout, jb, lt.layers[0], micro_batches > 1)
        return total

    act = memo(spec, ("saved", layout.tp, layout.cp, layout.sp, layout.pp, layout.stage_split, mb, job.seq, rc,
                      job.precision,
                job.profile, job.attention, micro_batches > 1),
               first_stage) * in_flight
    return max(worst, states(spec, layout, job, 0) + act)


def time_lower_bound(spec, layout, job, gpu, eff, mb: int, rc: str, v: int) -> float:
    """(M + (pp − 1)/v) · per-micro-batch time of the busiest stage counting only compute and the tensor- and
    expert-parallel collectives (always exposed in the model): every other term of the step is ≥ 0."""
    def make():
        from trainmath.comm.twolevel import Topology
        from trainmath.perf import comm as cm
        from trainmath.perf.placement import placed_group

        c = get_precision(job.precision).compute_bytes
        per_layer, head = layer_times(spec, micro_batch=mb, seq=job.seq, layout=layout, gpu=gpu, eff=eff,
                                      recompute=rc, dtype=job.gemm_dtype, compute_bytes=c, attention=job.attention,
                                      profile=job.profile, fp8=job.fp8_gemms)
        stages = stage_layers(spec.num_layers, layout.pp, *layout.stage_split)
        topo = Topology.of_gpu(gpu, eff.link_fraction)
        tp_group = placed_group(layout.tp, 1, gpu.gpus_per_node)
        act = mb * job.seq // layout.cp * spec.hidden_size * c
        if layout.tp > 1:
            ops = ("reduce_scatter", "all_gather") if layout.sp else ("all_reduce",)
            one_tp = sum(cm.item("tp_comm", op, "tp", tp_group, act, 1, topo).time_s for op in ops)
        else:
            one_tp = 0.0
        passes = 3 if rc == "full" else 2
        one_ep = 0.0
        if layout.ep > 1:
            moe = next((b for layer in spec.layers for b in layer.blocks if b.kind == "moe"), None)
            if moe is not None:
                ep_group = placed_group(layout.ep, layout.tp, gpu.gpus_per_node)
                size = mb * job.seq // layout.cp * moe.dims.top_k * spec.hidden_size * c
                one_ep = 2 * cm.item("ep_comm", "all_to_all", "ep", ep_group, size, 1, topo).time_s
        def compute(s: int) -> float:
            ts = [per_layer[i] for i in stages[s]] + ([head] if s == layout.pp - 1 else [])
            return sum(t.forward_s + t.backward_s + t.recompute_s + t.fp8_cast_s for t in ts)

        busiest = max(range(layout.pp), key=compute)  # the stage the estimate charges, chosen the same way
        layers = stages[busiest]
        n_tp = sum(1 for i in layers for blk in spec.layers[i].blocks if blk.kind in _TP_BLOCKS)
        n_moe = sum(1 for i in layers for blk in spec.layers[i].blocks if blk.kind == "moe")
        return compute(busiest) + passes * (n_tp * one_tp + n_moe * one_ep)

    key = ("bound", layout.tp, layout.cp, layout.ep, layout.sp, layout.pp, layout.stage_split, mb, job.seq, rc,
           job.dtype,
           job.attention, job.precision, job.fp8_head, gpu, eff, job.profile)
    per_mb = memo(spec, key, make)
    m = job.global_batch // (layout.dp * mb)
    return (m + (layout.pp - 1) / v) * per_mb
