"""FSDP / ZeRO-3 communication of one micro-batch: per-unit all-gathers and reduce-scatters against the compute.

PyTorch FSDP (Zhao et al. 2023, "PyTorch FSDP", §3.3, §4.1) as LLM Foundry and torchtitan wrap it: one unit per
decoder layer plus the root (the embeddings, the final norm and the LM head). Per micro-batch, each layer unit's
parameters are all-gathered before its forward and, being resharded after forward (``reshard_after_forward``,
FULL_SHARD), again before its backward; its gradients are reduce-scattered after its backward. The root is
gathered once before the forward, kept through the backward, and reduce-scattered after the whole backward (its
embedding gradient is the last to complete). On a pipeline stage (ZeRO-3 with pp > 1: torchtitan does not reshard after
forward under PP, and the stage's backwards run without gradient sync, ``memory.fsdp2_pipeline``) each unit is
gathered once and reduce-scattered once per step instead (``pipelined_time``).

One communication stream beside the compute stream, prefetching one unit ahead (FSDP's backward prefetch; the
forward's, ``forward_prefetch``, issues the next unit's gather as the current unit's compute starts):

- forward, computes c = [embedding lookup (0), f_0, ..., f_{L-1}], gathers g = [AG_root, AG_0, ..., AG_{L-1}]:
  exposed = g_0 + Σ_{k≥1} max(0, g_k − c_{k−1})  (so AG_root + AG_0: the first units' gathers fully exposed);
- backward, computes c = [head backward, b_{L-1}, ..., b_0] (b with its recompute), each overlapping the next
  unit's gather and the previous unit's reduce-scatter: exposed = Σ_j max(0, AG_{j+1} + RS_{j−1} − c_j), plus
  RS_0 and RS_root after the last compute, fully exposed.

A unit's excess is exposed where it arises and does not delay the next unit's (no backlog carried). Sizes are
nccl-tests' S (the unit's whole parameters at the weight dtype, its whole gradients at the gradient dtype); each
rank sends S·(W−1)/W per collective on a ring of W ranks (``rank_bytes``), on the link the placement gives the
data-parallel group (``trainmath.comm.twolevel``: NVLink inside a node, NICs across).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from trainmath.comm.twolevel import Group, Topology
from trainmath.perf import comm as cm


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One FSDP unit on the busiest stage, for one micro-batch on one rank."""

    name: str
    params: float
    """Parameters of the unit (its share of the data-parallel group's kind: dense or expert)."""
    forward_s: float
    backward_s: float
    """Backward plus any recompute of the unit."""


def chain_exposed(compute: Sequence[float], gather: Sequence[float], scatter: Sequence[float]) -> float:
    """Exposed seconds of a unit chain: ``gather[j]`` must land before ``compute[j]`` starts and ``scatter[j]`` is
    issued after it. ``gather[0]`` is exposed; during ``compute[j]`` the stream runs ``gather[j+1]`` and
    ``scatter[j−1]``, their excess exposed; ``scatter[-1]`` runs after the last compute, exposed."""
    n = len(compute)
    if n == 0:
        return 0.0
    exposed = gather[0]
    for j in range(n):
        comm = (gather[j + 1] if j + 1 < n else 0.0) + (scatter[j - 1] if j >= 1 else 0.0)
        exposed += max(0.0, comm - compute[j])
    return exposed + scatter[n - 1]


def rank_bytes(size: float, ranks: int) -> float:
    """Bytes one rank sends in a ring all-gather or reduce-scatter of a buffer of ``size`` bytes: S·(W−1)/W."""
    return size * (ranks - 1) / ranks if ranks > 1 else 0.0


@dataclass(frozen=True, kw_only=True)
class FsdpTime:
    total_s: float
    """Every collective of one micro-batch, end to end."""
    exposed_s: float
    """What the micro-batch waits for, with the prefetch overlap."""
    unoverlapped_s: float
    """What it would wait for with no overlap at all (= total_s)."""
    gathers: int
    scatters: int


def micro_batch_time(layers: Sequence[Unit], root: Unit, head_forward_s: float, head_backward_s: float,
                     weight_bytes: float, grad_bytes: float, time: Callable[[str, float], float]) -> FsdpTime:
    """One micro-batch's FSDP collectives (module docstring); ``time(op, size)`` prices one collective."""
    ag = [time("all_gather", u.params * weight_bytes) for u in layers]
    rs = [time("reduce_scatter", u.params * grad_bytes) for u in layers]
    ag_root = time("all_gather", root.params * weight_bytes)
    rs_root = time("reduce_scatter", root.params * grad_bytes)
    fwd = chain_exposed([0.0] + [u.forward_s for u in layers], [ag_root] + ag, [0.0] * (len(layers) + 1))
    back = list(reversed(layers))
    bwd = chain_exposed([head_backward_s] + [u.backward_s for u in back], [0.0] + [ag[-1 - i] for i in
                        range(len(back))], [0.0] + [rs[-1 - i] for i in range(len(back))])
    bwd += rs_root
    total = ag_root + rs_root + 2 * sum(ag) + sum(rs)
    exposed = min(total, fwd + bwd)
    n = len(layers)
    return FsdpTime(total_s=total, exposed_s=exposed, unoverlapped_s=total, gathers=2 * n + 1, scatters=n + 1)


def pipelined_fsdp(layout) -> bool:
    """ZeRO-3 (FSDP2) on a pipeline stage: its units gathered and reduced once per step (``pipelined_time``)."""
    return layout.pp > 1 and layout.zero >= 3 and layout.zero_degree > 1


def pipelined_time(layers: Sequence[Unit], root: Unit, weight_bytes: float, grad_bytes: float,
                   time: Callable[[str, float], float]) -> FsdpTime:
    """A pipeline stage's FSDP collectives for the whole step (``memory.fsdp2_pipeline``: torchtitan's
    ``reshard_after_forward=False`` under PP, the stage's backwards without gradient sync): each unit gathered
    once, in the first micro-batch's forward (the forward chain's exposure), and reduce-scattered once, after the
    last micro-batch's backward, when no compute is left to hide it (all exposed)."""
    ag = [time("all_gather", u.params * weight_bytes) for u in layers]
    rs = [time("reduce_scatter", u.params * grad_bytes) for u in layers]
    ag_root = time("all_gather", root.params * weight_bytes)
    rs_root = time("reduce_scatter", root.params * grad_bytes)
    fwd = chain_exposed([0.0] + [u.forward_s for u in layers], [ag_root] + ag, [0.0] * (len(layers) + 1))
    total = ag_root + rs_root + sum(ag) + sum(rs)
    n = len(layers)
    return FsdpTime(total_s=total, exposed_s=min(total, fwd + sum(rs) + rs_root), unoverlapped_s=total,
                    gathers=n + 1, scatters=n + 1)


def fsdp_item(gname: str, group: Group, topo: Topology, layers: Sequence[Unit], root: Unit, head_forward_s: float,
              head_backward_s: float, weight_bytes: float, grad_bytes: float, micro_batches: int,
              pipelined: bool = False) -> cm.CommItem:
    """The step's ZeRO-3 CommItem (``zero3_comm``) for one data-parallel group: ``micro_batches`` micro-batches;
    ``pipelined``: a pipeline stage's units, gathered and reduced once per step (``pipelined_time``)."""
    priced: dict[tuple[str, float], float] = {}  # the layers' units repeat: each collective priced once

    def time(op: str, size: float) -> float:
        t = priced.get((op, size))
        if t is None:
            t = priced[(op, size)] = cm.time_s(op, size, group, topo) if group.size > 1 and size > 0 else 0.0
        return t

    if pipelined:
        t, micro_batches = pipelined_time(layers, root, weight_bytes, grad_bytes, time), 1
    else:
        t = micro_batch_time(layers, root, head_forward_s, head_backward_s, weight_bytes, grad_bytes, time)
    params = root.params + sum(u.params for u in layers)
    return cm.CommItem(name="zero3_comm", op="all_gather+reduce_scatter", group=gname, group_size=group.size,
                       link=cm.link_of(group), size_bytes=params * weight_bytes,
                       count=micro_batches * (t.gathers + t.scatters), time_s=micro_batches * t.total_s,
                       exposed_s=micro_batches * t.exposed_s)


def stage_units(share: float, layers: Sequence[int], layer_params: Sequence[int], stage_params: int,
                per_layer: dict, head) -> tuple[list[Unit], Unit]:
    """The busiest stage's units: one per layer, and the root (the stage's other parameters: embeddings, final
    norm, head; computing the head when the stage has it), at ``share`` of their parameters."""
    units = [Unit(name=f"layer.{i}", params=lp * share, forward_s=per_layer[i].forward_s,
                  backward_s=per_layer[i].backward_s + per_layer[i].recompute_s)
             for i, lp in zip(layers, layer_params)]
    root = Unit(name="root", params=max(0, stage_params - sum(layer_params)) * share,
                forward_s=head.forward_s if head else 0.0, backward_s=head.backward_s if head else 0.0)
    return units, root


def zero3_item(gname: str, group: Group, topo: Topology, share: float, layers: Sequence[int],
               layer_params: Sequence[int], stage_params: int, per_layer: dict, head, weight_bytes: float,
               grad_bytes: float, micro_batches: int, pipelined: bool = False) -> cm.CommItem:
    """The hook the step assembly calls (``stage_units`` then ``fsdp_item``)."""
    units, root = stage_units(share, layers, layer_params, stage_params, per_layer, head)
    return fsdp_item(gname, group, topo, units, root, root.forward_s, root.backward_s, weight_bytes, grad_bytes,
                     micro_batches, pipelined)


OVERHEAD: dict[str, tuple[float, float]] = {"hopper": (0.13, 0.0009)}
"""Per GPU generation: (fixed seconds per step, seconds per unit per micro-batch per pass) of an FSDP job, fitted
by ``benchmarks/fsdp_fit.py`` on the FSDP runs of tests/perf/published_runs_more.json (never per run; its output,
in-sample and leave-one-source-out, is in docs/benchmarks.md). What it stands for: the eager framework's work
outside the modelled kernels, per step (optimizer launch, logging, the data loader's hand-off) and per unit pass
(FSDP's pre/post hooks, the all-gather copy-in/copy-out, kernel launches of small shapes). Generations without FSDP
runs to fit on have none (0, 0)."""


def overhead_s(generation: str, units: int, micro_batches: int, passes: int) -> float:
    """The fitted per-step overhead of an FSDP job (``OVERHEAD``): c + d · units · micro-batches · passes, passes 2
    (forward, backward), 3 with full recompute."""
    c, d = OVERHEAD.get(generation, (0.0, 0.0))
    return c + d * units * micro_batches * passes


def fsdp_text(generation: str) -> str:
    c, d = OVERHEAD.get(generation, (0.0, 0.0))
    return (f"{c:.2f} s/step + {1e3 * d:.1f} ms per unit per micro-batch per pass ({generation}, fitted on published "
            f"FSDP runs)" if c or d else f"none ({generation}: no FSDP runs fitted)")
