"""The pure cost model (math twin of the runtime): pinned numbers from the sources, and properties."""

import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainmath.comm import (
    Link,
    all_gather,
    all_reduce,
    broadcast,
    busbw_bytes_per_s,
    busbw_factor,
    chunk_bounds,
    fit_link,
    parse_size,
    parse_size_range,
    reduce_scatter,
    ring_all_gather_schedule,
    ring_all_reduce_bytes_sent_per_rank,
    ring_bytes_sent,
    ring_reduce_scatter_schedule,
)
from trainmath.comm.layout import even_ranks, subgroup_table, world_table
from trainmath.errors import TrainmathError


@pytest.mark.parametrize(
    "op,n,factor",
    [("all_reduce", 8, Fraction(7, 4)), ("all_reduce", 2, Fraction(1)), ("all_gather", 4, Fraction(3, 4)),
     ("reduce_scatter", 8, Fraction(7, 8)), ("broadcast", 8, Fraction(1)), ("reduce", 3, Fraction(1)),
     ("all_to_all", 4, Fraction(3, 4)), ("send_recv", 2, Fraction(1)), ("all_reduce", 1, Fraction(0))],
)
def test_busbw_factors_are_nccl_tests(op, n, factor):
    # nccl-tests PERFORMANCE.md: 2(n-1)/n, (n-1)/n, 1.
    assert busbw_factor(op, n) == factor


def test_busbw_of_a_known_run():
    # 1 GiB all-reduce in 10 ms on 8 ranks: algbw 107.37 GB/s, busbw x 7/4.
    assert busbw_bytes_per_s("all_reduce", 2**30, 0.01, 8) == pytest.approx(2**30 / 0.01 * 7 / 4)


def test_unknown_op_is_one_clear_error():
    with pytest.raises(TrainmathError, match="unknown collective 'allreduce'"):
        busbw_factor("allreduce", 4)


def test_ring_all_reduce_sends_two_n_minus_one_over_n():
    # Patarasuk & Yuan 2009: each rank sends 2(n-1)/n of S.
    assert ring_all_reduce_bytes_sent_per_rank(1024, 4) == 1536
    for rank in range(4):  # the runtime's schedule sends exactly that when n divides the length
        assert ring_bytes_sent("all_reduce", rank, 4, 256, 4) == 1536


@given(n=st.integers(1, 16), length=st.integers(0, 10_000))
def test_chunks_tile_the_buffer_like_tensor_split(n, length):
    bounds = chunk_bounds(length, n)
    assert bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@given(n=st.integers(1, 16), length=st.integers(0, 10_000))
def test_ring_bytes_sent_total_is_exact(n, length):
    # Over all ranks, a reduce-scatter moves every chunk n-1 times: (n-1)·L elements in total.
    total = sum(ring_bytes_sent("reduce_scatter", r, n, length, 1) for r in range(n))
    assert total == (n - 1) * length
    assert sum(ring_bytes_sent("all_reduce", r, n, length, 2) for r in range(n)) == 2 * 2 * (n - 1) * length


@given(n=st.integers(2, 12))
def test_ring_schedule_ends_with_rank_owning_its_chunk(n):
    for r in range(n):
        rs = ring_reduce_scatter_schedule(r, n)
        assert rs[-1][1] == r  # the last chunk reduced is chunk r
        left = ring_reduce_scatter_schedule((r - 1) % n, n)
        assert [s for s, _ in left] == [c for _, c in rs]  # receive what the left neighbour sends
        ag = ring_all_gather_schedule(r, n)
        assert ag[0][0] == r and sorted(c for _, c in ag) == sorted(set(range(n)) - {r})


LINK = Link(alpha_s=10e-6, bandwidth_bytes_per_s=10e9)


def test_alpha_beta_pinned():
    # Thakur et al. 2005: ring all-gather (n-1)α + (n-1)/n·S/B; 8 ranks, 1 GB, 10 µs, 10 GB/s.
    assert all_gather(10**9, 8, LINK) == pytest.approx(7 * 10e-6 + 7 / 8 * 0.1)
    assert reduce_scatter(10**9, 8, LINK) == pytest.approx(7 * 10e-6 + 7 / 8 * 0.1)
    assert all_reduce(10**9, 8, LINK) == pytest.approx(14 * 10e-6 + 14 / 8 * 0.1)
    assert all_reduce(10**9, 8, LINK, "naive") == pytest.approx(14 * (10e-6 + 0.1))
    assert broadcast(10**9, 8, LINK) == pytest.approx(3 * (10e-6 + 0.1))  # binomial tree, ceil(log2 8) = 3


def test_reduction_cost_gamma():
    link = Link(alpha_s=0.0, bandwidth_bytes_per_s=1e9, reduce_bytes_per_s=2e9)
    assert all_reduce(8 * 10**6, 4, link) == pytest.approx(6 / 4 * 8e-3 + 3 / 4 * 4e-3)


@given(size=st.integers(1, 2**34), n=st.integers(2, 1024))
def test_ring_all_reduce_busbw_approaches_link_bandwidth(size, n):
    # With α = 0 and free reduction, ring all-reduce busbw equals the link bandwidth exactly.
    link = Link(alpha_s=0.0, bandwidth_bytes_per_s=25e9)
    t = all_reduce(size, n, link)
    assert busbw_bytes_per_s("all_reduce", size, t, n) == pytest.approx(25e9)
    assert all_reduce(size, n, link, "naive") >= t


def test_one_rank_costs_nothing():
    assert all_reduce(2**20, 1, LINK) == 0.0


def test_fit_link_recovers_alpha_and_beta():
    pts = [(s, 5e-6 + s / 2e9) for s in (4096, 2**20, 2**22)]
    link = fit_link(pts)
    assert link.alpha_s == pytest.approx(5e-6) and link.bandwidth_bytes_per_s == pytest.approx(2e9)


@pytest.mark.parametrize("text,sizes", [("1K:8K", [1024, 2048, 4096, 8192]), ("64M", [2**26]),
                                        ("1M,3M", [2**20, 3 * 2**20])])
def test_sizes(text, sizes):
    assert parse_size_range(text) == sizes


@pytest.mark.parametrize("text", ["", "12Q", "M", "-1K", "4K:1K"])
def test_bad_sizes(text):
    with pytest.raises(TrainmathError):
        parse_size_range(text)


def test_seed_layout_table():
    world = world_table(2, 4)
    assert [(r.process_id, r.rank, r.node, r.local_gpu) for r in world][4] == (4, 4, 1, 0)
    sub = subgroup_table(world, even_ranks(8))
    # The seed's subgroup table: process 0,2,4,6 -> rank 0,1,2,3 on nodes 0,0,1,1, GPUs 0,2,0,2.
    placed = [(r.process_id, r.rank, r.node, r.local_gpu) for r in sub]
    assert placed == [(0, 0, 0, 0), (2, 1, 0, 2), (4, 2, 1, 0), (6, 3, 1, 2)]
    assert parse_size("2G") == 2**31


def test_cost_model_imports_without_torch():
    code = "import sys; sys.modules['torch'] = None; import trainmath.comm, trainmath.cli.comm; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "ok", out.stderr
