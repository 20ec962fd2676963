"""Selective checkpointing as a fold over a layer's op list: torchtitan's op-level policy.

``trainmath.runtime.checkpointing.apply_selective`` runs each decoder layer under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` with torchtitan's policy
(pytorch/torchtitan ``torchtitan/distributed/activation_checkpoint.py``, ``_apply_op_sac``): the outputs of
``aten.mm`` and of the SDPA kernels are cached for backward, except every second mm of the layer. What a layer
then keeps after forward is

- its inputs, held by the checkpoint for the recompute: the residual stream entering it (the rotary cos/sin are
  shared by every layer and counted once, as under full recompute);
- the cache: the output of the 1st, 3rd, 5th, ... bias-free linear in call order (a biased ``nn.Linear``
  dispatches to ``aten.addmm``, which the policy neither keeps nor counts), and the output and fp32 logsumexp of
  SDPA's fused kernel (CPU: ``_scaled_dot_product_flash_attention_for_cpu``; CUDA flash the same; eager attention
  and SDPA's math fallback run ``bmm``s, which are not kept).

Backward recomputes the layer once more, serving the cached ops from the cache: the recomputed forward saves
what the layer saves without checkpointing, but the storages that are cached outputs or layer inputs are the
cached ones, not new. That difference, the largest over layers, is the ``recompute transient``.
Checked against ``sac_oracle.measure`` in ``tests/activations/test_selective_oracle.py``, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmath.errors import TrainmathError
from trainmath.model.spec import LayerSpec
from trainmath.ops.fold import saved_storages
from trainmath.ops.ir import SINGLE, Degrees, Op, Tensor
from trainmath.tree import Node

FUSED_ATTENTION = ("sdpa",)
"""Attention kernels that run one SDPA op whose outputs the policy keeps (``Op.kernel``)."""


def _biases(layer: LayerSpec) -> set[str]:
    return {t.name for bl in layer.blocks for t in bl.tensors if t.kind == "bias"}


def runs_mm(op: Op, layer: LayerSpec) -> bool:
    """A linear without a bias: ``F.linear`` dispatches to ``aten.mm`` (with one: ``aten.addmm``)."""
    if op.kind != "linear" or op.weight is None:
        return False
    stem = op.weight.name[: -len("weight")] if op.weight.name.endswith("weight") else op.weight.name + "."
    return stem + "bias" not in _biases(layer)


def cached(ops: Sequence[Op], layer: LayerSpec, *, every_second_mm: bool = True) -> list[Tensor]:
    """The tensors the policy caches in one layer, in call order."""
    out: list[Tensor] = []
    mms = 0
    for op in ops:
        if runs_mm(op, layer):
            mms += 1
            if not (every_second_mm and mms % 2 == 0):
                out.extend(op.outputs)
        elif op.kind == "attention" and op.kernel in FUSED_ATTENTION:
            lse = [t for t in op.saved if t.name.endswith("logsumexp")]
            if len(lse) != 1:
                raise TrainmathError(f"{op.name}: an SDPA op without its logsumexp in the op list")
            out.extend([*op.outputs, *lse])
    return out


def layer_input(ops: Sequence[Op]) -> Tensor:
    """The residual stream entering the layer: the first op's input (the input norm reads it)."""
    if not ops or not ops[0].inputs or ops[0].inputs[0].name != "layer.input":
        raise TrainmathError("selective checkpointing folds layers whose op list starts from 'layer.input'")
    return ops[0].inputs[0]


def _leaf(t: Tensor, deg: Degrees, note: str = "") -> Node:
    return Node(name=t.name, value=t.nbytes(deg), unit="bytes", note=note or t.note)


def selective_layer(label: str, ops: Sequence[Op], layer: LayerSpec, deg: Degrees = SINGLE, *,
                    every_second_mm: bool = True) -> tuple[Node, Node]:
    """(what the layer keeps after forward, what its recompute saves anew in backward)."""
    x = layer_input(ops)
    cache = cached(ops, layer, every_second_mm=every_second_mm)
    kept = [_leaf(x, deg, "layer input, held by the checkpoint")]
    kept.append(Node.of("selective cache", [_leaf(t, deg) for t in cache], "bytes",
                        note="outputs of the 1st, 3rd, ... mm and of SDPA (torchtitan's op-level policy)"))
    held = {id(x), *(id(t) for t in cache)}
    fresh = [_leaf(t, deg) if st is t else Node(name=t.name, value=st.nbytes(deg), unit="bytes",
                                                note=f"a view of {st.name}")
             for t, st in saved_storages(ops, deg) if id(st) not in held]
    return (Node.of(label, kept, "bytes"),
            Node.of(label, fresh, "bytes", note="saved by the recomputed forward, beside the cache and input"))


def recomputed_linear_flops(ops: Sequence[Op], layer: LayerSpec, tokens: int, *,
                            every_second_mm: bool = True) -> int:
    """FLOPs the backward's recompute spends on linears: 2·T·in·out for every linear whose output is not cached
    (the 2nd, 4th, ... mm, and every biased ``addmm``). SDPA's output is cached: no attention-core recompute."""
    kept = {id(t) for t in cached(ops, layer, every_second_mm=every_second_mm)}
    flops = 0
    for op in ops:
        if op.kind == "linear" and op.weight is not None and not any(id(t) in kept for t in op.outputs):
            n = 1
            for k in op.weight.shape:
                n *= k
            flops += 2 * tokens * n
    return flops


def selective_recompute_flops(spec, *, batch: int, seq: int) -> int:
    """Recomputed linear FLOPs of one micro-batch over all layers (families with op lists; others raise)."""
    from trainmath.ops import families
    from trainmath.ops.context import Ctx, Precision
    from trainmath.ops.ir import Program

    emit = families.LAYERS.get(spec.model_type)
    if emit is None:
        raise TrainmathError(f"--recompute selective (torchtitan's op-level policy) is modelled for "
                             f"{', '.join(sorted(families.LAYERS))} so far; {spec.name} is {spec.model_type!r}")
    ctx = Ctx(b=batch, s=seq, d=spec.hidden_size, p=Precision(compute=2, param=2))
    total = 0
    for layer, idx in spec.layer_groups():
        prog = Program()
        emit(prog, ctx, layer, families.style(spec.model_type))
        total += len(idx) * recomputed_linear_flops(prog.ops, layer, batch * seq)
    return total
