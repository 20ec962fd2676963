"""ZeRO stage 2 from the primitives (Rajbhandari et al. 2020, §5.2, P_os+g): gradients partitioned too.

The model is cut into units (each decoder layer, and the rest: embeddings, final norm, LM head). During backward,
as soon as every parameter of a unit has its gradient (``register_post_accumulate_grad_hook``), the unit's
gradients are packed, reduce-scattered, and this rank's shard is added to its persistent gradient shard; the
full-size gradients are dropped at once. So a rank holds 1/n of the gradients, plus one unit's full gradients for
a moment. The step is ZeRO-1's, unit by unit: update the own shard, all-gather the parameters.
"""

from __future__ import annotations

import torch

from trainmath.errors import TrainmathError
from trainmath.runtime.train.flat import Comm, FlatLayout, alloc_storage, free_storage


def split_units(model: torch.nn.Module, layers: list[torch.nn.Module]) -> list[tuple[torch.nn.Module, list]]:
    """(module, [(name, param)]) per decoder layer, then the root (model) with every parameter in no layer."""
    seen: set[int] = set()
    units = []
    names = {id(p): n for n, p in model.named_parameters()}
    for layer in layers:
        ps = [(names[id(p)], p) for p in layer.parameters() if p.requires_grad]
        seen.update(id(p) for _, p in ps)
        units.append((layer, ps))
    rest = [(n, p) for n, p in model.named_parameters() if p.requires_grad and id(p) not in seen]
    units.append((model, rest))
    return units


class UnitGradShards:
    """What ZeRO-2 and ZeRO-3 share: each unit's gradients reduce-scattered into its persistent shard as soon as
    every parameter of the unit has its gradient. Needs ``stage``, ``comm``, ``layouts`` and ``shards``."""

    def _hook_gradients(self) -> None:
        self.grad_shards = [L.new_shard() for L in self.layouts]
        self._pending = [len(L.params) for L in self.layouts]
        for u, L in enumerate(self.layouts):
            for p in L.params:
                p.register_post_accumulate_grad_hook(lambda p, u=u: self._grad_ready(u))

    def _grad_ready(self, u: int) -> None:
        self._pending[u] -= 1
        if self._pending[u]:
            return
        L = self.layouts[u]
        self._pending[u] = len(L.params)
        buffer = L.pack([p.grad for p in L.params], L.new_buffer())
        part = L.new_shard()
        self.comm.reduce_scatter(part, buffer)
        self.grad_shards[u].add_(part.div_(self.comm.n))  # accumulates over micro-steps
        for p in L.params:
            p.grad = None  # the full gradient is gone: only the shard stays
        self._unit_reduced(u)

    def _unit_reduced(self, u: int) -> None:
        """Called once unit ``u``'s gradients are reduced (ZeRO-3 frees its parameters here)."""

    def after_backward(self) -> None:
        """Every unit was reduced during backward; a parameter that got no gradient would leave its unit waiting
        (transformers' eager experts give every expert one, zeros when no token was routed to it)."""
        stuck = [L.names[0] for L, n in zip(self.layouts, self._pending) if n != len(L.params)]
        if stuck:
            raise TrainmathError(f"our ZeRO-{self.stage}: the unit of {stuck[0]} did not get a gradient for every "
                                 f"parameter in this backward; use --impl torch")

    def zero_grad(self) -> None:
        for g in self.grad_shards:
            g.zero_()

    def gradients(self) -> list[torch.Tensor]:
        return list(self.grad_shards)

    def units(self) -> list[tuple[FlatLayout, torch.Tensor]]:
        return list(zip(self.layouts, self.shards))


class Zero2(UnitGradShards):
    stage = 2

    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module], comm: Comm, make_optimizer):
        self.model, self.comm = model, comm
        self.layouts = [FlatLayout(ps, comm.n, comm.rank) for _, ps in split_units(model, layers)]
        self.shards = [L.new_shard() for L in self.layouts]
        for s in self.shards:
            free_storage(s)
        self.optimizer = make_optimizer(self.shards)
        self._hook_gradients()

    @torch.no_grad()
    def step(self) -> None:
        for L, shard, grad in zip(self.layouts, self.shards, self.grad_shards):
            alloc_storage(shard)
            shard.zero_()
            L.take_own([p.detach() for p in L.params], shard)
            shard.grad = grad
        self.optimizer.step()
        for L, shard in zip(self.layouts, self.shards):
            shard.grad = None
            buffer = L.new_buffer()
            self.comm.all_gather(buffer, shard)
            L.unpack(buffer, [p.data for p in L.params])
            free_storage(shard)

    def weights(self) -> list[torch.Tensor]:
        return [p for L in self.layouts for p in L.params]
