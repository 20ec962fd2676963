"""Host (CPU) memory of an offloaded training job, per node: what DeepSpeed ZeRO-Offload and ZeRO-Infinity keep
in host RAM, and whether the node holds it.

With ``offload_optimizer: {device: cpu}`` each rank keeps its ZeRO partition of the optimizer on the host and runs
the step there (Ren et al. 2021, "ZeRO-Offload", §4). What each rank allocates, read from DeepSpeed 0.19.8
(``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py``; S = the rank's partition in elements, w = the
model dtype's bytes, 2 for bf16/fp16):

ZeRO-1/2 (``DeepSpeedZeroOptimizer``):
- ``single_partition_of_fp32_groups``: the fp32 master partition, 4·S, pinned;
- its ``.grad`` (``initialize_optimizer_states``): the fp32 gradient partition, 4·S, pinned;
- ``param_buffer_of_bit16_for_cpu_offload_groups``: a w·S copy of the updated partition for the H2D copy, pinned;
- ``temp_grad_buffer_for_cpu_offload``: w · the largest parameter's numel, pinned (the gradient staging buffer);
- ``accumulated_grads_in_cpu`` (gradient accumulation only: more than one micro-batch per step): each
  parameter's gradient in the model dtype, pinned: w·S (a parameter straddling the partition's edge is
  allocated whole there; counted by its share here);
- the optimizer states: DeepSpeedCPUAdam's ``exp_avg`` and ``exp_avg_sq`` (``deepspeed/ops/adam/cpu_adam.py``,
  ``torch.zeros_like`` of the fp32 partition), 8·S.

ZeRO-3 (``DeepSpeedZeroOptimizer_Stage3``):
- ``fp32_partitioned_groups_flat`` (4·S) and its ``.grad`` (4·S, pinned), the optimizer states (8·S for Adam);
- ``grad_partitions_flat_buffer``: the gradient partitions in ``grad_accum_dtype`` (default: the model dtype),
  w·S, pinned;
- with ``offload_param: {device: cpu}`` also ``param_groups_fp16_flat_cpu_memory``: the parameter partitions,
  w·S, pinned.

The CPU optimizer's temporaries: DeepSpeedCPUAdam updates parameters and states in place, tile by tile in SIMD
registers (``csrc/includes/cpu_adam.h``, ``TILE`` = 128 Mi elements, ``simd.h``): 0 bytes. Any other optimizer
runs torch's own step on the CPU over the one flat partition: its temporaries as ``optimizers.step_temporary_bytes``
gives them. The node holds ``ranks_per_node`` ranks (the GPU preset's GPUs per node, or fewer when the job has
fewer), each counted as the busiest rank (pipeline stages and TP shards differ a little).

A LoRA / QLoRA fine-tune (``peft_host_memory``) offloads its adapters alone: the same terms over the trainable
parameters, the bit16 buffers in the adapters' dtype (DeepSpeed takes the optimizer's parameters only).

Not counted: the model-loading peak before ZeRO partitions the model (every rank materialising the whole model
on the CPU: DeepSpeed's estimators' ``4 · gpus_per_node · params`` term without ``zero.Init``), the OS, data
loaders, NCCL's and CUDA's host buffers, and the allocator's slack: the fit rule leaves them to the user.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainmath.arith import numel
from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout
from trainmath.memory import states as st
from trainmath.memory.optimizers import step_temporary_bytes
from trainmath.placement import Placement
from trainmath.tree import Node

HOST_MEMORY_BYTES = 2 * 2**40
"""The default ``--host-memory`` per node: a DGX H100's 2 TB, "32x 64GB" DIMMs (32 · 64 GiB = 2 TiB), as MLCommons
lists it (mlcommons/inference_results_v4.0 closed/NVIDIA/systems/DGX-H100_H100-SXM-80GBx8_TRT.json@3c4a1cf196b7,
``host_memory_capacity`` and ``host_memory_configuration``)."""
MAX_HOST_MEMORY_BYTES = 2**50
"""The largest ``--host-memory`` accepted: 1 PiB, far above any one node."""
GPUS_PER_NODE = 8
"""Ranks per node when no GPU preset says (an 8-GPU server such as the DGX H100 above)."""
CPU_ADAM = ("adam", "adamw")
"""Optimizers DeepSpeed runs as DeepSpeedCPUAdam when offloaded (in place: no temporaries)."""
TERMS = ("master_weights_bytes", "fp32_gradients_bytes", "optimizer_states_bytes", "bit16_params_bytes",
         "bit16_gradients_bytes", "grad_staging_bytes", "grad_accumulation_bytes", "optimizer_step_temporaries_bytes")
"""The per-rank terms of ``host_bytes``, in order."""


@dataclass(frozen=True, kw_only=True)
class HostMemory:
    """Host RAM of one node of an offloaded job."""

    host_bytes: int
    """Bytes of host RAM the node's ranks hold: ``ranks_per_node`` · the busiest rank's ``per_rank`` total."""
    ranks_per_node: int
    per_rank: Node
    """The busiest rank's host bytes by term (``TERMS``); its value times ``ranks_per_node`` is ``host_bytes``."""
    conventions: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"host_bytes": self.host_bytes, "host_ranks_per_node": self.ranks_per_node,
                "host_per_rank": self.per_rank.flat(), "host_conventions": list(self.conventions)}


def largest_param_numel(pl: Placement) -> int:
    """Elements of the rank's largest parameter (a fused expert parameter counts all its experts)."""
    return max((numel(t.shape) * t.copies for t in pl.tensors), default=0)


def rank_host_terms(*, shard_numel: int, largest_numel: int, model_dtype_bytes: int, zero: int, offload: str,
                    optimizer_states_bytes: int, step_temporaries_bytes: int, micro_batches: int) -> dict[str, int]:
    """One rank's host bytes by term (module docstring: the DeepSpeed buffer each is), for a ZeRO partition of
    ``shard_numel`` elements. ``zero`` 0 is counted as ZeRO-1/2 over one rank (each rank its whole model)."""
    w, s = model_dtype_bytes, shard_numel
    terms = dict.fromkeys(TERMS, 0)
    terms["master_weights_bytes"] = 4 * s
    terms["fp32_gradients_bytes"] = 4 * s
    terms["optimizer_states_bytes"] = optimizer_states_bytes
    terms["optimizer_step_temporaries_bytes"] = step_temporaries_bytes
    if zero >= 3:
        terms["bit16_gradients_bytes"] = w * s
        terms["bit16_params_bytes"] = w * s if offload == "params" else 0
    else:
        terms["bit16_params_bytes"] = w * s
        terms["grad_staging_bytes"] = w * largest_numel
        terms["grad_accumulation_bytes"] = w * s if micro_batches > 1 else 0
    return terms


def rank_host_memory(pl: Placement, layout: ParallelLayout, prec, optimizer: str, *, impl: str, offload: str,
                     micro_batches: int) -> Node:
    """The host bytes of the rank that holds placement ``pl`` (its ZeRO-1 partition is what it offloads)."""
    shard = sum(numel(s) for s in st.optimizer_shard_shapes(pl, layout))
    if optimizer in CPU_ADAM:  # exp_avg and exp_avg_sq of the fp32 partition; the step count is a Python int
        states = 8 * shard
    else:  # DeepSpeed keeps an fp32 partition whatever the recipe (master_weights_and_grads_dtype = fp32)
        states = st.model_states(pl, layout, replace(prec, state_bytes=4), optimizer, impl=impl, granularity=1,
                                 device="cpu").optimizer_states_bytes
    temps = 0 if optimizer in CPU_ADAM else step_temporary_bytes(optimizer, [(shard,)], state_bytes=4, impl=impl)
    terms = rank_host_terms(shard_numel=shard, largest_numel=largest_param_numel(pl),
                            model_dtype_bytes=prec.weight_bytes, zero=layout.zero, offload=offload,
                            optimizer_states_bytes=states, step_temporaries_bytes=temps,
                            micro_batches=micro_batches)
    return Node.of("host_bytes_per_rank", [Node(name=k, value=v, unit="bytes") for k, v in terms.items()],
                   "bytes", note=f"stage {pl.stage}")


def ranks_per_node(layout: ParallelLayout, gpus_per_node: int | None) -> int:
    """Ranks of the job on one node: the GPUs a node has (``GPUS_PER_NODE`` unless a preset says), or the job's
    ranks when it has fewer."""
    return min(layout.ranks, gpus_per_node or GPUS_PER_NODE)


def host_memory(placements, layout: ParallelLayout, prec, optimizer: str, *, impl: str, offload: str,
                micro_batches: int, gpus_per_node: int | None = None) -> HostMemory:
    """Host RAM per node for ``offload`` ``optimizer`` or ``params`` (one placement per pipeline stage)."""
    if offload not in ("optimizer", "params"):
        raise TrainmathError(f"host memory is modelled for --offload optimizer|params, got {offload!r}")
    ranks = [rank_host_memory(pl, layout, prec, optimizer, impl=impl, offload=offload, micro_batches=micro_batches)
             for pl in placements]
    return node_host_memory(ranks, layout, optimizer, offload=offload, gpus_per_node=gpus_per_node)


def node_host_memory(ranks: list[Node], layout: ParallelLayout, optimizer: str, *, offload: str,
                     gpus_per_node: int | None = None, conventions: tuple[str, ...] = ()) -> HostMemory:
    """``HostMemory`` of a node whose ranks hold ``ranks`` (one ``host_bytes_per_rank`` tree per pipeline stage):
    ``ranks_per_node`` times the busiest."""
    top = max(ranks, key=lambda n: n.value)
    n = ranks_per_node(layout, gpus_per_node)
    how = ("DeepSpeedCPUAdam: updates in place, no temporaries" if optimizer in CPU_ADAM else
           f"torch's {optimizer} step on the CPU over the flat partition")
    conventions = (
        f"host_bytes: {n} ranks per node (GPUs per node{'' if gpus_per_node else f', default {GPUS_PER_NODE}'}, "
        f"or the job's ranks when fewer) x the busiest rank's host buffers, as DeepSpeed "
        f"{'ZeRO-3' if layout.zero >= 3 else 'ZeRO-1/2'} pins them with offload_"
        f"{'param and offload_optimizer' if offload == 'params' else 'optimizer'} device cpu "
        "(memory/host.py: fp32 master and gradient partitions, optimizer states, bit16 buffers)",
        f"CPU optimizer: {how}",
        "host_bytes is the training step's steady state: the model-loading peak before ZeRO partitions the model, "
        "the OS, data loaders and NCCL/CUDA host buffers are not counted",
    ) + conventions
    return HostMemory(host_bytes=n * top.value, ranks_per_node=n, per_rank=top, conventions=conventions)


def job_host_memory(spec, setup, layout: ParallelLayout, *, gpus_per_node: int | None = None) -> HostMemory | None:
    """``host_memory`` of a training job (``training.TrainingSetup``), None without offload: each pipeline stage
    placed as ``training_memory`` places it."""
    if setup.offload == "none":
        return None
    from trainmath.memory.training import vocab_sharded
    from trainmath.placement import place
    from trainmath.vocabulary import get_precision

    if setup.peft is not None:  # the adapters alone
        return peft_host_memory(spec, setup, layout, gpus_per_node=gpus_per_node)
    vocab = vocab_sharded(setup, layout)
    placements = [place(spec, layout, s, vocab_parallel=vocab) for s in range(layout.pp)]
    return host_memory(placements, layout, get_precision(setup.precision), setup.optimizer,
                       impl=setup.optimizer_impl, offload=setup.offload,
                       micro_batches=max(setup.micro_batches or 1, layout.pp), gpus_per_node=gpus_per_node)


def peft_rank_host_memory(spec, setup, layout) -> Node:
    """One rank's host bytes under ``--offload optimizer`` (``rank_host_terms``) for the adapters alone:
    DeepSpeed builds its fp32 partitions, their gradients, the bit16 copy and the staging buffer from the
    optimizer's param groups, whose parameters are the trainable ones (deepspeed 0.19.8
    ``runtime/zero/stage_1_and_2.py``: ``bit16_groups`` keeps ``is_optimized_parameter``, i.e. requires_grad,
    ``largest_param_numel`` runs over them; the buffers take their dtype, the adapters' here). Each adapter's flat
    ZeRO shard as ``memory.peft.adapter_states`` holds it."""
    from trainmath.adapters import ADAPTER_DTYPES
    from trainmath.arith import ceil_div
    from trainmath.memory.optimizers import state_tensors
    from trainmath.memory.peft import adapter_shapes

    run = setup.peft
    flat = [a * b for v in adapter_shapes(spec, run.job).values() for a, b in v]
    deg = layout.zero_degree if layout.zero >= 1 else 1
    held = [ceil_div(n, deg) for n in flat]
    shard = sum(held)
    if setup.optimizer in CPU_ADAM:  # DeepSpeedCPUAdam: exp_avg, exp_avg_sq of the fp32 partition
        states, temps = 8 * shard, 0
    else:  # torch's step over the one flat fp32 partition
        states = sum(t.nbytes for n in held for t in state_tensors(setup.optimizer, (n,), state_bytes=4,
                                                                     impl=setup.optimizer_impl))
        temps = step_temporary_bytes(setup.optimizer, [(shard,)], state_bytes=4, impl=setup.optimizer_impl)
    terms = rank_host_terms(shard_numel=shard, largest_numel=max(flat, default=0),
                            model_dtype_bytes=ADAPTER_DTYPES[run.job.dtype], zero=min(layout.zero, 2),
                            offload="optimizer", optimizer_states_bytes=states, step_temporaries_bytes=temps,
                            micro_batches=setup.micro_batches or 1)
    return Node.of("host_bytes_per_rank", [Node(name=k, value=v, unit="bytes") for k, v in terms.items()],
                   "bytes", note="stage 0, adapters only")


def peft_host_memory(spec, setup, layout, *, gpus_per_node: int | None = None) -> HostMemory:
    """``host_memory`` of a fine-tune (``memory.peft``) with ``--offload optimizer``: only the adapters move to the
    host; the frozen base stays on the GPU in its dtype (or NF4)."""
    from trainmath.memory.peft import check

    check(spec, setup, layout, setup.peft)
    run = setup.peft
    note = (f"peft: only the {run.job.method} adapters (the trainable parameters) are offloaded, their buffers in "
            f"--lora-dtype {run.job.dtype}; DeepSpeed's estimators (estimate_zero2_model_states_mem_needs_all_live) "
            f"count every parameter of a model passed whole, frozen or not: give them the trainable count. "
            f"DeepSpeed's bf16 config casts every parameter, the adapters too, to bf16: --lora-dtype bf16 matches it")
    return node_host_memory([peft_rank_host_memory(spec, setup, layout)], layout, setup.optimizer,
                            offload="optimizer", gpus_per_node=gpus_per_node, conventions=(note,))


@dataclass(frozen=True, kw_only=True)
class HostFit:
    """The host side of a fit verdict."""

    host_bytes: int
    host_memory_bytes: int

    @property
    def fits(self) -> bool:
        return self.host_bytes <= self.host_memory_bytes

    @property
    def margin_bytes(self) -> int:
        return self.host_memory_bytes - self.host_bytes

    @property
    def rule(self) -> str:
        return (f"host fit rule: host_bytes (per node) <= --host-memory ({self.host_memory_bytes:,} bytes = "
                f"{self.host_memory_bytes / 2**30:,.2f} GiB per node)")

    def to_dict(self) -> dict:
        return {"host_memory_bytes": self.host_memory_bytes, "host_fits": self.fits,
                "host_margin_bytes": self.margin_bytes, "host_fit_rule": self.rule}


def check_host_memory(value) -> int:
    """``value`` as bytes of host RAM per node, or one ``TrainmathError``: a positive integer of at most 1 PiB."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_HOST_MEMORY_BYTES:
        raise TrainmathError(f"--host-memory must be a positive size of at most 1 PiB per node (e.g. 2TiB, 512GB), "
                             f"got {value!r}")
    return value
