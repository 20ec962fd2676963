"""FSDP2 (``--zero 3``) communication of a LoRA fine-tune: the frozen base gathered, the adapters alone reduced.

What FSDP2 does with a frozen base (torch 2.13 ``torch/distributed/fsdp/_fully_shard/``, as ``memory.peft_fsdp2``
reads it): every parameter of a unit, frozen or not, is sharded and all-gathered before the unit's forward and,
resharded after it, again before its backward (the frozen weights are needed for the input's gradient); only the
parameters with a gradient are reduce-scattered (``foreach_reduce`` over ``fsdp_params_with_grad``): the adapters.
The root unit (frozen embedding, final norm, LM head) is gathered once and reduces nothing.

The chain is full training's (``perf.fsdp.chain_exposed``: one communication stream, one unit of prefetch): per
micro-batch, forward gathers [AG_root, AG_0 ... AG_{L-1}] against [0, f_0 ... f_{L-1}]; backward gathers
AG_{L-1} ... AG_0 and scatters RS_{L-1} ... RS_0 against [head backward, b_{L-1} (+ recompute) ... b_0]. Sizes
(derived): AG of a layer = its base parameters × the weight bytes + its adapters × the adapter bytes; RS = its
adapters × the adapter bytes. Every layer is gathered for its backward: with the same targets in every layer,
each layer's output requires grad (its adapters' at least), so FSDP2's pre-backward hook runs.
"""

from __future__ import annotations

from trainmath.perf import comm as cm
from trainmath.perf.fsdp import chain_exposed


def layer_adapter_params(spec, job) -> tuple[int, ...]:
    """Each layer's trainable parameters: r·(in + out) per adapted Linear the layer has, r·E·(in + out) per
    ``target_parameters`` stack (``adapters.select``, ``adapter_params``)."""
    from trainmath.adapter_params import hf_parameters
    from trainmath.adapters import select

    chosen = select(spec, job)
    have = hf_parameters(spec)
    out = []
    for i, layer in enumerate(spec.layers):
        names = {t.name for t in layer.tensors}
        total = 0
        for m in chosen:
            r = job.rank * m.rank_mult
            if m.parameter:
                p = have[m.name]
                total += r * p.experts * (p.in_features + p.out_features) if i in p.layers else 0
            elif m.name + ".weight" in names:
                total += r * (m.in_features + m.out_features)
        out.append(total)
    return tuple(out)


def zero3_item(group, topo, *, layer_params, adapter_params, root_params: int, layer_s, head_backward_s: float,
               weight_bytes: int, adapter_bytes: int, micro_batches: int) -> cm.CommItem:
    """The fine-tune's ``zero3_comm`` CommItem for ``micro_batches`` micro-batches (module docstring).
    ``layer_params`` / ``adapter_params``: each layer's base / trainable parameters; ``layer_s``: each layer's
    (forward, backward, recompute) seconds."""
    def time(op: str, size: float) -> float:
        return cm.time_s(op, size, group, topo) if group.size > 1 and size > 0 else 0.0

    ag = [time("all_gather", p * weight_bytes + a * adapter_bytes) for p, a in zip(layer_params, adapter_params)]
    rs = [time("reduce_scatter", a * adapter_bytes) for a in adapter_params]
    ag_root = time("all_gather", root_params * weight_bytes)
    fwd = chain_exposed([0.0] + [f for f, _, _ in layer_s], [ag_root] + ag, [0.0] * (len(ag) + 1))
    bwd = chain_exposed([head_backward_s] + [b + r for _, b, r in reversed(layer_s)], [0.0] + ag[::-1],
                        [0.0] + rs[::-1])
    total = ag_root + 2 * sum(ag) + sum(rs)
    gathers = 1 + 2 * len(ag)
    scatters = sum(1 for a in adapter_params if a)
    return cm.CommItem(name="zero3_comm", op="all_gather+reduce_scatter", group="dp", group_size=group.size,
                       link=cm.link_of(group), size_bytes=(root_params + sum(layer_params)) * weight_bytes
                       + sum(adapter_params) * adapter_bytes, count=micro_batches * (gathers + scatters),
                       time_s=micro_batches * total, exposed_s=micro_batches * min(total, fwd + bwd))
