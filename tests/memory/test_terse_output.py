"""``trainmath memory`` by default: the loop most people write (the logits freed before backward), the non-zero
terms and the loop's convention only; ``--explain`` every term and convention; readable FLOP units."""

from __future__ import annotations

import json

import pytest

from trainmath.cli import main
from trainmath.render import human_flops

ARGS = ["memory", "Qwen/Qwen3-8B", "--micro-batch", "1", "--seq", "4096"]


def run(capsys, *extra):
    code = main([*ARGS, *extra])
    out = capsys.readouterr().out
    assert code == 0
    return out


def test_default_loop_frees_the_logits_and_names_the_other(capsys):
    """The default is ``loss = model(...).loss``: its peak equals ``--loop-keeps loss``'s and sits below
    ``output``'s at the loss's backward by exactly the bf16 logits (b·s·V·2 bytes) the output loop holds."""
    default = json.loads(run(capsys, "--json"))
    loss = json.loads(run(capsys, "--json", "--loop-keeps", "loss"))
    output = json.loads(run(capsys, "--json", "--loop-keeps", "output"))
    assert default["peak_bytes"] == loss["peak_bytes"]

    def at_loss(d):
        return next(e["bytes"] for e in d["timeline"] if e["event"] == "backward: loss")

    assert at_loss(output) - at_loss(default) == 1 * 4096 * 151936 * 2  # the bf16 logits; both loops hold the loss
    text = run(capsys)
    assert "the loss only (loss = model(...).loss)" in text and "--loop-keeps output" in text


def test_terse_by_default_explain_prints_everything(capsys):
    terse = run(capsys)
    full = run(capsys, "--explain")
    rows = [line for line in terse.splitlines() if line.endswith("%") or "%  " in line]
    assert rows and all(" 0 " not in line.split("GiB")[0] for line in rows)  # no zero term
    assert "zero3_gather_bytes" not in terse and "zero3_gather_bytes" in full
    assert terse.count("convention:") == 1 and full.count("convention:") == len(
        json.loads(run(capsys, "--json"))["conventions"]) > 5
    assert "(1 GPU)" in terse and "GPUs)" not in terse
    assert run(capsys, "--verbose") == full


@pytest.mark.parametrize("n, text", [(2.1767101e23, "217.67 ZFLOP"), (1.84e15, "1.84 PFLOP"), (999, "999 FLOP"),
                                     (3.1e24, "3.10 YFLOP"), (3.1e27, "3.10e+27 FLOP")])
def test_flops_read_in_si_units(n, text):
    assert human_flops(n) == text


def test_flops_budget_line_has_no_thousands_of_exaflops(capsys):
    assert main(["flops", "Qwen/Qwen3-8B", "--batch", "1", "--seq", "4096", "--tokens", "15T"]) == 0
    out = capsys.readouterr().out
    assert "789.85 ZFLOP" in out and "EFLOP;" not in out
