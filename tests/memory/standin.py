"""A tiny stand-in for ``trainmath.memory.activations`` with its published signature, so the memory tests do not
depend on the activation model's numbers: every layer saves 10 values per token per hidden unit (÷ tp, ÷ cp)."""

from __future__ import annotations

from trainmath.placement import ceil_div
from trainmath.tree import Node


def activation_bytes(spec, *, micro_batch, seq, profile="hf", recompute="none", compute_dtype_bytes=2,
                     tp=1, sp=False, cp=1, pp=1, layers=None) -> Node:
    idx = range(spec.num_layers) if layers is None else layers
    per_layer = 10 * micro_batch * ceil_div(seq, cp) * ceil_div(spec.hidden_size, tp) * compute_dtype_bytes
    if recompute == "full":
        per_layer = micro_batch * ceil_div(seq, cp) * spec.hidden_size * compute_dtype_bytes
    groups: dict[str, int] = {}
    for i in idx:
        label = spec.layers[i].label
        groups[label] = groups.get(label, 0) + per_layer
    return Node.of("activations", [Node(name=k, value=v, unit="bytes") for k, v in groups.items()], "bytes")


def logits_bytes(spec, micro_batch, seq, *, compute_dtype_bytes=2, tp=1, cp=1, sp=False) -> Node:
    return Node(name="logits", value=micro_batch * ceil_div(seq, cp) * ceil_div(spec.vocab_size, tp)
                * compute_dtype_bytes, unit="bytes")
