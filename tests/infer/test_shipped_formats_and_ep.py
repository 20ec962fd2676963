"""Serving in the format a checkpoint ships in (quantization_config: DeepSeek-V3's fp8 blocks, gpt-oss's MXFP4
experts), expert parallelism over several GPUs, and the no-fit verdict with levers that are checked to fit."""

import json
import math
import shlex

import pytest

from trainmath.cli import main
from trainmath.errors import TrainmathError
from trainmath.hardware import gpu
from trainmath.infer import InferenceSetup, WeightFormat, infer_memory
from trainmath.infer.dtypes import shipped_format
from trainmath.infer.weights import tensor_rank_bytes
from trainmath.model.spec import named_tensors
from trainmath.sources import load_spec, resolve


def test_shipped_formats_of_the_catalog():
    ds = shipped_format(load_spec("deepseek-ai/DeepSeek-V3").options.get("quantization_config"))
    assert (ds.dtype, ds.group_size, ds.scale_name) == ("fp8", 128, "fp32")
    oss = shipped_format(load_spec("openai/gpt-oss-20b").options.get("quantization_config"))
    assert oss.dtype == "mxfp4" and "model.layers.*.self_attn" in oss.skip_modules
    assert shipped_format(load_spec("Qwen/Qwen3-8B").options.get("quantization_config")) == WeightFormat()
    with pytest.raises(TrainmathError, match="quant_method 'hqq' is not modelled"):
        shipped_format({"quant_method": "hqq"})
    with pytest.raises(TrainmathError, match="weight_block_size"):
        shipped_format({"quant_method": "fp8", "weight_block_size": [128, 64]})


def test_gpt_oss_20b_mxfp4_bytes_from_the_checkpoint_layout():
    """gpt-oss ships each layer's experts as gate_up_proj_blocks (E, 2f, d/32, 16) uint8 + gate_up_proj_scales
    (E, 2f, d/32) uint8, down_proj_blocks (E, d, f/32, 16) + down_proj_scales (E, d, f/32), biases in bf16;
    everything else (attention, router, embeddings, lm_head, norms, sinks) in bf16."""
    spec = load_spec("openai/gpt-oss-20b")
    cfg = resolve("openai/gpt-oss-20b").config
    d, f, e, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_local_experts"], cfg["num_hidden_layers"]
    packed = e * (2 * f * (d // 32) * 16 + 2 * f * (d // 32) + d * (f // 32) * 16 + d * (f // 32))
    expert_matrix_params = e * (2 * f * d + d * f)
    total_params = sum(math.prod(shape) for _, shape, _ in named_tensors(spec))
    expected = layers * packed + 2 * (total_params - layers * expert_matrix_params)
    fmt = shipped_format(spec.options["quantization_config"])
    assert infer_memory(spec, InferenceSetup(batch=1, context=1, weights=fmt)).weights_bytes == expected


@pytest.mark.parametrize("name, out_f, in_f", [
    ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", 576, 7168),   # weight_scale_inv (5, 56)
    ("model.layers.0.self_attn.q_b_proj.weight", 24576, 1536),           # (192, 12)
    ("model.layers.3.mlp.experts.{e}.down_proj.weight", 7168, 2048),     # (56, 16) per expert
])
def test_deepseek_v3_fp8_block_scales(name, out_f, in_f):
    """DeepSeek-V3's fp8 checkpoint: e4m3 data plus an fp32 weight_scale_inv of (⌈out/128⌉, ⌈in/128⌉)."""
    spec = load_spec("deepseek-ai/DeepSeek-V3")
    fmt = shipped_format(spec.options["quantization_config"])
    (t,) = [t for n, _, t in named_tensors(spec) if n == name.format(e=0)][:1]
    data, scales = tensor_rank_bytes(t, None, fmt, 1, name=name)
    copies = t.copies
    assert data == out_f * in_f * copies
    assert scales == -(-out_f // 128) * -(-in_f // 128) * 4 * copies


def test_expert_parallel_splits_only_routed_experts():
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    one = infer_memory(spec, InferenceSetup(batch=8, context=1024))
    ep8 = infer_memory(spec, InferenceSetup(batch=8, context=1024, gpus=8, ep=8))
    experts = one.weights.child("experts").value
    assert ep8.weights.child("experts").value * 8 == experts
    assert ep8.weights_bytes - ep8.weights.child("experts").value == one.weights_bytes - experts
    # eight attention replicas hold one sequence each
    assert ep8.kv_cache_bytes * 8 == one.kv_cache_bytes
    # degree 1 is the single-device case
    assert infer_memory(spec, InferenceSetup(batch=8, context=1024, gpus=1, ep=1)).total_bytes == one.total_bytes


@pytest.mark.parametrize("argv, message", [
    ("Qwen/Qwen3-30B-A3B --ep 3 --gpus 3", "expert parallel size 3 must divide the 128 routed experts"),
    ("Qwen/Qwen3-8B --ep 2 --gpus 2", "has no routed experts"),
    ("Qwen/Qwen3-8B --tp 3 --gpus 4", "--tp 3 must divide --gpus 4"),
    ("Qwen/Qwen3-8B --dtype nf5", "unknown weight dtype 'nf5'"),
])
def test_bad_parallel_layouts_are_one_line(argv, message, capsys):
    assert main(["infer", *shlex.split(argv), "--batch", "1", "--context", "16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_no_fit_names_the_weights_and_every_lever_fits(capsys):
    base = ["infer", "meta-llama/Llama-3.1-70B", "--batch", "8", "--context", "8192", "--gpu", "h100"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "does not fit: the weights alone" in out
    assert main([*base, "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]
    assert fit["fits"] is False and fit["weights_fit"] is False and fit["max_batch"] == 0
    assert fit["levers"]
    for lever in fit["levers"]:
        flags = shlex.split(lever.split(" (")[0])
        assert main([*base, *flags, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["fit"]["fits"] is True, lever


def test_shipped_format_is_the_cli_default(capsys):
    assert main(["infer", "openai/gpt-oss-120b", "--batch", "1", "--context", "1024", "--json"]) == 0
    auto = json.loads(capsys.readouterr().out)
    assert auto["dtype"] == "mxfp4"
    assert main(["infer", "openai/gpt-oss-120b", "--batch", "1", "--context", "1024", "--dtype", "bf16",
                 "--json"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert auto["weights_bytes"] < 0.6 * bf16["weights_bytes"]
    spec = load_spec("openai/gpt-oss-120b")
    assert auto["weights_bytes"] == infer_memory(
        spec, InferenceSetup(batch=1, context=1024, weights=shipped_format(spec.options["quantization_config"]))
    ).weights_bytes
    # fits one H100 as published (OpenAI: "runs on a single 80 GB GPU")
    assert auto["weights_bytes"] < gpu("h100").memory_bytes
