"""The dispatcher: --help lists every command with the summary its module registers; one module per run."""

import argparse
import subprocess
import sys
from importlib import import_module

import pytest

from trainmath.cli import COMMANDS, build_parser


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_summary_matches_module(name):
    module, summary = COMMANDS[name]
    sub = argparse.ArgumentParser().add_subparsers()
    import_module(f"trainmath.cli.{module}").register(sub)
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert registered[name] == summary


def test_full_parser_builds():
    assert build_parser() is not None


def test_params_run_imports_no_other_command():
    code = ("import sys; from trainmath.cli import main; main(['params', 'qwen3-0.6b', '--json']); "
            "print(sorted(m for m in sys.modules if m.startswith('trainmath.cli.') and m != 'trainmath.args'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "['trainmath.cli.params']"


def test_top_level_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "trainmath", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout
