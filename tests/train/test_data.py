"""Each rank reads its own shard of the step: on any world size the step's samples are the same set."""

import pytest
import torch

from trainmath.runtime.train.data import TokenSource


@pytest.mark.parametrize("world,accum", [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_shards_partition_the_step(world, accum):
    src = TokenSource("synthetic", vocab=67, seq=8, seed=3)
    batch = 4 // (world * accum)
    for step in range(3):
        got = torch.cat([src.micro_batch(step * 4, m, rank=r, world_size=world, batch=batch)
                         for r in range(world) for m in range(accum)])
        want = torch.stack([src.sample(step * 4 + i) for i in range(4)])
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))


def test_synthetic_samples_are_learnable_sequences():
    s = TokenSource("synthetic", vocab=67, seq=8, seed=0).sample(5)
    d = (s[1] - s[0]) % 67
    assert 1 <= d <= 7 and torch.equal((s[1:] - s[:-1]) % 67, torch.full((7,), int(d)))


def test_text_file_bytes_are_tokens(tmp_path):
    f = tmp_path / "t.txt"
    f.write_bytes(b"abcdefghij" * 3)
    src = TokenSource(str(f), vocab=256, seq=4, seed=0)
    assert src.sample(0).tolist() == list(b"abcd") and src.sample(1).tolist() == list(b"efgh")
