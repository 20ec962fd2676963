"""The flat rank-major layout of our ZeRO: chunks are torch.chunk's rows (FSDP2's Shard(0)), padded to ⌈d/n⌉,
and pack → (sum over ranks) → shard r is exactly chunk r of every parameter."""

import pytest
import torch

from trainmath.runtime.train.flat import FlatLayout, alloc_storage, free_storage


def _named(shapes):
    g = torch.Generator().manual_seed(0)
    return [(f"p{i}", torch.nn.Parameter(torch.randn(s, generator=g))) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_layout_matches_torch_chunk_and_round_trips(n):
    named = _named([(7, 3), (5,), (2, 4), (1, 6)])
    for r in range(n):
        L = FlatLayout(named, n, r)
        assert L.shard_numel == sum(-(-p.shape[0] // n) * (p.numel() // p.shape[0]) for _, p in named)
        shard = L.take_own([p.detach() for _, p in named], L.new_shard())
        for i, (_, p) in enumerate(named):
            chunks = torch.chunk(p.detach(), n)  # may be fewer than n: trailing ranks hold 0 rows
            want = chunks[r] if r < len(chunks) else p.detach()[:0]
            assert torch.equal(L.chunk(shard, i).view(-1, *p.shape[1:]), want)
        buffer = L.pack([p.detach() for _, p in named], L.new_buffer())
        assert torch.equal(buffer[r], shard)
        out = [torch.zeros_like(p) for _, p in named]
        L.unpack(buffer, out)
        assert all(torch.equal(a, p.detach()) for a, (_, p) in zip(out, named))


def test_free_and_alloc_keep_the_tensor():
    t = torch.ones(10)
    free_storage(t)
    assert t.untyped_storage().nbytes() == 0 and t.shape == (10,)
    alloc_storage(t)
    t.fill_(2.0)
    assert t.untyped_storage().nbytes() == 40 and t.sum().item() == 20.0
