"""A rank that dies, stalls or raises fails the job fast with one line naming it; bad input fails early."""

import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.runtime.launch import JobSpec, launch  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _job(ctx, mode):
    x = torch.ones(3) * (ctx.rank + 1)
    if mode == "die" and ctx.rank == 1:
        os._exit(3)
    if mode == "stall" and ctx.rank == 2:
        time.sleep(60)
    if mode == "raise" and ctx.rank == 1:
        raise ValueError("boom")
    dist.all_reduce(x, group=ctx.group)
    return x.tolist()


def test_ok():
    assert launch(JobSpec(nproc_per_node=3, timeout_s=5), _job, "ok") == {r: [6.0] * 3 for r in range(3)}


def test_dead_rank_is_named():
    t = time.monotonic()
    with pytest.raises(TrainmathError, match=r"^rank 1 exited with code 3"):
        launch(JobSpec(nproc_per_node=3, timeout_s=5), _job, "die")
    assert time.monotonic() - t < 10


def test_stalled_rank_is_named_within_the_timeout():
    t = time.monotonic()
    with pytest.raises(TrainmathError, match=r"^rank 2 stalled"):
        launch(JobSpec(nproc_per_node=3, timeout_s=2), _job, "stall")
    assert time.monotonic() - t < 10


def test_raising_rank_is_named():
    with pytest.raises(TrainmathError, match=r"^rank 1 failed: ValueError: boom"):
        launch(JobSpec(nproc_per_node=2, timeout_s=5), _job, "raise")


def _busy(ctx):
    while True:  # no collective: only the job deadline can stop it
        time.sleep(0.05)


def test_deadline_stops_a_job_that_never_communicates():
    with pytest.raises(TrainmathError, match=r"^rank 0, 1 stalled: no result within"):
        launch(JobSpec(nproc_per_node=2, timeout_s=5, deadline_s=1.5), _busy)


def test_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(TrainmathError, match=f"port {port} on 127.0.0.1 is already in use"):
            launch(JobSpec(nproc_per_node=2, master_port=port), _job, "ok")


@pytest.mark.parametrize("kwargs,msg", [
    (dict(nproc_per_node=0), "--nproc must be an integer >= 1"),
    (dict(nproc_per_node=2, nnodes=2, node_rank=2, master_port=29500), "--node-rank must be in 0..1"),
    (dict(nproc_per_node=2, nnodes=2), "--master-port is required"),
    (dict(nproc_per_node=2, backend="mpi"), "unknown backend"),
])
def test_bad_world_is_rejected_before_starting(kwargs, msg):
    with pytest.raises(TrainmathError, match=msg):
        JobSpec(**kwargs)
