"""Model states per rank: weights, gradients, fp32 master weights and optimizer states, after ZeRO sharding.

ZeRO (Rajbhandari et al. 2020, §5) stage 1 shards optimizer states (and the fp32 master weights, which are part
of them in mixed precision) over the data-parallel group, stage 2 also gradients, stage 3 also weights. The
sharding is modelled as PyTorch FSDP2 does it, per parameter on dim 0: a rank holds ``ceil_div(dim0, N)`` rows
of each tensor (padded), so per-tensor optimizer formulas (Adafactor's row/column factors, 8-bit blocks) apply
to the shard. DeepSpeed/Megatron shard one flat buffer instead; the totals differ by padding only.

Each tensor is one allocation of the CUDA caching allocator, which rounds every block up to 512 bytes
(``kMinBlockSize`` in ``c10/cuda/CUDACachingAllocator.cpp``); ``torch.cuda.memory_allocated`` reports the rounded
sizes, so every per-tensor figure here is rounded the same way (``granularity=1`` turns it off).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.arith import ceil_div, numel
from trainmath.layout import ParallelLayout, zero_shard_shape
from trainmath.memory.optimizers import BNB_QMAP_BYTES, state_tensors, step_temporary_bytes
from trainmath.placement import Placement, RankTensor
from trainmath.vocabulary import Precision

ALLOC_GRANULARITY = 512


def alloc_bytes(nbytes: int, granularity: int = ALLOC_GRANULARITY) -> int:
    """Bytes the caching allocator reserves for a tensor of ``nbytes`` (0 stays 0)."""
    return ceil_div(nbytes, granularity) * granularity if nbytes else 0


def _degree(t: RankTensor, layout: ParallelLayout) -> int:
    return layout.expert_zero_degree if t.expert else layout.zero_degree


def held_shape(t: RankTensor, layout: ParallelLayout, min_stage: int) -> tuple[int, ...]:
    """Shape a rank holds of ``t`` for a state that ZeRO shards from stage ``min_stage`` on."""
    return zero_shard_shape(t.shape, _degree(t, layout)) if layout.zero >= min_stage else t.shape


def held_tensors(t: RankTensor, layout: ParallelLayout, min_stage: int) -> tuple[tuple[int, ...], int]:
    """(shape, count): the tensors a rank holds of ``t`` for a state ZeRO shards from stage ``min_stage`` on. A
    per-expert tensor (``{e}``, ``copies`` experts) is one fused (experts, ...) parameter in transformers 5's
    modeling code, so once sharded its dim 0 is the experts: a rank holds ceil(copies / N) of them (Qwen1.5-MoE's
    60 experts: 8 on rank 0 of 8, FSDP2's padded shard), as one tensor."""
    degree = _degree(t, layout)
    if t.copies > 1 and layout.zero >= min_stage and degree > 1:
        return (ceil_div(t.copies, degree), *t.shape), 1
    return held_shape(t, layout, min_stage), t.copies


@dataclass(frozen=True, kw_only=True)
class ModelStates:
    """Bytes of the persistent training state one rank holds (allocator-rounded per tensor)."""

    weights_bytes: int
    gradients_bytes: int
    master_weights_bytes: int
    optimizer_states_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.master_weights_bytes + self.optimizer_states_bytes


def model_states(placement: Placement, layout: ParallelLayout, prec: Precision, optimizer: str, *,
                 impl: str = "foreach", granularity: int = ALLOC_GRANULARITY, block_size: int = 256,
                 device: str = "cuda") -> ModelStates:
    """Weights (sharded at ZeRO-3), gradients (ZeRO-2), master weights and optimizer states (ZeRO-1) of one rank.
    Optimizer states count what the device holds: on ``cuda`` non-fused torch optimizers keep their ``step``
    scalar on the CPU; on ``cpu`` every state is on the one device.

    Scalar states (Adam's ``step``) are one per torch parameter: a checkpoint's per-expert tensors
    (``experts.{e}.gate_proj``, ``up_proj``, ``down_proj``) are, in transformers 5's modeling code, fused 3-D
    parameters (``gate_up_proj``: gate and up concatenated, and ``down_proj``), so a layer's routed experts carry
    ``runtime_expert_params`` scalars, not one per expert per tensor (measured: MemTracker counts them)."""
    w = g = m = s = 0
    any_8bit = False
    scalar_units: dict[str, set] = {}
    done: dict[tuple, tuple[int, int, int, int, bool, bool]] = {}  # the layers' tensors repeat: one sum per shape
    for t in placement.tensors:
        per_expert = t.expert and "{e}" in t.spec.name
        key = (t.shape, t.copies, t.expert, per_expert)
        one = done.get(key)
        if one is None:
            one = done[key] = _tensor_states(t, layout, prec, optimizer, impl, granularity, block_size, device,
                                             per_expert)
        dw, dg, dm, ds, scalar, eight = one
        w, g, m, s = w + dw, g + dg, m + dm, s + ds
        any_8bit |= eight
        if scalar:
            scalar_units.setdefault(t.unit, set()).add(t.spec.name.rsplit(".", 2)[-2])
    for names in scalar_units.values():
        s += runtime_expert_params(names) * alloc_bytes(4, granularity)
    if any_8bit:
        s += 2 * alloc_bytes(BNB_QMAP_BYTES // 2, granularity)
    return ModelStates(weights_bytes=w, gradients_bytes=g, master_weights_bytes=m, optimizer_states_bytes=s)


def _tensor_states(t: RankTensor, layout: ParallelLayout, prec: Precision, optimizer: str, impl: str,
                   granularity: int, block_size: int, device: str,
                   per_expert: bool) -> tuple[int, int, int, int, bool, bool]:
    """(weight, gradient, master, optimizer-state bytes, has a per-expert scalar state, has an 8-bit state) of
    one placed tensor: ``model_states``' terms for ``t`` alone."""
    shape, n = held_tensors(t, layout, 3)
    w = n * alloc_bytes(numel(shape) * prec.weight_bytes, granularity)
    shape, n = held_tensors(t, layout, 2)
    g = n * alloc_bytes(numel(shape) * prec.grad_bytes, granularity)
    shard, n = held_tensors(t, layout, 1)
    m = n * alloc_bytes(numel(shard) * prec.master_bytes, granularity)
    s, scalar, eight = 0, False, False
    for st in state_tensors(optimizer, shard, state_bytes=prec.state_bytes, impl=impl, block_size=block_size):
        if st.on_device or device == "cpu":
            if per_expert and st.numel == 1:
                scalar = True
                continue
            s += n * alloc_bytes(st.nbytes, granularity)
        eight |= st.elem_bytes == 1
    return w, g, m, s, scalar, eight


def runtime_expert_params(names: set) -> int:
    """Fused expert parameters of one layer given its per-expert tensor kinds (``gate_proj``, ``up_proj``,
    ``down_proj``; Mixtral's ``w1``, ``w3``, ``w2``): gate and up become one ``gate_up_proj``; every other kind
    stays one parameter."""
    return len(names) - (1 if {"gate_proj", "up_proj"} <= names or {"w1", "w3"} <= names else 0)


def optimizer_shard_shapes(placement: Placement, layout: ParallelLayout) -> list[tuple[int, ...]]:
    """The shapes the optimizer updates on this rank (ZeRO-1 shards), one per tensor copy."""
    out: list[tuple[int, ...]] = []
    done: dict[tuple, tuple[tuple[int, ...], int]] = {}
    for t in placement.tensors:
        key = (t.shape, t.copies, t.expert)
        held = done.get(key)
        if held is None:
            held = done[key] = held_tensors(t, layout, 1)
        shape, n = held
        out += [shape] * n
    return out


def optimizer_temporaries_bytes(placement: Placement, layout: ParallelLayout, prec: Precision, optimizer: str,
                                *, impl: str = "foreach") -> int:
    """Peak bytes the optimizer step allocates beyond its state (see ``optimizers.step_temporary_bytes``)."""
    return step_temporary_bytes(optimizer, optimizer_shard_shapes(placement, layout), state_bytes=prec.state_bytes,
                                impl=impl)


def fp32_grad_copies_bytes(placement: Placement, layout: ParallelLayout, prec: Precision) -> int:
    """fp32 copies of the gradient shard made for an fp32-master optimizer step when gradients are kept in lower
    precision: Megatron's ``DistributedOptimizer._copy_model_grads_to_main_grads`` sets
    ``main_param.grad = model_grad.float()`` for the rank's shard. 0 without master weights."""
    if not prec.master_bytes or prec.grad_bytes >= 4:
        return 0
    return sum(numel(s) * 4 for s in optimizer_shard_shapes(placement, layout))
