"""Serving speed: the floors against hand-derived FLOPs and bytes, the structure of the bounds, continuous batching,
vLLM's KV capacity line, the planner, and the CLI's speed mode and bad input."""

import json
import math

import pytest

from trainmath.cli import main
from trainmath.hardware import gpu
from trainmath.infer import CacheFormat, InferenceSetup, WeightFormat
from trainmath.infer.batching import EngineMemory, steady_state, vllm_capacity
from trainmath.infer.kv import kv_bytes_per_token
from trainmath.infer.speed import FLOOR, Part, fixed_batch, new_token_flops, step, touched_fraction
from trainmath.sources import load_spec

L8 = "meta-llama/Llama-3.1-8B"
LINEAR_8B = 8_030_261_248 - 128_256 * 4096 - (2 * 32 + 1) * 4096  # params less the input embedding and the norms


def test_decode_flops_are_the_hand_count():
    """One decode token at context c: 2 FLOPs per linear weight (lm_head included) + 4·(c+1)·h·d per layer."""
    spec = load_spec(L8)
    for c in (0, 17, 4095):
        assert new_token_flops(spec, Part(n=3, t=1, c=c)) == 3 * (2 * LINEAR_8B + 4 * (c + 1) * 32 * 4096)


def test_prefill_flops_count_logits_once_per_sequence():
    spec = load_spec(L8)
    head = 2 * 4096 * 128_256
    pairs = 100 * 101 // 2  # causal half: Σ (i + 1)
    expected = 100 * 2 * (LINEAR_8B - 4096 * 128_256) + head + 4 * pairs * 32 * 4096
    assert new_token_flops(spec, Part(n=1, t=100, c=0)) == expected


def test_decode_floor_memory_is_weights_plus_cache():
    """Floor of a decode step, Llama-3.1-8B bf16 on one H100: bytes = weights less the input table + the cache
    after c tokens + one token written; time = bytes / 3.35 TB/s."""
    spec, h100 = load_spec(L8), gpu("h100")
    c, b = 1000, 4
    s = step(spec, InferenceSetup(batch=b, context=c + 1), h100, (Part(n=b, t=1, c=c),), FLOOR)
    weights = 8_030_261_248 * 2 - 128_256 * 4096 * 2
    cache = b * (c + 1) * 131_072
    assert s.bytes == weights + cache
    assert s.memory_s == pytest.approx((weights + cache) / 3.35e12, rel=1e-12)
    assert s.compute_s == pytest.approx(b * (2 * LINEAR_8B + 4 * (c + 1) * 32 * 4096) / 989.4e12, rel=1e-12)
    assert s.comm_s == 0 and s.bound == "memory"


def test_fp8_kv_halves_the_cache_read():
    spec, h100 = load_spec(L8), gpu("h100")
    p = (Part(n=8, t=1, c=8000),)
    bf16 = step(spec, InferenceSetup(batch=8, context=8001), h100, p, FLOOR)
    fp8 = step(spec, InferenceSetup(batch=8, context=8001, cache=CacheFormat(kv_dtype="fp8")), h100, p, FLOOR)
    assert bf16.cache_bytes == 2 * fp8.cache_bytes and bf16.weight_bytes == fp8.weight_bytes


def test_tp_two_allreduces_per_layer():
    spec, h100 = load_spec("meta-llama/Llama-3.1-70B"), gpu("h100")
    s = step(spec, InferenceSetup(batch=16, context=10, tp=4), h100, (Part(n=16, t=1, c=9),), FLOOR)
    assert s.comm_bytes == 2 * 80 * 16 * 8192 * 2
    size = 16 * 8192 * 2  # 256 KiB at 4 ranks: the one-shot (3 × it over the link, 2 barriers) beats the two-shot
    one_shot = 3 * size / 450e9 + 2 * 2e-6
    assert one_shot < 2 * 3 / 4 * size / 450e9 + 3 * 2e-6
    assert s.comm_s == pytest.approx(2 * 80 * one_shot, rel=1e-12)


def test_large_allreduce_is_two_shot():
    """A prefill all-reduce (16 × 128 tokens, 32 MiB at TP 4) is bandwidth-bound: the two-shot's 2·3/4 of it over
    the link, as vLLM switches to above 512 KiB at 4 ranks."""
    spec, h100 = load_spec("meta-llama/Llama-3.1-70B"), gpu("h100")
    s = step(spec, InferenceSetup(batch=16, context=128, tp=4), h100, (Part(n=16, t=128, c=0),), FLOOR)
    size = 16 * 128 * 8192 * 2
    assert s.comm_s == pytest.approx(2 * 80 * (2 * 3 / 4 * size / 450e9 + 3 * 2e-6), rel=1e-12)


def test_small_allreduce_is_one_shot_latency_not_a_ring():
    """A batch-1 decode all-reduce at TP 8 (16 KiB for 8192 hidden) costs the one-shot's 2 barriers, not a ring's
    2·(8 − 1) hops: 80 layers × 2 all-reduces × ((8 − 1)·16 KiB / link + 2α)."""
    spec, h100 = load_spec("meta-llama/Llama-3.1-70B"), gpu("h100")
    s = step(spec, InferenceSetup(batch=1, context=10, tp=8), h100, (Part(n=1, t=1, c=9),), FLOOR)
    size = 8192 * 2
    assert s.comm_s == pytest.approx(2 * 80 * (7 * size / 450e9 + 2 * 2e-6), rel=1e-12)
    assert s.comm_s < 2 * 80 * 2 * 7 * 2e-6 / 3  # under a third of the ring's latency alone


def test_touched_experts():
    assert touched_fraction(8, 2, 1) == 0.25
    assert touched_fraction(8, 2, 2) == pytest.approx(1 - 0.75**2)
    assert touched_fraction(0, 0, 5) == 1.0


def test_moe_decode_reads_more_experts_with_batch():
    spec, h200 = load_spec("deepseek-ai/DeepSeek-V3"), gpu("h200")
    setup = InferenceSetup(batch=1, context=2, tp=8, weights=WeightFormat(dtype="fp8"))
    one = step(spec, setup, h200, (Part(n=1, t=1, c=1),), FLOOR).weight_bytes
    many = step(spec, setup, h200, (Part(n=256, t=1, c=1),), FLOOR).weight_bytes
    assert one < 0.2 * many  # 8 of 256 experts per layer vs nearly all


def test_structure_prefill_compute_decode_memory_and_knee():
    spec, h100 = load_spec("meta-llama/Llama-3.1-70B"), gpu("h100")
    r = fixed_batch(spec, InferenceSetup(batch=32, context=1, tp=4), h100, input=2048, output=128)
    assert r.prefill.bound == "compute" and r.decode.bound == "memory"
    assert r.e2e_s == pytest.approx(r.ttft_s + 127 * r.tpot_s)
    assert r.output_tokens_per_s == pytest.approx(32 * 128 / r.e2e_s)
    assert r.prefill_floor.time_s < r.ttft_s and r.tpot_floor_s < r.tpot_s
    tpots = [fixed_batch(spec, InferenceSetup(batch=b, context=1, tp=4), h100, input=128, output=8).tpot_s
             for b in (1, 8, 64, 1024)]
    assert tpots == sorted(tpots)
    assert tpots[1] < 1.2 * tpots[0]  # below the knee the batch is almost free
    big = fixed_batch(spec, InferenceSetup(batch=1024, context=1, tp=4), h100, input=128, output=8)
    assert big.decode.bound == "compute"


def test_sliding_and_recurrent_caches_are_capped():
    """Past the windows a decode step reads only the full-attention layers' growth; recurrent states stay."""
    h100 = gpu("h100")
    for name in ("google/gemma-2-9b", "Qwen/Qwen3-Next-80B-A3B-Thinking"):
        spec = load_spec(name)
        setup = InferenceSetup(batch=1, context=2, tp=1)
        a = step(spec, setup, h100, (Part(n=1, t=1, c=20_000),), FLOOR).cache_bytes
        b = step(spec, setup, h100, (Part(n=1, t=1, c=30_000),), FLOOR).cache_bytes
        assert b - a == 10_000 * kv_bytes_per_token(spec, fmt=CacheFormat(), tp=1)


def test_vllm_capacity_formula_and_line():
    spec, h100 = load_spec(L8), gpu("h100")
    setup = InferenceSetup(batch=1, context=2000)
    cap = vllm_capacity(spec, setup, h100, request_tokens=2000, engine=EngineMemory())
    available = math.ceil(80 * 2**30 * 0.9) - 8_030_261_248 * 2 - cap.activation_bytes - 2 * 2**30
    assert cap.available_bytes == available
    assert cap.request_bytes == 2000 * 131_072  # 2000 = 125 blocks of 16
    assert cap.log_line() == f"Maximum concurrency for 2,000 tokens per request: {available / (2000 * 131072):.2f}x"


def test_continuous_batching_steady_state():
    spec, h100 = load_spec(L8), gpu("h100")
    setup = InferenceSetup(batch=1, context=2000)
    lo = steady_state(spec, setup, h100, concurrency=1, input=1000, output=1000)
    hi = steady_state(spec, setup, h100, concurrency=64, input=1000, output=1000)
    assert hi.tpot_s > lo.tpot_s and hi.output_tokens_per_s > 20 * lo.output_tokens_per_s
    assert hi.e2e_s == pytest.approx(hi.ttft_s + 999 * hi.tpot_s)
    queued = steady_state(spec, setup, h100, concurrency=64, input=1000, output=1000, capacity=16)
    assert queued.running == 16 and queued.ttft_s > hi.ttft_s
    long = steady_state(spec, setup, h100, concurrency=4, input=20_000, output=100, budget=2048)
    assert long.prefill_steps == math.ceil(20_000 / (2048 - math.ceil(long.decoding)))


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_speed_fields(capsys):
    out = run_json(capsys, ["infer", L8, "--gpu", "h100", "--batch", "8", "--input", "512", "--output", "64",
                            "--json"])
    for k in ("ttft_s", "tpot_s", "e2e_s", "output_tokens_per_s", "prefill_tokens_per_s"):
        assert out[k] > 0
    assert out["e2e_s"] == pytest.approx(out["ttft_s"] + 63 * out["tpot_s"])
    assert out["output_tokens_per_s"] == pytest.approx(8 * 64 / out["e2e_s"])
    assert out["prefill_tokens_per_s"] == pytest.approx(8 * 512 / out["ttft_s"])
    assert main(["infer", L8, "--gpu", "h100", "--concurrency", "32", "--input", "512", "--output", "64",
                 "--engine", "vllm"]) == 0
    text = capsys.readouterr().out
    assert "Maximum concurrency for 576 tokens per request:" in text and "compute" in text


def test_cli_memory_mode_unchanged(capsys):
    out = run_json(capsys, ["infer", L8, "--batch", "8", "--context", "8192", "--json"])
    assert out["kv_cache_bytes"] == 8 * 2**30 and "ttft_s" not in out


@pytest.mark.parametrize("argv", [
    ["--batch", "0"], ["--batch", "-3"], ["--input", "0"], ["--input", "nan"], ["--output", "-1"],
    ["--output", "inf"], ["--input", "99999999999"], ["--concurrency", "4"], ["--gpu", "nope"],
])
def test_cli_bad_input(capsys, argv):
    base = {"--batch": "4", "--input": "128", "--output": "16", "--gpu": "h100"}
    for k, v in zip(argv[::2], argv[1::2]):
        base[k] = v
    args = ["infer", L8] + [x for kv in base.items() for x in kv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainmath: error:") and err.count("\n") == 1


def test_cli_positions(capsys):
    assert main(["infer", "gpt2", "--gpu", "h100", "--batch", "1", "--input", "1000", "--output", "100"]) == 2
    assert "learned positions" in capsys.readouterr().err
    out = run_json(capsys, ["infer", L8, "--gpu", "h100", "--batch", "1", "--input", "200000", "--output", "10",
                            "--json"])
    assert any("max_position_embeddings 131072" in w for w in out["warnings"])


def test_infer_plan(capsys):
    base = ["infer-plan", L8, "--gpu", "h100", "--input", "1000", "--output", "200"]
    out = run_json(capsys, base + ["--qps", "10", "--ttft-slo", "1", "--tpot-slo", "0.05", "--price-per-gpu-hour",
                                   "2", "--json"])
    best = out["deployments"][0]
    assert best["meets"] and best["ttft_s"] <= 1 and best["tpot_s"] <= 0.05
    assert best["replicas"] * best["concurrency_per_instance"] / best["e2e_s"] >= 10  # Little's law
    assert best["cost_per_1m_output_tokens"] == pytest.approx(best["gpus"] * 2 / 3600 / (10 * 200) * 1e6)
    assert main(base + ["--qps", "10", "--ttft-slo", "0.0001", "--tpot-slo", "0.05"]) == 1
    assert "nothing meets" in capsys.readouterr().out
    for bad in (["--qps", "0"], ["--qps", "nan"], ["--qps", "-1"]):
        assert main(base + bad + ["--ttft-slo", "1", "--tpot-slo", "0.05"]) == 2


def test_latency_knee_and_plot(tmp_path):
    """The ridge batch: weight bytes / bandwidth ÷ (FLOPs per token / peak), from the hand counts."""
    from trainmath.plot.latency import knee_batch

    spec, h100 = load_spec(L8), gpu("h100")
    c = 1000
    weights = 8_030_261_248 * 2 - 128_256 * 4096 * 2
    flops = 2 * LINEAR_8B + 4 * (c + 1) * 32 * 4096
    assert knee_batch(spec, InferenceSetup(batch=1, context=c), h100, context=c) == round(
        weights / 3.35e12 / (flops / 989.4e12))
    pytest.importorskip("matplotlib")
    out = tmp_path / "lat.svg"
    assert main(["plot", "latency", L8, "--gpu", "h100", "--max-batch", "64", "-o", str(out)]) == 0
    assert "TPOT" in out.read_text()


def test_mla_decode_is_the_absorbed_form():
    """DeepSeek-V3 decode at context c: the op list's per-head form (forward FLOPs of c + 1 tokens less those of
    c) + 2·h·(c+1)·(2·d_c − d_nope − d_v) per layer: scores over the 576-wide latent + rotary key and values over
    the 512-wide latent instead of 192- and 128-wide heads."""
    from trainmath.flops.model import count_flops

    spec = load_spec("deepseek-ai/DeepSeek-V3")
    c = 999
    per_head = (count_flops(spec, batch=1, seq=c + 1, causal="half").forward.value
                - count_flops(spec, batch=1, seq=c, causal="half").forward.value)
    assert new_token_flops(spec, Part(n=1, t=1, c=c)) == per_head + 61 * 2 * 128 * (c + 1) * (2 * 512 - 128 - 128)


def test_tp_beyond_kv_heads_replicates_them():
    """Llama-3.1-70B has 8 K/V heads: at TP 16 each rank holds one (replicated on 2 ranks), as at TP 8."""
    spec, h100 = load_spec("meta-llama/Llama-3.1-70B"), gpu("h100")
    p = (Part(n=4, t=1, c=4096),)
    tp8 = step(spec, InferenceSetup(batch=4, context=4097, tp=8), h100, p, FLOOR)
    tp16 = step(spec, InferenceSetup(batch=4, context=4097, tp=16), h100, p, FLOOR)
    assert tp8.cache_bytes == tp16.cache_bytes == 4 * 4097 * 80 * 2 * 128 * 2


def test_absurd_batch(capsys):
    assert main(["infer", L8, "--gpu", "h100", "--batch", str(10**9), "--input", "8", "--output", "8"]) == 2
    assert "--batch must be in 1..1,048,576" in capsys.readouterr().err
