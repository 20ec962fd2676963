"""The corpus cases that need a real process: a FIFO that would block, torch not installed, signals to a
launcher, a node that vanishes from a two-launcher job. Each asserts one line, the exit code, the time, and
that no worker or rank log folder is left behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = pytest.mark.timeout(120)

TORCH_BLOCKED = "import sys; sys.modules['torch'] = None; from trainmath.cli import main; sys.exit(main(sys.argv[1:]))"


def _trainmath(*args, env=None, timeout=30):
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "trainmath", *args], capture_output=True, text=True,
                         timeout=timeout, env=env)
    return out, time.monotonic() - t


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainmath: error: "), stderr[-2000:]
    assert "Traceback" not in stderr
    return lines[0]


def test_fifo_named_safetensors_is_refused_not_opened(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors")
    for target in (str(tmp_path), str(tmp_path / "model.safetensors")):
        out, elapsed = _trainmath("check-checkpoint", target, "--config", "qwen3-0.6b", timeout=20)
        assert out.returncode == 2 and out.stdout == ""
        line = _one_error_line(out.stderr)
        assert "model.safetensors" in line and ("FIFO" in line or "not a regular file" in line)
        assert elapsed < 5


def test_fifo_index_is_refused(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors.index.json")
    out, elapsed = _trainmath("check-checkpoint", str(tmp_path), "--config", "qwen3-0.6b", timeout=20)
    assert out.returncode == 2 and "is a FIFO, not a regular file" in _one_error_line(out.stderr)
    assert elapsed < 5


@pytest.mark.parametrize("argv", [["comm", "demo", "all_reduce"], ["comm", "bench"], ["comm", "check"],
                                  ["comm", "demo", "barrier", "--nproc", "2"]])
def test_runtime_without_torch_says_how_to_install(argv):
    out = subprocess.run([sys.executable, "-c", TORCH_BLOCKED, *argv], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stdout == ""
    assert _one_error_line(out.stderr) == 'trainmath: error: this command needs torch: pip install "trainmath[runtime]"'


def test_demo_list_and_layout_need_no_torch():
    out = subprocess.run([sys.executable, "-c", TORCH_BLOCKED, "comm", "demo", "--list"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.splitlines()[0].startswith("send_recv") and len(out.stdout.splitlines()) == 12
    out = subprocess.run([sys.executable, "-c", TORCH_BLOCKED, "comm", "layout"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0 and "world size 8" in out.stdout


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_signal_to_a_launcher_is_forwarded_and_cleaned_up(sig, code, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "trainmath", "comm", "demo", "barrier", "--nproc", "3",
                          "--sleep", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while len(_children(p.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = _children(p.pid)
    assert len(workers) == 3 and any(n.startswith("trainmath-ranks-") for n in os.listdir(tmp_path))
    time.sleep(0.5)
    t = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert time.monotonic() - t < 8
    assert p.returncode == code, err
    line = _one_error_line(err)
    assert f"stopped by {signal.Signals(sig).name}" in line and "ranks 0, 1, 2" in line
    assert "KeyboardInterrupt" not in err and out == ""
    assert not [w for w in workers if _alive(w)]
    assert not [n for n in os.listdir(tmp_path) if n.startswith("trainmath-ranks-")]


def test_runs_leave_nothing_in_tmpdir(tmp_path, capsys, monkeypatch):
    """A launcher's rank-log folder lives in $TMPDIR only while its job runs: removed after a success and after a
    failure; on failure with --keep-logs it is kept, and its path printed."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out, _ = _trainmath("comm", "demo", "all_reduce", "--nproc", "2", env={**os.environ, "TMPDIR": str(tmp)},
                        timeout=90)
    assert out.returncode == 0, out.stderr
    assert os.listdir(tmp) == []
    from trainmath.cli import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # the launcher's mkdtemp, in this process
    stall = ["comm", "demo", "barrier", "--nproc", "2", "--sleep", "1", "--timeout", "0.3"]  # rank 1 arrives late
    assert main(stall) == 2
    assert "lost its peers" in capsys.readouterr().err
    assert os.listdir(tmp) == []
    assert main([*stall, "--keep-logs"]) == 2
    kept = [line.split(" in ", 1)[1] for line in capsys.readouterr().err.splitlines()
            if line.startswith("trainmath: rank logs kept in ")]
    assert len(kept) == 1 and os.listdir(tmp) == [os.path.basename(kept[0])]
    assert sorted(os.listdir(kept[0])) == ["rank0.log", "rank1.log"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("victim", [1, 0])
def test_a_vanished_node_is_named_by_the_survivor(victim, tmp_path):
    """Two launchers; the victim's whole process group is SIGKILLed mid-run (its machine went away): the survivor
    names the victim's node and ranks, not its own healthy ranks."""
    port = str(_free_port())
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    common = ["demo", "barrier", "--sleep", "4", "--nproc", "2", "--nnodes", "2", "--master-port", port]
    procs = {k: subprocess.Popen([sys.executable, "-m", "trainmath", "comm", *common, "--node-rank", str(k)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                 start_new_session=True) for k in (0, 1)}
    deadline = time.monotonic() + 60
    while (any(len(_children(p.pid)) < 3 for p in procs.values()) and time.monotonic() < deadline):
        time.sleep(0.1)  # two ranks and the heartbeat helper each
    time.sleep(2.0)  # in the barrier: rank 3 sleeps 12 s
    os.killpg(procs[victim].pid, signal.SIGKILL)
    t = time.monotonic()
    survivor = procs[1 - victim]
    out, err = survivor.communicate(timeout=60)
    procs[victim].communicate(timeout=10)
    assert time.monotonic() - t < 20  # ~3 s alone (2 s grace + heartbeat silence); CI shares two cores
    assert survivor.returncode == 2
    line = _one_error_line(err)
    ranks = "2, 3" if victim == 1 else "0, 1"
    assert f"node {victim}" in line and f"ranks {ranks} vanished" in line, line
    assert "stalled" not in line


@pytest.mark.parametrize("case_id", ["params-deep_value", "infer-sliding_neg", "flops---seq-giant",
                                     "comm-demo-timeout-nan", "plot-o-directory", "check-deep_header"])
def test_corpus_sample_through_the_real_entry_point(case_id, tmp_path):
    """The in-process corpus is what `python -m trainmath` does: a sample through the real entry point."""
    from .corpus import CLI_CASES, _config_cases
    from .test_corpus import _files, _materialise

    (argv, code), = [(a, c) for i, a, c, _ in _config_cases() + CLI_CASES if i == case_id]
    argv = _materialise(argv, tmp_path)
    before = _files(tmp_path)
    out, elapsed = _trainmath(*argv, timeout=30)
    assert out.returncode == code and out.stdout == ""
    _one_error_line(out.stderr)
    assert _files(tmp_path) == before and elapsed < 5
