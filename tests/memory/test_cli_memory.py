"""``trainmath memory``: JSON keys, one-line errors with exit 2, and a calculator that never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import standin
from trainmath.cli import main
from trainmath.memory import training


@pytest.fixture(autouse=True)
def _standin(monkeypatch):
    monkeypatch.setattr(training, "activations", standin)


def run(capsys, *argv):
    code = main(["memory", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_json_keys(capsys):
    code, out, _ = run(capsys, "qwen3-8b", "--micro-batch", "1", "--seq", "4096", "--dp", "4", "--tp", "2",
                       "--pp", "2", "--zero", "1", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["peak_bytes"] == sum(d["breakdown"].values())
    assert "activations_bytes" in d["breakdown"] and d["layout"]["world_size"] == 16
    assert {s["stage"] for s in d["stages"]} == {0, 1}
    assert d["outside_peak"] == {"cuda_context_bytes": None, "allocator_cached_free_bytes": None}


def test_table(capsys):
    code, out, _ = run(capsys, "qwen3-30b-a3b", "--micro-batch", "1", "--seq", "2048", "--dp", "8", "--ep", "8",
                       "--zero", "3", "--optimizer", "adam8bit")
    assert code == 0 and "peak_bytes" in out and "GiB (2**30)" in out


@pytest.mark.parametrize("argv, message", [
    (["--micro-batch", "0", "--seq", "8"], "micro-batch must be a positive integer, got 0"),
    (["--micro-batch", "1", "--seq", "-5"], "seq must be a positive integer, got -5"),
    (["--micro-batch", "1", "--seq", "8", "--tp", "3"],
     "tp (3) must divide attention heads (32); tp (3) must divide KV heads (8)"),
    (["--micro-batch", "1", "--seq", "4097", "--cp", "2", "--profile", "megatron"],
     "--seq (4097) must be a multiple of --cp (2): context parallelism gives every rank an equal slice of the "
     "sequence; pass --seq 4096"),
    (["--micro-batch", "1", "--seq", "8", "--world-size", "12", "--tp", "8"],
     "--world-size (12) must be a positive multiple of tp·pp·cp (8·1·1 = 8) to derive --dp"),
    (["--micro-batch", "1", "--seq", "8", "--dp", "2", "--offload", "params"], "--offload params needs --zero 3"),
    (["--micro-batch", "1", "--seq", "8", "--dp", "2", "--world-size", "3"],
     "world size (3) must equal dp·tp·pp·cp = 2·1·1·1 = 2"),
    (["--micro-batch", "1", "--seq", "8", "--pp", "64"], "pp (64) must not exceed the number of layers (36)"),
    (["--micro-batch", "1", "--seq", "8", "--dp", "2", "--ep", "2"], "has no routed experts"),
])
def test_bad_input_one_line_exit_2(capsys, argv, message):
    code, out, err = run(capsys, "qwen3-8b", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_calculator_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import trainmath.layout, trainmath.placement, trainmath.memory.training, trainmath.memory.optimizers\n"
            "import trainmath.memory.timeline, trainmath.memory.fit, trainmath.verify.simulate\n"
            "import trainmath.cli.memory\n")
    subprocess.run([sys.executable, "-c", code], check=True)
