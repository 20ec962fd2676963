"""The built wheel, not the editable install the other tests use: every data file ships, and the README's first
command works from a fresh virtual environment that has nothing but the wheel (the calculator needs no
dependency). An editable install reads data files from src/, so only this test can see a packaging miss."""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIRST_COMMAND = re.findall(r"```sh\n(.+?)\n```", README)[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    # Build from a copy of the sources alone: a build/ or *.egg-info/ left in the checkout by an earlier build
    # would lend the wheel files that the package data rules miss.
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(tree)],
                   check=True, capture_output=True, timeout=240)
    (whl,) = out.glob("trainmath-*.whl")
    return whl


def test_every_data_file_is_in_the_wheel(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    src = ROOT / "src"
    data = [p.relative_to(src).as_posix() for p in (src / "trainmath").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "no data files found under src/trainmath"
    assert [d for d in data if d not in names] == []


def test_readme_first_command_from_the_wheel_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bindir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    subprocess.run([str(bindir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, env=env, timeout=240)
    install, command = (part.strip() for part in FIRST_COMMAND.split("&&"))
    assert install == "pip install ."  # the README installs the project itself, as the wheel here
    # Run from an empty folder so that nothing of the source tree can be imported instead of the wheel.
    done = subprocess.run(shlex.split(command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "32,762,123,264" in done.stdout
    where = subprocess.run([str(bindir / "python"), "-c", "import trainmath; print(trainmath.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60).stdout
    assert str(venv) in where
