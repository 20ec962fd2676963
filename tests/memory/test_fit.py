"""``memory --gpu``: the verdict, the margin, levers re-run through the model; offload; dp from --world-size."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import standin
from trainmath.arith import numel
from trainmath.cli import main
from trainmath.errors import TrainmathError
from trainmath.hardware import gpu
from trainmath.layout import ParallelLayout
from trainmath.memory import training
from trainmath.memory.fit import derive_dp, fit
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.sources import load_spec

SPEC = load_spec("qwen3-8b")
H100 = gpu("h100")


def test_fit_margin_and_levers_are_reruns():
    setup = TrainingSetup(micro_batch=1, seq=4096)
    layout = ParallelLayout(dp=8)  # plain DDP: every state replicated, does not fit 80 GiB
    v = fit(SPEC, setup, layout, H100, activation_model=standin)
    peak = training_memory(SPEC, setup, layout, activation_model=standin).peak_bytes
    # the one fit rule: 95% of 80 GiB less the 300 MiB CUDA context
    usable = 80 * 2**30 * 95 // 100 - 300 * 2**20
    assert not v.fits and v.capacity_bytes == usable and v.margin_bytes == usable - peak
    names = [lv.name for lv in v.levers]
    assert names[:9] == ["--optimizer-impl fused", "--optimizer adamw8bit", "--recompute selective",
                         "--recompute full", "--zero 1", "--zero 2", "--zero 3", "--offload optimizer",
                         "--dp 16 --zero 3 (needs 16 GPUs)"]
    for lv in v.levers:
        if lv.name == "--zero 3":
            again = training_memory(SPEC, setup, ParallelLayout(dp=8, zero=3), activation_model=standin)
            assert lv.peak_bytes == again.peak_bytes and lv.fits == (again.peak_bytes <= usable)
        if lv.name == "--offload optimizer":
            assert lv.peak_bytes < peak
    assert any(lv.fits for lv in v.levers)


def test_selective_lever_is_the_op_level_fold():
    """From no recompute, the first lever is torchtitan's op-level selective checkpointing (the hf profile's
    fold, ``ops.selective``), re-run exactly; it lies between no recompute and full recompute."""
    setup, layout = TrainingSetup(micro_batch=4, seq=8192), ParallelLayout(dp=8, zero=3)
    v = fit(SPEC, setup, layout, H100)
    peaks = {r: training_memory(SPEC, replace(setup, recompute=r), layout).peak_bytes
             for r in ("none", "selective", "full")}
    lever = {lv.name: lv for lv in v.levers}["--recompute selective"]
    assert v.peak_bytes == peaks["none"] > v.capacity_bytes
    assert lever.peak_bytes == peaks["selective"] and lever.fits == (peaks["selective"] <= v.capacity_bytes)
    assert peaks["full"] < peaks["selective"] < peaks["none"]
    assert "--recompute selective" not in {lv.name for lv in fit(SPEC, replace(setup, recompute="full"), layout,
                                                                   H100).levers}


def test_fitting_job_has_no_levers():
    v = fit(SPEC, TrainingSetup(micro_batch=1, seq=1024), ParallelLayout(dp=8, zero=3), gpu("h200"),
            activation_model=standin)
    assert v.fits and v.margin_bytes > 0 and v.levers == ()


def test_offload_moves_states_off_the_gpu():
    setup = TrainingSetup(micro_batch=1, seq=1024)
    base = training_memory(SPEC, setup, ParallelLayout(dp=2, zero=3), activation_model=standin)
    opt = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=1024, offload="optimizer"),
                          ParallelLayout(dp=2, zero=3), activation_model=standin)
    par = training_memory(SPEC, TrainingSetup(micro_batch=1, seq=1024, offload="params"),
                          ParallelLayout(dp=2, zero=3), activation_model=standin)
    step = opt.stages[0].at("optimizer step").flat()
    assert step["optimizer_states_bytes"] == step["master_weights_bytes"] == 0
    assert step["optimizer_step_temporaries_bytes"] == 0 and step["weights_bytes"] > 0
    assert par.stages[0].at("step start").flat()["weights_bytes"] == 0
    assert par.peak_bytes <= opt.peak_bytes <= base.peak_bytes
    with pytest.raises(TrainmathError, match="--offload params needs --zero 3"):
        training_memory(SPEC, TrainingSetup(micro_batch=1, seq=1024, offload="params"), ParallelLayout(dp=2),
                        activation_model=standin)


def test_derive_dp():
    assert derive_dp(64, tp=4, pp=2, cp=1) == 8
    with pytest.raises(TrainmathError, match=r"--world-size \(12\) must be a positive multiple of tp·pp·cp"):
        derive_dp(12, tp=8, pp=1, cp=1)


@pytest.fixture
def _standin(monkeypatch):
    monkeypatch.setattr(training, "activations", standin)


def test_cli_gpu_json_and_world_size(capsys, _standin):
    argv = ["memory", "qwen3-8b", "--micro-batch", "1", "--seq", "4096", "--world-size", "8", "--gpu", "h100"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["layout"]["dp"] == 8 and d["layout"]["world_size"] == 8
    assert d["fits"] is False and d["margin_bytes"] == d["capacity_bytes"] - d["peak_bytes"] < 0
    assert {lv["lever"] for lv in d["levers"]} >= {"--recompute full", "--zero 3", "--offload optimizer"}
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "does NOT fit H100-SXM-80GB" in out and "would fit with: " in out and "GiB = 2**30 bytes" in out


def test_cli_gpu_bad_name_one_line(capsys):
    assert main(["memory", "qwen3-8b", "--micro-batch", "1", "--seq", "8", "--gpu", "h1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown GPU 'h1000'" in err


def test_single_gpu_levers_first_then_those_that_need_gpus():
    """Each lever is the model re-run with one change; the levers keeping the job's GPUs come first, every lever
    after them names the GPUs it needs (dp·tp·pp·cp of its layout)."""
    setup, layout = TrainingSetup(micro_batch=4, seq=2048), ParallelLayout()
    v = fit(SPEC, setup, layout, H100, activation_model=standin)
    names = [lv.name for lv in v.levers]
    need = [i for i, n in enumerate(names) if "(needs" in n]
    assert need and need == list(range(need[0], len(names)))
    expect = {
        "--optimizer-impl fused": (replace(setup, optimizer_impl="fused"), layout),
        "--optimizer adamw8bit": (replace(setup, optimizer="adamw8bit"), layout),
        "--micro-batch 2 --micro-batches 2": (replace(setup, micro_batch=2, micro_batches=2), layout),
        "--micro-batch 1 --micro-batches 4": (replace(setup, micro_batch=1, micro_batches=4), layout),
        "--dp 2 --zero 3 (needs 2 GPUs)": (setup, ParallelLayout(dp=2, zero=3)),
        "--tp 8 (needs 8 GPUs)": (setup, ParallelLayout(tp=8)),
    }
    got = {lv.name: lv for lv in v.levers}
    for name, (s, lay) in expect.items():
        assert got[name].peak_bytes == training_memory(SPEC, s, lay, activation_model=standin).peak_bytes, name
    # bitsandbytes' blockwise states: 1 + 1 byte per element and one fp32 absmax per 256-element block each,
    # against AdamW's two fp32 states: the 8-bit lever saves at least 6 bytes per parameter of the big tensors
    plain = training_memory(SPEC, setup, layout, activation_model=standin).breakdown
    eight = training_memory(SPEC, replace(setup, optimizer="adamw8bit"), layout, activation_model=standin).breakdown
    n_big = sum(numel(t.shape) for t in SPEC.layers[0].tensors if numel(t.shape) >= 4096) * SPEC.num_layers
    saved = plain.child("optimizer_states_bytes").value - eight.child("optimizer_states_bytes").value
    assert saved >= 6 * n_big - 8 * n_big // 256
