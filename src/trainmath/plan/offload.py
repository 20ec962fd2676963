"""``plan --offload auto``: the planner run once per offload mode (none, optimizer, params) and the results merged,
fastest first. Each run fits the GPU and, with offload, the host (``perf.offload``, ``memory.host``)."""

from __future__ import annotations

from dataclasses import replace

from trainmath.perf.offload import OFFLOADS


def plan_offload(spec, *, job, modes: tuple[str, ...] = OFFLOADS, top: int = 5, **kw):
    """The ``top`` fastest layouts over every mode in ``modes`` (``plan.search.plan`` for each, ``job.offload``
    replaced); rejections are summed by reason, each prefixed with its mode when it is not ``none``."""
    from trainmath.plan.search import _closest, plan

    results = [plan(spec, job=replace(job, offload=m), top=top, **kw) for m in modes]
    layouts = sorted((e for r in results for e in r.layouts), key=lambda e: e.step_time_s)[:top]
    counts: dict[str, int] = {}
    for m, r in zip(modes, results):
        for reason, n in r.rejected.items():
            key = reason if m == "none" else f"offload {m}: {reason}"
            counts[key] = counts.get(key, 0) + n
    rejected = tuple(x for r in results for x in r.rejected_list)
    first = results[0]
    return replace(first, layouts=tuple(layouts), rejected=counts, rejected_list=rejected,
                   closest=() if layouts else _closest(list(rejected), top),
                   candidates=sum(r.candidates for r in results), memory_checks=sum(r.memory_checks for r in results),
                   bounded=sum(r.bounded for r in results))
