"""``plan --peft lora|qlora``: the planner over the layouts a fine-tune can be modelled on.

The full-training planner's bounds (model states, saved GEMM inputs, compute) are full training's, so a fine-tune
is searched on its own: every layout of the GPUs is enumerated as ``plan.search`` does; one the fine-tune's step
model refuses (``perf.peft.peft_problems``: tp/pp/cp/ep > 1, offload under ZeRO-3) or that ``job_problems`` refuses is
rejected with its reason in one line; every option of the rest (micro-batch, recompute none or full) is timed
(``perf.peft``, cheap), and the memory model (``trainmath memory --peft``) is asked in order of step time until
the top K fit. A layout the memory model refuses is rejected with its message.
"""

from __future__ import annotations

from dataclasses import replace

from trainmath.errors import TrainmathError
from trainmath.hardware import presets
from trainmath.perf.compute import memo, spec_cache
from trainmath.perf.job import job_problems
from trainmath.perf.peft import peft_estimate, peft_peak_bytes, peft_problems
from trainmath.plan import search as full
from trainmath.plan.search import MICRO_BATCHES, PlanResult, Rejected, reason_category
from trainmath.usable import usable_bytes

RECOMPUTES = ("none", "full")
"""The recompute settings a fine-tune is searched with (the memory model's: selective is not modelled)."""
SEARCH_TEXT = ("every layout of the GPUs enumerated, those the fine-tune's step model covers (one device, DDP, "
               "ZeRO-1/2, ZeRO-3/FSDP2) timed with micro-batch 1/2/4/8 and recompute none/full; memory of trainmath "
               "memory --peft")


def plan_peft(spec, *, gpus: int, gpu, job, gpus_per_node: int | None = None, top: int = 5, hardware=None,
              fit_profiles: tuple[str, ...] | None = None) -> PlanResult:
    """The ``top`` fastest layouts of the fine-tune ``job.peft`` that fit, and every rejection (see the module
    docstring); arguments as ``plan.search.plan``."""
    if fit_profiles is not None and tuple(fit_profiles) != ("hf",):
        raise TrainmathError("--fit-profiles with --peft: the fine-tune's memory is modelled with the hf profile "
                             "only (pass --fit-profiles hf or leave it out)")
    gpu = full.checked_request(gpus, gpu, gpus_per_node, top)
    gpn = gpu.gpus_per_node
    hw = hardware or presets()
    limit = usable_bytes(gpu.memory_bytes, job.mem_util_percent)
    rejected: list[Rejected] = []
    per_structure = len(MICRO_BATCHES) * len(RECOMPUTES)
    timed = []
    n = 0
    for lay in full._structures(spec, gpus, gpn, job.seq, job.uneven_stages):
        n += per_structure
        bad = job_problems(spec, lay, replace(job, micro_batch=1, virtual_stages=1, recompute="none"), gpus) \
            or peft_problems(lay, job)
        if bad:
            rejected.append(Rejected(layout=lay, micro_batch=0, recompute="*", virtual_stages=0,
                                     reason=reason_category(bad[0]), detail="; ".join(bad), count=per_structure))
            continue
        for mb in MICRO_BATCHES:
            problem = full._option_problem(spec, lay, job, mb, 1)
            if problem:
                rejected.append(Rejected(layout=lay, micro_batch=mb, recompute="*", virtual_stages=1,
                                         reason=reason_category(problem), detail=problem, count=len(RECOMPUTES)))
                continue
            for rc in RECOMPUTES:
                jb = replace(job, micro_batch=mb, virtual_stages=1, recompute=rc)
                timed.append(peft_estimate(spec, lay, jb, gpu, hardware=hw, memory=False, validate=False))
    timed.sort(key=lambda e: e.step_time_s)
    found = []
    failures = full._FitFailures()
    checks = i = 0
    while i < len(timed) and len(found) < top:
        est = timed[i]
        i += 1
        lay, jb = est.layout, est.job
        known = failures.dominated(lay, jb)
        if known is not None:
            rejected.append(Rejected(layout=lay, micro_batch=jb.micro_batch, recompute=jb.recompute, virtual_stages=1,
                                     reason="does not fit memory", detail=f"needs at least the {known / 2**30:.1f} "
                                     f"GiB of a layout with less memory that did not fit", peak_bytes=known,
                                     step_time_s=est.step_time_s))
            continue
        key = ("peft memory", lay, jb.micro_batch, jb.seq, jb.precision, jb.optimizer, jb.recompute, jb.peft,
               jb.attention, jb.offload)
        if key not in spec_cache(spec):
            checks += 1
        try:
            peak = memo(spec, key, lambda: peft_peak_bytes(spec, lay, jb, est.micro_batches))
        except TrainmathError as e:
            rejected.append(Rejected(layout=lay, micro_batch=jb.micro_batch, recompute=jb.recompute, virtual_stages=1,
                                     reason=reason_category(str(e)), detail=str(e), step_time_s=est.step_time_s))
            continue
        if peak > limit:
            failures.add(lay, jb, peak)
            rejected.append(Rejected(layout=lay, micro_batch=jb.micro_batch, recompute=jb.recompute, virtual_stages=1,
                                     reason="does not fit memory", detail=f"peak {peak / 2**30:.1f} GiB > "
                                     f"{limit / 2**30:.1f} GiB usable", peak_bytes=peak, step_time_s=est.step_time_s))
            continue
        if jb.offload != "none":  # the host must hold the adapters' offloaded states too (plan.search's rule)
            from trainmath.perf.offload import host_verdict

            host = host_verdict(spec, lay, jb, gpu, est.micro_batches)
            est = replace(est, offload={**est.offload, **host})
            if not host["host_fits"]:
                rejected.append(Rejected(layout=lay, micro_batch=jb.micro_batch, recompute=jb.recompute,
                                         virtual_stages=1, reason="host RAM exceeded",
                                         detail=f"host RAM {host['host_bytes'] / 2**30:.1f} GiB per node > "
                                         f"--host-memory {host['host_memory_bytes'] / 2**30:.1f} GiB",
                                         step_time_s=est.step_time_s))
                continue
        found.append(replace(est, peak_bytes=peak, fits=True))
    bounded = len(timed) - i
    counts: dict[str, int] = {}
    for r in rejected:
        counts[r.reason] = counts.get(r.reason, 0) + r.count
    if bounded:
        counts["not needed: slower than the top K"] = bounded
    layouts = tuple(found)
    return PlanResult(model=spec.name, gpu=gpu.name, gpus=gpus, gpus_per_node=gpn, layouts=layouts,
                      rejected=counts, rejected_list=tuple(rejected),
                      closest=() if layouts else full._closest(rejected, top),
                      usable_bytes=limit, candidates=n, memory_checks=checks, bounded=bounded, fit_profiles=("hf",),
                      memory_bytes=gpu.memory_bytes, mem_util_percent=job.mem_util_percent, search=SEARCH_TEXT)


def plan_job(spec, *, job, **kw) -> PlanResult:
    """The planner for ``job``: ``plan.search.plan`` for full training, ``plan_peft`` for a fine-tune
    (``job.peft``); keyword arguments as ``plan.search.plan``."""
    if job.peft is not None:
        return plan_peft(spec, job=job, **kw)
    return full.plan(spec, job=job, **kw)
