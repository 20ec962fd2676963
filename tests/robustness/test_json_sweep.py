"""``--json`` means one JSON document on stdout (``train``: one JSON object per line), for every command that has
the flag: a sweep that reads the commands from the CLI's own parser, runs each on a tiny case, and parses stdout.
Progress (train's and verify's step lines) goes to stderr."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from trainmath.cli import COMMANDS, build_parser, main

_spec = importlib.util.spec_from_file_location("ckpt_build", os.path.join(os.path.dirname(__file__), "..",
                                                                          "checkpoint", "build.py"))
_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_build)
TINY_QWEN3, write_checkpoint = _build.TINY_QWEN3, _build.write_checkpoint

pytestmark = pytest.mark.timeout(300)

TINY = ["Qwen/Qwen3-0.6B", "--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--intermediate",
        "64", "--vocab", "64", "--seq", "8"]
JOB = ["Qwen/Qwen3-0.6B", "--gpus", "8", "--gpu", "h100", "--seq", "1024", "--global-batch", "8"]

# command path → argv after it; run in-process (the calculator) or as a real process (the runtime)
IN_PROCESS = {
    ("params",): ["Qwen/Qwen3-0.6B"],
    ("models",): [],
    ("flops",): ["Qwen/Qwen3-0.6B", "--seq", "128", "--tokens", "1T"],
    ("memory",): ["Qwen/Qwen3-0.6B", "--micro-batch", "1", "--seq", "128"],
    ("infer",): ["Qwen/Qwen3-0.6B", "--batch", "1", "--context", "128"],
    ("check-checkpoint",): ["{ckpt}"],
    ("comm", "layout"): ["--nnodes", "2", "--nproc-per-node", "2"],
    ("estimate",): [*JOB, "--tokens", "1T", "--price-per-gpu-hour", "2"],
    ("plan",): [*JOB, "--explain"],
    ("infer-plan",): ["Qwen/Qwen3-0.6B", "--gpu", "h100", "--qps", "1", "--input", "128", "--output", "32",
                      "--ttft-slo", "1", "--tpot-slo", "0.1", "--gpus-max", "2"],
}
PROCESS = {
    ("comm", "demo"): ["all_reduce", "--nproc", "2", "--sleep", "0"],
    ("comm", "bench"): ["--nproc", "2", "--sizes", "4K", "--iters", "1", "--warmup", "0"],
    ("comm", "check"): ["--nproc", "2", "--only", "native"],
    ("train",): [*TINY, "--nproc", "2", "--steps", "2"],
    ("verify",): [*TINY, "--nproc", "2"],
}
JSON_LINES = {("train",)}


def _json_commands() -> set[tuple[str, ...]]:
    """Every (sub)command whose parser has --json, read from the CLI itself."""
    found = set()

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        for action in parser._actions:
            if "--json" in action.option_strings:
                found.add(path)
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))

    for command in COMMANDS:
        walk(build_parser(command)._subparsers._group_actions[0].choices[command], (command,))
    return found


def test_the_sweep_covers_every_json_command():
    assert _json_commands() == set(IN_PROCESS) | set(PROCESS)


def _parse(stdout: str, lines: bool):
    if lines:
        records = [json.loads(line) for line in stdout.splitlines()]
        assert records and all(isinstance(r, dict) for r in records)
        return records
    return json.loads(stdout)


@pytest.mark.parametrize("command", sorted(IN_PROCESS), ids=" ".join)
def test_calculator_json_is_one_document(command, tmp_path, capsys):
    ckpt = write_checkpoint(tmp_path / "ckpt", TINY_QWEN3, shards=1)
    argv = [a.replace("{ckpt}", str(ckpt)) for a in IN_PROCESS[command]]
    code = main([*command, *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = _parse(out, False)
    assert doc


@pytest.mark.parametrize("command", sorted(PROCESS), ids=" ".join)
def test_runtime_json_is_one_document(command, tmp_path):
    pytest.importorskip("torch")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "trainmath", *command, *PROCESS[command], "--json"],
                          capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode in (0, 1) if command == ("verify",) else proc.returncode == 0, proc.stderr[-2000:]
    doc = _parse(proc.stdout, command in JSON_LINES)
    assert doc
    if command == ("train",):
        assert [r["step"] for r in doc] == [1, 2]
    if command == ("verify",):
        assert "step" in proc.stderr and {"fields", "model"} <= set(doc)  # progress on stderr, the report on stdout
