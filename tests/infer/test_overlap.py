"""The compute/memory overlap norm of a serving step: the roofline max at p = ∞ (the floor), the hand-computed
p-norm otherwise, per kernel class, and the stored p read by the prediction."""

import math

import pytest

from trainmath.hardware import gpu
from trainmath.infer import InferenceSetup
from trainmath.infer.speed import FLOOR, Efficiency, Part, combine, overlap_norm, serving_data, step
from trainmath.sources import load_spec


def test_combine_is_the_max_at_infinity_and_the_p_norm_otherwise():
    assert combine(3.0, 4.0, math.inf) == 4.0
    assert combine(3.0, 4.0, 2.0) == pytest.approx(5.0, rel=1e-15)
    assert combine(2.0, 2.0, 3.0) == pytest.approx(2.0 * 2 ** (1 / 3), rel=1e-15)
    assert combine(0.0, 7.0, 2.0) == 7.0
    for p in (1.5, 2.0, 4.0):  # between the larger and the sum
        assert 4.0 < combine(3.0, 4.0, p) < 7.0


def test_stored_norm_is_finite_and_explained():
    entry = serving_data()["overlap_norm"]
    assert overlap_norm() == entry["p"] and 1 < entry["p"] < math.inf
    assert "leave-one-source-out" in entry["how"]
    assert Efficiency.of(gpu("h100")).overlap == overlap_norm()
    assert math.isinf(FLOOR.overlap)


def test_step_time_joins_each_kernel_class_by_the_norm():
    """A 128-token batch-1 prefill of Llama-3.1-8B on an A100 sits near the ridge: the step is the hand-computed
    sum over kernel classes of (c^p + m^p)^(1/p), above the roofline max and below the sum; at the floor it is
    the max."""
    spec, a100 = load_spec("meta-llama/Llama-3.1-8B"), gpu("a100")
    setup = InferenceSetup(batch=1, context=128)
    eff = Efficiency.of(a100)
    s = step(spec, setup, a100, (Part(n=1, t=128, c=0),), eff)
    p = eff.overlap
    other_c = s.compute_s - s.attention_compute_s - s.expert_compute_s
    other_m = s.memory_s - s.cache_memory_s - s.expert_memory_s
    by_hand = ((other_c ** p + other_m ** p) ** (1 / p) + (s.attention_compute_s ** p + s.cache_memory_s ** p)
               ** (1 / p) + s.comm_s + s.overhead_s)
    assert s.expert_compute_s == s.expert_memory_s == 0
    assert s.time_s == pytest.approx(by_hand, rel=1e-12)
    assert 0.5 < other_c / other_m < 2  # near the ridge, where the norm matters
    roofline = max(other_c, other_m) + max(s.attention_compute_s, s.cache_memory_s) + s.comm_s + s.overhead_s
    assert roofline < s.time_s < roofline + min(other_c, other_m) + min(s.attention_compute_s, s.cache_memory_s)
    f = step(spec, setup, a100, (Part(n=1, t=128, c=0),), FLOOR)
    assert f.time_s == pytest.approx(max(f.compute_s - f.attention_compute_s, f.memory_s - f.cache_memory_s)
                                     + max(f.attention_compute_s, f.cache_memory_s) + f.comm_s, rel=1e-12)


def test_far_from_the_ridge_the_norm_is_nearly_the_larger():
    """A batch-1 decode is memory-bound by orders of magnitude: the norm adds under 0.1% to the roofline."""
    spec, h100 = load_spec("meta-llama/Llama-3.1-8B"), gpu("h100")
    s = step(spec, InferenceSetup(batch=1, context=1001), h100, (Part(n=1, t=1, c=1000),), Efficiency.of(h100))
    roofline = (max(s.compute_s - s.attention_compute_s, s.memory_s - s.cache_memory_s)
                + max(s.attention_compute_s, s.cache_memory_s) + s.comm_s + s.overhead_s)
    assert roofline <= s.time_s < roofline * 1.001


def test_per_spec_memo_is_keyed_by_identity_and_bounded():
    """The step terms are memoised per spec object: a second call returns the stored result, which equals the
    unmemoised computation; the entry holds the spec itself (so its id cannot be reused) and at most 32 are kept."""
    from trainmath.infer import speed

    spec = load_spec("meta-llama/Llama-3.1-8B")
    first = speed._forward(spec, 64)
    assert speed._forward(spec, 64) is first
    assert speed._forward.__wrapped__(spec, 64) == first
    assert speed._SPECS[id(spec)][0] is spec and ("_forward", 64) in speed._SPECS[id(spec)][1]
    assert len(speed._SPECS) <= 32
