"""A LoRA fine-tune under FSDP2 (``--zero 3``): ``peft.get_peft_model`` first, then ``fully_shard`` on every
decoder layer and on the root, as ``memory.fsdp2`` describes for full training. What a frozen base changes, read
from ``torch/distributed/fsdp/_fully_shard/`` (torch 2.13):

- **Every parameter is sharded and gathered, frozen or not.** ``FSDPParamGroup`` holds the layer's frozen
  weights and its adapters together; a unit's original dtype is asked of its trainable parameters only
  (``_init_mp_dtypes``), so a bf16 base with fp32 adapters is one unit, and ``foreach_all_gather`` then gathers
  it as bytes (``_get_all_gather_input_metadatas``: mixed dtypes make a uint8 all-gather): the flat output is
  W × Σ each parameter's padded shard in its own dtype. The layer is gathered in forward and again in
  backward (its pre-backward unshards the whole group, though the base only needs its weights for the input's
  gradient).
- **Gradients, reduce-scatter and optimizer states are the adapters'.** ``foreach_reduce`` copies in only the
  parameters with a gradient (``fsdp_params_with_grad``): the reduce-scatter input is W × the adapters' padded
  shards, the sharded gradients their shards; the root unit (frozen embedding, final norm, LM head) reduces
  nothing. The optimizer's states follow each adapter's dim-0 shard (``ceil_div(rows, W)`` rows on rank 0).

The step's timeline is ``memory.fsdp2.FSDP2Walk`` over these units; the activations are ``memory.peft``'s.
Measured: ``tests/memory/test_peft_fsdp2.py`` and ``benchmarks/peft_memory.py --fsdp W`` (FSDPMemTracker over a
fake process group, ``verify.peft_fsdp``).
"""

from __future__ import annotations

from trainmath.arith import numel
from trainmath.layout import ParallelLayout
from trainmath.memory import fsdp2
from trainmath.memory import states as st
from trainmath.memory.optimizers import state_tensors, step_temporary_bytes


def units(layout: ParallelLayout, pl, prec, adapters: dict, ab: int, *, granularity: int) -> dict[str, fsdp2.Unit]:
    """``root`` and ``layer.<i>`` → ``fsdp2.Unit`` of the fine-tune (module docstring): every parameter gathered
    in its dtype, the adapters alone reduced. ``adapters``: unit → the adapters' weight shapes in it
    (``memory.peft.adapter_shapes``), ``ab`` bytes each element."""
    deg = layout.zero_degree
    acc: dict[str, dict] = {}

    def add(name: str, unit: str, shape: tuple[int, ...], nbytes: int, trainable: bool) -> None:
        padded = numel(st.zero_shard_shape(shape, deg)) * deg  # dim 0 padded to a multiple of W
        a = acc.setdefault(name, {"ag": 0, "rs": 0, "shard": 0, "unsharded": 0, "grads": {}})
        a["ag"] += padded * nbytes
        a["unsharded"] += st.alloc_bytes(padded * nbytes, granularity)
        if trainable:
            a["rs"] += padded * nbytes
            a["shard"] += padded // deg * nbytes
            a["grads"][unit] = a["grads"].get(unit, 0) + st.alloc_bytes(numel(shape) * nbytes, granularity)

    for t in pl.tensors:
        add("root" if t.unit in fsdp2.ROOT else t.unit, t.unit, fsdp2.runtime_shape(t), prec.weight_bytes, False)
    for unit, shapes in adapters.items():
        if unit in acc:
            for shape in shapes:
                add(unit, unit, shape, ab, True)
    return {name: fsdp2.Unit(unsharded_bytes=a["unsharded"], all_gather_bytes=st.alloc_bytes(a["ag"], granularity),
                             grad_bytes=a["grads"], reduce_scatter_bytes=st.alloc_bytes(a["rs"], granularity),
                             sharded_grad_bytes=st.alloc_bytes(a["shard"], granularity))
            for name, a in acc.items()}


def sharded_states(setup, layout: ParallelLayout, pl, prec, adapters: dict, ab: int, *, granularity: int) -> dict:
    """The rank's persistent shards: ``weights`` (the frozen base's, ``base``, and the adapters', ``adapters``,
    padded dim-0 shards),
    ``states`` (the optimizer's, over the adapters' shards) and ``temps`` (the optimizer step's)."""
    deg = layout.zero_degree
    weights = 0
    for t in pl.tensors:
        weights += st.alloc_bytes(numel(st.zero_shard_shape(fsdp2.runtime_shape(t), deg)) * prec.weight_bytes,
                                  granularity)
    held = [st.zero_shard_shape(s, deg) for u, v in adapters.items()
            if u in {t.unit for t in pl.tensors} for s in v]
    adapters = sum(st.alloc_bytes(numel(s) * ab, granularity) for s in held)
    states = sum(st.alloc_bytes(x.nbytes, granularity) for s in held
                 for x in state_tensors(setup.optimizer, s, state_bytes=ab, impl=setup.optimizer_impl)
                 if x.on_device or setup.device == "cpu")
    temps = step_temporary_bytes(setup.optimizer, held, state_bytes=ab, impl=setup.optimizer_impl)
    return {"weights": weights + adapters, "base": weights, "adapters": adapters, "states": states, "temps": temps}
