"""Serving speed's fixed overheads, the NVFP4 byte rule and the native kernel formats per preset."""

import json
from dataclasses import replace
from importlib import resources

import pytest

from trainmath.hardware import all_gpus, gpu
from trainmath.infer import InferenceSetup, WeightFormat
from trainmath.infer.dtypes import quantised_weight_bytes
from trainmath.infer.speed import FLOOR, Efficiency, Part, compute_peak, fixed_batch, native_formats, step
from trainmath.sources import load_spec

L8 = "meta-llama/Llama-3.1-8B"


def test_overhead_is_step_plus_layers_times_constant():
    """The overhead term adds exactly step_s + layers · layer_s to a step, and (O − 1) times that to the decode."""
    spec, h100 = load_spec(L8), gpu("h100")
    setup = InferenceSetup(batch=1, context=200)
    base = replace(FLOOR, link=0.7)
    over = replace(base, step_s=1.5e-3, layer_s=20e-6)
    p = (Part(n=1, t=1, c=100),)
    a, b = step(spec, setup, h100, p, base), step(spec, setup, h100, p, over)
    assert b.overhead_s == pytest.approx(1.5e-3 + 32 * 20e-6, rel=1e-12)
    assert b.time_s - a.time_s == pytest.approx(1.5e-3 + 32 * 20e-6, rel=1e-9)
    fa = fixed_batch(spec, setup, h100, input=100, output=65, eff=base)
    fb = fixed_batch(spec, setup, h100, input=100, output=65, eff=over)
    assert (fb.e2e_s - fa.e2e_s) == pytest.approx(65 * (1.5e-3 + 32 * 20e-6), rel=1e-9)  # 1 prefill + 64 decodes
    assert fb.prefill_floor.overhead_s == 0 and fb.tpot_floor_s == fa.tpot_floor_s  # the floor has none


def test_overhead_bounds_batch_one_small_models():
    spec, h100 = load_spec("Qwen/Qwen3-0.6B"), gpu("h100")
    eff = replace(FLOOR, step_s=2e-3)
    s = step(spec, InferenceSetup(batch=1, context=101), h100, (Part(n=1, t=1, c=100),), eff)
    assert s.bound == "overhead"


def test_stored_constants_are_per_generation_with_a_how():
    data = json.loads(resources.files("trainmath.hardware").joinpath("serving.json").read_text())
    for gen, e in data["generations"].items():
        assert 0 < e["prefill_compute_fraction"] <= 1 and 0 < e["decode_memory_fraction"] <= 1, gen
        assert e["step_overhead_s"] >= 0 and e["layer_overhead_s"] >= 0 and e["how"], gen
    h = Efficiency.of(gpu("h100"))
    g = data["generations"]["hopper"]
    assert (h.compute, h.memory, h.step_s, h.layer_s) == (g["prefill_compute_fraction"], g["decode_memory_fraction"],
                                                          g["step_overhead_s"], g["layer_overhead_s"])


def test_nvfp4_bytes_hand_count():
    """A 4096 × 4096 weight in NVFP4: 4096·4096/2 bytes of E2M1 pairs, 4096·(4096/16) E4M3 scales of 1 byte,
    one fp32 per-tensor scale; 4.5 bits a value + 4 bytes."""
    data, scales = quantised_weight_bytes(4096, 4096, WeightFormat(dtype="nvfp4"))
    assert data == 8_388_608 and scales == 1_048_576 + 4
    data, scales = quantised_weight_bytes(3, 17, WeightFormat(dtype="nvfp4"))  # ragged: blocks round up
    assert data == 26 and scales == 3 * 2 + 4


def test_native_formats_per_preset():
    for g in all_gpus():
        formats, _ = native_formats(g)
        assert ("fp8" in formats) == bool(g.fp8_flops_per_s), g.name
    assert compute_peak(gpu("b200"), "nvfp4") == (9e15, "fp4 (nvfp4 W4A4, native)")
    assert compute_peak(gpu("h100"), "nvfp4")[0] == gpu("h100").bf16_flops_per_s  # no fp4 on Hopper: W4A16
    assert compute_peak(gpu("a100-40gb"), "fp8")[1] == "bf16"


def test_attention_flops_are_the_hand_count():
    """Llama-3.1-8B: a decode token at context c has 4·(c + 1)·heads·head_dim attention FLOPs per layer."""
    from trainmath.infer.speed import attention_flops

    spec = load_spec(L8)
    for c in (0, 99, 4095):
        assert attention_flops(spec, Part(n=2, t=1, c=c)) == 2 * 32 * 4 * (c + 1) * 32 * 128
    assert attention_flops(spec, Part(n=1, t=100, c=0)) == 32 * 4 * (100 * 101 // 2) * 32 * 128


def test_gemms_and_attention_are_bounded_in_turn():
    """At the floor, time = max(GEMM compute, weight bytes) + max(attention compute, cache bytes): the two kernel
    classes do not overlap, so a step is never faster than either and is their sum when one is compute- and one
    memory-bound."""
    spec, h100 = load_spec(L8), gpu("h100")
    s = step(spec, InferenceSetup(batch=256, context=32_001), h100, (Part(n=256, t=1, c=32_000),), FLOOR)
    gemm = max(s.compute_s - s.attention_compute_s, s.memory_s - s.cache_memory_s)
    attn = max(s.attention_compute_s, s.cache_memory_s)
    assert s.time_s == pytest.approx(gemm + attn, rel=1e-12)
    assert s.time_s >= max(s.compute_s, s.memory_s)


def test_prefill_wait_is_md1():
    """M/D/1 mean wait ρ·S / (2(1 − ρ)): S = 0.4 s, 25 requests of 20 s each → ρ = 0.5, wait 0.2 s."""
    from trainmath.infer.batching import prefill_wait

    assert prefill_wait(0.4, 1, 25, 20.0) == pytest.approx(0.2, rel=1e-12)
    assert prefill_wait(0.4, 2, 25, 20.0) == pytest.approx(0.25 * 0.2 / 1.5, rel=1e-12)  # two prompts a step
    assert prefill_wait(1.0, 1, 1000, 1.0) == pytest.approx(0.95 / 0.1, rel=1e-12)  # ρ capped at 0.95
