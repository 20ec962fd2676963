"""``trainmath train`` and ``trainmath verify`` from the command line: output, bad input (one line, exit 2), text
data, and one run through real torchrun."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from tests.train.runs import GLOBAL_BATCH, SEQ, SHRINK
from trainmath.cli import main

TINY = ["Qwen/Qwen3-0.6B", *[a for k, v in SHRINK.items() for a in (f"--{k.replace('_', '-')}", str(v))],
        "--seq", str(SEQ), "--global-batch", str(GLOBAL_BATCH)]


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_train_json_one_object_per_step(capfd):
    assert main(["train", *TINY, "--nproc", "2", "--strategy", "zero2", "--impl", "trainmath", "--steps", "3",
                 "--json"]) == 0
    records = _json_lines(capfd.readouterr().out)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["tokens"] == GLOBAL_BATCH * SEQ and r["tokens_per_s"] > 0 and r["loss"] > 0 for r in records)


def test_train_progress_lines(capfd):
    assert main(["train", *TINY, "--nproc", "2", "--steps", "2"]) == 0
    out = capfd.readouterr().out.splitlines()
    assert out[0].startswith("step    1  loss ") and "tok/s" in out[0]
    assert out[-1].startswith("trained Qwen/Qwen3-0.6B (layers=2") and "2 step(s)" in out[-1]


def test_text_file_through_the_byte_tokenizer(tmp_path, capfd):
    text = tmp_path / "tiny.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    args = [a if a != "67" else "256" for a in TINY]  # bytes need a 256-token vocabulary
    assert main(["train", *args, "--nproc", "2", "--data", str(text), "--steps", "2", "--json"]) == 0
    assert len(_json_lines(capfd.readouterr().out)) == 2


@pytest.mark.parametrize("extra,message", [
    (["--nproc", "3"], "--global-batch 4 is not divisible by world size × grad-accum = 3 × 1 = 3"),
    (["--data", "/nonexistent/corpus.txt"], "--data '/nonexistent/corpus.txt': no such file"),
    (["--data", "DIR"], "no such file (pass a text file or 'synthetic')"),
    (["--precision", "mixed-bf16"], "--precision mixed-bf16 (fp32 master weights, bf16 compute) is built on FSDP2"),
    (["--strategy", "ddp", "--impl", "trainmath"], "--strategy ddp has --impl torch only"),
    (["--resume"], "--resume and --checkpoint-every need --checkpoint-dir"),
    (["--kv-heads", "3"], "--kv-heads (3) must divide --heads (4)"),
])
def test_bad_input_is_one_line_exit_2(extra, message, capfd, tmp_path):
    extra = [str(tmp_path) if a == "DIR" else a for a in extra]
    assert main(["train", *TINY, *extra]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainmath: error: ") and message in err[0]


def test_model_that_cannot_fit(capfd):
    assert main(["train", "Qwen/Qwen3-235B-A22B", "--nproc", "2", "--seq", "16"]) == 2
    err = capfd.readouterr().err
    assert err.startswith("trainmath: error: Qwen/Qwen3-235B-A22B does not fit: the calculator's peak is ")
    assert err.count("\n") == 1


def test_experts_on_a_dense_model(capfd):
    assert main(["train", *TINY, "--experts", "4"]) == 2
    assert "--experts: Qwen/Qwen3-0.6B is not a mixture-of-experts model" in capfd.readouterr().err


def test_short_data_file(tmp_path, capfd):
    f = tmp_path / "short.txt"
    f.write_text("abc")
    args = [a if a != "67" else "256" for a in TINY]
    assert main(["train", *args, "--data", str(f), "--nproc", "2"]) == 2
    assert "holds 3 bytes; --seq 16 needs at least 17" in capfd.readouterr().err


def test_port_in_use(capfd):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        assert main(["train", *TINY, "--nproc", "2", "--master-port", str(port)]) == 2
    finally:
        s.close()
    assert f"port {port} on 127.0.0.1 is already in use" in capfd.readouterr().err


def test_verify_json_every_field_within_tolerance(capfd):
    assert main(["verify", *TINY, "--nproc", "2", "--strategy", "zero3", "--impl", "trainmath", "--json"]) == 0
    out = capfd.readouterr().out
    report = json.loads(out[out.index("{\n"):])
    names = [f["name"] for f in report["fields"]]
    assert {"weights_bytes (rank 1)", "gradients_bytes (rank 0)", "optimizer_states_bytes (rank 1)",
            "gemm_flops (rank 0)", "peak_bytes (rank 1)"} <= set(names)
    assert all(set(f) >= {"name", "predicted", "measured", "rel_error", "tolerance", "ok"} for f in report["fields"])
    assert all(f["ok"] for f in report["fields"])


def test_verify_exits_1_when_a_field_is_off(capfd, monkeypatch):
    """FSDP2's ZeRO-2 (``memory/fsdp2.py``, reshard_after_forward=False) agrees in every field, its weight shards
    included; its peak is 600 bytes off (0.02%), so a zero peak tolerance puts the peaks outside: exit 1."""
    from trainmath.verify import train as verify

    assert main(["verify", *TINY, "--nproc", "2", "--strategy", "zero2", "--impl", "torch"]) == 0
    capfd.readouterr()
    monkeypatch.setitem(verify.PEAK_TOLERANCE, "fsdp2_gloo", 0.0)
    assert main(["verify", *TINY, "--nproc", "2", "--strategy", "zero2", "--impl", "torch"]) == 1
    out = capfd.readouterr().out
    assert "outside: peak_bytes (rank 0), peak_bytes (rank 1)" in out


@pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "torchrun")), reason="torchrun is part of torch")
def test_real_torchrun_end_to_end(capfd, tmp_path):
    """The same command under torchrun: each process it starts is one rank; the losses equal our launcher's."""
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    args = [*TINY, "--strategy", "zero3", "--impl", "trainmath", "--steps", "3", "--json"]
    # TMPDIR: torchrun keeps its torchelastic_* log folder there after the job
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([os.path.abspath("src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "trainmath", "train", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0 and "Signal 6 (SIGABRT)" in proc.stderr:
        # Once in a CI run on 2 loaded cores a torchrun rank aborted in C++ (SIGABRT, no Python traceback); not
        # reproduced in 60 runs since (15 alone, 45 three at a time). Ranks now meet at a barrier before tearing
        # down (runtime.launch._teardown), the window a gloo peer-closed abort needs; one retry for that signature.
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = _json_lines(proc.stdout)
    assert main(["train", *args, "--nproc", "2"]) == 0
    ours = _json_lines(capfd.readouterr().out)
    assert [r["step"] for r in theirs] == [1, 2, 3]
    assert [r["loss"] for r in theirs] == [r["loss"] for r in ours]
