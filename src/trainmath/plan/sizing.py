"""How many GPUs: the fewest GPUs whose best layout trains ``tokens`` within a deadline, or the fastest layout
whose cost stays within a budget. Each probe is a full ``plan`` at one GPU count (top 1).

Search: GPU counts that are multiples of the node size and that the planner's degrees can make
(``candidate_counts``), from ``lower_bound_gpus`` (a deadline: the count that would meet it at 100% of the dense
peak on the model FLOPs with causal attention halved, which no layout beats) or one node (a budget) up to
``MAX_SIZING_GPUS``: doubling the index step, then bisecting between the last count that missed and the first
that met the goal. Bisection assumes the best layout's time does not grow with the GPU count (for a deadline) and
its cost does not fall (for a budget); it does not always hold (a count whose dp cannot be a power of two may be
slower than the one below it), so the answer is the fewest the search found, and every probe is returned and
printed. A count where nothing fits memory or can be built counts as a miss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.hardware import GPU, Hardware
from trainmath.model.spec import ModelSpec
from trainmath.perf.job import Job
from trainmath.plan.peft import plan_job as plan
from trainmath.plan.search import PlanResult

MAX_SIZING_GPUS = 131_072
"""Largest count the sizing search probes (2**17: 16,384 nodes of 8)."""


@dataclass(frozen=True, kw_only=True)
class Probe:
    gpus: int
    time_s: float | None
    """Wall time of the best layout on ``tokens`` (None: nothing fits or can be built at this count)."""
    cost: float | None = None


@dataclass(frozen=True, kw_only=True)
class Sizing:
    goal: str
    """``deadline`` (fewest GPUs that meet it) or ``budget`` (fastest layout within it)."""
    tokens: int
    deadline_s: float | None
    budget: float | None
    price_per_gpu_hour: float | None
    search_from: int
    search_to: int
    node: int
    probes: tuple[Probe, ...]
    gpus: int | None
    """The answer, or None when no count in the range meets the goal."""
    result: PlanResult | None
    """The plan at ``gpus`` (its top layout is the answer's layout)."""

    def to_dict(self) -> dict:
        return {"goal": self.goal, "tokens": self.tokens, "deadline_s": self.deadline_s, "budget": self.budget,
                "price_per_gpu_hour": self.price_per_gpu_hour, "search_gpus": [self.search_from, self.search_to],
                "node_gpus": self.node, "gpus": self.gpus,
                "probes": [{"gpus": p.gpus, "time_s": p.time_s, "cost": p.cost} for p in self.probes]}


def lower_bound_gpus(spec: ModelSpec, job: Job, gpu: GPU, tokens: int, deadline_s: float) -> int:
    """GPUs below which no layout can meet the deadline: model FLOPs of ``tokens`` (causal attention halved, no
    recompute) / (deadline · dense peak), rounded up to a whole node."""
    from trainmath.perf.step import _flops_per_sequence

    flops = _flops_per_sequence(spec, job.seq, "half", "none") * tokens / job.seq
    need = flops / (deadline_s * gpu.peak_flops_per_s(job.dtype))
    node = gpu.gpus_per_node
    return max(node, math.ceil(need / node) * node)


def size(spec: ModelSpec, *, gpu: GPU, job: Job, tokens: int, deadline_s: float | None = None,
         budget: float | None = None, price_per_gpu_hour: float | None = None, hardware: Hardware | None = None,
         top: int = 5, fit_profiles: tuple[str, ...] | None = None) -> Sizing:
    """The sizing answer (module docstring). With both a deadline and a budget: the fewest GPUs that meet the
    deadline, kept only when its cost is within the budget."""
    check_goal(tokens, deadline_s, budget, price_per_gpu_hour)
    node = gpu.gpus_per_node
    goal = "deadline" if deadline_s is not None else "budget"
    start = lower_bound_gpus(spec, job, gpu, tokens, deadline_s) if deadline_s is not None else node
    probes: dict[int, Probe] = {}
    plans: dict[int, PlanResult] = {}

    def probe(n: int) -> Probe:
        if n not in probes:
            r = plan(spec, gpus=n, gpu=gpu, job=job, top=1, hardware=hardware, fit_profiles=fit_profiles)
            plans[n] = r
            if r.layouts:
                b = r.layouts[0].budget(tokens, price_per_gpu_hour)
                probes[n] = Probe(gpus=n, time_s=b["time_s"], cost=b.get("cost"))
            else:
                probes[n] = Probe(gpus=n, time_s=None)
        return probes[n]

    def meets(n: int) -> bool:
        p = probe(n)
        if p.time_s is None:
            return False
        if goal == "deadline":
            return p.time_s <= deadline_s
        return p.cost <= budget

    counts = candidate_counts(spec, job, node, start)
    if goal == "deadline":
        found = _first_meeting(counts, meets)
    else:
        found = _last_within(counts, meets, lambda n: probe(n).time_s is None)
    if found is not None and goal == "deadline" and budget is not None and probe(found).cost > budget:
        found = None
    result = None
    if found is not None:
        result = plan(spec, gpus=found, gpu=gpu, job=job, top=top, hardware=hardware, fit_profiles=fit_profiles)
    return Sizing(goal=goal, tokens=tokens, deadline_s=deadline_s, budget=budget,
                  price_per_gpu_hour=price_per_gpu_hour, search_from=start, search_to=MAX_SIZING_GPUS, node=node,
                  probes=tuple(sorted(probes.values(), key=lambda p: p.gpus)), gpus=found, result=result)


def candidate_counts(spec: ModelSpec, job: Job, node: int, start: int) -> list[int]:
    """Node multiples in [start, MAX_SIZING_GPUS] that the planner's degrees can make: dp · tp · pp · cp with dp
    dividing the global batch (micro-batch 1), tp dividing the node, pp dividing the layers (one virtual stage;
    any pp up to the layers with ``uneven_stages``) and cp dividing the sequence while each rank keeps ≥ 1024
    tokens (``plan.search``'s own rules)."""
    def divisors(n: int) -> list[int]:
        return [d for d in range(1, n + 1) if n % d == 0]

    L = spec.num_layers
    pps = range(1, L + 1) if job.uneven_stages else divisors(L)
    cps = [c for c in divisors(job.seq) if c == 1 or job.seq // c >= 1024]
    models = {tp * pp * cp for tp in divisors(node) for pp in pps for cp in cps}
    out = {dp * m for dp in divisors(job.global_batch) for m in models}
    return sorted(n for n in out if start <= n <= MAX_SIZING_GPUS and n % node == 0)


def _first_meeting(counts: list[int], meets) -> int | None:
    """The first of ``counts`` that meets the goal: doubling the index step, then bisection."""
    if not counts:
        return None
    miss, i, step = -1, 0, 1
    while i < len(counts) and not meets(counts[i]):
        miss, i, step = i, i + step, step * 2
    if i >= len(counts):
        i = len(counts) - 1
        if miss == i or not meets(counts[i]):
            return None
    return counts[_first_true(miss, i, lambda j: meets(counts[j]))]  # miss misses (or is before the start)


def _first_true(lo: int, hi: int, test) -> int:
    """Bisection: the first index in (lo, hi] where ``test`` holds, given it fails at lo and holds at hi (hi is
    never evaluated, so it may stand one past the end)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if test(mid) else (mid, hi)
    return hi


def _last_within(counts: list[int], within, unfit) -> int | None:
    """The last of ``counts`` whose best layout stays within the budget (the fastest within it): past the counts
    where nothing fits, doubling the index step while within, then bisection."""
    i, step = 0, 1
    while i < len(counts) and unfit(counts[i]):
        i, step = i + step, step * 2
    if i >= len(counts) or not within(counts[i]):
        return None
    ok, step = i, 1
    while ok + step < len(counts) and within(counts[ok + step]):
        ok, step = ok + step, step * 2
    return counts[_first_true(ok, min(ok + step, len(counts)), lambda j: not within(counts[j])) - 1]


def check_goal(tokens, deadline_s, budget, price) -> None:
    """One ``TrainmathError`` naming every bad sizing input."""
    bad = []
    if deadline_s is None and budget is None:
        bad.append("--gpus auto needs --deadline (fewest GPUs that meet it) or --budget (fastest within it)")
    if not tokens or tokens < 1:
        bad.append("--deadline and --budget need --tokens (the training run's token count, e.g. 15T)")
    if deadline_s is not None and not (isinstance(deadline_s, (int, float)) and math.isfinite(deadline_s)
                                       and deadline_s > 0):
        bad.append(f"--deadline must be a positive finite duration, got {deadline_s!r}")
    if budget is not None:
        if not (isinstance(budget, (int, float)) and math.isfinite(budget) and budget > 0):
            bad.append(f"--budget must be a positive finite amount, got {budget!r}")
        if price is None or not (math.isfinite(price) and price > 0):
            bad.append("--budget needs --price-per-gpu-hour (a positive price of one GPU-hour)")
    if bad:
        raise TrainmathError("; ".join(bad))


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` (or bare seconds) → seconds; positive and finite."""
    s = str(text).strip().lower()
    unit = s[-1] if s and s[-1] in _UNITS else "s"
    number = s[:-1] if s and s[-1] in _UNITS else s
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0) or len(s) > 40:
        raise TrainmathError(f"--deadline must be a positive duration such as 30d, 12h or 90m, got {text!r}")
    return value

