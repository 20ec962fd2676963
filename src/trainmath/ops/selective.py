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
SELECTIVE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "gemma3_text", "qwen3_moe", "mixtral",
                      "deepseek_v3")
"""The families whose selective fold is checked against ``apply_selective`` on transformers' code (every op
list folds; the others are refused until a test checks them)."""


def check_family(spec) -> None:
    """One line for a family the fold is not checked for."""
    if spec.model_type not in SELECTIVE_FAMILIES:
        raise TrainmathError(f"--recompute selective (torchtitan's op-level policy on transformers' layers) is "
                             f"checked for {', '.join(SELECTIVE_FAMILIES)} so far; {spec.name} is "
                             f"{spec.model_type!r}: use --recompute full, or --profile megatron for Korthikanti's")
"""Attention kernels that run one SDPA op whose outputs the policy keeps (``Op.kernel``)."""


def _biases(layer: LayerSpec) -> set[str]:
    return {t.name for bl in layer.blocks for t in bl.tensors if t.kind == "bias"}


def runs_mm(op: Op, layer: LayerSpec) -> bool:
    """A linear that dispatches one ``aten.mm``: no bias (with one, ``F.linear`` runs ``aten.addmm``), not
    ``_grouped_mm`` (transformers' grouped experts), and not the second weight of one fused matmul (an op
    without outputs: gate and up stored apart, run as one gate_up). The eager experts' loop runs gate_up and down
    once per hit expert: an even count, so one op each stands for all of them (the parity on entry decides)."""
    if op.kind != "linear" or op.weight is None or not op.outputs or op.kernel == "grouped_mm":
        return False
    stem = op.weight.name[: -len("weight")] if op.weight.name.endswith("weight") else op.weight.name + "."
    return stem + "bias" not in _biases(layer)


def _decisions(ops: Sequence[Op], layer: LayerSpec, every_second_mm: bool) -> list[tuple[Op, bool]]:
    """(op, its outputs are cached) for every op, in order."""
    out: list[tuple[Op, bool]] = []
    mms, last = 0, False
    for op in ops:
        keep = False
        if runs_mm(op, layer):
            mms += 1
            keep = not (every_second_mm and mms % 2 == 0)
        elif op.kind == "linear" and not op.outputs:
            keep = last  # the second weight of a fused matmul: its first weight's decision
        elif op.kind == "attention" and op.kernel in FUSED_ATTENTION:
            keep = True
        if op.kind == "linear":
            last = keep
        out.append((op, keep))
    return out


def cached(ops: Sequence[Op], layer: LayerSpec, *, every_second_mm: bool = True) -> list[Tensor]:
    """The tensors the policy caches in one layer, in call order."""
    out: list[Tensor] = []
    for op, keep in _decisions(ops, layer, every_second_mm):
        if not keep:
            continue
        out.extend(op.outputs)
        if op.kind == "attention":
            lse = [t for t in op.saved if t.name.endswith("logsumexp")]
            if len(lse) != 1:
                raise TrainmathError(f"{op.name}: an SDPA op without its logsumexp in the op list")
            out.extend(lse)
    return out


def layer_input(ops: Sequence[Op]) -> Tensor:
    """The residual stream entering the layer (the tensor the families name ``layer.input``)."""
    for op in ops:
        for t in op.inputs:
            if t.name == "layer.input":
                return t
    raise TrainmathError("selective checkpointing folds layers whose op list reads 'layer.input'")


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
    # a row-parallel output's reduction (``linear.reduce_seq``) is the output itself on one tensor-parallel rank
    alias = {id(op.outputs[0]): op.inputs[0] for op in ops if op.kind == "reduce" and deg.tp == 1}

    def root(st: Tensor) -> Tensor:
        while id(st) in alias:
            st = alias[id(st)].storage_on(deg)
        return st

    fresh = [_leaf(t, deg) if st is t else Node(name=t.name, value=st.nbytes(deg), unit="bytes",
                                                note=f"a view of {st.name}")
             for t, st in saved_storages(ops, deg) if id(root(st)) not in held]
    return (Node.of(label, kept, "bytes"),
            Node.of(label, fresh, "bytes", note="saved by the recomputed forward, beside the cache and input"))


def recomputed_linear_flops(ops: Sequence[Op], layer: LayerSpec, *, every_second_mm: bool = True) -> int:
    """FLOPs the backward's recompute spends on linears: 2·rows·in·out for every linear whose output is not
    cached (the 2nd, 4th, ... mm, every biased ``addmm``, grouped experts). SDPA's output is cached: no
    attention-core recompute."""
    flops = 0
    for op, keep in _decisions(ops, layer, every_second_mm):
        if op.kind == "linear" and op.weight is not None and not keep:
            n = 2
            for a in op.inputs[0].axes[:-1]:
                n *= a.size
            for k in op.weight.shape:
                n *= k
            flops += n
    return flops


def selective_recompute_flops(spec, *, batch: int, seq: int) -> int:
    """Recomputed linear FLOPs of one micro-batch over all layers (families with op lists; others raise)."""
    from trainmath.ops import families
    from trainmath.ops.context import Ctx, Precision
    from trainmath.ops.ir import Program

    check_family(spec)
    emit = families.LAYERS[spec.model_type]
    ctx = Ctx(b=batch, s=seq, d=spec.hidden_size, p=Precision(compute=2, param=2))
    total = 0
    for layer, idx in spec.layer_groups():
        prog = Program()
        emit(prog, ctx, layer, families.style(spec.model_type))
        total += len(idx) * recomputed_linear_flops(prog.ops, layer)
    return total
