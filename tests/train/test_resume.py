"""Stop after step 2, resume in a new launch: steps 3-4 are bitwise the uninterrupted run's; on another number of
ranks (where the strategy allows) within the equivalence tolerance; a half-written checkpoint is ignored."""

import os

import pytest

from tests.train.runs import STRATEGIES, cached, losses, run
from trainmath.errors import TrainmathError
from trainmath.runtime.train import checkpoint


@pytest.mark.parametrize("strategy,impl", STRATEGIES)
def test_resume_is_bitwise(tmp_path, strategy, impl):
    full = losses(cached(2, strategy=strategy, impl=impl))  # measuring a step does not change its arithmetic
    d = str(tmp_path / "ck")
    first = losses(run(2, strategy=strategy, impl=impl, checkpoint_dir=d, stop_after=2))
    assert first == full[:2]
    assert sorted(os.listdir(d)) == ["step-000002"]
    rest = losses(run(2, strategy=strategy, impl=impl, checkpoint_dir=d, resume=True))
    assert rest == full[2:]  # bitwise


@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero3", "torch"), ("zero2", "trainmath"),
                                           ("zero3", "trainmath")])
def test_resume_on_four_ranks_from_two(tmp_path, strategy, impl):
    d = str(tmp_path / "ck")
    full = losses(cached(4, strategy=strategy, impl=impl))
    run(2, strategy=strategy, impl=impl, checkpoint_dir=d, stop_after=2)
    rest = losses(run(4, strategy=strategy, impl=impl, checkpoint_dir=d, resume=True))
    assert max(abs(a - b) for a, b in zip(rest, full[2:])) <= 1e-5


def test_zero_redundancy_optimizer_resumes_on_the_same_world_size_only(tmp_path):
    d = str(tmp_path / "ck")
    run(2, strategy="zero1", impl="torch", checkpoint_dir=d, stop_after=2)
    with pytest.raises(TrainmathError, match=r"ZeroRedundancyOptimizer keeps each rank's own partition"):
        run(4, strategy="zero1", impl="torch", checkpoint_dir=d, resume=True)


def test_half_written_checkpoint_is_ignored(tmp_path):
    d = str(tmp_path / "ck")
    run(2, strategy="zero3", impl="trainmath", checkpoint_dir=d, checkpoint_every=1, stop_after=2)
    assert checkpoint.latest(d).endswith("step-000002")
    os.makedirs(os.path.join(d, "step-000003.tmp"))  # a run killed while saving step 3
    assert checkpoint.latest(d).endswith("step-000002")
    assert sorted(os.listdir(d)) == ["step-000001", "step-000002", "step-000003.tmp"]
