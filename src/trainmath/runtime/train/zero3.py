"""ZeRO stage 3 from the primitives (Rajbhandari et al. 2020, §5.3, P_os+g+p): parameters partitioned too.

Each unit (decoder layer, or the rest of the model) persists only as this rank's shard of its parameters. The
module's parameters keep their full shapes, but their storage is empty (``resize_(0)``) except while the unit runs:

    forward pre-hook   all-gather the unit's shards, unpack into the parameters' storage
    forward hook       free the storage (a decoder layer; the root stays until its backward)
                       and hook the output: when its gradient arrives, the unit's backward is next →
    output grad hook   all-gather again (autograd saved the parameters themselves, whose storage is refilled)
    grad hooks         when every parameter has its gradient: reduce-scatter into the gradient shard, drop the
                       full gradients, free the parameters

The optimizer updates the parameter shards in place; nothing is gathered after the step (the next forward
does). With recompute the layer's forward runs again inside backward: the hooks see that (autograd's current
graph task) and keep the parameters.
"""

from __future__ import annotations

import torch

from trainmath.runtime.train.flat import Comm, FlatLayout, alloc_storage, free_storage
from trainmath.runtime.train.zero2 import UnitGradShards, split_units


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class Zero3(UnitGradShards):
    stage = 3

    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module], comm: Comm, make_optimizer):
        self.model, self.comm = model, comm
        units = split_units(model, layers)
        self.modules = [m for m, _ in units]
        self.layouts = [FlatLayout(ps, comm.n, comm.rank) for _, ps in units]
        self.shards = []
        for L in self.layouts:
            shard = L.take_own([p.detach() for p in L.params], L.new_shard())
            self.shards.append(shard)
            for p in L.params:
                free_storage(p.data)
        self.gathered = [False] * len(self.layouts)
        self.optimizer = make_optimizer(self.shards)
        self._hook_gradients()
        root = len(self.layouts) - 1
        for u, module in enumerate(self.modules):
            module.register_forward_pre_hook(lambda m, args, u=u: self.gather(u))
            if u != root:
                module.register_forward_hook(lambda m, args, out, u=u: self._after_forward(u, out))

    @torch.no_grad()
    def gather(self, u: int) -> None:
        if self.gathered[u]:
            return
        L = self.layouts[u]
        buffer = L.new_buffer()
        self.comm.all_gather(buffer, self.shards[u])
        for p in L.params:
            alloc_storage(p.data)
        L.unpack(buffer, [p.data for p in L.params])
        self.gathered[u] = True

    def release(self, u: int) -> None:
        for p in self.layouts[u].params:
            free_storage(p.data)
        self.gathered[u] = False

    def _after_forward(self, u: int, out) -> None:
        if _in_backward():  # recompute: backward of this unit follows at once
            return
        self.release(u)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad, u=u: self.gather(u))

    def _unit_reduced(self, u: int) -> None:
        self.release(u)

    @torch.no_grad()
    def step(self) -> None:
        for shard, grad in zip(self.shards, self.grad_shards):
            shard.grad = grad
        self.optimizer.step()
        for shard in self.shards:
            shard.grad = None

    def weights(self) -> list[torch.Tensor]:
        return list(self.shards)
