"""Folds over op lists: what autograd keeps, per rank.

``saved_storages`` walks the ops in order and keeps each saved storage once (two ops saving one tensor, or views
of one base, keep one storage: the exactness of ``tests/activations`` rests on it); ``layer_node`` turns a layer's
op list into the tree ``trainmath memory`` prints: its saved activations and, under autocast, its weight copies.
Every size is taken on one rank of ``deg`` (``Tensor.nbytes``): a fold of a layer at ``Degrees()`` is the
single device.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainmath.ops.ir import SINGLE, Degrees, Op, Tensor
from trainmath.tree import Node


def saved_storages(ops: Iterable[Op], deg: Degrees = SINGLE) -> list[tuple[Tensor, Tensor]]:
    """(the saved tensor as first saved, the storage it keeps) for every distinct storage saved by ``ops``."""
    seen: set[int] = set()
    out = []
    for op in ops:
        for t in op.saved:
            st = t.storage_on(deg)
            if id(st) not in seen:
                seen.add(id(st))
                out.append((t, st))
    return out


def _leaf(t: Tensor, st: Tensor, deg: Degrees) -> Node:
    note = t.note or st.note
    if st is not t and st.name != t.name and not note:
        note = f"a view of {st.name}"
    return Node(name=t.name, value=st.nbytes(deg), unit="bytes", note=note)


def layer_node(label: str, ops: Iterable[Op], deg: Degrees = SINGLE) -> Node:
    """A layer's tree: ``activations`` (saved tensors) and, when there are any, ``autocast weight copies``."""
    acts, copies = [], []
    for t, st in saved_storages(ops, deg):
        (copies if st.kind == "weight_copy" else acts).append(_leaf(t, st, deg))
    parts = [Node.of("activations", acts, "bytes")]
    if copies:
        parts.append(Node.of("autocast weight copies", copies, "bytes",
                             note="compute-dtype casts of the fp32 weights, kept for backward"))
    return Node.of(label, parts, "bytes")


def saved_leaves(ops: Iterable[Op], deg: Degrees = SINGLE) -> list[Node]:
    """Every distinct saved storage of ``ops`` as a leaf (weight copies included)."""
    return [_leaf(t, st, deg) for t, st in saved_storages(ops, deg)]
