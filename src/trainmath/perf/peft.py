"""Step time of a LoRA / QLoRA fine-tune: the fine-tune's FLOPs, priced per op class.

The GEMMs are ``flops.peft.peft_rows``' (the same rows ``trainmath flops --peft`` sums, so the step's FLOPs equal
its count), each priced as full training prices its kind (``perf.compute``):

- a frozen base Linear runs its forward (fprop) and, when its input needs a gradient, the input's gradient
  (dgrad): one GEMM of the forward's shape; no weight-gradient GEMM (wgrad). Full training runs three: the frozen
  base costs 2/3 of full training's GEMM time where every input needs a gradient;
- the adapters' GEMMs (lora_A: m × in × r, lora_B: m × r × out, and their backward's weight and input gradients)
  are tiny in r: ``gemm_time_s`` prices them on its small-shape efficiency u(r) = r / (r + gemm_half_dim) and the
  HBM roofline (streaming the m × in input for an r-wide output is memory-bound);
- the attention core: flash, the forward at ``attention_peak_fraction`` of peak on the causal half, the backward
  FlashAttention-2's 2.5× when any of Q, K, V needs a gradient (its kernel computes all three), else none; eager,
  each product's GEMMs as counted plus the score tensors' HBM traffic;
- the LM head: fprop + dgrad (frozen); memory-bound ops (norms, activations, residuals) as full training's;
- QLoRA: ``bnb.matmul_4bit`` dequantises each 4-bit weight to bf16 before every product that reads it (forward,
  input gradient, recompute): a memory-bound kernel reading the weight's NF4 storage (``qlora.nf4_storage``:
  packed 4-bit, absmax, double-quantised absmax, code tables) and writing its bf16 copy, at ``hbm_fraction`` of
  the bandwidth (``qlora_dequant`` in the breakdown);
- the optimizer step over the trainable parameters only, memory-bound; the data-parallel gradient sync over the
  adapters' gradients only (all-reduce, or ZeRO-1/2's reduce-scatter and all-gather), overlapped with the last
  backward as full training's.

MFU counts the fine-tune's executed FLOPs (``flops --peft``: no weight gradients of the frozen base, the adapters'
GEMMs, attention as ``mfu_causal``), not full training's 6N: the same job's MFU is lower than a pretraining MFU
of the same GPU speed would suggest, because a third of the work is never done.

Layouts: one device, DDP, ZeRO-1/2 and ZeRO-3 / FSDP2 (the memory model's, ``memory.peft``). Under FSDP2 every
unit's parameters, frozen or not, are all-gathered before its forward and again before its backward, and only
the adapters' gradients are reduce-scattered (``perf.peft_fsdp``), plus full training's fitted FSDP overhead per
unit pass (``perf.fsdp.overhead_s``). Tensor, pipeline, context and expert parallelism are refused in one line.

Routed-expert and router targets (peft's ``target_parameters``): the experts' GEMMs take their weight gradient
(``base_wgrad``, priced as the forward GEMM of the same shape), and the ``ParamWrapper``'s product (W + B·A, a
batched GEMM of E × a × r × b, twice per forward for a 3-d stack: ``flops.peft.delta_evaluations``) is an adapter
GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.adapters import ADAPTER_DTYPES
from trainmath.comm.twolevel import Topology
from trainmath.errors import TrainmathError
from trainmath.hardware import GPU, Hardware, presets
from trainmath.perf import comm as cm
from trainmath.perf import moe as moe_terms
from trainmath.perf.compute import EAGER_SCORE_BYTES, FLASH_BACKWARD_FACTOR, gemm_time_s, memo
from trainmath.perf.fsdp import fsdp_text, overhead_s
from trainmath.perf.job import Estimate, Job, job_problems
from trainmath.perf.placement import place_groups
from trainmath.qlora import nf4_storage
from trainmath.usable import rule_text, usable_bytes
from trainmath.vocabulary import MEMORY_ATTENTION, attention_as, get_precision

CLASSES = ("base_fprop", "base_dgrad", "base_wgrad", "adapter_forward", "adapter_backward", "attention_forward",
           "attention_backward", "head_fprop", "head_dgrad", "recompute")
"""The op classes of the compute decomposition (``Estimate.peft["compute"]``): each has FLOPs and seconds."""
FORWARD = ("base_fprop", "adapter_forward", "attention_forward", "elementwise_forward")
BACKWARD = ("base_dgrad", "base_wgrad", "adapter_backward", "attention_backward", "elementwise_backward")
"""A layer's forward and backward classes (the head's are added once per micro-batch)."""
MEMORY_CLASSES = ("elementwise_forward", "elementwise_backward", "elementwise_recompute", "qlora_dequant")
"""Memory-bound classes (no FLOPs): norms, activations and residuals (backward twice the forward's bytes, as
full training's), and QLoRA's dequantisation."""
BREAKDOWN = ("forward", "backward", "recompute", "qlora_dequant", "fp8_cast", "tp_comm", "cp_comm", "ep_comm",
             "zero3_comm", "pipeline_bubble", "pp_p2p", "dp_grad_sync", "zero_param_gather", "optimizer_step",
             "fsdp_overhead", "moe_overhead")
"""A fine-tune's breakdown: full training's keys (``perf.step.BREAKDOWN``) and ``qlora_dequant``."""
_STATES = {"adam": 2, "adamw": 2, "adam-amsgrad": 3, "adam8bit": 2, "adamw8bit": 2, "lion": 1, "sgd-momentum": 1,
           "sgd": 0, "adafactor": 0}


def layout_problems(layout) -> list[str]:
    """Why the step-time model cannot time a fine-tune on ``layout``; empty when it can."""
    bad = []
    if layout.tp > 1 or layout.pp > 1 or layout.cp > 1 or layout.ep > 1:
        bad.append("--peft step time is modelled on one device, DDP, ZeRO-1/2 and ZeRO-3/FSDP2: not with "
                   "tp/pp/cp/ep > 1")
    return bad


def job_peft_problems(job: Job) -> list[str]:
    """Why the fine-tune ``job.peft`` cannot be timed with the job's other settings (each a full sentence)."""
    from trainmath.memory.peft import QLORA_PRECISIONS

    bad = []
    if job.recompute == "selective":
        bad.append("--peft is timed with --recompute none or full, not selective")
    if job.precision == "fp8" or job.dtype != "bf16":
        bad.append("--peft is timed with bf16 GEMMs: --precision fp8 and --dtype fp8 are not modelled")
    if job.offload == "params":
        bad.append("--peft with --offload params is not modelled (ZeRO-Infinity offloads the frozen base too, "
                   "outside the optimizer's groups): use --offload optimizer with ZeRO-1/2")
    if job.profile != "hf":
        bad.append("--peft is modelled with the hf activation profile (transformers' saved tensors): pass "
                   "--profile hf")
    if job.peft.job.method == "qlora" and job.precision not in QLORA_PRECISIONS:
        bad.append(f"--peft qlora runs a bf16 model over its 4-bit weights (bnb_4bit_compute_dtype bf16): pass "
                   f"--precision bf16, not {job.precision}")
    return bad


def peft_problems(layout, job: Job) -> list[str]:
    """Every reason the step-time model cannot time this fine-tune; empty when it can."""
    bad = layout_problems(layout) + job_peft_problems(job)
    if job.offload == "optimizer" and layout.zero >= 3 and layout.zero_degree > 1:
        bad.append("--peft with --offload optimizer is timed as DeepSpeed ZeRO-Offload over ZeRO-1/2: peft's "
                   "ZeRO-3 is FSDP2, whose CPUOffloadPolicy is not modelled")
    if layout.zero >= 3 and layout.zero_degree > 1 and job.peft.job.method == "qlora":
        bad.append("--peft qlora with ZeRO-3/FSDP2 is not modelled: bitsandbytes' Params4bit is not a tensor "
                   "fully_shard can shard; use --zero 0-2")
    return bad


@dataclass
class _Sum:
    """FLOPs and seconds per op class of one micro-batch, and the dequantised elements."""

    flops: dict
    seconds: dict
    dequant_elements: int = 0
    layers: list = None
    """Per layer, in order: (forward, backward, recompute) seconds of its compute (``perf.peft_fsdp``'s chain)."""

    def add(self, cls: str, flops: float, seconds: float, times: int = 1) -> None:
        self.flops[cls] = self.flops.get(cls, 0) + int(flops) * times
        self.seconds[cls] = self.seconds.get(cls, 0.0) + seconds * times


def _rows(spec, pj, micro_batch: int, seq: int, causal: str, input_grads: bool):
    from trainmath.flops.peft import peft_rows

    return memo(spec, ("peft_rows", pj, micro_batch, seq, causal, input_grads),
                lambda: peft_rows(spec, pj, batch=micro_batch, seq=seq, causal=causal, input_grads=input_grads))


def micro_batch_compute(spec, job: Job, gpu: GPU, eff, input_grads: bool) -> _Sum:
    """Per op class, the FLOPs and seconds of one micro-batch on one device (see the module docstring)."""
    from trainmath.flops.peft import LORA

    pj = job.peft.job
    flash = job.attention == "flash"
    groups, head = _rows(spec, pj, job.micro_batch, job.seq, "half" if flash else "executed", input_grads)
    hbm = gpu.hbm_bytes_per_s * eff.hbm_fraction
    tokens = job.micro_batch * job.seq
    elem_fwd = eff.elementwise_bytes_per_token_per_hidden * tokens * spec.hidden_size / hbm
    qlora = pj.method == "qlora"
    out = _Sum(flops={c: 0 for c in CLASSES}, seconds={c: 0.0 for c in CLASSES + MEMORY_CLASSES})
    full = job.recompute == "full"
    out.layers = []
    for lr in groups:
        n = lr.count
        before = dict(out.seconds)
        block = next((b for b in lr.layer.blocks if b.kind == "moe"), None)
        experts = block.dims.experts if block else 0
        moe_f = moe_b = 0.0  # permutations, router and a clamped activation, forward and backward (as full training's)
        if block:
            moe_f = moe_b = moe_terms.dispatch_memory_s(moe_terms.dispatch_bytes(
                tokens, block.dims.top_k, spec.hidden_size, experts, 2, job.moe_imbalance), gpu, eff)
            if block.dims.activation_clamp:
                cf, cb = moe_terms.clamp_bytes(tokens, block.dims.top_k, block.dims.expert_intermediate, 2,
                                               job.moe_imbalance)
                moe_f += moe_terms.dispatch_memory_s(cf, gpu, eff)
                moe_b += moe_terms.dispatch_memory_s(cb, gpu, eff)
        out.add("elementwise_forward", 0, elem_fwd + moe_f, n)
        out.add("elementwise_backward", 0, 2 * elem_fwd + moe_b, n)
        out.add("elementwise_recompute", 0, elem_fwd + moe_f if full else 0.0, n)
        dq = 0
        for row in lr.rows:
            g = row.gemm
            if g.component == "attention_core":
                if flash:
                    t = g.flops / (gpu.peak_flops_per_s("bf16") * eff.attention_peak_fraction)
                    tb = FLASH_BACKWARD_FACTOR * t if row.backward_flops else 0.0
                else:
                    t = gemm_time_s(g.m, g.k, g.n, g.count, g.flops, gpu, eff)
                    if g.name.endswith("scores"):
                        t += g.count * g.m * g.n * EAGER_SCORE_BYTES / hbm
                    tb = t * row.backward_flops / row.forward_flops  # each operand's gradient a GEMM alike
                cls = "attention"
            else:
                if g.component == "experts" and experts:
                    t = moe_terms.expert_gemm_time_s(g.m / experts, g.k, g.n, experts, g.flops, gpu, eff,
                                                     imbalance=job.moe_imbalance)
                else:
                    t = gemm_time_s(g.m, g.k, g.n, g.count, g.flops, gpu, eff)
                tb = t * row.backward_flops / row.forward_flops  # dgrad (and wgrad) GEMMs of the forward's shape
                cls = "adapter" if g.component == LORA else "base"
            if cls == "base":
                dgrad = row.backward_flops - row.wgrad_flops
                out.add("base_fprop", row.forward_flops, t, n)
                out.add("base_dgrad", dgrad, t * dgrad / row.forward_flops, n)
                out.add("base_wgrad", row.wgrad_flops, t * row.wgrad_flops / row.forward_flops, n)
            else:
                out.add(f"{cls}_forward", row.forward_flops, t, n)
                out.add(f"{cls}_backward", row.backward_flops, tb, n)
            if full:
                out.add("recompute", row.forward_flops, t, n)
            if qlora and row.dequant_numel:
                dq += row.dequant_numel * (1 + (1 if row.backward_flops else 0))
        if qlora and full:
            dq += lr.recompute_dequant
        out.dequant_elements += dq * n
        d = {c: (out.seconds[c] - before[c]) / n for c in out.seconds}
        out.layers += [(sum(d[c] for c in FORWARD), sum(d[c] for c in BACKWARD), d["recompute"]
                        + d["elementwise_recompute"])] * n
    for g in head:
        t = gemm_time_s(g.m, g.k, g.n, g.count, g.flops, gpu, eff)
        out.add("head_fprop", g.flops, t)
        out.add("head_dgrad", g.flops, t)  # the input's gradient only: the head is frozen
    if qlora:
        out.seconds["qlora_dequant"] = dequant_bytes(spec, groups, full) / hbm
    return out


def _zero3(spec, job: Job, layout, topo, group, mb: _Sum, micro_batches: int):
    """FSDP2's gathers of the frozen base and reduce-scatters of the adapters (``perf.peft_fsdp``)."""
    from trainmath.params import count_params
    from trainmath.perf.peft_fsdp import layer_adapter_params, zero3_item

    layer_p = [sum(t.numel * t.copies for t in layer.tensors) for layer in spec.layers]
    return zero3_item(group, topo, layer_params=layer_p, adapter_params=layer_adapter_params(spec, job.peft.job),
                      root_params=count_params(spec).total_params - sum(layer_p), layer_s=mb.layers,
                      head_backward_s=mb.seconds["head_dgrad"], weight_bytes=get_precision(job.precision).weight_bytes,
                      adapter_bytes=ADAPTER_DTYPES[job.peft.job.dtype], micro_batches=micro_batches)


def dequant_bytes(spec, groups, recompute_full: bool) -> int:
    """HBM bytes of QLoRA's dequantisation in one micro-batch: per use of each 4-bit weight, its NF4 storage read
    and its bf16 copy written (2 bytes per element)."""
    total = 0
    for lr in groups:
        per_layer = 0
        for row in lr.rows:
            if row.dequant_numel:
                one = nf4_storage(row.dequant_numel)["total"] + 2 * row.dequant_numel
                per_layer += one * (1 + (1 if row.backward_flops else 0))
        if recompute_full:
            per_layer += sum(nf4_storage(r.dequant_numel)["total"] + 2 * r.dequant_numel
                             for r in lr.rows if r.dequant_numel)
        total += per_layer * lr.count
    return total


def _fine_tune_flops(spec, pj, seq: int, causal: str, recompute: str, input_grads: bool) -> int:
    """Executed FLOPs of one sequence of the fine-tune (``flops --peft``'s forward + backward + recompute)."""
    from trainmath.flops.peft import peft_flops

    return memo(spec, ("peft_flops", pj, seq, causal, recompute, input_grads),
                lambda: peft_flops(spec, pj, batch=1, seq=seq, causal=causal, recompute=recompute,
                                   input_grads=input_grads).report.training.value)


def peft_peak_bytes(spec, layout, job: Job, micro_batches: int) -> int:
    """``trainmath memory --peft``'s peak for the fine-tune ``job`` on ``layout`` (the hf activation profile)."""
    from trainmath.memory.training import TrainingSetup, training_memory

    setup = TrainingSetup(micro_batch=job.micro_batch, seq=job.seq, precision=job.precision, optimizer=job.optimizer,
                          recompute=job.recompute, profile=job.profile,
                          attention=attention_as(job.attention, MEMORY_ATTENTION), micro_batches=micro_batches,
                          offload=job.offload, peft=job.peft)
    return training_memory(spec, setup, layout).peak_bytes


def peft_estimate(spec, layout, job: Job, gpu: GPU, *, hardware: Hardware | None = None, memory: bool = True,
                  peak_bytes: int | None = None, validate: bool = True) -> Estimate:
    """The step of the fine-tune ``job.peft`` on ``layout`` (see the module docstring); arguments as
    ``perf.step.estimate``."""
    bad = (job_problems(spec, layout, job) if validate else []) + peft_problems(layout, job)
    if bad:
        raise TrainmathError(f"cannot time this fine-tune ({layout.describe()}): " + "; ".join(bad))
    from trainmath.adapters import adapter_report

    run, pj = job.peft, job.peft.job
    eff = (hardware or presets()).efficiency(gpu)
    ig = run.input_grad(job.recompute)
    M = job.micro_batches(layout.dp)
    mb = micro_batch_compute(spec, job, gpu, eff, ig)
    s = mb.seconds
    f = sum(s[c] for c in FORWARD) + s["head_fprop"]
    b = sum(s[c] for c in BACKWARD) + s["head_dgrad"]
    r = s["recompute"] + s["elementwise_recompute"]
    trainable = adapter_report(spec, pj, 0).trainable_params
    ab = ADAPTER_DTYPES[pj.dtype]

    # ---- data-parallel sync of the adapters' gradients; optimizer step over them -------------------------
    topo = Topology.of_gpu(gpu, eff.link_fraction)
    groups = place_groups(layout, gpu.gpus_per_node)
    items: list[cm.CommItem] = []
    g = groups.dp
    size = trainable * ab
    zero3 = layout.zero >= 3 and g.size > 1
    if zero3:
        items.append(_zero3(spec, job, layout, topo, g, mb, M))
    elif g.size > 1:
        if layout.zero == 0:
            items.append(cm.item("dp_grad_sync", "all_reduce", "dp", g, size, 1, topo, hidden_behind_s=b + r,
                                 floor_s=cm.bucket_floor_s("all_reduce", size, g, topo)))
        else:
            k = M if layout.zero == 2 else 1
            items.append(cm.item("dp_grad_sync", "reduce_scatter", "dp", g, size, k, topo,
                                 hidden_behind_s=k * (b + r),
                                 floor_s=cm.bucket_floor_s("reduce_scatter", size, g, topo)))
            items.append(cm.item("zero_param_gather", "all_gather", "dp", g, size, 1, topo, hidden_behind_s=f,
                                 floor_s=cm.bucket_floor_s("all_gather", size, g, topo)))
    master = 4 if ab < 4 else 0
    state = 1 if job.optimizer.endswith("8bit") else max(ab, master)
    states = _STATES.get(job.optimizer, 2)
    per_param = ab + 2 * master + 2 * states * state + ab
    shard = trainable / (layout.zero_degree if layout.zero else 1)
    optimizer_s = shard * per_param / (gpu.hbm_bytes_per_s * eff.hbm_fraction)
    once = {k: sum(it.exposed_s for it in items if it.name == k)
            for k in ("dp_grad_sync", "zero_param_gather", "zero3_comm")}
    if zero3:
        once["fsdp_overhead"] = overhead_s(gpu.generation, spec.num_layers + 1, M, 2 + (job.recompute == "full"))
    breakdown = {k: 0.0 for k in BREAKDOWN}
    breakdown.update(forward=M * f, backward=M * b, recompute=M * r, qlora_dequant=M * s["qlora_dequant"],
                     optimizer_step=optimizer_s, **once)
    step = sum(breakdown.values())

    n = layout.ranks
    model_flops = _fine_tune_flops(spec, pj, job.seq, job.mfu_causal, "none", ig) * job.global_batch
    hw_flops = _fine_tune_flops(spec, pj, job.seq, job.mfu_causal, job.recompute, ig) * job.global_batch
    peak = gpu.peak_flops_per_s("bf16")
    if peak_bytes is None and memory:
        peak_bytes = peft_peak_bytes(spec, layout, job, M)
    fits = None if peak_bytes is None else peak_bytes <= usable_bytes(gpu.memory_bytes, job.mem_util_percent)
    compute = {c: {"flops": M * mb.flops.get(c, 0), "seconds": M * s[c]} for c in CLASSES + MEMORY_CLASSES}
    # forward + backward + recompute + qlora_dequant of the breakdown == the sum of these seconds
    detail = {"method": pj.method, "lora_rank": pj.rank, "trainable_params": trainable, "input_grads": ig,
              "compute": compute, "dequant_elements": M * mb.dequant_elements,
              "executed_flops": M * sum(mb.flops.values()) * layout.dp,
              "flops_causal": "half" if job.attention == "flash" else "executed"}
    conventions = (
        f"peft {pj.method} r={pj.rank}: MFU counts the fine-tune's executed FLOPs (flops --peft: frozen base fprop "
        f"+ dgrad, no wgrad; the adapters' GEMMs; attention causal={job.mfu_causal}; no recompute) / (step time · "
        f"{n} GPUs · dense bf16 peak {peak / 1e12:.1f} TFLOP/s), not full training's 6N",
        f"HFU: the same with recompute={job.recompute}",
        f"compute at the {gpu.generation} efficiency curve: frozen base linears fprop + dgrad, adapters at their "
        f"small-shape efficiency (r={pj.rank}), flash attention's backward 2.5x its forward when Q, K or V needs a "
        f"gradient; LM head fprop + dgrad",
        *(("QLoRA dequantisation memory-bound: per use of each 4-bit weight (forward, input gradient, recompute) "
           f"its NF4 storage read + its bf16 copy written, at {eff.hbm_fraction:.0%} of HBM bandwidth",)
          if pj.method == "qlora" else ()),
        (f"FSDP2: per micro-batch every unit's parameters (frozen base at {get_precision(job.precision).weight_bytes}"
         f" bytes, adapters at {ab}) all-gathered before its forward and again before its backward, only the "
         f"{trainable:,} adapter parameters reduce-scattered; one unit of prefetch; fitted FSDP overhead "
         f"{fsdp_text(gpu.generation)}" if zero3 else
         f"gradient sync over the {trainable:,} trainable parameters ({ab} bytes each), overlapped with the last "
         f"backward except one bucket") + (f"; optimizer step over them: {per_param} bytes per parameter"
                                          if job.offload == "none" else ""),
        f"memory: trainmath memory --peft (hf activation profile, recompute={job.recompute}); "
        + rule_text(gpu.memory_bytes, job.mem_util_percent),
    )
    est = Estimate(model=spec.name, gpu=gpu.name, gpus=n, layout=layout, job=job, micro_batches=M,
                   step_time_s=step, breakdown=breakdown, comm=tuple(items), groups=groups,
                   model_flops=model_flops, hardware_flops=hw_flops, peak_flops_per_s=peak,
                   peak_bytes=peak_bytes, memory_bytes=gpu.memory_bytes,
                   fits=fits, conventions=conventions, stage_times_s=(f + b + r + s["qlora_dequant"],),
                   stage_layers=(spec.num_layers,), peft=detail)
    if job.offload == "none":
        return est
    from trainmath.perf.offload import with_offload

    # ZeRO-Offload over the adapters alone: their gradients to the host, DeepSpeedCPUAdam over them there
    return with_offload(est, spec, layout, job, gpu, host=peak_bytes is not None, weight_bytes=ab,
                        shard_params=-(-trainable // (layout.zero_degree if layout.zero else 1)))
