"""`ruff check` (rules and line length 120 from pyproject.toml's [tool.ruff]) passes on src, tests and benchmarks.

The one tolerated file is named in pyproject.toml's per-file-ignores (with its reason)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_ruff_finds_nothing():
    out = _ruff("src", "tests", "benchmarks")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_check_can_fail(tmp_path):
    """The same configuration flags a 121-character line and an unused import (so a pass above means something)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nX = " + repr("x" * 115) + "\n")
    out = _ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    assert out.returncode == 1
    assert "E501" in out.stdout and "F401" in out.stdout
