"""FSDP2 under a pipeline schedule (``torch.distributed.pipelining``): a stage's units stay unsharded for the whole
step and its gradients accumulate unsharded, in the reduce dtype, until the last micro-batch.

Read from torch and torchtitan:

- **Parameters.** torchtitan's ``apply_fsdp`` sets ``reshard_after_forward = False`` on every decoder layer and
  on the root when pipeline parallelism is on ("For PP, do not reshard after forward to avoid per-microbatch
  all-gathers, which can be expensive and non-overlapped", pytorch/torchtitan
  torchtitan/parallelisms/parallelize_llama.py@004b3148a92b565ef0ce7a7bcc61e0159c7ec930, ``apply_fsdp``), and the
  pipeline stage runs each micro-batch's backward of an ``FSDPModule`` after ``set_is_last_backward(False)``,
  ``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)`` (pytorch/pytorch
  torch/distributed/pipelining/stage.py@0138610331c90b8053a0bfc6df0175b200a1cad2,
  ``_PipelineStageBase.backward_maybe_with_nosync``): once gathered in the first micro-batch's forward, every unit
  of the stage stays unsharded until the step's gradients are reduced.
- **Gradients.** Without gradient sync, ``FSDPParamGroup.post_backward`` neither reduce-scatters nor frees: it
  adds the micro-batch's gradients into the accumulated ones (``accumulate_unsharded_grad_if_needed``) and keeps
  the first as ``unsharded_accumulated_grad``, upcast to the reduce dtype (``to_accumulated_grad_if_needed``:
  ``unsharded_grad.to(self.reduce_dtype)``; pytorch/pytorch
  torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py@002a76fbfea0ac0f199e4b8e2a0691074796c908 and
  torch/distributed/_composable/fsdp/_fsdp_param.py@007472c8e7190afc1ce22fdd6a6325a787f8d90d). torchtitan's
  reduce dtype is fp32 (``--training.mixed_precision_reduce``, default ``float32``, pytorch/torchtitan
  torchtitan/config_manager.py@0011fb905e9561a51af0f265e35d989f7448b1d8). So from the first micro-batch's backward
  on a rank holds the stage's unsharded gradients at 4 bytes per parameter beside its unsharded parameters.
- **The timeline** is that of a micro-batch after the first (the one the peak falls in: every unit's accumulated
  gradients exist, and the other micro-batches in flight are the 1F1B schedule's): no all-gather and no
  reduce-scatter inside it; a layer's backward makes its gradients in the parameter dtype beside the accumulated
  ones, its post-backward adds them in place. After the last micro-batch each unit reduce-scatters its
  accumulated gradients (``foreach_reduce``: the reduce-scatter input beside them) and reshards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath.memory.fsdp2 import FSDP2, FSDP2Walk, _with
from trainmath.memory.step import Event, Kind, Moment, StepInputs, Walk, acts_at


@dataclass(frozen=True)
class PipelinedFSDP2(FSDP2):
    """``fsdp2.FSDP2``'s units on a pipeline stage (module docstring): unsharded all step, gradients accumulated
    unsharded."""

    def walk(self, inp: StepInputs) -> Walk:
        return PipelinedFSDP2Walk(inp, self)


class PipelinedFSDP2Walk(FSDP2Walk):
    """One micro-batch of a pipeline stage under FSDP2 (module docstring)."""

    def __init__(self, inp, zero):
        super().__init__(inp, zero)
        units = [self.root, *self.layers, *(r for r in self.routers if r)]
        self.held = sum(u.unsharded_bytes for u in units)
        """Every unit's unsharded parameters, for the whole step."""
        self.accumulated = sum(u.accumulated_grad_bytes for u in units)
        """Every unit's unsharded gradients in the reduce dtype, from the first micro-batch's backward on."""
        self.largest_rs = max((u.reduce_scatter_bytes for u in units), default=0)
        self.root_grads = 0

    def ev(self, m: Moment, *, sharded: int = 0, **terms) -> list[Event]:
        return [self.event(m, gradients=self.accumulated + sharded, **terms)]

    def start(self, m):
        return self.ev(m, gather=self.held)

    def forward(self, pos, m):
        return self.ev(replace(m, acts=_with(m.acts, *self.positions)), gather=self.held)

    def loss(self, fwd, bwd):
        return (self.ev(replace(fwd, acts=_with(fwd.acts, *self.positions)), gather=self.held)
                + self.ev(bwd, gather=self.held))

    def head(self, m):
        g = self.root.grad_bytes
        self.root_grads = g.get("head", 0) + (g.get("embed", 0) if self.inp.tied_head else 0)
        return self.ev(m, gather=self.held, reduce=self.root_grads)

    def backward(self, pos, m):
        inp, i = self.inp, self.inp.layers[pos]
        out = self.ev(m, gather=self.held, reduce=self.root_grads)
        mix = self.z.mixer.get(i)
        if mix:
            kept = list(inp.layers[:pos + 1])
            out += self.ev(replace(m, kind=Kind.BACKWARD_ATTENTION, acts=acts_at(inp, kept, live_layer=i,
                                                                               less=mix.saved_after),
                                   hidden=inp.hidden_grad + mix.transient),
                           gather=self.held, reduce=self.root_grads + mix.grads_after)
        return out

    def backward_done(self, pos, m):
        # the layer's gradients in the parameter dtype, before its post-backward adds them to the accumulated ones
        return self.ev(m, gather=self.held, reduce=self.root_grads + self.layers[pos].grads)

    def embedding(self, m, loop):
        emb = self.root.grad_bytes.get("embed", 0)
        extra = 2 * emb if self.inp.tied_head else emb
        out = self.ev(m, gather=self.held, reduce=self.root_grads + extra)
        self.root_grads += 0 if self.inp.tied_head else emb
        return out

    def end(self, m):
        inp = self.inp
        # the last micro-batch's reduce: each unit's reduce-scatter input beside the accumulated gradients (the
        # first unit's moment is the largest); then every unit is resharded and holds its sharded gradients
        out = self.ev(replace(m, kind=Kind.GRADIENT_REDUCE_SCATTER), gather=self.held, reduce=self.largest_rs)
        return (out + [self.event(replace(m, temps=inp.optimizer_temporaries, fp32g=inp.fp32_grad_copies),
                                  gradients=self.s_all)]
                + [self.event(replace(m, kind=Kind.ZERO_GRAD), gradients=0)])
