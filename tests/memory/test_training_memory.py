"""Training memory: totals equal sums, ZeRO and degrees never grow per-rank state, degree 1 equals unsharded;
pinned examples (ZeRO's 16Ψ, 8-bit Adam, allocator rounding)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

import standin
from trainmath.layout import ParallelLayout
from trainmath.memory.optimizers import optimizer_state_bytes, state_tensors
from trainmath.memory.states import model_states
from trainmath.memory.training import TERMS, TrainingSetup, training_memory
from trainmath.params import count_params
from trainmath.placement import place
from trainmath.sources import load_spec
from trainmath.tree import check_sums
from trainmath.vocabulary import get_precision

SPECS = {m: load_spec(m) for m in ("qwen3-0.6b", "llama-3.2-1b", "qwen3-30b-a3b")}
PRECISIONS = ("fp32", "amp-bf16", "bf16", "mixed-bf16", "fp8")
OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adam-amsgrad", "adafactor", "adam8bit", "lion")


def states(spec, layout, precision="mixed-bf16", optimizer="adamw"):
    return model_states(place(spec, layout), layout, get_precision(precision), optimizer)


def test_zero_paper_16_psi():
    """Mixed-precision Adam holds 2Ψ + 2Ψ + 12Ψ bytes (ZeRO §3.1, K = 12) plus 4 bytes of fused ``step`` per
    tensor; without allocator rounding the sum is exact."""
    spec = SPECS["llama-3.2-1b"]
    psi = count_params(spec).total_params
    n_tensors = len(place(spec, ParallelLayout()).tensors)
    ms = model_states(place(spec, ParallelLayout()), ParallelLayout(), get_precision("mixed-bf16"), "adam",
                      impl="fused", granularity=1)
    assert (ms.weights_bytes, ms.gradients_bytes, ms.master_weights_bytes) == (2 * psi, 2 * psi, 4 * psi)
    assert ms.optimizer_states_bytes == 8 * psi + 4 * n_tensors
    assert ms.total_bytes == 16 * psi + 4 * n_tensors


def test_allocator_rounding_pinned():
    """A (3,) fp32 tensor occupies one 512-byte block; a (4096,) bf16 one exactly 8192 bytes."""
    from trainmath.memory.states import alloc_bytes
    assert (alloc_bytes(12), alloc_bytes(8192), alloc_bytes(8193), alloc_bytes(0)) == (512, 8192, 8704, 0)


def test_adam8bit_pinned():
    """bitsandbytes Optimizer2State.init_state, block-wise: a (4096, 4096) tensor has 2·n uint8 + 2·ceil(n/256)
    fp32 absmax; a (64,) tensor (< 4096 elements) keeps two fp32 states; plus the two shared 256-entry maps."""
    n = 4096 * 4096
    assert optimizer_state_bytes("adam8bit", [(4096, 4096)], state_bytes=4) == 2 * n + 2 * 4 * (n // 256) + 2048
    assert optimizer_state_bytes("adam8bit", [(64,)], state_bytes=2) == 2 * 64 * 4
    assert optimizer_state_bytes("adam8bit", [(4096, 4096)], state_bytes=4, block_size=2048) == \
        2 * n + 2 * 4 * (n // 2048) + 2048
    assert [s.name for s in state_tensors("adam8bit", (5000,), state_bytes=4)] == \
        ["state1", "state2", "absmax1", "absmax2"]


def test_lion_and_adafactor_pinned():
    assert optimizer_state_bytes("lion", [(10, 20)], state_bytes=2) == 400
    # Adafactor: (2, 10, 20) → row_var (2, 10, 1) + col_var (2, 1, 20) + fp32 step
    assert optimizer_state_bytes("adafactor", [(2, 10, 20)], state_bytes=4) == (20 + 40) * 4 + 4


@settings(max_examples=60, deadline=None)
@given(model=hs.sampled_from(sorted(SPECS)), precision=hs.sampled_from(PRECISIONS),
       optimizer=hs.sampled_from(OPTIMIZERS), dp=hs.sampled_from([1, 2, 4, 8, 16]), zero=hs.integers(0, 2))
def test_model_states_never_grow_with_zero_stage_or_degree(model, precision, optimizer, dp, zero):
    spec = SPECS[model]
    ep = 2 if model == "qwen3-30b-a3b" and dp >= 2 else 1
    a = states(spec, ParallelLayout(dp=dp, ep=ep, zero=zero), precision, optimizer)
    b = states(spec, ParallelLayout(dp=dp, ep=ep, zero=zero + 1), precision, optimizer)
    c = states(spec, ParallelLayout(dp=2 * dp, ep=ep, zero=zero), precision, optimizer)
    for field in ("weights_bytes", "gradients_bytes", "master_weights_bytes", "optimizer_states_bytes"):
        assert getattr(b, field) <= getattr(a, field)
        assert getattr(c, field) <= getattr(a, field)


def test_zero_pinned_example():
    """Llama-3.2-1B, mixed-bf16 AdamW, dp=8: each stage strictly smaller."""
    spec = SPECS["llama-3.2-1b"]
    totals = [states(spec, ParallelLayout(dp=8, zero=z)).total_bytes for z in range(4)]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


@settings(max_examples=40, deadline=None)
@given(model=hs.sampled_from(sorted(SPECS)), precision=hs.sampled_from(PRECISIONS),
       optimizer=hs.sampled_from(OPTIMIZERS), zero=hs.integers(0, 3), b=hs.integers(1, 4),
       s=hs.sampled_from([128, 1000, 4096]))
def test_degree_one_equals_unsharded_and_sums(model, precision, optimizer, zero, b, s):
    spec = SPECS[model]
    setup = TrainingSetup(micro_batch=b, seq=s, precision=precision, optimizer=optimizer)
    r = training_memory(spec, setup, ParallelLayout(zero=zero), activation_model=standin)
    base = training_memory(spec, setup, ParallelLayout(), activation_model=standin)
    assert r.peak_bytes == base.peak_bytes
    assert r.breakdown.flat() == base.breakdown.flat()
    assert check_sums(r.breakdown) == []
    assert r.peak_bytes == sum(r.breakdown.flat().values())
    assert tuple(r.breakdown.flat()) == TERMS


@settings(max_examples=40, deadline=None)
@given(zero=hs.integers(0, 3), dp=hs.sampled_from([2, 4, 8]), tp=hs.sampled_from([1, 2, 4]),
       pp=hs.sampled_from([1, 2, 4]), precision=hs.sampled_from(PRECISIONS))
def test_peak_never_grows_with_dp_at_fixed_stage(zero, dp, tp, pp, precision):
    """For dp ≥ 2 at a fixed ZeRO stage, doubling dp never raises the peak (ZeRO-3's gather buffers are per
    module and do not depend on dp; at dp=1 they vanish, which is why dp starts at 2)."""
    spec = SPECS["qwen3-0.6b"]
    setup = TrainingSetup(micro_batch=1, seq=2048, precision=precision)
    a = training_memory(spec, setup, ParallelLayout(dp=dp, tp=tp, pp=pp, zero=zero), activation_model=standin)
    b = training_memory(spec, setup, ParallelLayout(dp=2 * dp, tp=tp, pp=pp, zero=zero), activation_model=standin)
    assert b.peak_bytes <= a.peak_bytes
    for m in a.stages:
        assert check_sums(m.breakdown) == []


def test_zero3_gathers_as_fsdp2():
    """FSDP2 (per layer and at the root; ``memory/fsdp2.py``): Qwen3-0.6B's root (the tied 151936×1024 embedding
    and the final norm, bf16) stays unsharded through forward and backward; while a layer is copied out of its
    all-gather buffer, the previous unit's buffer is still alive (the root's, for layer 0); a layer's buffer
    lives through its forward (the last one's through the loss); the root's backward prefetch all-gathers the
    last layer before the loss's backward. The sharded weights are smaller than ZeRO-2's."""
    spec = SPECS["qwen3-0.6b"]
    setup = TrainingSetup(micro_batch=1, seq=1024, granularity=1)
    z2 = training_memory(spec, setup, ParallelLayout(dp=2, zero=2), activation_model=standin)
    z3 = training_memory(spec, setup, ParallelLayout(dp=2, zero=3), activation_model=standin)
    root = 151936 * 1024 * 2 + 1024 * 2
    layer = 2 * sum(t.params for t in place(spec, ParallelLayout()).tensors if t.unit == "layer.0")
    gather = {e: z3.stages[0].at(e).flat()["zero3_gather_bytes"] for e in (
        "forward: root all-gather", "forward layer 0 all-gather", "forward layer 27", "forward: loss",
        "backward: loss", "backward layer 27 all-gather", "backward layer 27", "backward layer 0",
        "backward: root reduce-scatter")}
    assert gather == {"forward: root all-gather": 2 * root, "forward layer 0 all-gather": 2 * root + 2 * layer,
                      "forward layer 27": root + 2 * layer, "forward: loss": root + layer,
                      "backward: loss": root + layer, "backward layer 27 all-gather": root + 2 * layer,
                      "backward layer 27": root + 2 * layer, "backward layer 0": root + layer,
                      "backward: root reduce-scatter": 0}
    # mixed-bf16 under FSDP2: the fp32 shards are the weights and the master weights at once
    z2f, z3f = z2.breakdown.flat(), z3.breakdown.flat()
    assert z3f["master_weights_bytes"] == 0 and z3f["weights_bytes"] == z2f["master_weights_bytes"]
    assert z3f["weights_bytes"] + z3f["master_weights_bytes"] < z2f["weights_bytes"] + z2f["master_weights_bytes"]


def test_pipeline_first_stage_holds_pp_micro_batches():
    spec = SPECS["llama-3.2-1b"]  # 16 layers
    r = training_memory(spec, TrainingSetup(micro_batch=1, seq=1024), ParallelLayout(pp=4), activation_model=standin)
    assert [m.in_flight for m in r.stages] == [4, 3, 2, 1]
    one = standin.activation_bytes(spec, micro_batch=1, seq=1024, layers=range(4)).total_bytes
    assert r.stages[0].at("forward layer 3").flat()["activations_bytes"] == 4 * one
    capped = training_memory(spec, TrainingSetup(micro_batch=1, seq=1024, micro_batches=2), ParallelLayout(pp=4),
                             activation_model=standin)
    assert [m.in_flight for m in capped.stages] == [2, 2, 2, 1]


def test_loss_transients_pinned():
    """HF loss: the fp32 upcast 4·b·s·|V| at the end of the forward, two fp32 gradients 8·b·s·|V| at the start
    of backward (the upcast freed by then)."""
    spec = SPECS["qwen3-0.6b"]
    r = training_memory(spec, TrainingSetup(micro_batch=2, seq=512), ParallelLayout(), activation_model=standin)
    fwd, bwd = r.stages[0].at("forward: loss").flat(), r.stages[0].at("backward: loss").flat()
    assert (fwd["logits_fp32_bytes"], fwd["cross_entropy_grad_bytes"]) == (4 * 2 * 512 * 151936, 0)
    assert (bwd["logits_fp32_bytes"], bwd["cross_entropy_grad_bytes"]) == (0, 8 * 2 * 512 * 151936)
    m = training_memory(spec, TrainingSetup(micro_batch=2, seq=512, profile="megatron"), ParallelLayout(tp=2),
                        activation_model=standin).stages[0].at("backward: loss").flat()
    assert m["cross_entropy_grad_bytes"] == 2 * 2 * 512 * 151936 // 2


def test_bad_setup_is_one_error():
    from trainmath.errors import TrainmathError
    with pytest.raises(TrainmathError, match=r"micro-batch must be a positive integer, got 0; seq must be a "
                                             r"positive integer, got -1"):
        training_memory(SPECS["qwen3-0.6b"], TrainingSetup(micro_batch=0, seq=-1), activation_model=standin)
