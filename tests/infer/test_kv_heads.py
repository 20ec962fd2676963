"""The K/V-heads convention (``CacheFormat.kv_heads``, ``--kv-heads``, ``--engine``): Falcon-180B's model code
caches its 232 query heads (K/V broadcast before caching); TensorRT-LLM and vLLM cache the config's 8 K/V heads.
Oracle: hand-derived bytes, 2 (K and V) · heads per rank · context · head_dim 64 · 2 bytes (bf16) · 80 layers."""

from __future__ import annotations

import json

import pytest

from trainmath.cli import main
from trainmath.infer.kv import CacheFormat, cache_tree
from trainmath.sources import load_spec

FALCON = "tiiuae/falcon-180B"


@pytest.mark.parametrize(("kv_heads", "tp", "per_rank_heads"), [
    ("model-code", 1, 232), ("model-code", 4, 58), ("kv-heads", 1, 8), ("kv-heads", 4, 2), ("kv-heads", 8, 1),
])
def test_falcon_180b_cache_bytes(kv_heads, tp, per_rank_heads):
    spec = load_spec(FALCON)
    got = cache_tree(spec, batch=3, context=1000, fmt=CacheFormat(kv_heads=kv_heads), tp=tp).value
    assert got == 3 * 2 * per_rank_heads * 1000 * 64 * 2 * 80


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-30B-A3B"])
def test_same_where_the_model_code_caches_the_kv_heads(model):
    spec = load_spec(model)
    a = cache_tree(spec, batch=2, context=777, fmt=CacheFormat(), tp=2).value
    assert a == cache_tree(spec, batch=2, context=777, fmt=CacheFormat(kv_heads="kv-heads"), tp=2).value


def test_bad_convention_is_refused():
    with pytest.raises(Exception, match="kv heads 'both' is not one of model-code, kv-heads"):
        CacheFormat(kv_heads="both")


def _cache_bytes(capsys, *extra) -> tuple[int, list[str]]:
    rc = main(["infer", FALCON, "--gpu", "h200", "--tp", "4", "--batch", "8", "--input", "100", "--output", "2",
               "--json", *extra])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    return out["decode_step"]["cache_bytes_per_rank"], out["conventions"]


def test_engine_sets_the_default_and_the_flag_overrides_it(capsys):
    code, conv = _cache_bytes(capsys)
    assert "engine stores KV heads as: model-code (the heads the model's transformers code caches)" in conv
    trt, conv = _cache_bytes(capsys, "--engine", "trtllm")
    assert any(c.startswith("engine stores KV heads as: kv-heads") for c in conv)
    assert _cache_bytes(capsys, "--engine", "vllm")[0] == trt
    assert _cache_bytes(capsys, "--engine", "trtllm", "--kv-heads", "model-code")[0] == code
    assert _cache_bytes(capsys, "--kv-heads", "kv-heads")[0] == trt
    assert code == pytest.approx(29 * trt, rel=0.01)  # 58 heads per rank against 2, at a context of 100-101


def test_memory_mode_follows_the_convention(capsys):
    def kv(*extra):
        assert main(["infer", FALCON, "--batch", "1", "--context", "1000", "--tp", "4", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["kv_cache_bytes"]

    assert kv() == 2 * 58 * 1000 * 64 * 2 * 80
    assert kv("--kv-heads", "kv-heads") == 2 * 2 * 1000 * 64 * 2 * 80


@pytest.mark.parametrize(("argv", "bad"), [
    (["infer", FALCON, "--batch", "1", "--context", "10", "--engine", "sglang"], "sglang"),
    (["infer", FALCON, "--batch", "1", "--context", "10", "--kv-heads", "query-heads"], "query-heads"),
    (["infer-plan", FALCON, "--gpu", "h200", "--qps", "1", "--input", "10", "--output", "10", "--ttft-slo", "1",
      "--tpot-slo", "1", "--kv-heads", "both"], "both"),
])
def test_unknown_convention_is_one_line(capsys, argv, bad):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert not out and len(lines) == 1 and lines[0].startswith("trainmath: error:")
    assert f"invalid choice: '{bad}'" in lines[0]


def test_infer_plan_prices_the_cache_as_vllm_stores_it(capsys):
    """infer-plan sizes for vLLM (default kv-heads): Falcon-180B on 4 H200 holds 29x more requests than under the
    model code's 232 cached heads, so the 4-GPU instance is bound by the TPOT SLO, not by the KV cache."""
    def first(*extra):
        argv = ["infer-plan", FALCON, "--gpu", "h200", "--qps", "2", "--input", "1000", "--output", "200",
                "--ttft-slo", "2", "--tpot-slo", "0.1", "--top", "1", "--json", *extra]
        assert main(argv) == 0
        out = json.loads(capsys.readouterr().out)
        return out["kv_heads"], out["deployments"][0]

    heads, engine = first()
    assert heads == "kv-heads" and engine["gpus"] == 4 and engine["binding"] == "TPOT SLO"
    heads, code = first("--kv-heads", "model-code")
    assert heads == "model-code" and code["gpus"] == 4 and code["binding"] == "KV cache"
    assert engine["concurrency_per_instance"] > 2 * code["concurrency_per_instance"]
