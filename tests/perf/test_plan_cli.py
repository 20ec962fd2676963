"""The planner against exhaustive search, and the estimate / plan / flops --tokens commands."""

import json

import pytest

from trainmath.cli import main
from trainmath.flops import count_flops
from trainmath.hardware import gpu
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.perf import Job, estimate, job_problems
from trainmath.perf.step import memory_recompute
from trainmath.plan import plan, reason_category
from trainmath.plan.search import _options, _structures
from trainmath.sources import load_spec

SMALL = load_spec("Qwen/Qwen3-0.6B")


def test_best_first_search_equals_exhaustive():
    """Every candidate estimated and memory-checked by brute force: the planner's top 4 are the same, in order."""
    g = gpu("l40s")  # 48 GB: some layouts of a 0.6B model at seq 4096 do not fit
    job = Job(global_batch=16, seq=4096)
    limit = g.memory_bytes * job.mem_util_percent // 100
    fits = []
    for lay in _structures(SMALL, 8, 8, job.seq):
        for jb in _options(lay, job):
            if job_problems(SMALL, lay, jb, 8):
                continue
            e = estimate(SMALL, lay, jb, g, memory=False)
            setup = TrainingSetup(micro_batch=jb.micro_batch, seq=jb.seq, recompute=memory_recompute(jb),
                                  profile="megatron", micro_batches=e.micro_batches)
            peak = training_memory(SMALL, setup, lay).peak_bytes
            if peak <= limit:
                fits.append(e.step_time_s)
    result = plan(SMALL, gpus=8, gpu=g, job=job, top=4, fit_profiles=("megatron",))
    assert [e.step_time_s for e in result.layouts] == sorted(fits)[:4]
    assert result.memory_checks < len(fits)
    assert all(e.fits for e in result.layouts)


def test_reason_categories_strip_values():
    assert reason_category("tp (8) must divide attention heads (12)") == "tp must divide attention heads"
    assert reason_category("global batch (10) must be divisible by dp × micro-batch (4 × 1 = 4)") == \
        "global batch must be divisible by dp × micro-batch"


def test_plan_json_shape(capsys):
    assert main(["plan", "qwen3-0.6b", "--gpus", "8", "--gpu", "h100", "--seq", "2048", "--global-batch", "32",
                 "--top", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"layouts", "rejected"} and len(out["layouts"]) == 3
    for d in out["layouts"]:
        assert {"step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_bytes", "fits", "breakdown", "dp", "tp",
                "pp", "cp", "ep", "zero", "micro_batch", "virtual_stages", "recompute"} <= set(d)
        assert d["dp"] * d["tp"] * d["pp"] * d["cp"] == 8 and d["fits"] is True
        assert sum(d["breakdown"].values()) == pytest.approx(d["step_time_s"])
    times = [d["step_time_s"] for d in out["layouts"]]
    assert times == sorted(times)
    assert all(isinstance(v, int) and v > 0 for v in out["rejected"].values())


def test_plan_nothing_fits_exit_1_with_closest(capsys):
    assert main(["plan", "meta-llama/Llama-3.1-405B", "--gpus", "8", "--gpu", "rtx4090", "--seq", "4096",
                 "--global-batch", "8"]) == 1
    out = capsys.readouterr().out
    assert "no layout fits in 22.51 GiB per GPU. closest" in out and "model states alone exceed memory" in out


def test_plan_nothing_fits_json_says_what_is_lacking(capsys):
    assert main(["plan", "meta-llama/Llama-3.1-70B", "--gpus", "16", "--gpu", "h100", "--seq", "4096",
                 "--global-batch", "64", "--top", "3", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    # one per ZeRO stage even beyond --top 3: the stages that shard the states are always shown
    assert out["layouts"] == [] and len(out["closest"]) == 4
    assert {c["zero"] for c in out["closest"]} == {0, 1, 2, 3}
    for c in out["closest"]:
        assert c["lacks_bytes"] == c["peak_bytes"] - out["usable_bytes"] > 0


def test_plan_explain_lists_reasons(capsys):
    assert main(["plan", "qwen3-0.6b", "--gpus", "6", "--gpu", "h100", "--seq", "1024", "--global-batch", "12",
                 "--explain"]) == 0
    out = capsys.readouterr().out
    assert "every rejected candidate" in out and "tp (3) must divide attention heads (16)" in out


def test_estimate_json_and_budget(capsys):
    assert main(["estimate", "qwen3-0.6b", "--gpus", "8", "--gpu", "H100-SXM", "--seq", "2048", "--global-batch",
                 "64", "--tp", "2", "--sp", "--tokens", "1T", "--price-per-gpu-hour", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dp"] == 4 and out["tp"] == 2 and out["gpu"] == "H100-SXM-80GB"
    assert out["budget"]["tokens"] == 10**12 and out["budget"]["cost"] == pytest.approx(2 * out["budget"]["gpu_hours"])
    assert out["mfu"] == pytest.approx(out["model_flops"] / (out["step_time_s"] * 8 * 989.4e12))


def test_estimate_text(capsys):
    assert main(["estimate", "qwen3-0.6b", "--gpus", "16", "--gpu", "a100", "--seq", "2048", "--global-batch", "64",
                 "--tp", "2", "--pp", "2", "--virtual-stages", "2", "--recompute", "selective"]) == 0
    out = capsys.readouterr().out
    assert "step breakdown" in out and "pipeline_bubble" in out and "memory per GPU" in out and "MFU" in out


@pytest.mark.parametrize("argv,match", [
    (["--gpu", "h10"], "unknown GPU 'h10'; did you mean H100-SXM-80GB"),
    (["--gpu", "h100", "--micro-batch", "3"], r"global batch \(8\) must be divisible by dp × micro-batch \(8 × 3 = "
                                              r"24\)"),
    (["--gpu", "h100", "--dp", "3"], r"world size \(8\) must equal dp·tp·pp·cp = 3·1·1·1 = 3"),
    (["--gpu", "h100", "--tp", "3"], r"tp·pp·cp = 3·1·1 = 3 must divide the GPU count \(8\)"),
    (["--gpu", "h100", "--ep", "3"], r"ep \(3\) must divide dp·cp \(8·1 = 8\)"),
    (["--gpu", "h100", "--pp", "8"], r"must divide the layers \(28\)"),
    (["--gpu", "h100", "--ep", "2"], "has no routed experts"),
    (["--gpu", "h100", "--tokens", "lots"], "argument --tokens: must be a token count"),
    (["--gpu", "a100", "--dtype", "fp8"], "A100-SXM-80GB has no dense fp8"),
])
def test_estimate_bad_input_exit_2(argv, match, capsys):
    base = ["estimate", "qwen3-0.6b", "--gpus", "8", "--seq", "1024", "--global-batch", "8"]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainmath: error: ") and len(err.strip().splitlines()) == 1
    import re
    assert re.search(match, err), err


def test_hardware_file_missing_fields_exit_2(tmp_path, capsys):
    p = tmp_path / "hw.json"
    g = gpu("h100").to_dict()
    g.update(name="X1")
    del g["nic_gbps"]
    p.write_text(json.dumps({"gpus": [g]}))
    assert main(["estimate", "qwen3-0.6b", "--gpus", "1", "--gpu", "x1", "--seq", "512", "--global-batch", "1",
                 "--hardware", str(p)]) == 2
    assert "GPU 'X1': missing nic_gbps" in capsys.readouterr().err


def test_flops_tokens(capsys):
    assert main(["flops", "qwen3-0.6b", "--seq", "1024", "--tokens", "10M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    per_seq = count_flops(SMALL, batch=1, seq=1024).training_flops
    assert out["budget"] == {"tokens": 10**7, "sequences": 9766, "training_flops": per_seq * 9766}


def test_time_lower_bound_never_exceeds_the_estimate():
    """The best-first search is exact only if its bound is a bound: checked on every candidate of a MoE model."""
    from trainmath.hardware import presets
    from trainmath.plan.bounds import time_lower_bound

    spec = load_spec("Qwen/Qwen1.5-MoE-A2.7B")  # 60 experts, shared experts, 24 layers
    g = gpu("h100")
    eff = presets().efficiency(g)
    job = Job(global_batch=64, seq=2048)
    n = 0
    for lay in _structures(spec, 16, 8, job.seq):
        for jb in _options(lay, job):
            if job_problems(spec, lay, jb, 16):
                continue
            bound = time_lower_bound(spec, lay, jb, g, eff, jb.micro_batch, jb.recompute, jb.virtual_stages)
            assert bound <= estimate(spec, lay, jb, g, memory=False).step_time_s * (1 + 1e-12)
            n += 1
    assert n > 500


def test_plan_70b_8k_layouts_fit_under_both_profiles():
    """Llama-3.1-70B on 1024 H100 at 8k: every recommended layout fits under the megatron profile (which the
    planner asks) and under the hf profile (transformers' saved tensors, vocabulary-parallel head as Megatron's);
    none is the tp=1, no-recompute layout that cannot hold 70B's activations at 8k."""
    from dataclasses import replace

    spec = load_spec("meta-llama/Llama-3.1-70B")
    g = gpu("h100")
    job = Job(global_batch=1024, seq=8192)
    result = plan(spec, gpus=1024, gpu=g, job=job)
    limit = g.memory_bytes * job.mem_util_percent // 100
    assert len(result.layouts) == 5
    for e in result.layouts:
        assert e.fits and e.peak_bytes <= limit
        assert e.layout.tp * e.layout.cp > 1 or e.job.recompute != "none"
        for profile in ("megatron", "hf"):
            setup = TrainingSetup(micro_batch=e.job.micro_batch, seq=e.job.seq, recompute=e.job.recompute,
                                  profile=profile, micro_batches=e.micro_batches)
            lay = replace(e.layout, vocab_parallel=e.layout.tp > 1) if profile == "hf" else e.layout
            assert training_memory(spec, setup, lay).peak_bytes <= limit, (profile, e.layout.describe())


def test_nothing_fits_closest_show_every_zero_stage():
    """Llama-3.1-70B on 8 H100: even ZeRO-3's states (16 bytes × 70.6B / 8 ranks) exceed 75.7 GiB. The closest
    list shows the least-needing candidate of each ZeRO stage, ZeRO-3 first (it shards all the states)."""
    spec = load_spec("meta-llama/Llama-3.1-70B")
    r = plan(spec, gpus=8, gpu=gpu("h100"), job=Job(global_batch=64, seq=8192))
    assert not r.layouts
    assert {c.layout.zero for c in r.closest} == {0, 1, 2, 3}
    assert r.closest[0].layout.zero == 3 and r.closest[0].layout.dp == 8
    assert [c.peak_bytes for c in r.closest] == sorted(c.peak_bytes for c in r.closest)
    assert all(c.peak_bytes > r.usable_bytes for c in r.closest)
