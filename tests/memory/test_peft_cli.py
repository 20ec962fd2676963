"""``trainmath memory --peft`` and ``flops --peft``: figures that follow from the rules, and bad input as one line,
exit 2."""

import json

import pytest

from trainmath.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_memory_json_states_the_job(capsys):
    code, out, _ = _run(capsys, "memory", "meta-llama/Llama-3.1-8B", "--micro-batch", "1", "--seq", "1024",
                        "--precision", "bf16", "--peft", "lora", "--lora-rank", "16", "--lora-targets",
                        "all-linear", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["peft"]["trainable_params"] == 41_943_040
    # no gradients or optimizer states for the frozen base: adapters only (fp32 grads, AdamW's two fp32 states)
    assert d["peft"]["adapter_weight_bytes"] == 41_943_040 * 4
    assert any(c.startswith("peft lora") for c in d["conventions"])


def test_qlora_is_smaller_than_lora(capsys):
    args = ("memory", "meta-llama/Llama-3.1-8B", "--micro-batch", "1", "--seq", "1024", "--precision", "bf16",
            "--lora-rank", "16", "--json")
    lora = json.loads(_run(capsys, *args, "--peft", "lora")[1])
    qlora = json.loads(_run(capsys, *args, "--peft", "qlora")[1])
    assert qlora["peft"]["base_weight_bytes"] < 0.4 * lora["peft"]["base_weight_bytes"]
    assert qlora["peak_bytes"] < lora["peak_bytes"]


def test_fsdp2_shards_the_frozen_base(capsys):
    """--zero 3 --dp 8: the rank holds an eighth of the frozen base (padded dim-0 shards), and its peak is lower."""
    args = ("memory", "meta-llama/Llama-3.1-8B", "--micro-batch", "1", "--seq", "4096", "--precision", "bf16",
            "--peft", "lora", "--lora-rank", "16", "--lora-targets", "all-linear", "--json")
    one = json.loads(_run(capsys, *args)[1])
    eight = json.loads(_run(capsys, *args, "--dp", "8", "--zero", "3")[1])
    assert eight["peft"]["trainable_params"] == one["peft"]["trainable_params"]
    assert one["peft"]["base_weight_bytes"] // 8 <= eight["peft"]["base_weight_bytes"]
    assert eight["peft"]["base_weight_bytes"] < one["peft"]["base_weight_bytes"] // 8 + 2**20
    assert eight["peak_bytes"] < one["peak_bytes"]


@pytest.mark.parametrize("argv,needle", [
    (("--peft", "lora", "--lora-rank", "0"), "--lora-rank 0"),
    (("--peft", "qlora", "--precision", "fp8"), "--precision bf16"),
    (("--peft", "qlora", "--precision", "bf16", "--zero", "3", "--dp", "2"), "Params4bit"),
    (("--peft", "lora", "--tp", "2"), "--tp"),
    (("--peft", "lora", "--lora-targets", "qkv"), "no such Linear module"),
    (("--lora-dropout", "0.1"), "needs --peft"),
    (("--peft", "lora", "--paged-optimizer"), "--paged-optimizer needs"),
    (("--peft", "lora", "--lora-dropout", "1.5"), "--lora-dropout"),
])
def test_bad_input_one_line(capsys, argv, needle):
    code, out, err = _run(capsys, "memory", "meta-llama/Llama-3.1-8B", "--micro-batch", "1", "--seq", "512", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("trainmath: error:") and needle in err


def test_flops_bad_input(capsys):
    code, _, err = _run(capsys, "flops", "Qwen/Qwen3-8B", "--seq", "512", "--input-grads", "on")
    assert code == 2 and "needs --peft" in err and err.count("\n") == 1


def test_levers_one_reason_one_line(capsys):
    """When nothing fits, the levers a fine-tune cannot build are listed once per reason, each naming all of
    the levers it stops (three ZeRO-3 layouts, one line), in the levers' order."""
    code, out, _ = _run(capsys, "memory", "meta-llama/Llama-3.1-70B", "--micro-batch", "1", "--seq", "4096",
                        "--precision", "bf16", "--peft", "qlora", "--lora-rank", "16", "--lora-targets",
                        "all-linear", "--recompute", "full", "--gpu", "l40s")
    assert code == 0
    assert "does NOT fit L40S" in out
    unbuilt = [ln for ln in out.splitlines() if "cannot be built here" in ln]
    zero3 = [ln for ln in unbuilt if "Params4bit" in ln]
    assert len(zero3) == 1 and all(f"--dp {n} --zero 3" in zero3[0] for n in (2, 4, 8))
    assert len(unbuilt) == len({ln.split(": cannot be built here: ")[1] for ln in unbuilt})
    built = [ln for ln in out.splitlines() if "-> does not fit" in ln or "-> fits" in ln]
    assert built and out.index(built[0]) < out.index(unbuilt[0])
