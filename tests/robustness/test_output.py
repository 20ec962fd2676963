"""Output rough edges of issue 8 item 7: help names the blog series, tables have headers and exact integers,
sources are not cut, errors speak in flags."""

from __future__ import annotations

import argparse
import json
import re

import pytest

from trainmath.cli import build_parser, main
from trainmath.sources import catalog_entry, catalog_index


def _helps(parser: argparse.ArgumentParser, path: str):
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _helps(sub, f"{path} {name}")


def test_no_help_text_says_the_seed():
    helps = list(_helps(build_parser(), "trainmath"))
    assert len(helps) >= 12
    for path, text in helps:
        # the blog series is named, never "the seed" (an RNG seed, "--seed N", is another matter)
        assert not re.search(r"\b(the|a) seed\b|\bseed's\b|\(seed\b", text, re.IGNORECASE), path


def test_explain_names_the_blog_series(capsys):
    assert main(["params", "Qwen/Qwen3-235B-A22B", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "Jiang Yi's blog series on distributed training" in out and "seed" not in out


def _table(text: str, first_header: str) -> list[list[str]]:
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(first_header))
    rows = []
    for line in lines[i:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_flops_tables_have_a_header_on_every_column_and_exact_integers(capsys):
    assert main(["flops", "Qwen/Qwen3-8B", "--seq", "4096"]) == 0
    out = capsys.readouterr().out
    per = _table(out, "FLOPs ")
    assert per[0] == ["FLOPs", "per step", "per sequence", "per token", "per step (SI)"]
    assert main(["flops", "Qwen/Qwen3-8B", "--seq", "4096", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    training = [r for r in per if r[0] == "training"][0]
    # per token: the exact integer, not 52,656,340,992.0
    assert training[3] == f"{data['training_flops'] // 4096:,}" and data["training_flops"] % 4096 == 0
    assert "." not in training[3]
    comps = _table(out, "component ")
    assert comps[0] == ["component", "forward", "backward", "recompute", "step", "share", "note"]


def test_params_table_has_a_header_on_every_column(capsys):
    assert main(["params", "qwen3-8b"]) == 0
    assert _table(capsys.readouterr().out, "component ")[0] == ["component", "params", "≈", "share", "note"]


def test_models_sources_are_whole(capsys):
    assert main(["models", "--sources"]) == 0
    out = capsys.readouterr().out
    longest = max((catalog_entry(r).provenance for r in catalog_index()), key=len)
    assert len(longest) > 100 and longest in out


@pytest.mark.parametrize("argv, flag", [
    (["flops", "qwen3-8b", "--seq", "x"], "--seq"),
    (["comm", "demo", "all_reduce", "--timeout", "nan"], "--timeout"),
])
def test_usage_errors_are_one_line_naming_the_flag(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trainmath: error: ") and f"argument {flag}" in err
