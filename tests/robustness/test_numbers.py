"""Numbers on the command line, held to the bounds of ``trainmath.args`` for every command (2**40 for counts,
finite and in range for real numbers, 10**18 for a token budget), and the positions rule shared by every command
that takes ``--seq``."""

from __future__ import annotations

import json

import pytest

from trainmath.cli import main
from trainmath.sources import catalog_entry

pytestmark = pytest.mark.timeout(60)

EST = ["estimate", "Qwen/Qwen3-0.6B", "--gpus", "8", "--gpu", "h100", "--seq", "1024", "--global-batch", "8"]
PLAN = ["plan", *EST[1:]]
TRAIN = ["train", "Qwen/Qwen3-0.6B", "--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1",
         "--intermediate", "64", "--vocab", "64", "--seq", "8"]
HUGE = "9" * 30

CASES = {
    "tokens_1e300": ([*EST, "--tokens", "1e300"], "--tokens"),
    "tokens_huge_digits": ([*EST, "--tokens", HUGE], "--tokens"),
    "flops_tokens_1e300": (["flops", "Qwen/Qwen3-0.6B", "--batch", "1", "--seq", "128", "--tokens", "1e300"],
                           "--tokens"),
    "price_nan": ([*EST, "--tokens", "1T", "--price-per-gpu-hour", "nan"], "--price-per-gpu-hour"),
    "price_inf": ([*EST, "--tokens", "1T", "--price-per-gpu-hour", "inf"], "--price-per-gpu-hour"),
    "price_negative": ([*EST, "--tokens", "1T", "--price-per-gpu-hour", "-1"], "--price-per-gpu-hour"),
    "seq_1e30": ([*EST[:6], "--seq", "1e30", *EST[8:]], "--seq"),
    "seq_digits": ([*EST[:6], "--seq", HUGE, *EST[8:]], "--seq"),
    "global_batch_1e30": ([*EST[:8], "--global-batch", "1e30"], "--global-batch"),
    "global_batch_digits": ([*EST[:8], "--global-batch", HUGE], "--global-batch"),
    "gpus_digits": ([*EST[:2], "--gpus", HUGE, *EST[4:]], "--gpus"),
    "tp_1e400": ([*EST, "--tp", "1e400"], "--tp"),
    "tp_digits": ([*EST, "--tp", HUGE], "--tp"),
    "dp_digits": ([*EST, "--dp", HUGE], "--dp"),
    "mem_util_digits": ([*EST, "--mem-util", HUGE], "--mem-util"),
    "plan_seq_digits": ([*PLAN[:6], "--seq", HUGE, *PLAN[8:]], "--seq"),
    "plan_top_digits": ([*PLAN, "--top", HUGE], "--top"),
    "plot_layout_digits": (["plot", "memory", "Qwen/Qwen3-0.6B", "--micro-batch", "1", "--seq", "128", "--layout",
                            f"tp={HUGE}", "-o", "{out}/m.svg"], "at most 2**40"),
    "report_layout_seq": (["report", "Qwen/Qwen3-0.6B", "--micro-batch", "1", "--seq", HUGE, "-o", "{out}/r.html"],
                          "--seq"),
    "train_steps_1e30": ([*TRAIN, "--steps", "1e30"], "--steps"),
    "train_steps_digits": ([*TRAIN, "--steps", HUGE], "--steps"),
    "train_lr_inf": ([*TRAIN, "--lr", "inf"], "--lr"),
    "train_lr_nan": ([*TRAIN, "--lr", "nan"], "--lr"),
    "train_lr_zero": ([*TRAIN, "--lr", "0"], "--lr"),
    "train_stop_after_negative": ([*TRAIN, "--stop-after", "-1"], "--stop-after"),
    "train_stop_after_zero": ([*TRAIN, "--stop-after", "0"], "--stop-after"),
    "train_seq_digits": ([*TRAIN, "--seq", HUGE], "--seq"),
    "train_layers_digits": ([*TRAIN, "--layers", HUGE], "--layers"),
    "train_seed_negative": ([*TRAIN, "--seed", "-3"], "--seed"),
    "train_checkpoint_every_negative": ([*TRAIN, "--checkpoint-every", "-1"], "--checkpoint-every"),
    "verify_steps_digits": (["verify", *TRAIN[1:], "--steps", HUGE], "--steps"),
    "serve_port_digits": (["serve", "--port", HUGE], "--port"),
    # learned positions: flops refuses GPT-2 at 4096, and so does every other command taking --seq
    "estimate_gpt2_4096": (["estimate", "gpt2", "--gpus", "8", "--gpu", "h100", "--seq", "4096", "--global-batch",
                            "8"], "1024 learned positions"),
    "plan_gpt2_4096": (["plan", "gpt2", "--gpus", "8", "--gpu", "h100", "--seq", "4096", "--global-batch", "8"],
                       "1024 learned positions"),
    "report_gpt2_4096": (["report", "gpt2", "--micro-batch", "1", "--seq", "4096", "-o", "{out}/r.html"],
                         "1024 learned positions"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_out_of_bounds_is_one_line(case, tmp_path, capsys):
    argv, needle = CASES[case]
    code = main([a.replace("{out}", str(tmp_path)) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("trainmath: error:") and "Traceback" not in err, err
    assert needle in err, err
    assert list(tmp_path.iterdir()) == []


def test_flops_and_estimate_agree_on_gpt2_positions(capsys):
    """The oracle of the shared rule: at GPT-2's 1024 positions every command runs; at 1025 each refuses."""
    for seq, code in (("1024", 0), ("1025", 2)):
        assert main(["flops", "gpt2", "--batch", "1", "--seq", seq, "--json"]) == code
        assert main(["estimate", "gpt2", "--gpus", "8", "--gpu", "h100", "--seq", seq, "--global-batch", "8",
                     "--json"]) == code
        capsys.readouterr()


def test_token_budgets_within_bounds_are_exact(capsys):
    """A budget written as digits is exact (not rounded through a float), and 1e18 is the largest accepted."""
    big = "123456789012345678"
    assert main([*EST, "--tokens", big, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"]["tokens"] == int(big)
    assert main(["flops", "Qwen/Qwen3-0.6B", "--batch", "1", "--seq", "128", "--tokens", "1e18", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["budget"]["tokens"] == 10**18


@pytest.mark.parametrize("group", [-5, 0, -2, True, 10**50])
def test_gptq_group_size_must_be_positive_or_minus_one(group, tmp_path, capsys):
    config = {k: v for k, v in catalog_entry("Qwen/Qwen3-0.6B").config.items() if k != "_source"}
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = main(["infer", str(path), "--batch", "1", "--context", "128"])
    err = capsys.readouterr().err
    assert code == 2 and "group_size" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("group", [-1, 128])
def test_gptq_group_sizes_that_exist_still_load(group, tmp_path, capsys):
    config = {k: v for k, v in catalog_entry("Qwen/Qwen3-0.6B").config.items() if k != "_source"}
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["infer", str(path), "--batch", "1", "--context", "128", "--json"]) == 0, capsys.readouterr().err
