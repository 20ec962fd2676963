"""ZeRO stage 1 from the primitives (Rajbhandari et al. 2020, §5.1, P_os): optimizer states partitioned.

Every rank keeps the whole model and computes its whole gradients; it keeps optimizer states for its 1/n shard
only. One optimizer step:

    buffer  = pack(p.grad for every p)                  # (n, shard_numel), rank-major (see ``flat``); each
                                                        # p.grad is dropped once packed
    g_r     = reduce_scatter(buffer) / n                # this rank's shard of the mean gradient (the ring
                                                        # reduces in the buffer: no copy of it)
    θ_r     = own chunks of every p                     # a temporary copy, freed after the step
    θ_r     ← optimizer(θ_r, g_r)                       # states exist for θ_r only: 1/n of them
    buffer  = all_gather(θ_r)  →  unpack into every p   # all ranks hold the updated model again

Gradients of several micro-steps simply accumulate in ``p.grad`` (nothing is communicated until the step).

Memory at the reduce: the full gradients and the buffer, for a moment (as DeepSpeed's gradients and its reduce
bucket, which the calculator counts); afterwards only the 1/n gradient shard. Two copies this class made before
were measured (MemTracker, 4 ranks, tests/train): the full gradients kept through the step beside their reduced
shard, and the ring's workspace copy of the whole buffer (kept between calls); the peak was 35% above the
calculator's.
"""

from __future__ import annotations

import torch

from trainmath.runtime.train.flat import Comm, FlatLayout, alloc_storage, free_storage


class Zero1:
    stage = 1

    def __init__(self, model: torch.nn.Module, comm: Comm, make_optimizer):
        self.model, self.comm = model, comm
        self.layout = FlatLayout([(n, p) for n, p in model.named_parameters() if p.requires_grad], comm.n, comm.rank)
        self.shard = self.layout.new_shard()
        free_storage(self.shard)  # lives only during the step (fp32: the model's own weights are the master)
        self.optimizer = make_optimizer([self.shard])
        self.grad_shard: torch.Tensor | None = None

    def after_backward(self) -> None:
        L = self.layout
        buffer = L.new_buffer()  # zeroed: a parameter without a gradient (an expert no token reached) adds zeros
        for i, p in enumerate(L.params):
            if p.grad is not None:
                L.pack_one(i, p.grad, buffer)
            p.grad = None  # reduced below; only this rank's shard of the mean is kept
        self.grad_shard = L.new_shard()
        self.comm.reduce_scatter(self.grad_shard, buffer)
        self.grad_shard.div_(self.comm.n)

    @torch.no_grad()
    def step(self) -> None:
        L = self.layout
        alloc_storage(self.shard)
        self.shard.zero_()  # padding rows stay 0: zero gradient, zero state, zero update
        L.take_own([p.detach() for p in L.params], self.shard)
        self.shard.grad = self.grad_shard
        self.optimizer.step()
        self.shard.grad = self.grad_shard = None
        buffer = L.new_buffer()
        self.comm.all_gather(buffer, self.shard)
        L.unpack(buffer, [p.data for p in L.params])
        free_storage(self.shard)

    def zero_grad(self) -> None:
        for p in self.layout.params:
            p.grad = None

    # what measurement and checkpoints see
    def weights(self) -> list[torch.Tensor]:
        return list(self.layout.params)

    def gradients(self) -> list[torch.Tensor]:
        return [p.grad for p in self.layout.params if p.grad is not None]

    def units(self) -> list[tuple[FlatLayout, torch.Tensor]]:
        """(layout, the tensor the optimizer updates) per unit."""
        return [(self.layout, self.shard)]
