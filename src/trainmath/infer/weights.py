"""Weight bytes on one tensor-parallel rank, in a serving format (bf16, fp8, int8, int4 with their scales).

Each tensor's sharding hint (``TensorSpec.shard``) says which axis TP splits: ``column`` the output features,
``row`` the input features, ``vocab`` the vocabulary rows, ``head`` the per-head axis; ``replicated`` tensors
(norms, routers, MLA's down-projections, row-parallel biases) are whole on every rank. The axis rule is
Megatron's (and ``trainmath.placement``'s). Two refinements serving engines make, modelled here:

- K/V heads fewer than tp: each rank holds one K/V head, replicated on tp/h_kv ranks (vLLM ``QKVParallelLinear``),
  so k_proj/v_proj rows per rank are h_d, not h_kv·h_d/tp;
- the vocabulary split is ``ceil_div(V, tp)`` rows (vLLM pads to a multiple of 64·tp, not modelled).

Any other split that tp does not divide is an error naming the tensor. Quantised bytes of a sharded weight are
those of its shard: each rank keeps the scales of its own rows/groups (``ceil_div`` at a ragged edge).

Expert parallelism (``ep``) over an instance of ``gpus`` ranks: each rank holds ``experts / ep`` whole routed
experts, whose matrices are split by the same axis rule over the remaining ``gpus / ep`` ranks (vLLM's
``--enable-expert-parallel``: EP over the TP × DP ranks); everything else is split over ``tp`` and replicated on
``gpus / tp`` ranks.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError
from trainmath.infer.dtypes import WeightFormat, quantised_weight_bytes, tensor_bytes
from trainmath.infer.kv import heads_per_rank, kv_heads_per_rank, validate_tp  # noqa: F401  (validate_tp: re-exported)
from trainmath.model.spec import COMPONENTS, AttentionDims, Block, ModelSpec, TensorSpec
from trainmath.placement import tp_axis  # the one column/row rule, shared with training placement
from trainmath.tree import Node

# Components whose linear weights stay at keep_dtype when the rest is quantised.
KEPT_COMPONENTS = ("embed_tokens", "pos_embed", "lm_head", "router")


def _split(t: TensorSpec, size: int, block: Block | None, tp: int) -> int:
    """The size of the split axis on one rank."""
    if t.shard == "vocab":
        return ceil_div(size, tp)
    d = block.dims if block is not None else None
    if isinstance(d, AttentionDims) and d.kv_heads < tp:
        kv_local, hd = kv_heads_per_rank(d.kv_heads, tp), d.head_dim
        q_local = heads_per_rank(d.heads, tp, "num_attention_heads")
        if size == d.kv_heads * hd:  # k_proj / v_proj rows (or biases, or a full k_norm)
            return kv_local * hd
        if size == (d.heads + 2 * d.kv_heads) * hd:  # fused qkv_proj
            return (q_local + 2 * kv_local) * hd
        if t.shard == "head" and size == d.kv_heads:  # per-head k_norm
            return kv_local
    if size % tp:
        raise TrainmathError(f"tensor parallel size {tp} must divide axis {tp_axis(t)} ({size}) of {t.name} "
                             f"{t.shape}")
    return size // tp


def rank_shape(t: TensorSpec, block: Block | None, tp: int) -> tuple[int, ...]:
    """One copy's shape on a TP rank."""
    axis = tp_axis(t)
    if axis is None or tp == 1:
        return t.shape
    return tuple(_split(t, s, block, tp) if i == axis else s for i, s in enumerate(t.shape))


def skipped(name: str, fmt: WeightFormat) -> bool:
    """Whether a tensor's full checkpoint name lies in a module ``fmt.skip_modules`` keeps unquantised: a pattern
    matches the module's name or any name below it (``model.layers.*.self_attn`` covers its q_proj.weight)."""
    return any(fnmatchcase(name, pat) or fnmatchcase(name, pat + ".*") for pat in fmt.skip_modules)


def is_quantised(t: TensorSpec, fmt: WeightFormat, name: str = "") -> bool:
    """Whether ``fmt`` quantises this tensor: decoder ``linear`` weights only (module docstring of dtypes), less
    the modules the format skips (``name`` is the tensor's full checkpoint name)."""
    return (fmt.quantised and t.kind == "linear" and len(t.shape) == 2 and t.component not in KEPT_COMPONENTS
            and not (fmt.skip_modules and skipped(name, fmt)))


def expert_copies(t: TensorSpec, ep: int) -> int:
    """Copies of a tensor on one rank: a routed expert's tensor has ``experts / ep`` (ep must divide them)."""
    if not t.experts or ep == 1:
        return t.copies
    if t.experts % ep:
        raise TrainmathError(f"expert parallel size {ep} must divide the {t.experts} routed experts "
                             f"(try --ep {max(e for e in range(1, ep) if t.experts % e == 0)})")
    return t.experts // ep


def tensor_rank_bytes(t: TensorSpec, block: Block | None, fmt: WeightFormat, tp: int, *, name: str = "",
                      ep: int = 1, expert_tp: int | None = None) -> tuple[int, int]:
    """(data, scale) bytes of all copies of one tensor on one rank: split over ``tp`` (a routed expert's tensor
    over ``expert_tp``, default ``tp``, with ``experts / ep`` copies)."""
    if t.experts:
        shape, copies = rank_shape(t, block, tp if expert_tp is None else expert_tp), expert_copies(t, ep)
    else:
        shape, copies = rank_shape(t, block, tp), t.copies
    if is_quantised(t, fmt, name):
        out_f, in_f = (shape[1], shape[0]) if t.transposed else shape
        data, scales = quantised_weight_bytes(out_f, in_f, fmt)
        return data * copies, scales * copies
    numel = 1
    for s in shape:
        numel *= s
    return tensor_bytes(numel, fmt.kept_bits) * copies, 0


def weights_tree(spec: ModelSpec, *, fmt: WeightFormat, tp: int, ep: int = 1, gpus: int | None = None) -> Node:
    """Weight bytes on one rank, per component; a quantised component splits into ``data`` and ``scales``.
    Tied tensors (a tied lm_head) add nothing; tensors transformers does not build (``spec.extras``) are left out.
    Routed experts are split over ``ep`` ranks and their matrices over ``gpus / ep`` (module docstring)."""
    data = dict.fromkeys(COMPONENTS, 0)
    scales = dict.fromkeys(COMPONENTS, 0)
    expert_tp = (gpus or tp) // ep

    def add(t: TensorSpec, block: Block | None, times: int, name: str) -> None:
        if t.tied:
            return
        d, s = tensor_rank_bytes(t, block, fmt, tp, name=name, ep=ep, expert_tp=expert_tp)
        data[t.component] += d * times
        scales[t.component] += s * times

    for t in spec.pre + spec.post:
        add(t, None, 1, t.name)
    for layer, idx in spec.layer_groups():
        for b in layer.blocks:
            for t in b.tensors:
                if fmt.skip_modules:  # patterns may name layers: decide per layer (names as in named_tensors)
                    for i in idx:
                        add(t, b, 1, spec.layer_prefix.format(i=i) + t.name)
                else:
                    add(t, b, len(idx), "")
    children = []
    for c in COMPONENTS:
        if not data[c] and not scales[c]:
            continue
        if scales[c]:
            children.append(Node.of(c, [Node(name="data", value=data[c], unit="bytes"),
                                        Node(name="scales", value=scales[c], unit="bytes")], "bytes"))
        else:
            children.append(Node(name=c, value=data[c], unit="bytes"))
    return Node.of("weights", children, "bytes")
