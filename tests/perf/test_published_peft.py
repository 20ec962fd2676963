"""The published fine-tune throughputs of tests/perf/published_peft.json (benchmarks/peft_speed.py prints the
comparison): each row names its source at a commit, runs through ``estimate --peft``, and the prediction stays
within a factor of two of the published figure (the benchmark's table in docs/benchmarks.md says how close)."""

import json
import pathlib

import pytest

from trainmath.cli import main

ROWS = json.loads((pathlib.Path(__file__).parent / "published_peft.json").read_text())["runs"]


@pytest.mark.parametrize("run", ROWS, ids=[r["id"] for r in ROWS])
def test_row_is_sourced_and_within_a_factor_of_two(run, capsys):
    assert "@" in run["source"] and run["assumptions"] and run["published"] > 0
    capsys.readouterr()
    assert main(["estimate", run["model"], "--gpu", run["gpu"], *run["argv"], "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["peft"]["method"] == ("qlora" if "qlora" in run["id"] else "lora")
    assert 0.5 < est[run["metric"]] / run["published"] < 2
