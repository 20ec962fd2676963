"""Every primitive and every ring algorithm against its oracle, on forked gloo workers (world sizes 1-8)."""

import pytest

torch = pytest.importorskip("torch")

from trainmath.comm.ring import ring_bytes_sent  # noqa: E402
from trainmath.runtime.check import _same, expected_demo, run_check  # noqa: E402
from trainmath.runtime.demo import DEMOS, run_demo  # noqa: E402
from trainmath.runtime.launch import JobSpec, launch  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_correctness_matrix(n):
    rows = launch(JobSpec(nproc_per_node=n, timeout_s=30), run_check, None if n in (2, 4) else "ring")[0]
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:5]
    ops = {(r["op"], r["impl"]) for r in rows}
    assert {("all_reduce", "ring"), ("all_reduce", "naive"), ("reduce_scatter", "ring"), ("all_gather", "ring"),
            ("reduce_scatter", "ring in place")} <= ops
    assert {("all_reduce", "ring/16B-seg"), ("reduce_scatter", "ring/16B-seg"), ("all_gather", "ring/16B-seg")} <= ops
    assert {r["dtype"] for r in rows} >= {"int32", "int64", "float32", "float64", "bfloat16"}
    assert any(r["length"] % n for r in rows) or n == 1  # uneven lengths are covered


def _check_stepwise(ctx):
    """The ring half of the matrix through the step-by-step engine NCCL uses (batch_isend_irecv per step)."""
    from trainmath.runtime import ring

    ring._pipelined = lambda group: False
    return run_check(ctx, "ring")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_stepwise_engine_matches_native(n):
    rows = launch(JobSpec(nproc_per_node=n, timeout_s=30), _check_stepwise)[0]
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:5]
    assert {r["op"] for r in rows} == {"all_reduce", "reduce_scatter", "all_gather"}


@pytest.mark.parametrize("n", [2, 4])
def test_seed_demos_show_the_seed_tensors(n):
    for name in DEMOS:
        if name == "barrier":
            continue
        records = launch(JobSpec(nproc_per_node=n, timeout_s=20), run_demo, name, {"reduce_op": "sum"})[0]
        assert [r["rank"] for r in records] == list(range(n))
        for r in records:
            assert (r["before"], r["after"]) == expected_demo(name, r["rank"], n), (name, r)


def test_seed_all_reduce_pinned():
    records = launch(JobSpec(nproc_per_node=4, timeout_s=20), run_demo, "all_reduce", {"reduce_op": "sum"})[0]
    assert [r["after"] for r in records] == [[10.0] * 5] * 4  # the blog series' output


def test_subgroup_ranks_are_renumbered():
    records = launch(JobSpec(nproc_per_node=4, timeout_s=20), run_demo, "subgroup", {})[0]
    assert [r["group_rank"] for r in records] == [0, None, 1, None]


def test_barrier_releases_everyone_after_the_last_arrival():
    records = launch(JobSpec(nproc_per_node=3, timeout_s=20), run_demo, "barrier", {"sleep_s": 0.3})[0]
    last_arrival = max(r["arrival_s"] for r in records)
    assert last_arrival >= 0.6
    assert all(r["release_s"] >= last_arrival - 0.05 for r in records)
    assert records[0]["arrival_s"] < 0.3  # rank 0 did not sleep


def _count_ring_sends(ctx, length, segment_bytes=1 << 20):
    """Wrap isend to count the bytes the ring actually sends: must equal the pure schedule's count.
    Returns (bytes, messages)."""
    import torch.distributed as dist

    from trainmath.runtime import ring

    sent = []
    real = dist.isend

    def counting(tensor, *a, **k):
        sent.append(tensor.numel() * tensor.element_size())
        return real(tensor, *a, **k)

    ring.dist.isend = counting
    try:
        ring.ring_all_reduce(torch.ones(length), ctx.group, segment_bytes=segment_bytes)
    finally:
        ring.dist.isend = real
    return sum(sent), len(sent)


@pytest.mark.parametrize("length", [12, 13])
def test_ring_sends_what_the_cost_model_counts(length):
    got = launch(JobSpec(nproc_per_node=3, timeout_s=20), _count_ring_sends, length)
    assert {r: b for r, (b, _) in got.items()} == {r: ring_bytes_sent("all_reduce", r, 3, length, 4) for r in range(3)}
    assert {m for _, m in got.values()} == {2 * 2}  # one message per step
    if length == 12:
        assert {b for b, _ in got.values()} == {2 * 2 * 4 * 4}  # 2(n-1)/n · S = 4/3 · 48 bytes


def test_segmented_ring_sends_the_same_bytes_in_more_messages():
    # 3 ranks, 300 float32: chunks of 400 B cut into 400 // 64 = 6 segments; 4 steps x 6 messages.
    got = launch(JobSpec(nproc_per_node=3, timeout_s=20), _count_ring_sends, 300, 64)
    assert got == {r: (ring_bytes_sent("all_reduce", r, 3, 300, 4), 4 * 6) for r in range(3)}


def test_oracle_can_fail():
    # The comparison the matrix relies on rejects a wrong answer, bitwise for ints, by tolerance for floats.
    assert _same(torch.tensor([1, 2]), torch.tensor([1, 3]), 2)
    assert not _same(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7]), 2)
    assert _same(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]), 2)
    assert expected_demo("all_reduce", 0, 4) != ([1.0] * 5, [9.0] * 5)
