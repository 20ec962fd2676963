"""A rank that dies or stalls mid-training: the others stop within the timeout, the error names it, and the last
complete checkpoint still resumes to the uninterrupted run's losses."""

import os
import time

import pytest

from tests.train.runs import cached, losses, run
from trainmath.errors import TrainmathError
from trainmath.runtime.train import checkpoint
from trainmath.runtime.train.data import TokenSource

pytestmark = pytest.mark.timeout(120)


def _fault_at_step_3(monkeypatch, action):
    real = TokenSource.micro_batch

    def faulty(self, step_start, micro, *, rank, **kw):
        if step_start == 2 * 4 and rank == 1:  # the third step's first sample: 2 steps × 4 sequences
            action()
        return real(self, step_start, micro, rank=rank, **kw)

    monkeypatch.setattr(TokenSource, "micro_batch", faulty)  # before the fork: the ranks inherit it


def test_dead_rank_is_named_and_the_last_checkpoint_resumes(tmp_path, monkeypatch):
    d = str(tmp_path / "ck")
    _fault_at_step_3(monkeypatch, lambda: os._exit(3))
    t = time.monotonic()
    with pytest.raises(TrainmathError, match=r"^rank 1 exited with code 3"):
        run(2, timeout_s=10, strategy="zero3", impl="trainmath", checkpoint_dir=d, checkpoint_every=1)
    assert time.monotonic() - t < 30
    assert checkpoint.latest(d).endswith("step-000002")
    monkeypatch.undo()
    rest = losses(run(2, strategy="zero3", impl="trainmath", checkpoint_dir=d, resume=True))
    assert rest == losses(cached(2, strategy="zero3", impl="trainmath"))[2:]


def test_stalled_rank_is_named_within_the_timeout(monkeypatch):
    _fault_at_step_3(monkeypatch, lambda: time.sleep(120))
    t = time.monotonic()
    with pytest.raises(TrainmathError, match=r"^rank 1 stalled"):
        run(2, timeout_s=3, strategy="ddp", impl="torch")
    assert time.monotonic() - t < 30
