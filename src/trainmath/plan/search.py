"""The layout planner: every DP×TP×PP×CP×EP split of N GPUs, with ZeRO stage, recompute, micro-batch and virtual
stages, checked, fitted to memory and ranked by step time.

Search (exact, branch and bound):

1. Enumerate degrees whose product is N (tp within a node), and every option; each impossible combination is
   rejected with its reason (``trainmath.perf.job_problems``: heads, layers, experts, batch divisibility, ...).
2. Reject a layout whose model states alone (weights, gradients, master weights, optimizer states after ZeRO
   sharding; no activations) exceed the memory: a cheap lower bound of the memory model's peak.
3. Reject an option whose cheap memory lower bound (``memory_lower_bound``: states plus the saved GEMM inputs of
   the micro-batches in flight) exceeds the memory.
4. Best-first search: every candidate waits in a heap keyed by a lower bound of its step time (compute and
   pipeline bubble only; every other term of the step is ≥ 0). Popped, it is estimated and re-queued keyed by its
   exact step time; popped again, no candidate left can be faster, so the memory model
   (``trainmath.memory.training.training_memory``, cached per distinct key) decides whether it is the next
   result. A layout needing no less memory than one that failed (same degrees, larger micro-batch, less
   recompute, lower ZeRO stage) is rejected without asking; when failures pile up with nothing fitting yet, a layout's
   first failure also asks about its leanest option (ZeRO-3, micro-batch 1, full recompute), whose failure rules out
   all its options at once. Stop after K results; what is left in the heap is counted as not needed.

The result is the same top K an exhaustive search gives, with the memory model asked only about candidates
faster than the K-th result.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, replace

from trainmath.errors import TrainmathError
from trainmath.hardware import GPU, Hardware, presets
from trainmath.layout import ParallelLayout
from trainmath.model.spec import ModelSpec, MoEDims
from trainmath.perf.compute import memo, spec_cache
from trainmath.perf.job import Estimate, Job, job_problems
from trainmath.perf.step import estimate, memory_peak_bytes, memory_recompute
from trainmath.plan.bounds import memory_lb, states_max, time_lower_bound
from trainmath.usable import MEM_UTIL_PERCENT, rule_text, usable_bytes
from trainmath.vocabulary import RECOMPUTE as RECOMPUTES

MAX_GPUS = 1 << 20
"""Largest job searched (1,048,576 GPUs, a few seconds on one core). The enumeration of degrees grows with the
divisors of the GPU count (720,720 GPUs: ~9 s; 2**40: over a minute), and the web page runs the planner on a typed
count, so a larger one is refused rather than left running."""
MICRO_BATCHES = (1, 2, 4, 8)
VIRTUAL_STAGES = (1, 2, 4)
ZERO_STAGES = (0, 1, 2, 3)
PROBE_AFTER_FAILURES = 8
"""Memory-model failures, with nothing fitting yet, after which each new failure also probes its degrees' leanest
option (a probe costs one call; it pays off only when most degrees cannot fit at all)."""
PROBE_LEAN_SHARE = 2
"""A probe is asked only when the leanest option's memory lower bound is at least 1/PROBE_LEAN_SHARE of the usable
memory (the memory model's peak stays within ~2× of that bound on the layouts profiled); below that the probe
would almost surely fit and prune nothing. Either way the answer is the same: probes only prune soundly."""
MIN_TOKENS_PER_CP_RANK = 1024
"""Context parallelism is tried only while each rank keeps at least this many tokens of a sequence."""


@dataclass(frozen=True, kw_only=True)
class Rejected:
    layout: ParallelLayout
    micro_batch: int
    recompute: str
    virtual_stages: int
    reason: str
    """Category (values stripped), the key of ``PlanResult.rejected``."""
    detail: str
    """The full message, with values."""
    peak_bytes: int | None = None
    step_time_s: float | None = None
    """The step time, when the candidate was estimated before its memory rejected it."""
    count: int = 1
    """Candidates this rejection stands for (a layout-level reason removes every option under it at once)."""


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    model: str
    gpu: str
    gpus: int
    gpus_per_node: int
    layouts: tuple[Estimate, ...]
    """The top K that fit, fastest first."""
    rejected: dict
    """reason → how many candidates it removed."""
    rejected_list: tuple[Rejected, ...]
    closest: tuple[Rejected, ...]
    """When nothing fits: the candidates that missed memory by the least."""
    usable_bytes: int
    """What a layout's peak may reach: the one fit rule (``trainmath.usable.usable_bytes``)."""
    candidates: int
    memory_checks: int
    bounded: int
    """Candidates never evaluated: their step-time lower bound was already slower than the K-th best."""
    fit_profiles: tuple[str, ...] = ("megatron",)
    """The activation profiles every layout's peak must fit under (``peak_bytes``: the largest)."""
    memory_bytes: int = 0
    mem_util_percent: int = MEM_UTIL_PERCENT
    search: str = ""
    """What was searched, when not full training's space (``plan.peft``); "" for full training."""

    @property
    def fit_rule(self) -> str:
        return rule_text(self.memory_bytes, self.mem_util_percent)

    def to_dict(self) -> dict:
        return {"model": self.model, "gpu": self.gpu, "gpus": self.gpus, "gpus_per_node": self.gpus_per_node,
                "layouts": [e.to_dict() for e in self.layouts], "rejected": dict(self.rejected),
                "candidates": self.candidates, "memory_checks": self.memory_checks, "bounded": self.bounded,
                "usable_bytes": self.usable_bytes, "fit_profiles": list(self.fit_profiles),
                "mem_util_percent": self.mem_util_percent, "fit_rule": self.fit_rule,
                "closest": [{**_describe(r), "reason": r.detail, "peak_bytes": r.peak_bytes,
                             "lacks_bytes": r.peak_bytes - self.usable_bytes} for r in self.closest]}


def _describe(r: Rejected) -> dict:
    lay = r.layout
    return {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep, "sp": lay.sp, "zero": lay.zero,
            "micro_batch": r.micro_batch, "recompute": r.recompute, "virtual_stages": r.virtual_stages,
            "first_stage_layers": lay.first_stage_layers, "last_stage_layers": lay.last_stage_layers}


def reason_category(message: str) -> str:
    """'tp (8) must divide attention heads (12)' → 'tp must divide attention heads': counts group by kind."""
    text = re.sub(r"\s*\([^)]*\)", "", message)
    text = re.sub(r"\s*=\s*[\d·×\s]+", " ", text)
    return re.sub(r"\s+", " ", text).strip(" ;:")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _experts(spec: ModelSpec) -> int:
    return next((b.dims.experts for layer in spec.layers for b in layer.blocks if isinstance(b.dims, MoEDims)), 0)


def _option_problem(spec: ModelSpec, layout: ParallelLayout, job: Job, mb: int, v: int) -> str | None:
    """The first reason (micro-batch, virtual stages) cannot run on a layout that passed ``job_problems`` with
    micro-batch 1 and no interleaving: the same rules, without building a Job per option."""
    if job.global_batch % (layout.dp * mb):
        return (f"global batch ({job.global_batch}) must be divisible by dp × micro-batch ({layout.dp} × {mb} = "
                f"{layout.dp * mb})")
    if v > 1 and layout.stage_split != (None, None):
        return "first/last stage layers with virtual stages > 1 are not modelled"
    if v > 1:
        chunks = layout.pp * v
        if chunks > spec.num_layers:
            return f"pp × virtual stages ({layout.pp} × {v}) must not exceed the layers ({spec.num_layers})"
        if spec.num_layers % chunks and not job.uneven_stages:
            return f"pp × virtual stages ({layout.pp} × {v} = {chunks}) must divide the layers ({spec.num_layers})"
        m = job.global_batch // (layout.dp * mb)
        if m % layout.pp:
            return f"interleaved 1F1B needs the micro-batches ({m}) to be a multiple of pp ({layout.pp})"
    return None


def megatron_split(num_layers: int, pp: int) -> tuple[int, int] | None:
    """(first, last) stage layers that balance ``num_layers`` over ``pp`` stages when pp does not divide them:
    the inner stages take ⌈L/pp⌉ each and the first and last share the rest, the first the lighter
    (Megatron-LM's ``--decoder-first/last-pipeline-num-layers``: 126 on pp 16 → 7 + 8·14 + 7). None when pp
    divides the layers or no such split exists."""
    if pp < 2 or num_layers % pp == 0:
        return None
    per = -(-num_layers // pp)
    rest = num_layers - (pp - 2) * per
    if rest < 2 or rest > 2 * per:
        return None
    return rest // 2, rest - rest // 2


def _structures(spec: ModelSpec, gpus: int, gpus_per_node: int, seq: int, uneven: bool = False):
    """Every layout (degrees and ZeRO stage) of ``gpus`` GPUs the planner considers, tp within a node; with
    ``uneven``, a pp not dividing the layers is tried with the even split and with ``megatron_split``."""
    experts = _experts(spec)
    for tp in _divisors(gpus):
        if tp > gpus_per_node:
            continue
        for pp in _divisors(gpus // tp):
            for cp in _divisors(gpus // (tp * pp)):
                if cp > 1 and seq // cp < MIN_TOKENS_PER_CP_RANK:
                    continue
                dp = gpus // (tp * pp * cp)
                for ep in [e for e in _divisors(dp * cp) if experts and experts % e == 0] or [1]:
                    split = megatron_split(spec.num_layers, pp) if uneven else None
                    for zero in ZERO_STAGES:
                        yield ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, sp=tp > 1, zero=zero)
                        if split:
                            yield ParallelLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, sp=tp > 1, zero=zero,
                                                 first_stage_layers=split[0], last_stage_layers=split[1])


def _options(layout: ParallelLayout, job: Job):
    for mb in MICRO_BATCHES:
        for v in (VIRTUAL_STAGES if layout.pp > 1 else (1,)):
            for rc in RECOMPUTES:
                yield replace(job, micro_batch=mb, virtual_stages=v, recompute=rc)


_HEAVIER = {"none": 0, "selective": 1, "full": 2}


class _FitFailures:
    """Checked layouts that did not fit, to reject without the memory model what they dominate: per-rank memory
    never falls with a larger micro-batch, less recomputation or a lower ZeRO stage (tests/perf check it)."""

    def __init__(self) -> None:
        self.by_degrees: dict[tuple, list[tuple[int, int, int, int]]] = {}

    @staticmethod
    def _key(lay: ParallelLayout) -> tuple:
        return (lay.dp, lay.tp, lay.pp, lay.cp, lay.ep, lay.sp, lay.stage_split)

    def add(self, lay: ParallelLayout, job: Job, peak: int) -> None:
        self.by_degrees.setdefault(self._key(lay), []).append((lay.zero, job.micro_batch, _HEAVIER[job.recompute],
                                                               peak))

    def dominated(self, lay: ParallelLayout, job: Job) -> int | None:
        """The peak of a failed layout that needs no more memory than this one, if any."""
        r = _HEAVIER[job.recompute]
        for zero, mb, rc, peak in self.by_degrees.get(self._key(lay), ()):
            if lay.zero <= zero and job.micro_batch >= mb and r <= rc:
                return peak
        return None


def fit_profiles_default(spec: ModelSpec, job: Job) -> tuple[str, ...]:
    """The activation profiles a recommended layout must fit under: the job's, and the hf profile too where
    transformers' saved tensors are modelled for the family (a layout that fits only the leaner profile is one
    implementation away from running out of memory)."""
    extra = ("hf",) if job.profile != "hf" and spec.family.modelled else ()
    return (job.profile, *extra)


def checked_request(gpus, gpu, gpus_per_node: int | None, top: int):
    """The planner's request checked (one line for a bad one); ``gpu`` with ``gpus_per_node`` applied."""
    if not isinstance(gpus, int) or gpus < 1:
        raise TrainmathError(f"--gpus must be a positive integer, got {gpus!r}")
    if gpus > MAX_GPUS:
        raise TrainmathError(f"--gpus must be at most {MAX_GPUS:,} (2**20) for the planner, got {gpus:,}")
    if top < 1:
        raise TrainmathError(f"--top must be at least 1, got {top}")
    gpn = gpus_per_node or gpu.gpus_per_node
    if gpn < 1:
        raise TrainmathError(f"--gpus-per-node must be a positive integer, got {gpn}")
    return gpu if gpn == gpu.gpus_per_node else replace(gpu, gpus_per_node=gpn)


def plan(spec: ModelSpec, *, gpus: int, gpu: GPU, job: Job, gpus_per_node: int | None = None, top: int = 5,
         hardware: Hardware | None = None, fit_profiles: tuple[str, ...] | None = None) -> PlanResult:
    """The ``top`` fastest layouts of ``job`` on ``gpus`` GPUs of type ``gpu`` that fit, and every rejection.
    ``job``'s micro-batch, recompute and virtual stages are ignored (searched). ``fit_profiles``: the activation
    profiles whose peak must fit (the largest is the layout's ``peak_bytes``; default ``fit_profiles_default``;
    the hf profile is skipped for a layout it refuses, e.g. fused projections under tp). Full training only: a
    fine-tune (``job.peft``) is searched by ``plan.peft.plan_peft`` (``trainmath.plan.plan`` picks)."""
    profiles = fit_profiles_default(spec, job) if fit_profiles is None else tuple(fit_profiles)
    if not profiles or any(p not in ("megatron", "hf") for p in profiles):
        raise TrainmathError(f"--fit-profiles must name megatron and/or hf, got {','.join(profiles) or 'nothing'}")
    gpu = checked_request(gpus, gpu, gpus_per_node, top)
    gpn = gpu.gpus_per_node
    hw = hardware or presets()
    eff = hw.efficiency(gpu)
    limit = usable_bytes(gpu.memory_bytes, job.mem_util_percent)
    rejected: list[Rejected] = []

    def reject(lay, jb, reason, detail, peak=None, count=1, step=None):
        rejected.append(Rejected(layout=lay, micro_batch=jb.micro_batch if jb else 0,
                                 recompute=jb.recompute if jb else "*", virtual_stages=jb.virtual_stages if jb else 0,
                                 reason=reason, detail=detail, peak_bytes=peak, count=count, step_time_s=step))

    live: list[tuple] = []
    n = 0
    per_structure = len(MICRO_BATCHES) * len(RECOMPUTES)
    for lay in _structures(spec, gpus, gpn, job.seq, job.uneven_stages):
        vs = VIRTUAL_STAGES if lay.pp > 1 else (1,)
        n += per_structure * len(vs)
        bad = job_problems(spec, lay, replace(job, micro_batch=1, virtual_stages=1), gpus)
        if bad:
            reject(lay, None, reason_category(bad[0]), "; ".join(bad), count=per_structure * len(vs))
            continue
        held = states_max(spec, lay, job)
        if held > limit:
            reject(lay, None, "model states alone exceed memory",
                   f"model states {held / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB usable", held,
                   per_structure * len(vs))
            continue
        for mb in MICRO_BATCHES:
            for v in vs:
                problem = _option_problem(spec, lay, job, mb, v)
                if problem:
                    rejected.append(Rejected(layout=lay, micro_batch=mb, recompute="*", virtual_stages=v,
                                             reason=reason_category(problem), detail=problem,
                                             count=len(RECOMPUTES)))
                    continue
                for rc in RECOMPUTES:
                    low = memory_lb(spec, lay, job, mb, rc)
                    if low > limit:
                        rejected.append(Rejected(
                            layout=lay, micro_batch=mb, recompute=rc, virtual_stages=v, reason="does not fit memory",
                            detail=f"at least {low / 2**30:.1f} GiB (model states + saved inputs) > "
                                   f"{limit / 2**30:.1f} GiB usable", peak_bytes=low))
                        continue
                    live.append((time_lower_bound(spec, lay, job, gpu, eff, mb, rc, v), len(live), lay, mb, v, rc))
    # Best-first: a candidate enters keyed by its step-time lower bound; popped once, it is estimated and
    # re-entered keyed by its exact step time; popped again, nothing left can be faster, so its memory decides.
    heap = [(bound, order, 0, lay, (mb, v, rc), None) for bound, order, lay, mb, v, rc in live]
    heapq.heapify(heap)
    found: list[Estimate] = []
    failures = _FitFailures()
    checks = failed = 0
    probed: set = set()

    def peak_of(lay: ParallelLayout, jb: Job, micro_batches: int) -> int:
        nonlocal checks
        key = ("memory", lay, jb.micro_batch, jb.seq, jb.precision, jb.optimizer, memory_recompute(jb), jb.profile,
               min(micro_batches, lay.pp), jb.attention, profiles, jb.offload)
        if key not in spec_cache(spec):
            checks += 1
        return memo(spec, key, lambda: _peak(spec, lay, jb, micro_batches, profiles, limit))

    def probe_leanest(lay: ParallelLayout, jb: Job) -> None:
        """After a layout's first failure, ask about its leanest option (ZeRO-3, micro-batch 1, full recompute):
        if even that does not fit, every option of these degrees is dominated and none is asked about again."""
        degrees = _FitFailures._key(lay)
        if degrees in probed:
            return
        probed.add(degrees)
        lean, lean_job = replace(lay, zero=3), replace(jb, micro_batch=1, recompute="full", virtual_stages=1)
        if memory_lb(spec, lean, job, 1, "full") * PROBE_LEAN_SHARE < limit:
            return  # the leanest option is far below the memory on its lower bound: it will likely fit, and a
            #         probe that fits teaches nothing
        try:
            peak = peak_of(lean, lean_job, job.global_batch // lay.dp)
        except TrainmathError:
            return
        if peak > limit:
            failures.add(lean, lean_job, peak)
    while heap and len(found) < top:
        key, order, exact, lay, jb, est = heapq.heappop(heap)
        if not exact:
            mb, v, rc = jb
            jb = replace(job, micro_batch=mb, virtual_stages=v, recompute=rc)
            est = estimate(spec, lay, jb, gpu, hardware=hw, memory=False, validate=False)
            heapq.heappush(heap, (est.step_time_s, order, 1, lay, jb, est))
            continue
        known = failures.dominated(lay, jb)
        if known is not None:
            reject(lay, jb, "does not fit memory", f"needs at least the {known / 2**30:.1f} GiB of a layout with "
                                                   f"less memory that did not fit", known, step=est.step_time_s)
            continue
        try:
            peak = peak_of(lay, jb, est.micro_batches)
        except TrainmathError as e:
            reject(lay, jb, reason_category(str(e)), str(e))
            continue
        if peak > limit:
            failures.add(lay, jb, peak)
            reject(lay, jb, "does not fit memory", f"peak {peak / 2**30:.1f} GiB > {limit / 2**30:.1f} GiB usable",
                   peak, step=est.step_time_s)
            failed += 1
            if not found and failed > PROBE_AFTER_FAILURES:  # nothing fits so far: learn at once whether these
                probe_leanest(lay, jb)                        # degrees can fit at all
            continue
        if jb.offload != "none":  # the host must hold the offloaded states too
            from trainmath.perf.offload import host_verdict

            host = host_verdict(spec, lay, jb, gpu, est.micro_batches)
            est = replace(est, offload={**est.offload, **host})
            if not host["host_fits"]:
                reject(lay, jb, "host RAM exceeded", f"host RAM {host['host_bytes'] / 2**30:.1f} GiB per node > "
                       f"--host-memory {host['host_memory_bytes'] / 2**30:.1f} GiB", step=est.step_time_s)
                continue
        found.append(replace(est, peak_bytes=peak, fits=True))
    bounded = len(heap)
    layouts = tuple(found)
    counts: dict[str, int] = {}
    for r in rejected:
        counts[r.reason] = counts.get(r.reason, 0) + r.count
    if bounded:
        counts["not needed: slower than the top K"] = bounded
    closest = ()
    if not layouts:
        closest = _closest(rejected, top)
    return PlanResult(model=spec.name, gpu=gpu.name, gpus=gpus, gpus_per_node=gpn, layouts=layouts,
                      rejected=counts, rejected_list=tuple(rejected), closest=closest, usable_bytes=limit,
                      candidates=n, memory_checks=checks, bounded=bounded, fit_profiles=profiles,
                      memory_bytes=gpu.memory_bytes, mem_util_percent=job.mem_util_percent)


def _closest(rejected: list[Rejected], top: int) -> tuple[Rejected, ...]:
    """When nothing fits: the candidate that needs the least memory under each ZeRO stage (so the stages that
    shard the states are shown beside the others, each with what it lacks), then the next smallest needs up to
    ``top``, smallest need first."""
    mem = sorted((r for r in rejected if r.peak_bytes is not None), key=lambda r: r.peak_bytes)
    picked: list[Rejected] = []
    for z in ZERO_STAGES:
        best = next((r for r in mem if r.layout.zero == z), None)
        if best is not None:
            picked.append(best)
    picked += [r for r in mem if r not in picked][:max(0, top - len(picked))]
    return tuple(sorted(picked, key=lambda r: r.peak_bytes))


def _peak(spec, layout, job, micro_batches, profiles, limit: int) -> int:
    """The largest peak over ``profiles`` (the first is the job's own and must answer; the others are skipped
    where they refuse the layout, and once a peak exceeds ``limit``: the layout is out either way). The hf profile
    gets Megatron's vocabulary-parallel head."""
    peaks = [memory_peak_bytes(spec, layout, replace(job, profile=profiles[0]), micro_batches)]
    for p in profiles[1:]:
        if max(peaks) > limit:
            break
        lay = replace(layout, vocab_parallel=layout.tp > 1) if p == "hf" else layout
        try:
            peaks.append(memory_peak_bytes(spec, lay, replace(job, profile=p), micro_batches))
        except TrainmathError:
            continue
    return max(peaks)
