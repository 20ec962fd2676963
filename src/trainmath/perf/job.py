"""What a training job runs (``Job``), what the step-time model answers (``Estimate``), and the rules a job must
obey on a layout (``job_problems``: every problem, each naming its values)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainmath.layout import ParallelLayout, layout_problems
from trainmath.model.spec import ModelSpec
from trainmath.perf.compute import memo
from trainmath.perf.placement import Groups
from trainmath.usable import MEM_UTIL_PERCENT, rule_text, usable_bytes
from trainmath.vocabulary import STEP_ATTENTION


@dataclass(frozen=True, kw_only=True)
class Job:
    """What a training step runs, besides the layout."""

    global_batch: int
    """Sequences per optimizer step, over all data-parallel ranks."""
    seq: int
    micro_batch: int = 1
    precision: str = "mixed-bf16"
    optimizer: str = "adamw"
    recompute: str = "none"
    virtual_stages: int = 1
    """Interleaved 1F1B model chunks per pipeline rank (1: plain 1F1B)."""
    dtype: str = "bf16"
    """Tensor-core format the GEMMs run in (its dense peak is MFU's denominator)."""
    mfu_causal: str = "executed"
    """Attention FLOPs in MFU/HFU: ``executed`` (all s², Megatron-LM's and PaLM's formulas) or ``half``."""
    attention: str = "flash"
    """Attention kernel: ``flash`` or ``eager`` (materialised scores; ``trainmath.perf.compute``)."""
    flash_kernel: str = "native"
    """Which flash kernel (``trainmath.perf.attention``): ``native`` (the generation's calibrated one), ``te``
    (Transformer Engine's, as Megatron-Core and NeMo run it) or ``fa2`` (FlashAttention-2: flash-attn 2, SDPA)."""
    profile: str = "megatron"
    """Activation profile of the memory model."""
    uneven_stages: bool = False
    """Allow pp · virtual_stages not dividing the layers (stages differ by one layer, like Llama 3's)."""
    fp8_head: bool = False
    """With ``precision="fp8"``: run the LM head's GEMMs in FP8 too (Transformer Engine's recipe keeps it BF16)."""
    fsdp: bool = False
    """The data-parallel sharding runs as PyTorch FSDP units (``zero`` 3 FULL_SHARD, 2 SHARD_GRAD_OP): the fitted
    FSDP overhead (``trainmath.perf.fsdp``: per-unit hooks) applies at ZeRO-2 too. ZeRO-3 pays it either way."""
    moe_imbalance: float = 1.0
    """MoE load imbalance: tokens routed to the busiest expert-parallel rank / the mean (1.0 balanced; a capacity
    factor with dropping bounds it; ``trainmath.perf.moe``)."""
    ep_overlap: bool = False
    """Megatron-Core's EP all-to-all overlap (``--overlap-moe-expert-parallel-comm``, the combined 1F1B schedule):
    one micro-batch's dispatch and combine run on a communication stream while another micro-batch's forward and
    backward compute; only what that compute cannot cover is exposed (``trainmath.perf.step``)."""
    ep_dispatcher: str = "alltoall"
    """EP token dispatcher (``trainmath.perf.moe.DISPATCHERS``): ``alltoall`` (one copy per routed expert) or
    ``deepep`` (DeepEP: one RDMA copy per destination node, forwarded over NVLink)."""
    zero_group: int = 0
    """Ranks the ZeRO-1/2 optimizer states are sharded over, when fewer than the data-parallel group (InternLM's
    hybrid ZeRO, ``zero1=N``); 0: all of it. The gradients are then all-reduced over the whole group, the optimizer
    steps 1/N of the parameters and the updates are broadcast inside the group (``trainmath.perf.dpsync``)."""
    grad_bucket_elements: int = 0
    """Gradient elements per reduce bucket, when the job states them (InternLM's ``reduce_bucket_size``): the sync
    is timed bucket by bucket in backward order (``trainmath.perf.dpsync``); 0: the default scheme (hidden behind
    the last backward except one 25 MiB bucket)."""
    blocking_buckets: bool = False
    """With ``grad_bucket_elements``: the host waits for each bucket before launching the next, stalling the
    backward (InternLM's ``torch.cuda.synchronize()`` before each bucket)."""
    param_sync_overlap: bool = True
    """The ZeRO parameter all-gather (or broadcast) after the optimizer step overlaps the next forward (Megatron's
    ``--overlap-param-gather``); False: the step waits for it (InternLM's ``broadcast_params(overlap=False)``)."""
    autograd_grad_accumulation: bool = False
    """Micro-batches after the first add their gradients into ``.grad`` through PyTorch's AccumulateGrad (read
    both, write one, at HBM bandwidth: InternLM's hooks skip the reduce and let autograd accumulate); False: fused
    into the weight-gradient GEMM (Megatron's ``gradient_accumulation_fusion``) or sharded away (ZeRO-2/3)."""
    mem_util_percent: int = MEM_UTIL_PERCENT
    """The fit rule's usable share (``trainmath.usable``: peak_bytes + the CUDA context under this share of the
    GPU's memory)."""
    offload: str = "none"
    """DeepSpeed offload (``perf.offload``): ``optimizer`` (ZeRO-Offload) or ``params`` (ZeRO-3, ZeRO-Infinity's
    CPU tier); timed and fitted on the GPU and the host."""
    host_memory_bytes: int = 2 * 2**40
    """Host RAM per node for the host fit with ``offload`` (``memory.host.HOST_MEMORY_BYTES``, a DGX H100's)."""
    host_bytes_per_s: float | None = None
    """Achieved host DRAM rate of the CPU optimizer step per node (B/s); None: ``perf.offload``'s calibration."""
    peft: object = None
    """A LoRA / QLoRA fine-tune (``memory.peft.PeftRun``): timed by ``perf.peft``; None: full training."""
    recompute_saves: tuple[str, ...] = ()
    """With ``recompute="full"`` (megatron profile): the layer's tensors kept beside its checkpointed input, by
    their ``memory.megatron`` names, as a JAX ``save_only_these_names`` policy keeps them (MaxText's
    ``remat_policy``); empty: Megatron-Core's full recompute (the input only)."""
    recompute_modules: tuple[str, ...] = ()
    """With ``recompute="selective"`` (megatron profile): Megatron-Core's ``--recompute-modules``
    (``memory.megatron_recompute``); empty: ``core_attn``. The step times the core attention's recompute only
    (``perf.step.timed_recompute``)."""
    zero_impl: str = "deepspeed"
    """Whose data-parallel buffers the memory model counts (``memory.setup.TrainingSetup.zero_impl``):
    ``megatron`` for Megatron-Core runs (no bucket beside the contiguous gradient buffer)."""
    cross_entropy_fusion: str = "none"
    """A fused cross-entropy kernel (megatron profile; ``memory.recipe_options.fused_cross_entropy``): ``te``
    (Megatron-Core's ``cross_entropy_fusion_impl="te"``, gradient in place) or ``flash-attn`` (flash-attn's
    ``CrossEntropyLoss``); the loss keeps no fp32 logits. ``none``: the profile's own loss."""
    offload_layers: int = 0
    """Megatron-Core's ``--cpu-offloading-num-layers``: the saved activations of the first that many layers of
    each rank live in host memory between their forward and backward (``memory.recipe_options``); 0: none."""
    fp8_param_gather: bool = False
    """With ``precision="fp8"``: Megatron's ``fp8_param_gather``: the linear weights are kept as FP8 tensors (1
    byte, not a bf16 copy beside an FP8 cache; ``memory.recipe_options.fp8_param_bytes_saved``)."""

    @property
    def fp8_gemms(self) -> str:
        """Which GEMMs run in FP8 (``trainmath.perf.compute.FP8_GEMMS``): with ``precision="fp8"``, Transformer
        Engine's recipe (the decoder's linear layers; the LM head too with ``fp8_head``); otherwise none."""
        if self.precision != "fp8":
            return "none"
        return "linears+head" if self.fp8_head else "linears"

    @property
    def gemm_dtype(self) -> str:
        """The format of the GEMMs not named by ``fp8_gemms``: BF16 under ``precision="fp8"`` (attention cores,
        and the head unless ``fp8_head``), else ``dtype``."""
        return "bf16" if self.precision == "fp8" else self.dtype

    def micro_batches(self, dp: int) -> int:
        """Micro-batches per optimizer step on each data-parallel rank: global_batch / (dp · micro_batch)."""
        return self.global_batch // (dp * self.micro_batch)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    model: str
    gpu: str
    gpus: int
    layout: ParallelLayout
    job: Job
    micro_batches: int
    step_time_s: float
    breakdown: dict
    """BREAKDOWN key → seconds of the step; sums to step_time_s."""
    comm: tuple
    """Every collective of the step (``CommItem``), exposed or not."""
    groups: Groups
    model_flops: int
    hardware_flops: int
    peak_flops_per_s: float
    """One GPU's dense peak FLOP/s at the precision MFU and HFU are quoted against."""
    peak_bytes: int | None
    memory_bytes: int
    fits: bool | None
    conventions: tuple = field(default=())
    stage_times_s: tuple = field(default=())
    """Per pipeline stage: seconds of one micro-batch's compute (forward + backward + recompute + FP8 casts);
    the slowest sets the pace and the bubble."""
    stage_layers: tuple = field(default=())
    """Per pipeline stage: its decoder layers (count)."""
    offload: dict | None = None
    """With ``job.offload``: the offload terms, their bytes and rates, and the host RAM verdict
    (``perf.offload.with_offload``); None without."""
    peft: dict | None = None
    """A fine-tune's figures (``perf.peft``: the adapters, the compute by op class with its FLOPs and seconds);
    None for full training."""

    @property
    def tokens_per_s(self) -> float:
        """The whole job's tokens per second: global batch · sequence / step time."""
        return self.job.global_batch * self.job.seq / self.step_time_s

    @property
    def tflops_per_gpu(self) -> float:
        """MFU's numerator: model FLOPs per step / step time / GPUs, in TFLOP/s."""
        return self.model_flops / self.step_time_s / self.gpus / 1e12

    @property
    def hardware_tflops_per_gpu(self) -> float:
        """HFU's numerator: hardware FLOPs (recompute included) per step / step time / GPUs, in TFLOP/s."""
        return self.hardware_flops / self.step_time_s / self.gpus / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs / (step time · GPUs · peak FLOP/s)."""
        return self.model_flops / (self.step_time_s * self.gpus * self.peak_flops_per_s)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: hardware FLOPs / (step time · GPUs · peak FLOP/s)."""
        return self.hardware_flops / (self.step_time_s * self.gpus * self.peak_flops_per_s)

    def budget(self, tokens: float, price_per_gpu_hour: float | None = None) -> dict:
        """Wall time, GPU-hours and cost of training on ``tokens`` tokens at this step's rate."""
        seconds = tokens / self.tokens_per_s
        hours = seconds * self.gpus / 3600
        out = {"tokens": tokens, "steps": tokens / (self.job.global_batch * self.job.seq), "time_s": seconds,
               "days": seconds / 86400, "gpu_hours": hours, "training_flops": self.model_flops * tokens
               / (self.job.global_batch * self.job.seq)}
        if price_per_gpu_hour is not None:
            out["price_per_gpu_hour"] = price_per_gpu_hour
            out["cost"] = hours * price_per_gpu_hour
        return out

    def to_dict(self) -> dict:
        lay = self.layout
        return {"model": self.model, "gpu": self.gpu, "gpus": self.gpus,
                "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp, "zero": lay.zero,
                "micro_batch": self.job.micro_batch, "virtual_stages": self.job.virtual_stages,
                "recompute": self.job.recompute, "micro_batches": self.micro_batches,
                "global_batch": self.job.global_batch, "seq": self.job.seq,
                "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
                "tflops_per_gpu": self.tflops_per_gpu, "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
                "mfu": self.mfu, "hfu": self.hfu, "model_flops": self.model_flops,
                "hardware_flops": self.hardware_flops, "peak_bytes": self.peak_bytes,
                "memory_bytes": self.memory_bytes, "mem_util_percent": self.job.mem_util_percent,
                "usable_bytes": usable_bytes(self.memory_bytes, self.job.mem_util_percent),
                "fit_rule": rule_text(self.memory_bytes, self.job.mem_util_percent),
                "activation_profile": self.job.profile, "fits": self.fits, "breakdown": dict(self.breakdown),
                "comm": [c.to_dict() for c in self.comm], "groups": self.groups.to_dict(),
                "conventions": list(self.conventions), "stage_times_s": list(self.stage_times_s),
                "stage_layers": list(self.stage_layers),
                "first_stage_layers": lay.first_stage_layers, "last_stage_layers": lay.last_stage_layers,
                **({"offload": self.offload} if self.offload is not None else {}),
                **({"peft": self.peft} if self.peft is not None else {})}


def job_problems(spec: ModelSpec, layout: ParallelLayout, job: Job, gpus: int | None = None) -> list[str]:
    """Every reason the job cannot run as laid out, each naming its values; empty when it can."""
    bad = layout_problems(layout)
    if not bad:  # the model-dependent rules read only tp, pp and ep (trainmath.layout): checked once per triple
        t, p, e = layout.tp, layout.pp, layout.ep
        bad = list(memo(spec, ("layout", t, p, e),
                        lambda: layout_problems(ParallelLayout(tp=t, pp=p, ep=e, dp=e), spec)))
    if gpus is not None and layout.ranks != gpus and not bad:
        bad.append(f"dp·tp·pp·cp = {layout.dp}·{layout.tp}·{layout.pp}·{layout.cp} = {layout.ranks} must equal "
                   f"the GPU count ({gpus})")
    for name in ("global_batch", "seq", "micro_batch", "virtual_stages"):
        v = getattr(job, name)
        if not isinstance(v, int) or v < 1:
            bad.append(f"{name.replace('_', ' ')} must be a positive integer, got {v!r}")
    if job.attention not in STEP_ATTENTION:
        bad.append(f"attention kernel must be flash or eager, got {job.attention!r}")
    if job.attention == "flash":
        from trainmath.perf.attention import kernel_problems

        bad += kernel_problems(job.flash_kernel)
    if not isinstance(job.moe_imbalance, (int, float)) or not 1 <= job.moe_imbalance <= 1e3:
        bad.append(f"moe imbalance (busiest EP rank's tokens / the mean) must be a number from 1 to 1000, got "
                   f"{job.moe_imbalance!r}")
    from trainmath.perf.moe import DISPATCHERS

    if job.ep_dispatcher not in DISPATCHERS:
        bad.append(f"ep dispatcher must be one of {', '.join(DISPATCHERS)}, got {job.ep_dispatcher!r}")
    if not isinstance(job.ep_overlap, bool):
        bad.append(f"ep overlap must be true or false, got {job.ep_overlap!r}")
    for name in ("blocking_buckets", "param_sync_overlap", "autograd_grad_accumulation"):
        if not isinstance(getattr(job, name), bool):
            bad.append(f"{name.replace('_', ' ')} must be true or false, got {getattr(job, name)!r}")
    for name in ("zero_group", "grad_bucket_elements"):
        v = getattr(job, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            bad.append(f"{name.replace('_', ' ')} must be a non-negative integer (0: the default), got {v!r}")
    if job.mfu_causal not in ("executed", "half"):
        bad.append(f"mfu causal convention must be executed or half, got {job.mfu_causal!r}")
    if bad:
        return bad
    if job.global_batch % (layout.dp * job.micro_batch):
        bad.append(f"global batch ({job.global_batch}) must be divisible by dp × micro-batch ({layout.dp} × "
                   f"{job.micro_batch} = {layout.dp * job.micro_batch})")
    chunks = layout.pp * job.virtual_stages
    split = split_problems(spec.num_layers, layout, job.virtual_stages)
    if split or layout.stage_split != (None, None):
        bad += split
    elif chunks > spec.num_layers:
        bad.append(f"pp × virtual stages ({layout.pp} × {job.virtual_stages}) must not exceed the layers "
                   f"({spec.num_layers})")
    elif spec.num_layers % chunks and not job.uneven_stages:
        bad.append(f"pp × virtual stages ({layout.pp} × {job.virtual_stages} = {chunks}) must divide the layers "
                   f"({spec.num_layers})")
    if job.virtual_stages > 1:
        if layout.pp == 1:
            bad.append(f"virtual stages ({job.virtual_stages}) need pp > 1")
        elif not bad and job.micro_batches(layout.dp) % layout.pp:
            bad.append(f"interleaved 1F1B needs the micro-batches ({job.micro_batches(layout.dp)}) to be a multiple "
                       f"of pp ({layout.pp})")
    if job.zero_group and (layout.zero not in (1, 2) or layout.zero_degree % job.zero_group):
        bad.append(f"zero group ({job.zero_group}) needs ZeRO 1 or 2 and must divide dp·cp ({layout.zero_degree}); "
                   f"got zero {layout.zero}")
    if job.seq % layout.cp:
        bad.append(f"cp ({layout.cp}) must divide the sequence length ({job.seq})")
    if job.offload != "none":
        from trainmath.perf.offload import offload_problems

        bad += offload_problems(layout.zero, job.offload, job.optimizer)
    return bad


def split_problems(num_layers: int, layout: ParallelLayout, virtual_stages: int = 1) -> list[str]:
    """Why ``layout``'s first/last stage layers (Megatron-LM's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers``) cannot split ``num_layers``: Megatron-Core gives the stages between
    an equal share of the rest, so it must divide; interleaving is not modelled with them."""
    first, last = layout.stage_split
    if first is None and last is None:
        return []
    bad = [f"{name} stage layers must be a positive integer, got {v!r}"
           for name, v in (("first", first), ("last", last)) if v is not None and (not isinstance(v, int) or v < 1)]
    if bad:
        return bad
    if layout.pp < 2:
        return [f"first/last stage layers need pp >= 2, got pp {layout.pp}"]
    if virtual_stages > 1:
        return ["first/last stage layers with virtual stages > 1 are not modelled; pass --virtual-stages 1"]
    ends = [n for n in (first, last) if n is not None]
    inner = layout.pp - len(ends)
    rest = num_layers - sum(ends)
    if inner == 0:
        if rest:
            bad.append(f"first + last stage layers ({' + '.join(map(str, ends))}) must equal the layers "
                       f"({num_layers}) with pp 2")
    elif rest < inner or rest % inner:
        bad.append(f"the {rest} layers left after the first/last stage(s) must split evenly over the other "
                   f"{inner} stage(s) (Megatron-Core's rule): {num_layers} - {' - '.join(map(str, ends))} = {rest} "
                   f"is not a positive multiple of {inner}")
    return bad
