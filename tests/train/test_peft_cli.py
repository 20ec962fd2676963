"""``trainmath train/verify --peft``: what the runtime refuses, each in one line with exit 2, before any rank
starts (no process is spawned here)."""

import pytest

from tests.train.test_cli import TINY
from trainmath.cli import main


@pytest.mark.parametrize("extra,message", [
    (["--peft", "lora", "--strategy", "zero2", "--impl", "trainmath"], "--peft lora runs on torch's DDP"),
    (["--peft", "qlora", "--strategy", "zero3"], "FSDP2 cannot shard bitsandbytes' 4-bit weights"),
    (["--lora-rank", "4"], "--lora-rank needs --peft lora or --peft qlora"),
    (["--peft", "lora", "--lora-rank", "0"], "--lora-rank 0: the rank must be a positive integer"),
    (["--peft", "lora", "--lora-rank", "99"], "--lora-rank 99 exceeds self_attn."),
    (["--peft", "lora", "--lora-targets", "qkv_proj"], "no such Linear module"),
])
@pytest.mark.parametrize("command", ["train", "verify"])
def test_bad_input_is_one_line_exit_2(command, extra, message, capfd):
    assert main([command, *TINY, *extra]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainmath: error: ") and message in err[0], err


def test_unknown_target_names_the_model_modules(capfd):
    assert main(["train", *TINY, "--peft", "lora", "--lora-targets", "c_attn"]) == 2
    err = capfd.readouterr().err
    assert all(n in err for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))


def test_routed_experts_are_refused_by_the_runtime(capfd):
    args = ["train", "mistralai/Mixtral-8x7B-v0.1", "--layers", "1", "--hidden", "32", "--intermediate", "16",
            "--heads", "4", "--kv-heads", "2", "--vocab", "64", "--experts", "4", "--seq", "8"]
    assert main([*args, "--peft", "lora", "--lora-targets", "w1,w3"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "experts.gate_up_proj" in err[0] and "Linear modules only" in err[0]


def test_peak_and_flops_are_printed_as_measured_where_the_calculator_has_no_fine_tune_step(monkeypatch):
    """Without ``trainmath.memory.peft`` / ``flops.peft`` (or where they refuse the run) the peak and FLOPs are not
    fields: they are listed as measured, with the reason."""
    import sys

    from tests.train.runs import config
    from trainmath.adapters import PeftJob
    from trainmath.runtime.train.model import model_spec, shrunk_config
    from trainmath.verify.peft import measured_only, predicted_flops, predicted_peak

    monkeypatch.setitem(sys.modules, "trainmath.memory.peft", None)  # import fails, as before it exists
    monkeypatch.setitem(sys.modules, "trainmath.flops.peft", None)
    cfg = config(peft=PeftJob(method="lora", rank=4))
    spec = model_spec(*shrunk_config(cfg.model, cfg.overrides))
    peak, why = predicted_peak(spec, cfg, 2)
    assert peak is None and "no fine-tune step timeline" in why
    flops, why_flops = predicted_flops(spec, cfg, 2)
    assert flops is None and "no fine-tune FLOPs" in why_flops
    got = measured_only({"peak_bytes": None, "peak_note": why}, {0: {"peak_bytes": 7, "training_flops": 9}})
    assert got["peak_bytes"] == {0: 7} and got["training_flops"] == {0: 9}
    assert got["peak_bytes_why_not_predicted"] == why
    assert "peak_bytes" not in measured_only({"peak_bytes": 5}, {0: {"peak_bytes": 7}})
    assert "training_flops" not in measured_only({"flops": {"gemm_flops": 1}}, {0: {"training_flops": 9}})


def test_qlora_on_a_quantized_checkpoint_is_refused(capfd):
    args = ["train", "deepseek-ai/DeepSeek-V3", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "64"]
    assert main([*args, "--peft", "qlora", "--lora-targets", "q_a_proj"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already ships quantized (fp8 quantization_config)" in err[0]
