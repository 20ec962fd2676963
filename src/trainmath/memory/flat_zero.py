"""ZeRO-1/2/3 over flat padded buffers, as ``trainmath train --impl trainmath`` runs it (``runtime/train/zero1.py``,
``zero2.py``, ``zero3.py``): the buffers the timeline adds under ``TrainingSetup.zero_impl="trainmath"``.

A unit (ZeRO-1: the whole model; ZeRO-2: each decoder layer, and the root — embeddings, final norm, LM head) is
packed rank-major: every tensor of dim 0 size d gives each of the n ranks ``ceil_div(d, n)`` rows (padded), so
a unit's buffer is n · shard_numel elements and a rank's shard shard_numel (the same padded shards the
calculator counts per tensor, ``states.zero_shard_shape``). What exists when (derived from the code, measured
by MemTracker on gloo ranks in ``tests/train/test_measure.py``):

- ZeRO-1: no buffer during forward and backward; after backward the buffer (gradient dtype) is allocated beside
  every full gradient, each gradient is dropped once packed, the buffer is reduce-scattered in place into the
  gradient shard (our ring's receive window, ``ring_window_bytes``, exists during the call); the step copies this rank's
  parameter chunks into a temporary shard (weight dtype), updates it, and all-gathers it into a fresh buffer, which is
  unpacked into the parameters.
- ZeRO-2: the gradient shards live for the whole step (``zero_grad`` zeroes them); a unit's full gradients live
  from its backward until all of them exist, then the unit's buffer is packed and reduce-scattered beside them, with the
  ring's receive window (a layer at the end of its backward; the root, whose LM head gradient comes first, after the
  embedding's); the step allocates every unit's temporary parameter shard, then all-gathers unit after unit, freeing
  each unit's shard after its buffer is unpacked.
- ZeRO-3: gradients as ZeRO-2's; a unit's parameters are all-gathered when it runs (the root from the first
  forward to its reduce after the embedding's backward; a layer for its forward, and again when its output's
  gradient arrives, until its reduce) — no prefetch of the next layer, unlike FSDP2; the optimizer updates the
  parameter shards in place (no temporary copy, no all-gather after the step).

Checked against MemTracker on gloo ranks: exact to a few bytes where the peak is the loss, a recomputed layer or
ZeRO-1's pack (``benchmarks/train_verify.py``), up to 3% low when it is a unit's reduce inside a layer's backward
(``tests/train/test_measure.py``).

The optimizer sees one flat tensor per unit, so its temporaries follow the largest unit shard.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath.arith import numel
from trainmath.layout import ParallelLayout
from trainmath.memory import states as st
from trainmath.memory.precision import Precision
from trainmath.memory.step import Kind, StepInputs, Walk
from trainmath.memory.timeline import BucketsWalk, ZeroImpl
from trainmath.placement import Placement

ZERO_IMPLS = ("deepspeed", "trainmath", "fsdp2")

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
        shard = t.copies * numel(st.zero_shard_shape(t.shape, n))
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


@dataclass(frozen=True)
class Flat(ZeroImpl):
    """Our flat-buffer ZeRO as the timeline's parameter: ``units`` from ``flat_units``, ``stage`` 1, 2 or 3."""

    units: dict
    stage: int

    def walk(self, inp: StepInputs) -> Walk:
        return FlatWalk(inp, self)


class FlatWalk(BucketsWalk):
    """No bucket: the reduce, the step on temporary parameter shards and the all-gathers are events. ZeRO-2/3:
    gradient shards all step, each unit's full gradients until its reduce-scatter (the root's until the
    embedding's); ZeRO-3 gathers the unit that runs, with no prefetch, and updates its shards in place."""

    tied_in_root = False

    def __init__(self, inp: StepInputs, zero: Flat):
        super().__init__(inp)
        self.flat, self.stage = zero.units, zero.stage
        self.prefetch = zero.stage != 3
        if zero.stage >= 2:
            self.shards = sum(u.grad_shard_bytes for u in self.flat.values())
            self.unit_grads = {k: v for u in self.flat.values() for k, v in u.full_grads.items()}

    def reduce_buffers(self, unit: str) -> int:
        """ZeRO-2/3 reduce-scatter of a unit: the packed buffer, the shard it reduces into and the ring's receive
        window (the unit's full gradients are counted as gradients)."""
        if self.stage < 2:
            return 0
        u = self.flat[unit]
        return u.buffer_bytes + u.grad_shard_bytes + u.ring_window_bytes

    def backward_done(self, pos, m):
        out = super().backward_done(pos, m)
        if self.stage >= 2:
            self.grads -= self.unit_grads.get(f"layer.{self.inp.layers[pos]}", 0)
        return out

    def end(self, m):
        inp = self.inp
        zero_grad = replace(m, kind=Kind.ZERO_GRAD)
        if self.stage == 3:  # the shards updated in place; the next forward gathers
            return (self.ev(replace(m, temps=inp.optimizer_temporaries), 0, reduced=True)
                    + self.ev(zero_grad, 0, reduced=True))
        params = sum(u.param_shard_bytes for u in self.flat.values())
        step = replace(m, temps=params + inp.optimizer_temporaries)
        gather = replace(m, kind=Kind.PARAMETER_ALL_GATHER)
        if self.stage == 1:  # the reduce, the step on temporary parameter shards, the all-gathers
            model = self.flat["model"]
            return (self.ev(replace(m, kind=Kind.GRADIENT_PACK), self.all_grads, buffers=model.buffer_bytes)
                    + self.ev(replace(m, kind=Kind.GRADIENT_REDUCE_SCATTER), model.grad_shard_bytes,
                              buffers=model.buffer_bytes + model.ring_window_bytes, reduced=True)
                    + self.ev(step, model.grad_shard_bytes, reduced=True)
                    + self.ev(gather, 0, buffers=gather_peak_bytes(self.flat), reduced=True)
                    + self.ev(zero_grad, 0, reduced=True))
        return (self.ev(step, 0) + self.ev(gather, 0, buffers=gather_peak_bytes(self.flat))
                + self.ev(zero_grad, 0, reduced=True))
