"""What a rank really holds and does, under the calculator's field names and units.

- ``weights_bytes``, ``gradients_bytes``, ``optimizer_states_bytes``: the bytes of the real tensors each strategy
  keeps (DTensors by their local shard), each storage counted once. Optimizer states leave out the 0-dim ``step``
  counters: on a GPU torch keeps them on the CPU, and the calculator counts device memory.
- ``peak_bytes`` of one training step (forward, backward, optimizer step) and its breakdown by kind: on CUDA
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``; on CPU torch's ``MemTracker``
  (``FSDPMemTracker`` under FSDP2), which follows every tensor storage created or resized in the step.
- ``training_flops`` of one step: ``FlopCounterMode`` over the step after the one whose peak is measured, or the
  first step when there is none (every micro-step, forward + backward, recompute included; matmul FLOPs do not
  change between steps), the oracle the calculator's FLOPs are tested against. Not the same step: the counter's
  ``ModuleTracker`` registers a multi-grad hook on the outputs of every module call, also on the calls a non-reentrant
  checkpoint makes when it recomputes a layer inside backward; each hook's closure holds the ``grad_fn`` of those
  outputs, whose node holds the hook (a cycle), so every recomputed layer's graph and the tensors it saved stay alive
  until the counter exits (measured on the benchmark's 2-layer model: +465–473 KB per recomputed layer, the peak of a
  step 2.17 → 2.96 MB). torch's own ``ModTracker`` (MemTracker's) skips registering in backward. torch 2.13's counter
  has no formula for the CPU flash-attention kernel (``_scaled_dot_product_flash_attention_for_cpu`` and its backward)
  and counts it as 0; we register torch's own SDPA formulas (``sdpa_flop``, ``sdpa_backward_flop``) for it.
- bytes per collective: our ZeRO's ``Comm`` counts each call's buffer (nccl-tests' size); DDP's gradient buckets
  are counted by a communication hook (``ZeroRedundancyOptimizer``'s parameter broadcasts and FSDP2's
  collectives are not counted).
"""

from __future__ import annotations

import contextlib

import torch


def tensor_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors`` (DTensors: the local shard's), each storage once."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        s = t.untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def state_bytes(strategy) -> dict:
    """The bytes of each state; ``frozen_weights_bytes``: parameters that need no gradient (a fine-tune's base)."""
    frozen = [p for p in strategy.model.parameters() if not p.requires_grad]
    return {"weights_bytes": tensor_bytes(strategy.weights()), "frozen_weights_bytes": tensor_bytes(frozen),
            "gradients_bytes": tensor_bytes(strategy.gradients()),
            "master_weights_bytes": 0,  # no strategy here keeps a separate fp32 copy of bf16 weights
            "optimizer_states_bytes": tensor_bytes(strategy.optimizer_state())}


def _sdpa_forward(q, k, v, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(q, k, v)


def _sdpa_backward(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, q, k, v)


_CPU_SDPA = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_forward,
             torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward}


class _NoHook:
    def remove(self) -> None:
        pass


def _skip_frozen(tracker, model) -> None:
    """MemTracker registers a gradient hook on every parameter it tracks, which torch refuses on a tensor that
    needs no gradient (a fine-tune's frozen base; a 4-bit weight cannot even ask for one). Such a parameter gets a
    gradient never, so it is entered as already hooked; its bytes are still tracked as a parameter."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


class StepProbe:
    """Context manager around one training step: its peak memory (``memory``) and/or its FLOPs (``flops``); the
    loop counts FLOPs in another step than it measures memory in (see the module docstring)."""

    def __init__(self, strategy, device: torch.device, *, fsdp: bool, memory: bool = True, flops: bool = True):
        self.strategy, self.device, self.fsdp = strategy, device, fsdp
        self.memory, self.count_flops = memory, flops
        self.peak_bytes = 0
        self.breakdown: dict[str, int] = {}
        self.flops = 0
        self.attention_flops = 0
        """FLOPs of the attention kernels (SDPA forward and backward), part of ``flops``."""
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        from torch.utils.flop_counter import FlopCounterMode

        self._flops = FlopCounterMode(display=False, custom_mapping=_CPU_SDPA) if self.count_flops else None
        self._tracker = None
        if self.memory and self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.memory:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
            from torch.distributed._tools.mem_tracker import MemTracker

            s = self.strategy
            if self.fsdp:
                self._tracker = FSDPMemTracker(s.model, s.optimizer)
            else:
                self._tracker = MemTracker()
                extra = [t for t in (*s.weights(), *getattr(s, "extra_tensors", lambda: [])()) if t is not None]
                # ZeroRedundancyOptimizer keeps its states in the local optimizer it wraps (``local_optimizer``)
                self._tracker.track_external(s.model, getattr(s, "local_optimizer", s.optimizer), *extra)
            _skip_frozen(self._tracker, s.model)
            self._stack.enter_context(self._tracker)
        if self._flops is not None:
            self._stack.enter_context(self._flops)
        return self

    def micro_step_done(self) -> None:
        """MemTracker follows one forward+backward per module; with gradient accumulation its per-module records
        are cleared between micro-steps (the peak it keeps is the step's)."""
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def __exit__(self, *exc):
        self._stack.close()
        if exc[0] is not None:
            return False
        if self._flops is not None:
            self.flops = int(self._flops.get_total_flops())
            counts = self._flops.get_flop_counts().get("Global", {})
            self.attention_flops = int(sum(v for op, v in counts.items() if "scaled_dot_product" in str(op)))
        if not self.memory:
            return False
        if self._tracker is None:
            torch.cuda.synchronize()
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        else:
            snap = self._tracker.get_tracker_snapshot("peak")
            dev = next((d for d in snap if torch.device(d).type == self.device.type), None)
            stats = snap.get(dev, {}) if dev is not None else {}
            self.peak_bytes = int(stats.get("Total", 0))
            self.breakdown = {str(k): int(v) for k, v in stats.items() if k != "Total"}
        return False
