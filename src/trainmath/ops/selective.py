"""Selective checkpointing as a fold over a layer's op list: torchtitan's op-level policy.

``trainmath.runtime.checkpointing.apply_selective`` runs each decoder layer under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` with torchtitan's policy
(pytorch/torchtitan ``torchtitan/distributed/activation_checkpoint.py``, ``_apply_op_sac``): the outputs of
``aten.mm`` and of the SDPA kernels are cached for backward, except every second mm of the layer. What a layer
then keeps after forward is

- its inputs, held by the checkpoint for the recompute: the residual stream entering it (the rotary cos/sin are
  shared by every layer and counted once, as under full recompute) and the attention mask transformers passes
  (``mask_arguments``: eager attention's (b, 1, s, s) masks, Falcon's and Llama 4's bool masks under SDPA);
- the cache: the output of the 1st, 3rd, 5th, ... bias-free linear in call order (a biased ``nn.Linear``
  dispatches to ``aten.addmm``, which the policy neither keeps nor counts; ``_grouped_mm`` and Llama 4's
  experts' ``bmm`` likewise; gpt-oss's experts run ``x @ W`` then ``+ b``: the mm's own output is cached), and
  the output and fp32 logsumexp of SDPA's fused kernel (CPU: ``_scaled_dot_product_flash_attention_for_cpu``;
  CUDA flash the same; eager attention and SDPA's math fallback run ``bmm``s, which are not kept). The mm count
  follows the module's call order (a Qwen2-MoE shared expert runs before the router: ``families.moe``); under
  peft each adapted Linear's base mm is followed by its lora_A and lora_B mms (``ops.lora``: bias-free
  ``nn.Linear``s), which count and are cached by the same rule.

Backward recomputes the layer once more, serving the cached ops from the cache: the recomputed forward saves
what the layer saves without checkpointing, but the storages that are cached outputs or layer inputs are the
cached ones, not new, and the checkpoint stores a recomputed tensor only for a forward node still alive after
forward (nodes that cannot reach the loss, e.g. the DeepSeek-V3 router's group top-k and masked_fill, died with
their holders; ``kernels.scans.UNREACHED``). That difference, the largest over layers, is the ``recompute
transient``. Checked against ``sac_oracle.measure`` in ``tests/activations/test_selective_oracle.py``, exactly,
for every family the hf profile models (``FamilyDef.modelled``).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmath.errors import TrainmathError
from trainmath.model.spec import LayerSpec
from trainmath.ops.fold import saved_storages
from trainmath.ops.ir import SINGLE, Axis, Degrees, Op, Tensor, tensor
from trainmath.ops.kernels.scans import UNREACHED
from trainmath.tree import Node

FUSED_ATTENTION = ("sdpa",)
"""Attention kernels that run one SDPA op whose outputs the policy keeps (``Op.kernel``)."""
NOT_MM = ("grouped_mm", "all_tokens")
"""Linear kernels that run no ``aten.mm``: ``_grouped_mm`` and ``bmm``, which the policy neither keeps nor
counts."""


def check_family(spec) -> None:
    """One line for a family without an op list (the hf profile refuses it the same way)."""
    if spec.family.layer is None:
        raise TrainmathError(f"--recompute selective (torchtitan's op-level policy on transformers' layers) folds "
                             f"the hf profile's op lists; {spec.name} is {spec.model_type!r}, which has none: use "
                             f"--profile megatron for Korthikanti's selective recompute")


def _biases(layer: LayerSpec) -> set[str]:
    return {t.name for bl in layer.blocks for t in bl.tensors if t.kind == "bias"}


def runs_mm(op: Op, layer: LayerSpec) -> bool:
    """A linear that dispatches one ``aten.mm``: no bias (with one, ``F.linear`` runs ``aten.addmm``), not
    ``_grouped_mm`` (transformers' grouped experts) or ``bmm`` (Llama 4's experts over all tokens), and not the
    second weight of one fused matmul (an op without outputs: gate and up stored apart, run as one gate_up). The
    eager experts' loop runs gate_up and down once per hit expert: an even count, so one op each stands for all
    of them (the parity on entry decides)."""
    if op.kind == "lora":  # peft's lora_A / lora_B: bias-free nn.Linear (ops.lora)
        return bool(op.outputs)
    if op.kind != "linear" or op.weight is None or not op.outputs or op.kernel in NOT_MM:
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


def _bias_after_mm(op: Op, layer: LayerSpec) -> bool:
    """An expert projection written ``x @ W + b`` (gpt-oss: the bias a separate ``*_bias`` parameter): the mm
    runs bias-free and its output, which the policy caches, is not the biased output the next ops save."""
    return op.weight.name + "_bias" in _biases(layer)


def cached(ops: Sequence[Op], layer: LayerSpec, *, every_second_mm: bool = True) -> list[Tensor]:
    """The tensors the policy caches in one layer, in call order."""
    out: list[Tensor] = []
    for op, keep in _decisions(ops, layer, every_second_mm):
        if not keep:
            continue
        if op.kind == "linear" and op.outputs and _bias_after_mm(op, layer):
            y = op.outputs[0]  # the mm's own output: in the (cast) input's dtype, before the fp32 bias promotes it
            out.append(tensor(f"{y.name}.mm", y.axes, op.saved[0].dtype_bytes, "the mm's output, before + bias"))
            continue
        out.extend(op.outputs)
        if op.kind == "attention":
            lse = [t for t in op.saved if t.name.endswith("logsumexp")]
            if len(lse) != 1:
                raise TrainmathError(f"{op.name}: an SDPA op without its logsumexp in the op list")
            out.extend(lse)
    return out


LAYER_INPUT = "layer.input"
"""The name the families give the residual stream entering a layer (``families.common.residual``)."""


def layer_input(ops: Sequence[Op]) -> Tensor:
    """The residual stream entering the layer (the tensor the families name ``LAYER_INPUT``)."""
    for op in ops:
        for t in op.inputs:
            if t.name == LAYER_INPUT:
                return t
    raise TrainmathError("selective checkpointing folds layers whose op list reads 'layer.input'")


def mask_arguments(ctx, spec, style, layers: Sequence[int]) -> list[Tensor]:
    """The attention masks the rank's checkpointed ``layers`` receive as arguments: distinct storages the
    checkpoints hold until each layer's backward (one per attention kind, shared by the layers of that kind;
    ``Style.layer_mask``). transformers builds them once per forward (``create_causal_mask`` and its sliding and
    chunked variants, a mapping per layer type); under SDPA a sliding window at most s is a bool (1, 1, s, s)
    mask (``masking_utils._ignore_causal_mask_sdpa`` skips to ``is_causal`` only while s is below the window);
    without checkpointing none is saved."""
    from trainmath.model.spec import AttentionDims

    windows = [bl.dims.sliding_window for i in layers for bl in spec.layers[i].blocks
               if isinstance(bl.dims, AttentionDims)]
    axes = (Axis(ctx.b), Axis(1), Axis(ctx.s, "seq"), Axis(ctx.s))
    if ctx.eager or style.attention == "eager":
        return [tensor("attention_mask.sliding" if sliding else "attention_mask", axes, ctx.p.weight_bytes,
                       "eager attention's additive (b, 1, s, s) mask in the parameters' dtype, one per attention kind")
                for sliding in sorted({w is not None for w in windows})]
    if style.layer_mask == "bool" and windows:
        return [tensor("attention_mask", (Axis(1), *axes[1:]), 1,
                       "bool (1, 1, s, s) expanded over the batch, one for all layers")]
    reached = any(w is not None and w <= ctx.s for w in windows)
    if style.layer_mask == "bool_chunked" and reached:
        return [tensor("attention_mask.chunked", axes, 1, "bool (b, 1, s, s) of the chunked layers")]
    if reached:  # masking_utils._ignore_causal_mask_sdpa: no is_causal skip once kv_length >= the window
        return [tensor("attention_mask.sliding", (Axis(1), *axes[1:]), 1,
                       "bool (1, 1, s, s) sliding-window mask expanded over the batch, built once s reaches the "
                       "window")]
    return []


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

    # the recompute stores a saved tensor only where the forward's node still holds its holder (kernels.scans)
    dead = {id(t) for op in ops if op.kernel == UNREACHED for t in op.saved}
    fresh = [_leaf(t, deg) if st is t else Node(name=t.name, value=st.nbytes(deg), unit="bytes",
                                                note=f"a view of {st.name}")
             for t, st in saved_storages(ops, deg) if id(root(st)) not in held and id(t) not in dead]
    return (Node.of(label, kept, "bytes"),
            Node.of(label, fresh, "bytes", note="saved by the recomputed forward, beside the cache and input"))


def recomputed_linears(ops: Sequence[Op], layer: LayerSpec, *, every_second_mm: bool = True) -> list[bool]:
    """Per linear op with a weight, in op order (the GEMMs ``ops.flops.linear_gemms_from_ops`` lists): does the
    backward's recompute run it? Not when its output is cached (the 1st, 3rd, ... mm), and not when it is the
    layer's last op that saves anything: torch's non-reentrant checkpoint stops the recompute once it has packed
    the last tensor backward needs (``torch.utils.checkpoint`` early stop, on by default), and a linear packs its
    input and weight before it runs (Phi-3's and Qwen2's down_proj, the 4th mm: measured, never recomputed)."""
    stop = max((i for i, op in enumerate(ops) if op.saved), default=len(ops))
    while stop > 0 and ops[stop].kind == "linear" and not ops[stop].outputs:
        stop -= 1  # the second weight of a fused matmul: the stop falls before the matmul
    return [not keep and i < stop for i, (op, keep) in enumerate(_decisions(ops, layer, every_second_mm))
            if op.kind == "linear" and op.weight is not None]


def core_recomputed(ops: Sequence[Op]) -> bool:
    """Does the recompute run the layer's attention core again? Not where SDPA's fused kernel is cached; eager
    attention's and SDPA's math fallback's ``bmm``s are recomputed (a layer without attention: its scans and
    convolutions are recomputed, none being in the policy's list)."""
    return not any(op.kind == "attention" and op.kernel in FUSED_ATTENTION for op in ops)
