"""ZeRO-1/2/3 over flat padded buffers, as ``trainmath train --impl trainmath`` runs it (``runtime/train/zero1.py``,
``zero2.py``, ``zero3.py``): the buffers the timeline adds under ``TrainingSetup.zero_impl="trainmath"``.

The units and their buffers are ``comm.flat``'s. What exists when (derived from the code, measured by MemTracker
on gloo ranks in ``tests/train/test_measure.py``):

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

from trainmath.comm.flat import gather_peak_bytes
from trainmath.memory.step import Kind, StepInputs, Walk
from trainmath.memory.timeline import BucketsWalk, ZeroImpl


@dataclass(frozen=True)
class Flat(ZeroImpl):
    """Our flat-buffer ZeRO as the timeline's parameter: ``units`` from ``comm.flat.flat_units``, ``stage`` 1, 2
    or 3."""

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
        super().__init__(inp, mixer={})  # no attention-backward moment: memory.training gives one to Buckets and FSDP2
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
