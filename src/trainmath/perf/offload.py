"""Step time of an offloaded job: DeepSpeed ZeRO-Offload (``--offload optimizer``) and ZeRO-Infinity's CPU tier
(``--offload params``, ZeRO-3), and the host RAM it pins (``memory.host``).

Per rank, S = its ZeRO partition in parameters (dense / zero degree + expert / expert zero degree), g and w the
gradient and weight dtype's bytes (2 for bf16), M micro-batches per step, n the node's ranks
(``memory.host.ranks_per_node``). Each term is derived, with its convention:

- ``offload_grad_d2h``: every reduced gradient partition is copied to the host over PCIe, g·S bytes per
  micro-batch from ZeRO-2 on (each micro-batch's backward reduces, as ``perf.step`` times it), once per step under
  ZeRO-1; at ``pcie_bytes_per_s · pcie_fraction`` (``hardware/offload.json``). Convention: exposed under
  ZeRO-1/2 (DeepSpeed's ``overlap_comm`` off), hidden behind the backward under ZeRO-3 (``overlap_comm`` on),
  the part longer than the backward exposed.
- ``cpu_optimizer_step``: DeepSpeedCPUAdam over the node's n·S parameters, memory-bound: it reads the fp32
  gradient, master weight and both states and writes the master, both states and the bit16 copy,
  ``CPU_ADAM_BYTES_PER_PARAM`` = 4+4+4+4 + 4+4+4 + w bytes (``csrc/includes/cpu_adam.h``'s Step: params, grads,
  exp_avg, exp_avg_sq in, the first three and the half-precision copy out), at the node's achieved rate: by
  default DeepSpeed #6834's ~10 s for Qwen2.5-72B over 4 nodes (``cpu_adam`` in ``hardware/offload.json``; the
  rate is fitted to that one figure: in-sample), or ``host_bytes_per_s`` (``--host-bandwidth``) over
  ``CPU_ADAM_BYTES_PER_PARAM``. The updated bit16 partition's copy to the GPU (w·S, optimizer offload only) runs
  tile by tile during the step (Ren et al. 2021, §5.1, Algorithm 1 line 15): the term is the longer of the two.
  Convention: the step waits for the whole backward (no overlap: DeepSpeed's one-step delayed update, §5.2, is
  off by default) and replaces ``perf.step``'s GPU ``optimizer_step``.
- ``offload_param_h2d`` (``params`` only): each forward and backward pass (and the recompute) copies the rank's
  parameter partition to the GPU before ZeRO-3's all-gather, w·S per pass per micro-batch, prefetched behind the
  micro-batch's compute: the part longer than forward + backward + recompute is exposed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from trainmath.errors import TrainmathError
from trainmath.vocabulary import OFFLOAD as OFFLOADS

"""``Job.offload`` values."""
CPU_ADAM = ("adam", "adamw")
"""Optimizers DeepSpeed runs as DeepSpeedCPUAdam (the only CPU step timed)."""
BREAKDOWN_OFFLOAD = ("offload_grad_d2h", "cpu_optimizer_step", "offload_param_h2d")
"""The breakdown keys an offloaded estimate adds (seconds; the GPU ``optimizer_step`` becomes 0)."""


def cpu_adam_bytes_per_param(weight_bytes: int) -> int:
    """Host DRAM bytes DeepSpeedCPUAdam moves per parameter: reads fp32 gradient, master, exp_avg, exp_avg_sq
    (16), writes master, exp_avg, exp_avg_sq (12) and the bit16 copy (``weight_bytes``)."""
    return 4 * 4 + 3 * 4 + weight_bytes


@lru_cache(maxsize=1)
def offload_data() -> dict:
    """``hardware/offload.json``: PCIe per GPU generation, the PCIe fraction, the CPU Adam calibration."""
    from trainmath import hardware

    return json.loads(resources.files(hardware).joinpath("offload.json").read_text(encoding="utf-8"))


def pcie_bytes_per_s(generation: str) -> tuple[int, str]:
    """(one direction of one GPU's host link in B/s, its source) for a GPU generation."""
    table = offload_data()["pcie"]
    if generation not in table:
        raise TrainmathError(f"no PCIe host-link figure for GPU generation {generation!r} (hardware/offload.json "
                             f"has {', '.join(sorted(table))})")
    return table[generation]["pcie_bytes_per_s"], table[generation]["source"]


def cpu_adam_params_per_s() -> float:
    """DeepSpeedCPUAdam's achieved rate per node (parameters/s), fitted to ``cpu_adam`` in ``offload.json``:
    the parameters one node updates (params / nodes) over the published step time."""
    c = offload_data()["cpu_adam"]
    return c["params"] / c["nodes"] / c["step_s"]


@dataclass(frozen=True, kw_only=True)
class OffloadTime:
    """The offload terms of one step (seconds) and the bytes behind them (per rank unless named per node)."""

    offload: str
    shard_params: int
    ranks_per_node: int
    grad_d2h_bytes: int
    update_h2d_bytes: int
    param_h2d_bytes: int
    cpu_step_bytes_per_node: int
    pcie_bytes_per_s: float
    """Achieved: the link's rate times ``pcie_fraction``."""
    host_bytes_per_s: float
    """Achieved host DRAM rate of the CPU step per node."""
    grad_d2h_s: float
    update_h2d_s: float
    param_h2d_s: float
    cpu_step_s: float
    breakdown: dict
    """``BREAKDOWN_OFFLOAD`` → exposed seconds."""

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("offload", "shard_params", "ranks_per_node", "grad_d2h_bytes",
                                              "update_h2d_bytes", "param_h2d_bytes", "cpu_step_bytes_per_node",
                                              "pcie_bytes_per_s", "host_bytes_per_s", "grad_d2h_s",
                                              "update_h2d_s", "param_h2d_s", "cpu_step_s")}


def offload_time(*, offload: str, zero: int, shard_params: int, ranks_per_node: int, micro_batches: int,
                 grad_bytes: int, weight_bytes: int, passes: int, pcie_bytes_per_s: float, host_bytes_per_s: float,
                 backward_s: float, compute_s: float) -> OffloadTime:
    """The offload terms (module docstring). ``backward_s``, ``compute_s``: the step's backward (+ recompute) and
    forward + backward + recompute seconds on the busiest stage, all micro-batches; ``passes``: parameter
    fetches per micro-batch under ``params`` (2, 3 with full recompute); rates are achieved B/s."""
    if offload not in ("optimizer", "params"):
        raise TrainmathError(f"offload time is modelled for --offload optimizer|params, got {offload!r}")
    s, m = shard_params, micro_batches
    d2h = grad_bytes * s * (m if zero >= 2 else 1)
    update = weight_bytes * s if offload == "optimizer" else 0
    fetch = weight_bytes * s * passes * m if offload == "params" else 0
    cpu_bytes = ranks_per_node * s * cpu_adam_bytes_per_param(weight_bytes)
    d2h_s, update_s, fetch_s = d2h / pcie_bytes_per_s, update / pcie_bytes_per_s, fetch / pcie_bytes_per_s
    cpu_s = cpu_bytes / host_bytes_per_s
    breakdown = {"offload_grad_d2h": max(0.0, d2h_s - backward_s) if zero >= 3 else d2h_s,
                 "cpu_optimizer_step": max(cpu_s, update_s),
                 "offload_param_h2d": max(0.0, fetch_s - compute_s)}
    return OffloadTime(offload=offload, shard_params=s, ranks_per_node=ranks_per_node, grad_d2h_bytes=d2h,
                       update_h2d_bytes=update, param_h2d_bytes=fetch, cpu_step_bytes_per_node=cpu_bytes,
                       pcie_bytes_per_s=pcie_bytes_per_s, host_bytes_per_s=host_bytes_per_s, grad_d2h_s=d2h_s,
                       update_h2d_s=update_s, param_h2d_s=fetch_s, cpu_step_s=cpu_s, breakdown=breakdown)


def offload_problems(zero: int, offload: str, optimizer: str) -> list[str]:
    """Why a layout cannot be timed with ``offload`` (empty when it can)."""
    if offload == "none":
        return []
    if offload not in OFFLOADS:
        return [f"--offload must be one of {', '.join(OFFLOADS)}, got {offload!r}"]
    bad = []
    if zero < 1 and offload == "optimizer":
        bad.append(f"--offload {offload} needs ZeRO stage 1 or more (DeepSpeed offloads the ZeRO partition), "
                   f"got --zero {zero}")
    if offload == "params" and zero != 3:
        bad.append(f"--offload params needs ZeRO-3, got --zero {zero}")
    if optimizer not in CPU_ADAM:
        bad.append(f"the offloaded step is timed for DeepSpeedCPUAdam (--optimizer adam or adamw), got {optimizer}")
    return bad


def with_offload(est, spec, layout, job, gpu, *, shard_params: int, host: bool = True,
                 weight_bytes: int | None = None):
    """``est`` (``perf.step.estimate``'s, without offload terms) with the offload terms and, with ``host``, its
    host RAM and the host verdict (``fits`` then needs both): the GPU ``optimizer_step`` is 0,
    ``BREAKDOWN_OFFLOAD`` added, rates and MFU recomputed. ``shard_params``: the busiest stage's S;
    ``weight_bytes``: the bytes of its weights and gradients (a fine-tune's adapter dtype), else the precision's."""
    from trainmath.memory.host import ranks_per_node
    from trainmath.vocabulary import get_precision
    prec = get_precision(job.precision)
    if weight_bytes is not None:
        prec = replace(prec, weight_bytes=weight_bytes, grad_bytes=weight_bytes)
    shard = shard_params
    link, _ = pcie_bytes_per_s(gpu.generation)
    fraction = offload_data()["pcie_fraction"]
    host_rate = job.host_bytes_per_s or cpu_adam_params_per_s() * cpu_adam_bytes_per_param(prec.weight_bytes)
    b = est.breakdown
    n = ranks_per_node(layout, gpu.gpus_per_node)
    t = offload_time(offload=job.offload, zero=layout.zero, shard_params=shard, ranks_per_node=n,
                     micro_batches=est.micro_batches, grad_bytes=prec.grad_bytes, weight_bytes=prec.weight_bytes,
                     passes=3 if job.recompute == "full" else 2, pcie_bytes_per_s=link * fraction,
                     host_bytes_per_s=host_rate, backward_s=b["backward"] + b["recompute"],
                     compute_s=b["forward"] + b["backward"] + b["recompute"])
    breakdown = {**b, "optimizer_step": 0.0, **t.breakdown}
    step = sum(breakdown.values())
    extra = {**t.to_dict(), **(host_verdict(spec, layout, job, gpu, est.micro_batches) if host else {})}
    host_fits = extra.get("host_fits", True)
    kept = (c for c in est.conventions if not c.startswith("optimizer step memory-bound"))  # the GPU step is 0
    conventions = (*kept, *offload_conventions(job, layout, gpu, fraction, host_rate, prec.weight_bytes))
    return replace(est, step_time_s=step, breakdown=breakdown,
                   fits=None if est.fits is None else est.fits and host_fits, offload=extra,
                   conventions=conventions)


def host_verdict(spec, layout, job, gpu, micro_batches: int) -> dict:
    """The host RAM per node of ``job`` with offload (``memory.host``) against ``job.host_memory_bytes``:
    ``host_bytes``, ``host_memory_bytes``, ``host_fits``, ``host_margin_bytes``, ``host_per_rank``."""
    from trainmath.memory.host import check_host_memory, job_host_memory
    from trainmath.memory.training import TrainingSetup

    setup = TrainingSetup(micro_batch=job.micro_batch, seq=job.seq, precision=job.precision,
                          optimizer=job.optimizer, recompute=job.recompute, micro_batches=micro_batches,
                          offload=job.offload, peft=job.peft)
    host = job_host_memory(spec, setup, layout, gpus_per_node=gpu.gpus_per_node)
    limit = check_host_memory(job.host_memory_bytes)
    return {"host_bytes": host.host_bytes, "host_memory_bytes": limit, "host_fits": host.host_bytes <= limit,
            "host_margin_bytes": limit - host.host_bytes, "host_per_rank": host.per_rank.flat()}


def offload_conventions(job, layout, gpu, fraction: float, host_rate: float, weight_bytes: int) -> tuple[str, ...]:
    link, source = pcie_bytes_per_s(gpu.generation)
    rate = ("--host-bandwidth" if job.host_bytes_per_s else
            f"fitted to DeepSpeed #6834 (Qwen2.5-72B over 4 nodes, ~10 s; in-sample): "
            f"{cpu_adam_params_per_s() / 1e9:.3f}e9 parameters/s per node")
    overlap = ("hidden behind the backward (overlap_comm on), the excess exposed" if layout.zero >= 3 else
               "exposed (overlap_comm off)")
    return (
        f"offload {job.offload} (DeepSpeed ZeRO-{'Infinity CPU tier' if job.offload == 'params' else 'Offload'}): "
        f"gradients to the host over PCIe at {link / 1e9:.0f} GB/s x {fraction:.0%} per GPU per direction "
        f"({gpu.generation}: {source}), {overlap}",
        f"CPU optimizer step: DeepSpeedCPUAdam memory-bound, {cpu_adam_bytes_per_param(weight_bytes)} bytes per "
        f"parameter over the node's host DRAM shared by its ranks at {host_rate / 1e9:.1f} GB/s ({rate}); after "
        f"the whole backward (one-step delayed update off), the bit16 copy to the GPU overlapped with it; it "
        f"replaces the GPU optimizer step",
        *(("parameters fetched from the host per pass (forward, backward, recompute) per micro-batch, prefetched "
           "behind the micro-batch's compute",) if job.offload == "params" else ()),
    )
