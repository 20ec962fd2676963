"""The op-list core: storage identity, views, the sequence gather and per-rank sizes, on hand-built programs."""

import pytest

from trainmath.errors import TrainmathError
from trainmath.ops.context import Ctx
from trainmath.ops.fold import layer_node, saved_storages
from trainmath.ops.ir import Axis, Degrees, Program, Tensor
from trainmath.ops.kernels.linear import gather_seq, linear
from trainmath.tree import check_sums
from trainmath.vocabulary import precision_of

B, S, D = 2, 16, 64


def _x(ctx):
    return Tensor(name="x", axes=(*ctx.rows(), Axis(D)), dtype_bytes=ctx.p.residual_bytes)


@pytest.mark.parametrize("autocast", [False, True])
def test_linears_reading_one_tensor_keep_one_storage_unless_autocast(autocast):
    ctx = Ctx(b=B, s=S, d=D, p=precision_of(compute_bytes=2, weight_bytes=4 if autocast else 2))
    prog = Program()
    x = _x(ctx)
    for n in ("q", "k", "v"):
        linear(prog, ctx, n, x, Axis(32, "tp"))
    kept = saved_storages(prog.ops)
    assert len(kept) == (3 if autocast else 1)
    assert sum(st.nbytes() for _, st in kept) == (3 if autocast else 1) * 2 * B * S * D


def test_a_view_keeps_its_whole_base():
    prog = Program()
    base = Tensor(name="qkv", axes=(Axis(B), Axis(S), Axis(3 * D)), dtype_bytes=2)
    v = base.view("v", Axis(B), Axis(S), Axis(D))
    prog.emit("attention", "sdpa", saved=(v,))
    (t, st), = saved_storages(prog.ops)
    assert t is v and st is base and st.nbytes() == 2 * B * S * 3 * D


def test_the_sequence_gather_is_a_new_storage_only_under_sequence_parallelism():
    ctx = Ctx(b=B, s=S, d=D, p=precision_of(compute_bytes=2, weight_bytes=2))
    prog = Program()
    x = _x(ctx)
    prog.emit("norm", "n", saved=(x,))
    g = gather_seq(prog, x, "attn.input")
    linear(prog, ctx, "q", g, Axis(32, "tp"))
    full = 2 * B * S * D
    assert layer_node("l", prog.ops).value == full  # one storage on one device
    assert layer_node("l", prog.ops, Degrees(tp=2)).value == full  # plain TP: replicated input
    sp = layer_node("l", prog.ops, Degrees(tp=2, sp=True))
    assert sp.value == full // 2 + full  # the norm's shard and the gathered input
    assert check_sums(sp) == []


@pytest.mark.parametrize("rule,deg,div", [("tp", Degrees(tp=4), 4), ("seq", Degrees(tp=4, cp=2), 2),
                                          ("seq_sp", Degrees(tp=4, cp=2), 2), ("seq_sp", Degrees(tp=4, sp=True), 4),
                                          ("vocab", Degrees(tp=4), 1), ("vocab", Degrees(tp=4, vocab_parallel=True), 4),
                                          ("expert", Degrees(ep=8), 8), (None, Degrees(tp=8, cp=8, ep=8), 1)])
def test_each_rule_divides_by_its_degree(rule, deg, div):
    t = Tensor(name="t", axes=(Axis(64, rule), Axis(3)), dtype_bytes=2)
    assert t.nbytes(deg) * div == t.nbytes()


def test_uneven_split_rounds_up_and_unknown_rule_is_one_line():
    assert Tensor(name="t", axes=(Axis(10, "tp"),), dtype_bytes=1).nbytes(Degrees(tp=4)) == 3
    with pytest.raises(TrainmathError, match="unknown sharding rule"):
        Tensor(name="t", axes=(Axis(10, "heads"),), dtype_bytes=1).nbytes(Degrees(tp=2))
