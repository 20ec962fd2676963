"""Data-parallel gradient sync as a timeline of buckets, and hybrid ZeRO (optimizer states sharded inside a group).

The default scheme of ``trainmath.perf.step`` hides the gradient sync behind the last micro-batch's backward except
one 25 MiB bucket. A job that states its buckets (``Job.grad_bucket_elements``) is timed bucket by bucket instead
(:func:`bucket_timeline`): the gradients become ready in backward order — the LM head, the layers last to first,
the input embedding (whose backward is a scatter-add, no GEMM: it overlaps nothing) — and a bucket is reduced
once ``bucket_elements`` gradients have accumulated since the previous one; the rest, a partial bucket, after the
backward ends. Collectives on one communicator run one after another (NCCL's stream order), so bucket k starts at
max(its gradients ready, bucket k − 1 done). With ``Job.blocking_buckets`` the host also waits for the previous
bucket before launching the next, stalling the backward at every bucket boundary until it is done: InternLM's
``HybridZeroOptimizer._reduce_and_copy`` calls ``torch.cuda.synchronize()`` before each bucket
(InternLM/InternLM ``internlm/solver/optimizer/hybrid_zero_optim.py``@fa7337b37b0024e70bee3c638f969451dc4d7351).

Hybrid ZeRO (``Job.zero_group`` smaller than the data-parallel group: InternLM's ``zero1=N``, "optimizer states
are distributed within 8 GPUs in a single node, and the optimizer states remain consistent across different
nodes", doc/en/train_performance.md@20fe5ac297e61c6ee62a8589e0b7fd12e36b590b): the same file's
``_reduce_and_copy`` all-reduces each bucket over the whole data-parallel group (``reduce_tensor(...,
dst_rank=None, parallel_mode=ParallelMode.DATA)``, bf16), each rank steps the 1/N of the parameters it owns, and
``broadcast_params`` broadcasts each of the N partitions from its owner inside the group (``ParallelMode.ZERO1``)
— with ``overlap=False`` at that commit ("TODO: support broadcast overlap"), so the step waits for it
(``Job.param_sync_overlap`` False). Only the last micro-batch reduces: ``forward_backward_step`` in
``internlm/core/no_pipeline_scheduler.py`` (same commit) sets ``skip_grad_reduce`` on the others, whose gradients
autograd's AccumulateGrad adds into ``.grad`` (``Job.autograd_grad_accumulation``, :func:`accumulation_s`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.model.spec import ModelSpec
from trainmath.perf import comm as cm
from trainmath.perf.compute import memo
from trainmath.perf.placement import placed_group


@dataclass(frozen=True, kw_only=True)
class BucketTimeline:
    """The gradient buckets of one backward, as run."""

    buckets: int
    comm_s: float
    """All buckets' collectives, end to end."""
    exposed_s: float
    """What the step waits for beyond the backward's own compute: the stalls at bucket boundaries (blocking) and
    the collectives still running when the backward ends."""


def bucket_timeline(units: list[tuple[float, float]], bucket_elements: float, time_of, blocking: bool = False
                    ) -> BucketTimeline:
    """The buckets of a backward whose ``units`` — (gradient elements, backward seconds), in the order backward
    produces them — fill buckets of ``bucket_elements``; ``time_of(elements)`` prices one bucket's collective.

    A unit's gradients are taken as ready evenly over its compute (a bucket boundary inside a unit falls at its
    share of the unit's seconds: exact to one tensor of InternLM's per-parameter rule). Bucket k of a full size is
    launched when its gradients are ready; without blocking it starts at max(launch, bucket k − 1 done); with
    blocking the backward itself waits at the boundary until bucket k − 1 is done, then bucket k starts. The last,
    partial bucket is launched after the backward (the optimizer step reduces what is left in the bucket).
    """
    total = sum(e for e, _ in units)
    compute = sum(s for _, s in units)
    if total <= 0:
        return BucketTimeline(buckets=0, comm_s=0.0, exposed_s=0.0)
    full = int(total // bucket_elements)
    if full and full * bucket_elements == total:
        full -= 1  # the bucket that ends with the last gradient is reduced after the backward
    boundaries = [(k + 1) * bucket_elements for k in range(full)]
    ready, pos, at, i = [], 0.0, 0.0, 0  # compute seconds when each boundary's gradients are ready
    for elems, secs in units:
        while i < len(boundaries) and boundaries[i] <= pos + elems:
            ready.append(at + secs * (boundaries[i] - pos) / elems if elems else at)
            i += 1
        pos, at = pos + elems, at + secs
    one = time_of(bucket_elements) if full else 0.0
    last = time_of(total - full * bucket_elements)
    clock, done, stall, prev = 0.0, 0.0, 0.0, 0.0  # backward clock (with stalls), last bucket's end
    for t in ready:
        clock += t - prev
        prev = t
        if blocking:
            stall += max(0.0, done - clock)
            clock = max(clock, done)
            done = clock + one
        else:
            done = max(clock, done) + one
    end = clock + compute - prev
    finish = max(end, done) + last
    return BucketTimeline(buckets=full + 1, comm_s=full * one + last, exposed_s=finish - compute)


def backward_units(spec: ModelSpec, unit_params: dict[str, int], layers, per_layer, head) -> list[tuple[float, float]]:
    """(gradient elements, backward + recompute seconds) of one rank's units in backward order: the LM head (with
    the final norm), the layers last to first, the input embedding (no GEMM in its backward)."""
    out = []
    if "head" in unit_params and head is not None:
        out.append((unit_params["head"], head.backward_s + head.recompute_s))
    for i in reversed(layers):
        out.append((unit_params.get(f"layer.{i}", 0), per_layer[i].backward_s + per_layer[i].recompute_s))
    if "embed" in unit_params:
        out.append((unit_params["embed"], 0.0))
    return out


def unit_params(spec: ModelSpec, layout, stage: int) -> dict[str, int]:
    """Parameters per unit (``embed``, ``layer.<i>``, ``head``) one rank of ``stage`` holds."""
    from trainmath.layout import ParallelLayout
    from trainmath.placement import place

    def make():
        lay = ParallelLayout(tp=layout.tp, pp=layout.pp, ep=layout.ep, dp=layout.dp, cp=layout.cp,
                             first_stage_layers=layout.first_stage_layers, last_stage_layers=layout.last_stage_layers)
        return place(spec, lay, stage).unit_params()

    return memo(spec, ("unit_params", layout.tp, layout.pp, layout.ep, layout.dp, layout.cp, layout.stage_split,
                       stage), make)


def bucketed_item(name: str, op: str, gname: str, group, topo, units, bucket_elements: int, grad_bytes: int,
                  blocking: bool) -> cm.CommItem:
    """The gradient sync of ``units`` as one ``CommItem``: ``count`` buckets, ``time_s`` all of them, ``exposed_s``
    the timeline's (:func:`bucket_timeline`)."""
    tl = bucket_timeline(units, bucket_elements,
                         lambda e: cm.time_s(op, e * grad_bytes, group, topo) if group.size > 1 and e > 0 else 0.0,
                         blocking)
    total = sum(e for e, _ in units) * grad_bytes
    return cm.CommItem(name=name, op=op, group=gname, group_size=group.size, link=cm.link_of(group),
                       size_bytes=total / max(1, tl.buckets), count=tl.buckets, time_s=tl.comm_s,
                       exposed_s=tl.exposed_s)


def dpsync_text(job) -> str | None:
    """The convention line of a job that states its gradient buckets or a hybrid ZeRO group; None otherwise."""
    parts = []
    if job.grad_bucket_elements:
        parts.append(f"gradient sync in buckets of {job.grad_bucket_elements:,} elements in backward order (head, "
                     f"layers last to first, embedding), one after another"
                     + (", the backward waiting for each before the next (a device synchronize per bucket)"
                        if job.blocking_buckets else "") + "; the last partial bucket after the backward")
    if job.zero_group:
        parts.append(f"hybrid ZeRO over groups of {job.zero_group}: gradients all-reduced over all of dp, the "
                     f"optimizer step over 1/{job.zero_group} of the parameters, the updates broadcast inside the "
                     f"group")
    if job.autograd_grad_accumulation:
        parts.append("gradients of later micro-batches added into .grad by autograd (3 x grad bytes per parameter "
                     "at HBM bandwidth, in backward)")
    if not job.param_sync_overlap:
        parts.append("the parameter sync after the optimizer step not overlapped")
    return "; ".join(parts) or None


def sync_items(spec: ModelSpec, layout, job, *, kind: str, params: int, group, gname: str, topo, stage: int,
               layers, per_layer, head, grad_bytes: int, weight_bytes: int, micro_batches: int,
               forward_s: float, last_backward_s: float) -> list[cm.CommItem]:
    """The gradient sync (``dp_grad_sync``) and, under ZeRO 1/2, the parameter sync (``zero_param_gather``) of
    ``params`` parameters of ``kind`` (``dense`` or ``expert``) over ``group``, with the job's stated buckets,
    hybrid ZeRO group and overlap (see the module docstring). ZeRO 2 reduces every micro-batch's gradients (each
    timed like the last); ZeRO 1 and 0 once."""
    degree = layout.zero_degree if kind == "dense" else layout.expert_zero_degree
    shard = min(job.zero_group, degree) if job.zero_group else degree
    hybrid = layout.zero in (1, 2) and shard < degree
    op = "all_reduce" if layout.zero == 0 or hybrid else "reduce_scatter"
    k = micro_batches if layout.zero == 2 else 1
    g = params * grad_bytes
    if job.grad_bucket_elements:
        units = backward_units(spec, unit_params(spec, layout, stage), layers, per_layer, head)
        total = sum(e for e, _ in units)
        share = params / total if total else 0.0  # this kind's part of every unit (experts: their own group)
        it = bucketed_item("dp_grad_sync", op, gname, group, topo, [(e * share, s) for e, s in units],
                           job.grad_bucket_elements, grad_bytes, job.blocking_buckets)
        grad = cm.CommItem(**{**it.__dict__, "count": it.count * k, "time_s": it.time_s * k,
                              "exposed_s": it.exposed_s * k})
    else:
        grad = cm.item("dp_grad_sync", op, gname, group, g, k, topo, hidden_behind_s=k * last_backward_s,
                       floor_s=cm.bucket_floor_s(op, g, group, topo))
    if layout.zero == 0:
        return [grad]
    hide = forward_s if job.param_sync_overlap else None
    w = params * weight_bytes
    if hybrid:  # each of the shard's owners broadcasts its 1/shard inside the group
        stride = layout.tp if kind == "dense" else layout.expert_tp * layout.ep
        zgroup = placed_group(shard, stride, topo.gpus_per_node)
        param = cm.item("zero_param_gather", "broadcast", "zero", zgroup, w / shard, shard, topo,
                        hidden_behind_s=hide)
    else:
        param = cm.item("zero_param_gather", "all_gather", gname, group, w, 1, topo, hidden_behind_s=hide,
                        floor_s=cm.bucket_floor_s("all_gather", w, group, topo))
    return [grad, param]


def optimizer_shard(layout, job, kind: str) -> int:
    """Ranks the optimizer step of ``kind`` parameters is divided over: the ZeRO degree, or the hybrid group."""
    if not layout.zero:
        return 1
    degree = layout.zero_degree if kind == "dense" else layout.expert_zero_degree
    return min(job.zero_group, degree) if job.zero_group else degree


def accumulation_s(job, layout, rank_params: int, grad_bytes: int, hbm_bytes_per_s: float,
                   micro_batches: int) -> float:
    """Seconds per step of PyTorch's AccumulateGrad adding each later micro-batch's gradients into ``.grad``
    (``Job.autograd_grad_accumulation``): (M − 1) · 3 · P · grad bytes (read ``.grad`` and the new gradient,
    write ``.grad``) at ``hbm_bytes_per_s``. Only where whole gradients are kept (ZeRO 0/1)."""
    if not job.autograd_grad_accumulation or layout.zero > 1 or micro_batches < 2:
        return 0.0
    return (micro_batches - 1) * 3 * rank_params * grad_bytes / hbm_bytes_per_s
