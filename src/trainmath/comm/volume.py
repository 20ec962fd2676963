"""Bytes the data-parallel collectives of one training step move, per rank, as ``trainmath train`` runs them.

Sizes are nccl-tests' (the whole buffer of each call, what ``runtime.train`` counts), summed per collective over
the step:

- ``ddp`` (torch's DDP, and the DDP under torch's ZeRO-1): one all-reduce of every gradient bucket per step
  (``no_sync`` on the other micro-steps) — Ψ gradient elements, unpadded;
- our ZeRO-1/2/3 (``--impl trainmath``, ``runtime/train/zero*.py``): one flat padded buffer per unit
  (``comm.flat``: n · Σ ⌈d/n⌉·cols elements): ZeRO-1 reduce-scatters the whole model once and
  all-gathers it after the step; ZeRO-2 reduce-scatters every unit in each micro-step's backward and all-gathers
  every unit after the step; ZeRO-3 all-gathers the root once and each decoder layer twice per micro-step
  (forward, and again for its backward; a recomputed layer reuses the backward's gather) and reduce-scatters
  every unit once per micro-step.

Not covered: ZeroRedundancyOptimizer's parameter broadcasts and FSDP2's collectives (the runtime does not count
them). ``perf`` charges the same operations on Ψ unpadded (ZeRO-3 per layer, 2 all-gathers and 1 reduce-scatter
per micro-batch): the figures differ by the padding and by the root's single gather.
"""

from __future__ import annotations

from trainmath.comm.flat import flat_units
from trainmath.layout import ParallelLayout
from trainmath.placement import Placement
from trainmath.vocabulary import Precision

STRATEGIES = ("ddp", "trainmath")


def dp_step_collective_bytes(placement: Placement, layout: ParallelLayout, prec: Precision, *, strategy: str,
                             micro_batches: int = 1) -> dict[str, int]:
    """Collective name → buffer bytes per step on one rank; ``strategy`` ``ddp`` (torch's DDP, ``layout.zero``
    0 or 1) or ``trainmath`` (our ZeRO, ``layout.zero`` 1–3). Empty on one rank."""
    if layout.zero_degree == 1:
        return {}
    if strategy == "ddp":
        return {"all_reduce": sum(t.copies * t.numel for t in placement.tensors) * prec.grad_bytes}
    units = flat_units(placement, layout, prec, 1 if layout.zero == 1 else 2)
    buffers = {u: f.buffer_bytes for u, f in units.items()}
    total = sum(buffers.values())
    if layout.zero == 1:
        return {"reduce_scatter": total, "all_gather": total}
    if layout.zero == 2:
        return {"reduce_scatter": micro_batches * total, "all_gather": total}
    layers = sum(b for u, b in buffers.items() if u.startswith("layer."))
    return {"reduce_scatter": micro_batches * total, "all_gather": micro_batches * (total + layers)}
