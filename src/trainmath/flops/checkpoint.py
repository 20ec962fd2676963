"""What full activation checkpointing recomputes of a decoder layer, by implementation (``CHECKPOINT_IMPLS``).

- ``megatron``: the whole layer forward again (Megatron-LM's full recompute; torch's reentrant checkpoint).
- ``torch``: ``torch.utils.checkpoint`` with ``use_reentrant=False`` (what transformers' ``gradient_checkpointing_
  enable()`` runs in 5.x) stops the recomputation early (``torch.utils.checkpoint.set_checkpoint_early_stop``, on
  by default): its pack hook raises once the last tensor the layer's backward needs has been saved again. An
  autograd op saves its inputs before it computes, so the op that saves last does not run, nor anything after it.
  In a layer whose last saving op is a Linear (``down_proj``, ``o_proj``, ``out_proj``: it saves its input and
  nothing after it saves anything), that Linear's GEMM is not recomputed; a layer that ends with a dropout, a
  routing product or a post-norm recomputes every GEMM. Derived from ``torch/utils/checkpoint.py``
  (``_checkpoint_hook``, ``_StopRecomputationError``), read from the op list (``trainmath.ops``); checked against
  FlopCounterMode on real recompute steps (``tests/flops/test_checkpoint_oracle.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmath.errors import TrainmathError
from trainmath.ops.gemm import module_name
from trainmath.ops.ir import Op

CHECKPOINT_IMPLS = ("megatron", "torch")


def not_recomputed(ops: Sequence[Op], impl: str) -> set[str]:
    """Module names (as ``ops.gemm.Gemm.name``) of the layer's linears that full recompute does not run again
    under ``impl``: none for ``megatron``; for ``torch`` the last saving op's Linear, if it is one."""
    if impl not in CHECKPOINT_IMPLS:
        raise TrainmathError(f"checkpoint implementation must be one of {', '.join(CHECKPOINT_IMPLS)}; got {impl!r}")
    saving = [op for op in ops if op.saved]
    if impl == "megatron" or not saving:
        return set()
    last = saving[-1]
    return {module_name(last.weight.name)} if last.kind == "linear" and last.weight is not None else set()
