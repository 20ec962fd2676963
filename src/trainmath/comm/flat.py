"""The flat padded buffers of our ZeRO-1/2/3 (``trainmath train --impl trainmath``, ``runtime/train/zero*.py``):
the units the runtime reduces and gathers, and the scratch of our ring.

A unit (ZeRO-1: the whole model; ZeRO-2/3: each decoder layer, and the root — embeddings, final norm, LM head) is
packed rank-major: every tensor of dim 0 size d gives each of the n ranks ``ceil_div(d, n)`` rows (padded), so
a unit's buffer is n · shard_numel elements and a rank's shard shard_numel (the same padded shards the
calculator counts per tensor, ``layout.zero_shard_shape``). What the timeline holds when is ``memory.flat_zero``'s;
the bytes the collectives move are ``comm.volume``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.arith import numel
from trainmath.layout import ParallelLayout, zero_shard_shape
from trainmath.placement import Placement
from trainmath.vocabulary import Precision

RING_SEGMENT_BYTES = 4 << 20
RING_MAX_SEGMENTS = 8
RING_WINDOW_STEPS = 2
"""``trainmath.runtime.ring``'s SEGMENT_BYTES, MAX_SEGMENTS and _RS_WINDOW_STEPS (kept equal by a test; the
runtime imports torch, the calculator does not)."""


@dataclass(frozen=True, kw_only=True)
class FlatUnit:
    """One unit's flat buffers on one rank, bytes (``shard_numel`` in elements)."""

    shard_numel: int
    buffer_bytes: int
    """n · shard_numel in the gradient dtype: the packed gradients, and again the gathered parameters."""
    grad_shard_bytes: int
    param_shard_bytes: int
    """This rank's parameter chunks, the optimizer's temporary copy during the step (weight dtype)."""
    full_grad_bytes: int
    """The unit's full (unpadded) gradients before its reduce-scatter."""
    full_grads: dict
    """The same by the calculator's unit (``embed``, ``layer.<i>``, ``head``): when each part appears."""
    ring_window_bytes: int
    """The receive window of the unit's reduce-scatter on our ring (``ring_window_bytes``)."""


def flat_units(placement: Placement, layout: ParallelLayout, prec: Precision, stage: int) -> dict[str, FlatUnit]:
    """Unit → its buffers, in the order the runtime reduces and gathers them: ZeRO-1 one unit ``model``;
    ZeRO-2 ``layer.<i>`` per decoder layer, then ``root`` (every tensor outside the layers)."""
    n = layout.zero_degree
    acc: dict[str, list] = {}
    for t in placement.tensors:
        unit = "model" if stage == 1 else (t.unit if t.unit.startswith("layer.") else "root")
        shard = t.copies * numel(zero_shard_shape(t.shape, n))
        full = t.copies * t.numel * prec.grad_bytes
        a = acc.setdefault(unit, [0, 0, {}])
        a[0] += shard
        a[1] += full
        a[2][t.unit] = a[2].get(t.unit, 0) + full
    order = sorted((u for u in acc if u.startswith("layer.")), key=lambda u: int(u.split(".")[1]))
    order += [u for u in acc if not u.startswith("layer.")]
    return {u: FlatUnit(shard_numel=acc[u][0], buffer_bytes=n * acc[u][0] * prec.grad_bytes,
                        grad_shard_bytes=acc[u][0] * prec.grad_bytes, param_shard_bytes=acc[u][0] * prec.weight_bytes,
                        full_grad_bytes=acc[u][1], full_grads=acc[u][2],
                        ring_window_bytes=ring_window_bytes(acc[u][0], n, prec.grad_bytes)) for u in order}


def gather_peak_bytes(units: dict[str, FlatUnit]) -> int:
    """Bytes of the step's all-gathers at their largest: unit u's buffer beside the parameter shards not yet
    unpacked and freed (u and every unit after it)."""
    shards = [u.param_shard_bytes for u in units.values()]
    return max((u.buffer_bytes + sum(shards[k:]) for k, u in enumerate(units.values())), default=0)


def ring_window_bytes(chunk_numel: int, n: int, elem_bytes: int) -> int:
    """Scratch of one reduce-scatter of n chunks of ``chunk_numel`` elements on ``trainmath.runtime.ring``'s
    pipelined (gloo) engine, derived from ``_run_ring``: each chunk is cut into k = clamp(C // 4 MiB, 1, 8)
    segments (C its bytes), and receives land in a window of min(2, n − 1) steps × k slots of the largest
    segment, ⌈chunk_numel / k⌉ elements (``tensor_split``). Allocated for the call (``inplace=True``)."""
    if n < 2 or not chunk_numel:
        return 0
    k = max(1, min(RING_MAX_SEGMENTS, chunk_numel * elem_bytes // RING_SEGMENT_BYTES))
    return min(RING_WINDOW_STEPS, n - 1) * k * -(-chunk_numel // k) * elem_bytes
