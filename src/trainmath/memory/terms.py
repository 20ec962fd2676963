"""Terms of the step that are not model states or saved activations: the loss's fp32 buffers, autocast's weight
copies, and the data-parallel wrapper's gradient buffers. Each is one function with its source."""

from __future__ import annotations

from trainmath.arith import ceil_div
from trainmath.layout import ParallelLayout
from trainmath.memory.setup import TrainingSetup
from trainmath.model.spec import ModelSpec
from trainmath.placement import Placement
from trainmath.vocabulary import Precision, get_precision

DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's ``zero_optimization.reduce_bucket_size`` default (elements)."""


def loss_transients(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout) -> tuple[int, int]:
    """(logits_fp32_bytes, cross_entropy_grad_bytes) on the last stage at the start of backward. T = b · s/cp
    tokens, V' = ceil_div(|V|, tp) vocabulary entries per rank when the vocabulary is sharded (the megatron
    profile, or ``--vocab-parallel``), else V' = |V| (plain ``--tp`` with the hf profile: the loss is whole).

    - ``hf``: transformers' ``ForCausalLMLoss`` does ``logits.float()`` then ``F.cross_entropy``; log_softmax
      saves its fp32 output (4·T·V'). In backward, ``nll_loss_backward`` makes the fp32 gradient of the
      log-probabilities and ``log_softmax_backward`` the fp32 gradient of the logits, both live at once
      (2 · 4·T·V').
    - ``megatron``: ``vocab_parallel_cross_entropy(logits.float())`` keeps the fp32 softmax (4·T·V') and writes
      the gradient into it in place; only the cast of that gradient back to the compute dtype is new
      (c·T·V' when c < 4, else 0).
    Derived from the code; the compute-dtype logits themselves are ``logits_bytes`` (activation model)."""
    tokens = setup.micro_batch * ceil_div(setup.seq, layout.cp)
    vocab = layout.tp > 1 and (layout.vocab_parallel or setup.profile == "megatron")  # ``training.vocab_sharded``
    tv = tokens * (ceil_div(spec.vocab_size, layout.tp) if vocab else spec.vocab_size)
    c = get_precision(setup.precision).compute_bytes
    if setup.profile == "megatron":
        return 4 * tv, (c * tv if c < 4 else 0)
    return 4 * tv, 2 * 4 * tv


def loss_parallel_bytes(spec: ModelSpec, setup: TrainingSetup, layout: ParallelLayout) -> int:
    """One fp32 (T, V/tp) buffer that torch's ``loss_parallel()`` (the hf profile's ``--vocab-parallel`` loss) holds
    beyond the plain loss, in forward and again in backward (``torch/distributed/tensor/parallel/loss.py``):
    ``_log_softmax`` keeps ``shifted = x - max`` (an all-reduced max) beside its input while it makes ``exp``
    and then the result; ``_nll_loss_and_log_softmax_backward`` fuses both backwards as
    ``(zeros_like(x) + exp(x)) * grad``: three fp32 buffers at once where aten's two kernels leave two. 0 when the
    vocabulary is not sharded or under the megatron profile. Derived from the code."""
    if setup.profile != "hf" or layout.tp == 1 or not layout.vocab_parallel:
        return 0
    return 4 * setup.micro_batch * ceil_div(setup.seq, layout.cp) * ceil_div(spec.vocab_size, layout.tp)


def weight_copies_bytes(placement: Placement, prec: Precision, in_flight: int) -> int:
    """Low-precision copies of linear weights live during forward+backward: autocast's bf16 casts are saved by
    every micro-batch's matmuls (× micro-batches in flight); Transformer Engine caches its fp8 weight and
    transpose once per step. Embedding lookups are not cast (autocast runs them in fp32)."""
    if not prec.weight_copy_bytes:
        return 0
    linear = sum(t.params for t in placement.tensors if t.spec.kind == "linear")
    return linear * prec.weight_copy_bytes * (in_flight if prec.name == "amp-bf16" else 1)


def framework_overhead(placement: Placement, layout: ParallelLayout, prec: Precision, grads_bytes: int) -> int:
    """Communication buffers of the data-parallel wrapper:
    ZeRO-0 with dp·cp > 1 is torch DDP, whose buckets copy every gradient (``gradient_as_bucket_view=False``, the
    default; torch's DDP docs: the view "saves memory equal to the total gradients size");
    ZeRO-1/2 is DeepSpeed, whose reduce bucket holds up to ``reduce_bucket_size`` = 5e8 elements in the gradient
    dtype; ZeRO-3's buffers are counted in ``zero3_*``."""
    if layout.zero_degree == 1:
        return 0
    if layout.zero == 0:
        return grads_bytes
    if layout.zero in (1, 2):
        return min(DEEPSPEED_REDUCE_BUCKET_ELEMENTS, placement.params) * prec.grad_bytes
    return 0
