"""The real CLI (`python -m trainmath comm ...`) as a subprocess: output, JSON, errors, two launchers."""

import json
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(120)


def _run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "trainmath", "comm", *args], capture_output=True, text=True,
                          timeout=timeout)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_json_is_the_seed_all_reduce():
    out = _run("demo", "all_reduce", "--nproc", "4", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [r["after"] for r in data["records"]] == [[10.0] * 5] * 4
    assert [r["before"] for r in data["records"]] == [[float(r + 1)] * 5 for r in range(4)]


def test_demo_table_snapshot():
    out = _run("demo", "broadcast", "--nproc", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "broadcast: 3 ranks (1 node(s) x 3, gloo)",
        "rank  node  local  before                after",
        "0     0     0      [1., 2., 3., 4., 5.]  [1., 2., 3., 4., 5.]",
        "1     0     1      [0., 0., 0., 0., 0.]  [1., 2., 3., 4., 5.]",
        "2     0     2      [0., 0., 0., 0., 0.]  [1., 2., 3., 4., 5.]",
    ]


def test_two_launchers_form_one_job():
    port = str(_free_port())
    common = ["demo", "all_reduce", "--nproc", "2", "--nnodes", "2", "--master-addr", "127.0.0.1",
              "--master-port", port, "--json", "--timeout", "30"]
    procs = [subprocess.Popen([sys.executable, "-m", "trainmath", "comm", *common, "--node-rank", str(k)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in (0, 1)]
    outs = [p.communicate(timeout=90) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e
    for o, _ in outs:
        records = json.loads(o)["records"]
        placed = [(r["rank"], r["node"], r["local_rank"]) for r in records]
        assert placed == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
        assert [r["after"] for r in records] == [[10.0] * 5] * 4


def test_bench_json_fields():
    out = _run("bench", "--op", "all_reduce", "--impl", "ring", "--nproc", "2", "--sizes", "64K,256K",
               "--iters", "3", "--warmup", "1", "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [r["size_bytes"] for r in rows] == [65536, 262144]
    for r in rows:
        assert {"op", "impl", "nproc", "backend", "size_bytes", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s",
                "predicted_time_s"} <= set(r)
        assert r["busbw_bytes_per_s"] == pytest.approx(r["algbw_bytes_per_s"])  # 2(n-1)/n = 1 at n = 2
        assert r["predicted_time_s"] > 0
        assert r["segment_bytes"] == 4 << 20


def test_bench_ring_segment_option():
    out = _run("bench", "--op", "reduce_scatter", "--impl", "ring", "--nproc", "2", "--sizes", "256K",
               "--segment", "16K", "--iters", "2", "--warmup", "0", "--json")
    assert out.returncode == 0, out.stderr
    assert [r["segment_bytes"] for r in json.loads(out.stdout)] == [16384]


def test_cli_demo_table_is_the_runtime_table():
    from trainmath.cli.comm import DEMO_INFO
    from trainmath.runtime.demo import DEMOS

    assert DEMO_INFO == {name: (n, text) for name, (_, n, text) in DEMOS.items()}


def test_demo_under_real_torchrun(tmp_path):
    # `python -m torch.distributed.run ... -m trainmath.cli.demo`: the demo runs as torchrun's ranks
    # (TMPDIR: torchrun keeps its torchelastic_* log folder there after the job)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m",
                          "trainmath.cli.demo", "all_reduce"], capture_output=True, text=True, timeout=90,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "all_reduce: 2 ranks (1 node(s) x 2, gloo, reduce op sum)",
        "rank  node  local  before                after",
        "0     0     0      [1., 1., 1., 1., 1.]  [3., 3., 3., 3., 3.]",
        "1     0     1      [2., 2., 2., 2., 2.]  [3., 3., 3., 3., 3.]",
    ]


def test_demo_module_outside_torchrun_is_one_line():
    out = subprocess.run([sys.executable, "-m", "trainmath.cli.demo", "all_reduce"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("trainmath: error: not started by torchrun") and out.stderr.count("\n") == 1


def test_cli_segment_default_is_the_ring_default():
    from trainmath.cli.comm import RING_SEGMENT_DEFAULT
    from trainmath.comm.sizes import parse_size
    from trainmath.runtime.ring import SEGMENT_BYTES

    assert parse_size(RING_SEGMENT_DEFAULT) == SEGMENT_BYTES


def test_bench_with_given_link_predicts_the_formula():
    out = _run("bench", "--op", "all_gather", "--nproc", "2", "--sizes", "1M", "--iters", "2", "--warmup", "0",
               "--alpha-us", "10", "--link-gbps", "1", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert row["predicted_time_s"] == pytest.approx(10e-6 + 0.5 * 2**20 / 1e9)


def test_check_passes():
    out = _run("check", "--nproc", "2", "--only", "native")
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("cases passed on 2 ranks (gloo)")


def test_layout_prints_the_seed_table():
    out = _run("layout", "--nnodes", "2", "--nproc-per-node", "4", "--json")
    data = json.loads(out.stdout)
    assert [(r["process_id"], r["rank"]) for r in data["subgroup"]] == [(0, 0), (2, 1), (4, 2), (6, 3)]


@pytest.mark.parametrize("args,msg", [
    (["demo", "all_reduce", "--nproc", "0"], "argument --nproc/--nproc-per-node: must be an integer in 1..64"),
    (["demo", "nope"], "unknown demo 'nope'"),
    (["demo", "send_recv", "--nproc", "1"], "send_recv needs at least 2 ranks"),
    (["bench", "--sizes", "1Q"], "bad size '1Q'"),
    (["bench", "--op", "broadcast", "--impl", "ring"], "no ring implementation of broadcast"),
    (["bench", "--segment", "1M"], "--segment applies to --impl ring only"),
    (["bench", "--impl", "ring", "--segment", "0"], "--segment must be 1 byte to 4G"),
    (["demo", "all_reduce", "--nnodes", "2"], "--master-port is required"),
])
def test_bad_input_is_one_line(args, msg):
    out = _run(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"trainmath: error: {out.stderr.strip()[len('trainmath: error: '):]}"]
    assert msg in out.stderr


def test_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = _run("demo", "all_reduce", "--nproc", "2", "--master-port", str(port))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip() == (f"trainmath: error: port {port} on 127.0.0.1 is already in use; choose another "
                                  f"--master-port (0 picks a free one)")


def test_missing_master_fails_within_the_timeout():
    # Node 1 with no node 0: one line naming the rank and the master, not a hang.
    out = _run("demo", "all_reduce", "--nproc", "1", "--nnodes", "2", "--node-rank", "1", "--master-port",
               str(_free_port()), "--timeout", "2")
    assert out.returncode == 2
    assert "rank 1: could not reach the master at 127.0.0.1:" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
