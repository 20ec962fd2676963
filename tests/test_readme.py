"""The README's examples run, and CI runs the README's test command: they cannot drift."""

import pathlib
import re
import shlex

import pytest

from trainmath.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EXAMPLES = [line[2:].strip() for line in README.splitlines() if line.startswith("$ trainmath ")]
SETUP = re.findall(r"```sh\n(.+?)\n```", README)


def test_readme_has_exactly_two_setup_commands():
    assert len(SETUP) == 2
    assert "trainmath " in SETUP[0] and "pytest" in SETUP[1]


def test_ci_runs_both_readme_setup_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    assert SETUP[0] in ci  # the plain, non-editable install and the main job
    assert SETUP[1] in ci


@pytest.mark.parametrize("command", EXAMPLES)
def test_readme_example_runs(command, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    argv = shlex.split(command)[1:]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip()


def test_main_job_command_runs(capsys):
    argv = shlex.split(SETUP[0].split("&&")[1])[1:]
    assert main(argv) == 0
    assert "32,762,123,264" in capsys.readouterr().out
