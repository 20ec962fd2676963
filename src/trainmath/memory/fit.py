"""Does a training step fit a GPU, and if not, which of the usual levers would make it fit.

The verdict is the one fit rule of every command (``trainmath.usable``): ``peak_bytes`` (the largest event of the
step's timeline, 512-byte blocks) plus the stated CUDA context must stay under ``--mem-util`` percent of the
preset's memory; with offload, the node's host RAM (``memory.host.host_memory``) must also stay within
``--host-memory``, and a verdict that fails on the host says so. Preset capacities are the datasheet's "GB"
read as GiB (``hardware/gpus.json``'s conventions:
"80GB" = 80 · 2**30 bytes); the margin is exact bytes, rendered in GiB.

Levers are not guessed: each is the same model re-run with one change to the setup or layout, and its peak is
reported beside whether it fits. First those that keep the job's GPUs: the fused optimizer (no foreach
temporaries); bitsandbytes' 8-bit Adam/AdamW (``--optimizer adamw8bit``: 2 bytes of state per parameter plus one
fp32 absmax per 256-element block, ``memory.optimizers``); a smaller micro-batch with more accumulation steps
(the same sequences per step); selective recompute (from none: torchtitan's op-level policy under the hf profile,
Megatron-Core's under megatron); full recompute; each higher ZeRO stage (when data parallelism has more than one
rank); optimizer offload; parameter offload (ZeRO-3). Then those that need more GPUs, labelled ``(needs N
GPUs)``: more data-parallel ranks (×2, ×4, ×8; with ZeRO-3 when the job has none, since plain DDP replicates every
state); tensor parallelism (2, 4, 8, as the layout's other flags give it: plain ``parallelize_module`` unless
``--sp``/``--vocab-parallel``; impossible degrees, or a family whose hf activation profile is one device only,
are skipped with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath.errors import TrainmathError
from trainmath.hardware import GPU
from trainmath.layout import ParallelLayout
from trainmath.memory.host import HOST_MEMORY_BYTES, HostFit, job_host_memory
from trainmath.memory.training import MemoryReport, TrainingSetup, training_memory
from trainmath.model.spec import ModelSpec
from trainmath.usable import MEM_UTIL_PERCENT, rule_text, usable_bytes


@dataclass(frozen=True, kw_only=True)
class Lever:
    """One change to the job and what the model says it does."""

    name: str
    """What changes, as CLI flags (``--recompute full``, ``--zero 3``, ``--dp 16``)."""
    peak_bytes: int | None
    """The re-run model's peak, or None when the change cannot be built (``reason`` says why)."""
    fits: bool
    reason: str = ""

    def to_dict(self) -> dict:
        return {"lever": self.name, "peak_bytes": self.peak_bytes, "fits": self.fits, "reason": self.reason}


@dataclass(frozen=True, kw_only=True)
class Fit:
    gpu: GPU
    peak_bytes: int
    capacity_bytes: int
    """What ``peak_bytes`` may reach under the fit rule (``usable.usable_bytes``)."""
    levers: tuple[Lever, ...]
    """Empty when the job fits as given."""
    mem_util_percent: int = MEM_UTIL_PERCENT
    host: HostFit | None = None
    """With offload: host RAM per node against ``--host-memory`` (``memory.host``); None without."""

    @property
    def rule(self) -> str:
        return rule_text(self.gpu.memory_bytes, self.mem_util_percent)

    @property
    def gpu_fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    @property
    def fits(self) -> bool:
        """The GPU and, with offload, the host."""
        return self.gpu_fits and (self.host is None or self.host.fits)

    @property
    def margin_bytes(self) -> int:
        """Capacity − peak: negative when it does not fit."""
        return self.capacity_bytes - self.peak_bytes

    def to_dict(self) -> dict:
        return {"gpu": self.gpu.name, "capacity_bytes": self.capacity_bytes, "memory_bytes": self.gpu.memory_bytes,
                "mem_util_percent": self.mem_util_percent, "fit_rule": self.rule, "fits": self.fits,
                "margin_bytes": self.margin_bytes, "gpu_fits": self.gpu_fits,
                "levers": [lv.to_dict() for lv in self.levers],
                **(self.host.to_dict() if self.host is not None else {})}


def candidate_changes(setup: TrainingSetup, layout: ParallelLayout) -> list[tuple[str, TrainingSetup, ParallelLayout]]:
    """The levers to try, each as (flags, setup, layout): those that keep the job's GPUs first, then those that
    need more GPUs (their flags end in ``(needs N GPUs)``)."""
    out: list[tuple[str, TrainingSetup, ParallelLayout]] = []
    if setup.optimizer_impl != "fused" and setup.optimizer not in ("adam8bit", "adamw8bit"):
        # torch's fused Adam/AdamW/SGD updates in one kernel: no foreach temporaries at the step
        out.append(("--optimizer-impl fused", replace(setup, optimizer_impl="fused"), layout))
    if setup.optimizer in ("adam", "adamw"):  # bitsandbytes' blockwise 8-bit states (memory.optimizers)
        impl = "foreach" if setup.optimizer_impl == "fused" else setup.optimizer_impl  # its own kernels, not torch's
        out.append((f"--optimizer {setup.optimizer}8bit", replace(setup, optimizer=f"{setup.optimizer}8bit",
                                                                  optimizer_impl=impl), layout))
    steps = setup.micro_batches or layout.pp
    for k in (2, 4, 8):  # the same sequences per step in k times more, k times smaller micro-batches
        if setup.micro_batch % k == 0:
            out.append((f"--micro-batch {setup.micro_batch // k} --micro-batches {steps * k}",
                        replace(setup, micro_batch=setup.micro_batch // k, micro_batches=steps * k), layout))
    if setup.recompute == "none":  # torchtitan's op-level policy (hf) or Korthikanti's (megatron): lighter first
        out.append(("--recompute selective", replace(setup, recompute="selective"), layout))
    if setup.recompute != "full":
        out.append(("--recompute full", replace(setup, recompute="full"), layout))
    if layout.zero_degree > 1:
        for z in range(layout.zero + 1, 4):
            out.append((f"--zero {z}", setup, replace(layout, zero=z)))
    if setup.offload == "none":
        out.append(("--offload optimizer", replace(setup, offload="optimizer"), layout))
    if layout.zero == 3 and setup.offload != "params":
        out.append(("--offload params", replace(setup, offload="params"), layout))
    more: list[ParallelLayout] = []
    for k in (2, 4, 8):
        if layout.zero >= 1:
            more.append(replace(layout, dp=layout.dp * k, world_size=None))
        else:  # ZeRO shards the states over the new ranks (plain DDP would replicate them)
            more.append(replace(layout, dp=layout.dp * k, zero=3, world_size=None))
    if layout.tp == 1:
        more += [replace(layout, tp=t, world_size=None) for t in (2, 4, 8)]
    for lay in more:
        flags = f"--dp {lay.dp}" if lay.tp == layout.tp else f"--tp {lay.tp}"
        if lay.zero != layout.zero:
            flags += f" --zero {lay.zero}"
        out.append((f"{flags} (needs {lay.ranks} GPUs)", setup, lay))
    return out


def fit(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout, gpu: GPU, *,
        report: MemoryReport | None = None, activation_model=None, mem_util_percent: int = MEM_UTIL_PERCENT,
        host_memory_bytes: int = HOST_MEMORY_BYTES) -> Fit:
    """The verdict for ``gpu`` under the fit rule (with offload: and the host's, ``memory.host``) and, when the
    job does not fit, every lever re-run. A lever that offloads fits only if its host RAM fits too."""
    report = report or training_memory(spec, setup, layout, activation_model=activation_model)
    capacity = usable_bytes(gpu.memory_bytes, mem_util_percent)

    def host_fit(s: TrainingSetup, lay: ParallelLayout) -> HostFit | None:
        h = job_host_memory(spec, s, lay, gpus_per_node=gpu.gpus_per_node)
        return None if h is None else HostFit(host_bytes=h.host_bytes, host_memory_bytes=host_memory_bytes)

    host = host_fit(setup, layout)
    levers: list[Lever] = []
    if report.peak_bytes > capacity or (host is not None and not host.fits):
        for name, s, lay in candidate_changes(setup, layout):
            try:
                peak = training_memory(spec, s, lay, activation_model=activation_model).peak_bytes
                h = host_fit(s, lay)
            except TrainmathError as e:
                levers.append(Lever(name=name, peak_bytes=None, fits=False, reason=str(e)))
                continue
            ok = peak <= capacity and (h is None or h.fits)
            reason = "" if h is None or h.fits else f"host RAM {h.host_bytes:,} bytes per node > --host-memory"
            levers.append(Lever(name=name, peak_bytes=peak, fits=ok, reason=reason))
    return Fit(gpu=gpu, peak_bytes=report.peak_bytes, capacity_bytes=capacity, levers=tuple(levers),
               mem_util_percent=mem_util_percent, host=host)


def derive_dp(world_size: int, *, tp: int, pp: int, cp: int) -> int:
    """The data-parallel degree that ``world_size`` GPUs leave once tp, pp and cp are given."""
    model = tp * pp * cp
    if world_size < 1 or world_size % model:
        raise TrainmathError(f"--world-size ({world_size}) must be a positive multiple of tp·pp·cp "
                             f"({tp}·{pp}·{cp} = {model}) to derive --dp")
    return world_size // model
