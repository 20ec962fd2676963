"""Step time of a training job on a cluster, and what it makes of the GPUs: tokens/s, TFLOP/s, MFU and HFU.

One step runs M = global_batch / (dp · micro_batch) micro-batches through the 1F1B pipeline schedule (Narayanan
et al. 2021, §2.2). The busiest stage sets the pace; per micro-batch it spends forward + backward + recompute
(``compute``) plus the communication that does not overlap (``comm``: tp, cp, ep, ZeRO-3). Then

    step = M · per_mb + bubble + pp fill/drain p2p + exposed gradient sync + exposed ZeRO gathers + optimizer
           + FSDP overhead (``fsdp``) + MoE per-expert overhead (``moe``)
    bubble = (pp − 1) / v · per_mb     (v virtual stages: interleaved 1F1B, Narayanan et al. 2021 §2.2.2, Eq. 2)

and the breakdown's entries sum to the step time. Utilisation conventions (stated in every result):

- MFU (Chowdhery et al. 2022, PaLM, Appendix B): the model's FLOPs per step — the GEMM ledger's forward and
  backward, no recomputation, attention counted ``mfu_causal`` — over step time × GPUs × dense peak;
- HFU: the FLOPs the GPUs execute, recomputation included (same attention convention), over the same;
- ``tflops_per_gpu`` is MFU's numerator per GPU per second; ``hardware_tflops_per_gpu`` HFU's.
"""

from __future__ import annotations

from dataclasses import replace
from math import gcd

from trainmath.comm.cost import Link
from trainmath.comm.twolevel import Topology
from trainmath.errors import TrainmathError
from trainmath.flops import count_flops
from trainmath.hardware import GPU, Hardware, presets
from trainmath.layout import ParallelLayout
from trainmath.model.spec import ModelSpec
from trainmath.perf import comm as cm
from trainmath.perf import dpsync
from trainmath.perf import moe as moe_terms
from trainmath.perf.attention import kernel_efficiency, kernel_text
from trainmath.perf.compute import FLASH_BACKWARD_FACTOR, FP8_CAST_TRANSPOSE_BYTES, layer_times, memo
from trainmath.perf.fsdp import fsdp_text, overhead_s, pipelined_fsdp, zero3_item
from trainmath.perf.job import Estimate, Job, job_problems
from trainmath.perf.placement import place_groups
from trainmath.placement import place, stage_layers
from trainmath.usable import rule_text, usable_bytes
from trainmath.vocabulary import MEMORY_ATTENTION, attention_as, get_precision

BREAKDOWN = ("forward", "backward", "recompute", "fp8_cast", "tp_comm", "cp_comm", "ep_comm", "zero3_comm",
             "pipeline_bubble", "pp_p2p", "dp_grad_sync", "zero_param_gather", "optimizer_step", "fsdp_overhead",
             "moe_overhead")
"""Every key of an estimate's ``breakdown`` (seconds), in order; their sum is ``step_time_s``."""

_TP_BLOCKS = ("attention", "mla", "linear_attention", "mamba", "mlp", "moe")
_OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "adam-amsgrad": 3, "adam8bit": 2, "adamw8bit": 2, "lion": 1,
                     "sgd-momentum": 1, "sgd": 0, "adafactor": 0}
"""Per-parameter state tensors the optimizer step reads and writes (adafactor's factored rows/columns: ~0)."""


def _layer_types(spec: ModelSpec):
    return memo(spec, ("layer_types",), spec.layer_groups)


def _flops_per_sequence(spec: ModelSpec, seq: int, causal: str, recompute: str, profile: str = "hf") -> int:
    """Executed FLOPs of one sequence. Selective recompute is the profile's: ``hf`` torchtitan's op-level policy
    (``count_flops``' own), ``megatron`` Korthikanti et al. 2022 §5's (the attention core forward again)."""
    def make() -> int:
        if recompute == "selective" and profile == "megatron":
            r = count_flops(spec, batch=1, seq=seq, causal=causal)
            return r.training_flops + r.forward.flat()["attention_core"]
        return count_flops(spec, batch=1, seq=seq, causal=causal, recompute=recompute).training_flops

    return memo(spec, ("flops", seq, causal, recompute, profile), make)


def stage_params(spec: ModelSpec, tp: int, pp: int, ep: int, stage: int,
                 split: tuple[int | None, int | None] = (None, None),
                 expert_tp: int | None = None) -> tuple[int, int, tuple[int, ...]]:
    """(dense, expert) parameters of one rank of ``stage`` before ZeRO, and each layer's (ZeRO-3 gathers).
    ``split``: the layout's (first, last) stage layers (``ParallelLayout.stage_split``); ``expert_tp``: the
    layout's ``expert_tp`` (default tp)."""
    folded = expert_tp is not None and expert_tp != tp
    if len(_layer_types(spec)) == 1 and 0 < stage < pp - 1:
        # one layer type: an inner stage is known by its length alone (no embeddings, no head)
        stages = memo(spec, ("stages", pp, split), lambda: stage_layers(spec.num_layers, pp, *split))
        twin = next(i for i in range(1, pp - 1) if len(stages[i]) == len(stages[stage]))
        if twin != stage:
            return stage_params(spec, tp, pp, ep, twin, split, expert_tp)

    def make():
        dp = ep // gcd(ep, tp) if folded else ep  # a dp with ep ∤ dp but ep | tp·dp: expert TP 1
        p = place(spec, ParallelLayout(tp=tp, pp=pp, ep=ep, dp=dp, first_stage_layers=split[0],
                                       last_stage_layers=split[1]), stage)
        units = p.unit_params()
        return p.dense_params, p.expert_params, tuple(units.get(f"layer.{i}", 0) for i in p.layers)

    return memo(spec, ("params", tp, pp, ep, stage, split, folded), make)


def _overlapped_ep(it: cm.CommItem, micro_batches: int, parts: list[tuple[float, float, float, float]],
                   passes: int, sm_share: float = 0.0) -> cm.CommItem:
    """The EP all-to-all under Megatron-Core's combined 1F1B (``Job.ep_overlap``). Each MoE layer runs one
    micro-batch's forward beside the previous one's backward in three phases
    (NVIDIA/Megatron-LM ``megatron/core/models/common/model_chunk_schedule_plan.py``@01cf4fb,
    ``TransformerLayerSchedulePlan.run``):

        comm stream:    combine_bwd | dispatch_fwd → dispatch_bwd  | combine_fwd
        compute stream: attn_fwd    | mlp_bwd → mlp_bwd_dw → mlp_fwd | attn_bwd

    so with one all-to-all taking a, a layer pair exposes max(0, a − attn_fwd) + max(0, 2a − mlp_bwd − mlp_fwd)
    + max(0, a − attn_bwd). ``parts`` holds (attn_fwd, mlp_fwd, attn_bwd, mlp_bwd) per MoE layer of the stage
    (the ``mlp`` node: the expert GEMMs and permutations, ``LayerTime.moe_forward_s``; ``attn``: the rest of the
    layer). The M − 1 steady pairs expose that; the first forward and the last backward have no partner, so one
    micro-batch's all-to-all is exposed whole; a recompute's forward all-to-all (``passes`` 3) is not paired.

    ``sm_share`` (``moe.overlap_sm_share``): the communication kernels hold that share of the SMs, so the compute
    beside them runs at 1 − share of its rate while they run. A phase of communication c beside compute x then
    takes x + max(c − x, share · c) (derived: if c ≥ x / (1 − share) the compute finishes inside the
    communication, c − x exposed; otherwise the compute loses share · c), so each phase exposes
    max(c − x, share · c); share 0 gives max(0, c − x)."""
    total = it.time_s
    a = total / it.count if it.count else 0.0

    def phase(c: float, x: float) -> float:
        return max(0.0, c - x, sm_share * c)

    pair = sum(phase(a, af) + phase(2 * a, mb + mf) + phase(a, ab) for af, mf, ab, mb in parts)
    pair += (passes - 2) * 2 * a * len(parts)
    exposed = min(total, total / micro_batches + (micro_batches - 1) * pair)
    return cm.CommItem(**{**it.__dict__, "exposed_s": exposed})


def _split_text(stages, layout: ParallelLayout) -> str:
    sizes = [len(r) for r in stages]
    if len(set(sizes)) == 1:
        return f"{sizes[0]} each"
    if layout.stage_split == (None, None):
        return "/".join(map(str, sizes)) + " (uneven: the first L mod pp stages one layer longer)"
    return "/".join(map(str, sizes)) + " (first/last as Megatron-LM's --decoder-first/last-pipeline-num-layers)"


def _fp8_conventions(job: Job) -> tuple[str, ...]:
    if job.fp8_gemms == "none":
        return ()
    head = "the LM head too" if job.fp8_head else "attention cores, norms and the LM head in BF16"
    return (f"precision fp8 (Transformer Engine's recipe): fprop, dgrad and wgrad of the decoder's linear layers "
            f"in FP8 at the FP8 peak on the same efficiency curve (1-byte operands in the roofline); {head}; "
            f"casts memory-bound, {FP8_CAST_TRANSPOSE_BYTES} bytes per element (fused cast-transpose with amax: "
            f"read 16-bit, write FP8 and its transpose) per linear input and output gradient each micro-batch, "
            f"per weight once per step (fp8_cast); memory counted as mixed-bf16 plus the FP8 weight copies, "
            f"and under the megatron profile TE's linear inputs saved in FP8 (memory/te_fp8.py)",)


def memory_recompute(job: Job) -> str:
    """The recompute setting the memory model is asked with: the job's own. The attention kernel is passed as
    itself (``flash`` → ``sdpa``: the megatron profile keeps flash's logsumexp, no s² tensor; ``eager``: the
    unfused softmax of Korthikanti et al. 2022 Table 2)."""
    return job.recompute


def timed_recompute(job: Job) -> str:
    """The recompute the step times: the job's, except Megatron-Core's ``--recompute-modules`` without
    ``core_attn``, whose recompute (MLA's up-projection GEMMs, the norms', the experts' activation) is not
    timed: ``none``. The memory model reads the modules (``memory.megatron_recompute``)."""
    if job.recompute == "selective" and job.recompute_modules and "core_attn" not in job.recompute_modules:
        return "none"
    return job.recompute


def _profile_text(profile: str) -> str:
    from trainmath.memory.training import PROFILE_TEXT

    return PROFILE_TEXT[profile]


def memory_peak_bytes(spec: ModelSpec, layout: ParallelLayout, job: Job, micro_batches: int) -> int:
    """``training_memory(...).peak_bytes`` for ``job`` on ``layout`` (the memory model's entry point)."""
    from trainmath.memory.training import TrainingSetup, training_memory

    setup = TrainingSetup(micro_batch=job.micro_batch, seq=job.seq, precision=job.precision,
                          optimizer=job.optimizer, recompute=memory_recompute(job), profile=job.profile,
                          attention=attention_as(job.attention, MEMORY_ATTENTION), micro_batches=micro_batches,
                          offload=job.offload, recompute_saves=tuple(job.recompute_saves),
                          recompute_modules=tuple(job.recompute_modules), cross_entropy_fusion=job.cross_entropy_fusion,
                          zero_impl=job.zero_impl,
                          offload_layers=job.offload_layers, fp8_param_gather=job.fp8_param_gather)
    return training_memory(spec, setup, layout).peak_bytes


def estimate(spec: ModelSpec, layout: ParallelLayout, job: Job, gpu: GPU, *, hardware: Hardware | None = None,
             memory: bool = True, peak_bytes: int | None = None, validate: bool = True) -> Estimate:
    """The step of ``job`` on ``layout`` over dp·tp·pp·cp GPUs of type ``gpu`` (see the module docstring).
    ``memory=False`` skips the memory model (``peak_bytes`` and ``fits`` None) unless ``peak_bytes`` is given;
    ``validate=False`` skips ``job_problems`` (the planner has checked). A fine-tune (``job.peft``) is timed by
    ``perf.peft``."""
    if job.peft is not None:
        from trainmath.perf.peft import peft_estimate

        return peft_estimate(spec, layout, job, gpu, hardware=hardware, memory=memory, peak_bytes=peak_bytes,
                             validate=validate)
    bad = job_problems(spec, layout, job) if validate else []
    if bad:
        raise TrainmathError(f"impossible job ({layout.describe()}, micro-batch {job.micro_batch}, "
                             f"{job.virtual_stages} virtual stages) for {spec.name}: " + "; ".join(bad))
    eff = (hardware or presets()).efficiency(gpu)
    prec = get_precision(job.precision)
    c = prec.compute_bytes
    topo = Topology.of_gpu(gpu, eff.link_fraction)
    groups = place_groups(layout, gpu.gpus_per_node)
    M = job.micro_batches(layout.dp)
    kernel_eff = kernel_efficiency(eff, job.flash_kernel) if job.attention == "flash" else eff
    per_layer, head = layer_times(spec, micro_batch=job.micro_batch, seq=job.seq, layout=layout, gpu=gpu,
                                  eff=kernel_eff,
                                  recompute=timed_recompute(job), dtype=job.gemm_dtype, compute_bytes=c,
                                  attention=job.attention, profile=job.profile, fp8=job.fp8_gemms,
                                  moe_imbalance=job.moe_imbalance)
    stages = stage_layers(spec.num_layers, layout.pp, *layout.stage_split)

    def stage_time(s: int) -> tuple[float, float, float, float]:
        ts = [per_layer[i] for i in stages[s]] + ([head] if s == layout.pp - 1 else [])
        return (sum(t.forward_s for t in ts), sum(t.backward_s for t in ts), sum(t.recompute_s for t in ts),
                sum(t.fp8_cast_s for t in ts))

    times = [stage_time(s) for s in range(layout.pp)]
    busiest = max(range(layout.pp), key=lambda s: sum(times[s]))
    f, b, r, cast = times[busiest]
    weight_cast_bytes = sum(t.fp8_weight_cast_bytes for t in [per_layer[i] for i in stages[busiest]]
                            + ([head] if busiest == layout.pp - 1 else []))
    weight_cast_s = weight_cast_bytes / (gpu.hbm_bytes_per_s * eff.hbm_fraction)
    layers = stages[busiest]
    dense_p, expert_p, layer_p = stage_params(spec, layout.tp, layout.pp, layout.ep, busiest, layout.stage_split,
                                              layout.expert_tp)

    # ---- per micro-batch communication on the busiest stage --------------------------------------------
    tokens = job.micro_batch * job.seq // layout.cp
    act = tokens * spec.hidden_size * c
    items: list[cm.CommItem] = []
    n_tp = sum(1 for i in layers for blk in spec.layers[i].blocks if blk.kind in _TP_BLOCKS)
    passes = 2 + (1 if timed_recompute(job) == "full" else 0)  # forward, backward, forward again
    if layout.sp and layout.tp > 1:
        items.append(cm.item("tp_comm", "reduce_scatter", "tp", groups.tp, act, M * n_tp * passes, topo))
        items.append(cm.item("tp_comm", "all_gather", "tp", groups.tp, act, M * n_tp * passes, topo))
    else:
        items.append(cm.item("tp_comm", "all_reduce", "tp", groups.tp, act, M * n_tp * passes, topo))
    if layout.cp > 1:
        ring: dict[tuple[int, float], int] = {}  # (K+V bytes per rank, attention forward s) → layers like it
        for i in layers:
            for blk in spec.layers[i].blocks:
                if blk.kind in ("attention", "mla"):
                    d = blk.dims
                    kv = (d.kv_heads * (d.head_dim + d.v_head_dim) if blk.kind == "attention"
                          else d.heads * (d.qk_head_dim + d.v_head_dim)) // layout.tp
                    key = (tokens * kv * c, per_layer[i].attention_forward_s)
                    ring[key] = ring.get(key, 0) + 1
        steps = layout.cp - 1
        for (size, attn), count in ring.items():
            items.append(cm.item("cp_comm", "send_recv", "cp", groups.cp, size, M * steps * count, topo,
                                 hidden_behind_s=M * attn * count))
            items.append(cm.item("cp_comm", "send_recv", "cp", groups.cp, 2 * size, M * steps * count, topo,
                                 hidden_behind_s=M * attn * count * FLASH_BACKWARD_FACTOR))
    moe = [blk for i in layers for blk in spec.layers[i].blocks if blk.kind == "moe"]
    if layout.ep > 1 and moe:
        # dispatch and combine per MoE layer and pass; the busiest rank receives moe_imbalance × the mean
        # (expert TP 1: each rank dispatches only its sequence-parallel 1/tp of the tokens)
        size = (tokens / (layout.tp // layout.expert_tp) * moe[0].dims.top_k * spec.hidden_size * c
                * job.moe_imbalance)
        ep_topo = topo
        if job.ep_dispatcher == "deepep":  # one RDMA copy per destination node (its cross-node share dominates)
            size *= moe_terms.deepep_node_share(moe[0].dims.experts, moe[0].dims.top_k, groups.ep.nodes)
            nic = moe_terms.DEEPEP_NIC_FRACTION.get(gpu.generation)
            if nic is not None:  # DeepEP's measured NIC rate, not NCCL's link fraction
                ep_topo = replace(topo, inter=Link(alpha_s=topo.inter.alpha_s,
                                                   bandwidth_bytes_per_s=gpu.inter_node_bytes_per_s * nic))
        items.append(cm.item("ep_comm", "all_to_all", "ep", groups.ep, size, M * len(moe) * 2 * passes, ep_topo))
        if job.ep_overlap and M > 1:
            moe_layers = [per_layer[i] for i in layers if any(blk.kind == "moe" for blk in spec.layers[i].blocks)]
            parts = [(t.forward_s - t.moe_forward_s, t.moe_forward_s,
                      t.backward_s + t.recompute_s - t.moe_backward_s, t.moe_backward_s) for t in moe_layers]
            items[-1] = _overlapped_ep(items[-1], M, parts, passes, moe_terms.overlap_sm_share(gpu.generation))
    if layout.pp > 1:
        size = act / layout.tp
        items.append(cm.item("pp_p2p", "send_recv", "pp", groups.pp, size, 2 * M * job.virtual_stages, topo,
                             hidden_behind_s=0.0, floor_s=0.0))
        one = items[-1].time_s / items[-1].count if items[-1].count else 0.0
        items[-1] = cm.CommItem(**{**items[-1].__dict__, "exposed_s": 2 * (layout.pp - 1) * one})

    # ---- gradient sync and ZeRO -------------------------------------------------------------------------
    g, w = prec.grad_bytes, prec.weight_bytes
    for kind, params, group, gname in (("dense", dense_p, groups.dp, "dp"),
                                       ("expert", expert_p, groups.expert_dp, "expert_dp")):
        if not params or group.size == 1:
            continue
        if layout.zero in (0, 1, 2):
            items += dpsync.sync_items(spec, layout, job, kind=kind, params=params, group=group, gname=gname,
                                       topo=topo, stage=busiest, layers=layers, per_layer=per_layer,
                                       head=head if busiest == layout.pp - 1 else None, grad_bytes=g,
                                       weight_bytes=w, micro_batches=M, forward_s=f, last_backward_s=b + r)
        else:
            items.append(zero3_item(gname, group, topo, params / max(1, dense_p + expert_p), layers, layer_p,
                                    dense_p + expert_p, per_layer, head if busiest == layout.pp - 1 else None,
                                    w, g, M, pipelined=pipelined_fsdp(layout)))

    # ---- optimizer step (memory-bound) ------------------------------------------------------------------
    states = _OPTIMIZER_STATES.get(job.optimizer, 2)
    per_param = g + 2 * prec.master_bytes + 2 * states * prec.state_bytes + w
    opt_params = (dense_p / dpsync.optimizer_shard(layout, job, "dense")
                  + expert_p / dpsync.optimizer_shard(layout, job, "expert"))
    optimizer_s = opt_params * per_param / (gpu.hbm_bytes_per_s * eff.hbm_fraction)

    # ---- assemble -----------------------------------------------------------------------------------------
    per_mb_comm = {k: 0.0 for k in ("tp_comm", "cp_comm", "ep_comm", "zero3_comm")}
    once = {k: 0.0 for k in ("pp_p2p", "dp_grad_sync", "zero_param_gather")}
    for it in items:
        (per_mb_comm if it.name in per_mb_comm else once)[it.name] += it.exposed_s
    # a pipeline stage's FSDP collectives run once per step (perf/fsdp.py, pipelined_time): not in every micro-batch
    in_mb = {k: v for k, v in per_mb_comm.items() if not (k == "zero3_comm" and pipelined_fsdp(layout))}
    per_mb = f + b + r + cast + sum(in_mb.values()) / M
    bubble = (layout.pp - 1) / job.virtual_stages * per_mb
    accumulate_s = dpsync.accumulation_s(job, layout, dense_p + expert_p, g, gpu.hbm_bytes_per_s * eff.hbm_fraction,
                                         M)
    breakdown = {"forward": M * f, "backward": M * b + accumulate_s, "recompute": M * r,
                 "fp8_cast": M * cast + weight_cast_s,
                 **per_mb_comm,
                 "pipeline_bubble": bubble, **once, "optimizer_step": optimizer_s,
                 "fsdp_overhead": overhead_s(gpu.generation, len(layers) + 1, M, 2 + (timed_recompute(job) == "full"))
                 if (layout.zero == 3 or (job.fsdp and layout.zero == 2)) and layout.zero_degree > 1 else 0.0,
                 "moe_overhead": moe_terms.overhead_s(gpu.generation, len(moe), M, passes,
                                                  moe[0].dims.experts // layout.ep if moe else 0)}
    breakdown = {k: breakdown[k] for k in BREAKDOWN}
    step = sum(breakdown.values())

    n = layout.ranks
    model_flops = _flops_per_sequence(spec, job.seq, job.mfu_causal, "none") * job.global_batch
    hw_flops = _flops_per_sequence(spec, job.seq, job.mfu_causal, timed_recompute(job), job.profile) \
        * job.global_batch
    peak = gpu.peak_flops_per_s(job.dtype)
    if peak_bytes is None and memory:
        peak_bytes = memory_peak_bytes(spec, layout, job, M)
    fits = None if peak_bytes is None else peak_bytes <= usable_bytes(gpu.memory_bytes, job.mem_util_percent)
    conventions = (
        f"MFU: model FLOPs (GEMM ledger forward + backward, no recompute, attention causal={job.mfu_causal}) / "
        f"(step time · {n} GPUs · dense {job.dtype} peak {peak / 1e12:.1f} TFLOP/s)",
        f"HFU: executed FLOPs (recompute={job.recompute} included, same attention convention) / the same",
        f"compute at the {gpu.generation} efficiency curve (gpus.json 'generations'); flash attention skips "
        f"causally masked blocks"
        + (f"; {kernel_text(eff, job.flash_kernel)}" if job.attention == "flash" else ""),
        *_fp8_conventions(job),
        f"1F1B pipeline, {job.virtual_stages} virtual stage(s): bubble (pp - 1)/v micro-batch times of the slowest "
        f"stage; layers per stage {_split_text(stages, layout)}",
        f"groups placed tp-cp-ep-dp-pp on nodes of {gpu.gpus_per_node} GPUs; links at {eff.link_fraction:.0%} of "
        f"datasheet bandwidth",
        "TP/EP collectives exposed; "
        + (dpsync.dpsync_text(job) or "DP/ZeRO gradient sync overlapped with the last backward except one 25 MiB "
                                      "bucket"),
        f"ZeRO-3/FSDP: per-unit (each layer, plus the root) all-gather before forward and backward and "
        f"reduce-scatter after backward, prefetched one unit ahead; fixed overhead {fsdp_text(gpu.generation)}",
        *((moe_terms.moe_text(gpu.generation, job.moe_imbalance, cm.link_of(groups.ep), layout.ep,
                              groups.ep.local),) if moe else ()),
        *((f"MoE activation clamp (gpt-oss's swiglu_limit) as Megatron-Core runs it, eager before the fused "
           f"activation: {moe_terms.CLAMP_HALF_COPIES[0]} forward and {moe_terms.CLAMP_HALF_COPIES[1]} backward "
           f"copies of half the experts' fc1 output, memory-bound",)
          if moe and moe[0].dims.activation_clamp else ()),
        *((f"EP dispatcher DeepEP: one RDMA copy per token per destination node, the all-to-all's bytes × "
           f"{moe_terms.deepep_node_share(moe[0].dims.experts, moe[0].dims.top_k, groups.ep.nodes):.3f} "
           f"(experts spread evenly, top-k uniform)"
           + (f"; across nodes at DeepEP's measured {moe_terms.DEEPEP_NIC_FRACTION[gpu.generation]:.0%} of the NIC "
              f"rate (its README, EP 32 on H800), not the {eff.link_fraction:.0%} link fraction"
              if gpu.generation in moe_terms.DEEPEP_NIC_FRACTION else ""),)
           if moe and job.ep_dispatcher == "deepep" and layout.ep > 1 else ()),
        *(("EP all-to-all overlapped with the other micro-batch's forward and backward (Megatron-Core combined "
           "1F1B, --overlap-moe-expert-parallel-comm), per layer in three phases: combine_bwd beside attn_fwd, "
           "dispatch_fwd + dispatch_bwd beside mlp_bwd + mlp_fwd, combine_fwd beside attn_bwd; each phase exposes "
           "what its compute cannot cover, and one micro-batch's all-to-all has no partner"
           + (f"; the communication kernels hold {moe_terms.OVERLAP_COMM_SMS} of the "
              f"{moe_terms.SMS[gpu.generation]} SMs, so a phase exposes at least "
              f"{moe_terms.overlap_sm_share(gpu.generation):.1%} of its communication time (the compute beside it "
              f"slowed)" if moe_terms.overlap_sm_share(gpu.generation) else ""),)
          if moe and job.ep_overlap and layout.ep > 1 else ()),
        f"optimizer step memory-bound over the rank's shard: {per_param} bytes per parameter (grad read, master "
        f"read+write, {states} state(s) read+write, weight write) at {eff.hbm_fraction:.0%} of HBM bandwidth",
        f"memory: the {job.profile} activation profile ({_profile_text(job.profile)}) with recompute={job.recompute}, "
        f"{job.attention} attention"
        + f"; {rule_text(gpu.memory_bytes, job.mem_util_percent)}",
    )
    est = Estimate(model=spec.name, gpu=gpu.name, gpus=n, layout=layout, job=job, micro_batches=M,
                   step_time_s=step, breakdown=breakdown, comm=tuple(items), groups=groups,
                   model_flops=model_flops, hardware_flops=hw_flops, peak_flops_per_s=peak,
                   peak_bytes=peak_bytes, memory_bytes=gpu.memory_bytes,
                   fits=fits, conventions=conventions, stage_times_s=tuple(sum(t) for t in times),
                   stage_layers=tuple(len(r) for r in stages))
    if job.offload == "none":
        return est
    from trainmath.perf.offload import with_offload

    return with_offload(est, spec, layout, job, gpu, host=peak_bytes is not None,
                        shard_params=dense_p // layout.zero_degree + expert_p // layout.expert_zero_degree)
