"""FSDP2 wrapping as trainmath runs it (``trainmath train --strategy zero2|zero3 --impl torch``, ``trainmath memory
--simulate --zero 3``, and what ``trainmath.memory.fsdp2`` models): ``fully_shard`` on every decoder layer, then
on the root.

One refinement: FSDP2 needs one original parameter dtype per unit (``FSDPParamGroup._init_mp_dtypes``: "FSDP
expects uniform original parameter dtype"), and transformers keeps some parameters in fp32 in a bf16 model —
DeepSeek-V2/V3's and GLM-4.5's router weight (``mlp.gate.weight``: the router runs in fp32). Such a submodule is
wrapped first, as its own unit (torch's advice for mixed dtypes), so the layer's unit holds the rest; the
calculator counts the router's own all-gather, unsharded weight, gradient and reduce-scatter buffers.
"""

from __future__ import annotations

import torch


def odd_dtype_modules(layer: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules of ``layer`` whose own trainable parameters are not in the layer's main dtype (the dtype
    holding most of its trainable elements)."""
    count: dict = {}
    for p in layer.parameters():
        if p.requires_grad:
            count[p.dtype] = count.get(p.dtype, 0) + p.numel()
    if len(count) < 2:
        return []
    main = max(count, key=count.get)
    return [m for m in layer.modules() if m is not layer and any(
        p.requires_grad and p.dtype != main for p in m.parameters(recurse=False))]


def shard_model(model: torch.nn.Module, layers: list[torch.nn.Module], **kw) -> list[torch.nn.Module]:
    """``fully_shard(module, **kw)`` on each odd-dtype submodule of each layer, each layer, then the root; returns
    the submodules wrapped on their own."""
    from torch.distributed.fsdp import fully_shard

    own = []
    for layer in layers:
        for m in odd_dtype_modules(layer):
            fully_shard(m, **kw)
            own.append(m)
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return own
