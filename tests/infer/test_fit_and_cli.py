"""GPU fit (exact integer boundaries), presets as data, the pure-import rule, and the ``trainmath infer`` CLI."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmath.cli import main
from trainmath.hardware import all_gpus, gpu
from trainmath.infer import CacheFormat, InferenceSetup, infer_memory
from trainmath.infer.kv import cache_tree
from trainmath.sources import load_spec
from trainmath.tree import check_sums


def test_llama_8b_pinned():
    """Seed, third article: KV cache = 2·b·s·N·h_kv·h_d·bytes = 2·8·8192·32·8·128·2 = 8 GiB."""
    r = infer_memory(load_spec("meta-llama/Llama-3.1-8B"), InferenceSetup(batch=8, context=8192), gpu=gpu("h100"))
    assert r.kv_cache_bytes == 2 * 8 * 8192 * 32 * 8 * 128 * 2 == 8 * 2**30
    assert r.kv_bytes_per_token == 131_072
    assert r.weights_bytes == 8_030_261_248 * 2
    assert r.total_bytes == r.weights_bytes + r.kv_cache_bytes
    assert check_sums(r.total) == [] and check_sums(r.kv_cache) == []


def test_deepseek_v3_latent_per_token():
    """DeepSeek-V2 §2.1.2: (d_c + d_h^R)·l = (512 + 64)·61 elements per token, at bf16."""
    r = infer_memory(load_spec("deepseek-ai/DeepSeek-V3"), InferenceSetup(batch=1, context=1))
    assert r.kv_bytes_per_token == (512 + 64) * 61 * 2
    expanded = infer_memory(load_spec("deepseek-ai/DeepSeek-V3"),
                            InferenceSetup(batch=1, context=1, cache=CacheFormat(mla_cache="expanded")))
    assert expanded.kv_bytes_per_token == 128 * (192 + 128) * 61 * 2


@settings(max_examples=20, deadline=None)
@given(model=st.sampled_from(["meta-llama/Llama-3.1-8B", "google/gemma-2-9b", "Qwen/Qwen3-Next-80B-A3B-Thinking",
                              "openai/gpt-oss-20b", "deepseek-ai/DeepSeek-V2-Lite"]),
       batch=st.integers(1, 64), context=st.integers(1, 200_000), gpu_name=st.sampled_from(["h100", "b200", "l40s"]),
       kv=st.sampled_from(["bf16", "fp8"]))
def test_fit_boundaries_are_exact(model, batch, context, gpu_name, kv):
    spec = load_spec(model)
    setup = InferenceSetup(batch=batch, context=context, cache=CacheFormat(kv_dtype=kv))
    r = infer_memory(spec, setup, gpu=gpu(gpu_name))
    f = r.fit
    room = f.usable_bytes - r.weights_bytes
    assert f.free_bytes == f.usable_bytes - r.total_bytes
    fmt = setup.cache
    # cache is linear in the batch; max_batch fits and max_batch + 1 does not
    assert cache_tree(spec, batch=f.max_batch, context=context, fmt=fmt, tp=1).value <= room or f.max_batch == 0
    assert cache_tree(spec, batch=f.max_batch + 1, context=context, fmt=fmt, tp=1).value > room
    if f.max_context:
        assert cache_tree(spec, batch=batch, context=f.max_context, fmt=fmt, tp=1).value <= room
        assert cache_tree(spec, batch=batch, context=f.max_context + 1, fmt=fmt, tp=1).value > room


def test_cache_is_linear_in_batch():
    spec = load_spec("Qwen/Qwen3-Next-80B-A3B-Thinking")
    one = cache_tree(spec, batch=1, context=1000, fmt=CacheFormat(), tp=2).value
    assert cache_tree(spec, batch=7, context=1000, fmt=CacheFormat(), tp=2).value == 7 * one


def test_context_is_unbounded_when_no_cache_grows(tmp_path):
    """A model whose every layer slides keeps a constant cache: the largest context is unbounded (None)."""
    from trainmath.sources import catalog_entry

    cfg = dict(catalog_entry("mistralai/Mistral-7B-v0.3").config, sliding_window=4096)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    r = infer_memory(load_spec(str(path)), InferenceSetup(batch=1, context=100_000), gpu=gpu("h100"))
    assert r.fit.max_context is None
    assert r.kv_bytes_per_token == 0
    assert r.kv_cache_bytes == 4095 * 32 * 8 * 128 * 2 * 2


def test_presets_are_data_with_sources():
    names = {g.name for g in all_gpus()}
    assert {"H100-SXM-80GB", "H200-SXM-141GB", "A100-SXM-40GB", "A100-SXM-80GB", "B200-180GB", "L40S", "RTX-4090",
            "MI300X"} <= names
    for g in all_gpus():
        assert g.source and g.memory_bytes > 0 and g.bf16_flops_per_s > 0 and g.hbm_bytes_per_s > 0
        assert g.interconnect_bytes_per_s * 2 == g.interconnect_bidirectional_bytes_per_s
    assert gpu("H100").memory_bytes == 80 * 2**30
    assert gpu("a100").fp8_flops_per_s is None


def test_core_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import trainmath.infer, trainmath.hardware, trainmath.cli.infer; "
            "from trainmath.sources import load_spec; from trainmath.infer import InferenceSetup, infer_memory; "
            "infer_memory(load_spec('qwen3-0.6b'), InferenceSetup(batch=1, context=8))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_json_keys(capsys):
    assert main(["infer", "Qwen/Qwen3-8B", "--batch", "4", "--context", "4096", "--dtype", "int4", "--kv-dtype",
                 "fp8", "--tp", "2", "--gpu", "l40s", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_bytes"] == out["weights_bytes"] + out["kv_cache_bytes"] + out["workspace_bytes"]
    # 36 layers, 8 KV heads / 2 ranks, head_dim 128, K and V, 1 byte
    assert out["kv_cache_bytes"] == 4 * 4096 * 36 * 4 * 128 * 2
    assert out["fit"]["gpu"] == "L40S" and out["fit"]["max_batch"] > 0
    assert any("int4" in c for c in out["conventions"])


def test_cli_text(capsys):
    assert main(["infer", "qwen3-0.6b", "--batch", "1", "--context", "128", "--gpu", "4090", "--workspace",
                 "1GiB"]) == 0
    text = capsys.readouterr().out
    assert "total_bytes" in text and "largest batch" in text and "conventions:" in text


@pytest.mark.parametrize("argv,needle", [
    (["--batch", "0", "--context", "10"], "batch (0) must be positive"),
    (["--batch", "2", "--context", "-5"], "context (-5) must be positive"),
    (["--batch", "1", "--context", "10", "--tp", "3"], "num_attention_heads (16)"),
    (["--batch", "1", "--context", "10", "--tp", "32"], "num_attention_heads (16)"),
    (["--batch", "1", "--context", "10", "--tp", "0"], "must be positive"),
    (["--batch", "1", "--context", "10", "--gpu", "tpu9"], "unknown GPU"),
    (["--batch", "1", "--context", "10", "--kv-dtype", "int4"], "kv dtype"),
])
def test_cli_bad_input_is_one_line_exit_2(argv, needle, capsys):
    assert main(["infer", "qwen3-0.6b", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err


def test_cli_kv_heads_not_dividing(capsys):
    assert main(["infer", "Qwen/Qwen3-14B", "--batch", "1", "--context", "10", "--tp", "5"]) == 2
    assert "num_key_value_heads (8)" in capsys.readouterr().err


def test_largest_context_is_capped_at_max_position_embeddings(capsys):
    """DeepSeek-V2-Lite on an H200 at batch 1: the memory holds more than its 163,840 positions; the context it can
    serve is the configured limit, and the memory's own figure is named beside it."""
    spec = load_spec("deepseek-ai/DeepSeek-V2-Lite")
    r = infer_memory(spec, InferenceSetup(batch=1, context=4096), gpu=gpu("h200"))
    f = r.fit
    assert f.max_context > spec.max_position_embeddings == 163_840 == f.usable_context
    assert main(["infer", "deepseek-ai/DeepSeek-V2-Lite", "--gpu", "h200", "--batch", "1", "--context", "4096"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("largest context"))
    assert line.startswith("largest context at batch 1: 163,840, the config's max_position_embeddings")
    assert f"the memory alone would hold {f.max_context:,}" in line
    # below the limit the memory's figure is the answer
    small = infer_memory(spec, InferenceSetup(batch=256, context=4096), gpu=gpu("h200")).fit
    assert small.usable_context == small.max_context < 163_840


def test_unbounded_context_is_the_position_limit(tmp_path):
    from trainmath.sources import catalog_entry

    cfg = dict(catalog_entry("mistralai/Mistral-7B-v0.3").config, sliding_window=4096)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    f = infer_memory(load_spec(str(path)), InferenceSetup(batch=1, context=100), gpu=gpu("h100")).fit
    assert f.max_context is None and f.usable_context == cfg["max_position_embeddings"]
