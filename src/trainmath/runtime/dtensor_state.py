"""DTensor's process-wide caches, and why a new rank (or a finished simulation) must forget them.

DTensor caches each op's sharding propagation (in C++, ``torch._C`` native dispatch, and in Python) keyed by the
input specs, and a ``DeviceMesh`` hashes and compares without its owner's rank: two meshes over ranks [0, 1]
are equal whichever rank built them. A cached output spec holds the mesh it was computed with, and that mesh its
rank's coordinate. A process that ran a fake process group as rank 0 (``verify.simulate``, ``verify.peft_fsdp``)
and then forks gloo ranks hands rank 1 a cache whose DTensors say "coordinate 0": torch.distributed.checkpoint
then sees both ranks write the first shard and refuses the plan ("invalid fill"). ``forget`` drops those caches;
the launcher's workers call it before their process group starts and the simulations when they end."""

from __future__ import annotations

import sys


def forget() -> None:
    """Clear DTensor's sharding-propagation and redistribution caches in this process (a no-op where
    ``torch.distributed.tensor`` was never imported)."""
    if "torch.distributed.tensor" not in sys.modules:
        return
    import torch

    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if native is not None:
        native()
    from torch.distributed.tensor import DTensor

    prop = DTensor._op_dispatcher.sharding_propagator
    for name in ("propagate_op_sharding", "_propagate_tensor_meta_cached"):
        clear = getattr(getattr(prop, name, None), "cache_clear", None)
        if clear is not None:
            clear()
    try:
        from torch.distributed.tensor._redistribute import _gen_transform_infos
    except ImportError:
        return
    _gen_transform_infos.cache_clear()
