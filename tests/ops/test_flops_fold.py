"""The linears' GEMM FLOPs as a fold over the op lists (``trainmath.ops.flops``): equal to ``flops.gemm``'s count
from the ModelSpec's blocks (which ``tests/flops`` checks against FlopCounterMode) for every catalog model and
layer type, and divided per rank exactly as the op tensors' sharding rules say."""

from collections import Counter

import pytest

from trainmath.errors import TrainmathError
from trainmath.flops.gemm import linear_gemms
from trainmath.ops import families
from trainmath.ops.flops import layer_ops, layer_top_k, linear_gemms_from_ops
from trainmath.ops.ir import Degrees
from trainmath.sources import catalog_index, load_spec

B, S = 2, 64
ALL = sorted(catalog_index())
EMITTED = [m for m in ALL if load_spec(m).model_type in families.LAYERS]


def test_only_kimi_lacks_an_op_list():
    """The catalog models without a layer emitter (``block_gemms`` counts them from the spec's blocks)."""
    assert sorted({load_spec(m).model_type for m in ALL} - set(families.LAYERS)) == ["kimi_k2"]


def _fold(spec, layer, deg=Degrees(), **kw):
    return linear_gemms_from_ops(layer_ops(spec, layer, batch=B, seq=S), deg, top_k=layer_top_k(layer), **kw)


@pytest.mark.parametrize("model", EMITTED)
def test_fold_equals_spec_gemms(model):
    spec = load_spec(model)
    for layer, _ in spec.layer_groups():
        ops = [(g.name, g.component, g.m, g.k, g.n, g.flops) for g in _fold(spec, layer)]
        blocks = [(g.name, g.component, g.m, g.k, g.n, g.flops) for bl in layer.blocks
                  for g in linear_gemms(bl, B * S)]
        assert ops and Counter(ops) == Counter(blocks), layer.label


@pytest.mark.parametrize("model", EMITTED)
def test_tp2_halves_column_and_row_gemms(model):
    """tp=2: a column-parallel Linear's n and a row-parallel one's k halve exactly, a replicated one (routers,
    MLA's down-projections, ...) is whole; the rule is the weight's shard hint, read by ``placement``."""
    spec = load_spec(model)
    halved = 0
    for layer, _ in spec.layer_groups():
        one, two = _fold(spec, layer), _fold(spec, layer, Degrees(tp=2))
        assert [g.name for g in one] == [g.name for g in two]
        for g1, g2, w in zip(one, two, [op.weight for op in layer_ops(spec, layer, batch=B, seq=S)
                                       if op.kind == "linear" and op.weight is not None]):
            col, row = w.shard == "column", w.shard == "row"
            assert (g2.m, g2.k, g2.n) == (g1.m, g1.k // 2 if row else g1.k, g1.n // 2 if col else g1.n), g1.name
            assert g2.flops * (2 if col or row else 1) == g1.flops
            halved += col or row
    assert halved > 0


@pytest.mark.parametrize("model", [m for m in EMITTED if layer_top_k(load_spec(m).layers[-1])])
def test_ep2_halves_routed_rows(model):
    spec = load_spec(model)
    for layer, _ in spec.layer_groups():
        one, two = _fold(spec, layer), _fold(spec, layer, Degrees(ep=2))
        assert (layer_top_k(layer) is None) == all(g.component != "experts" for g in one)
        for g1, g2 in zip(one, two):
            assert (g2.m * (2 if g1.component == "experts" else 1), g2.k, g2.n) == (g1.m, g1.k, g1.n), g1.name


def test_llama4_executed_experts_are_all_tokens():
    """Llama 4 runs every expert on every token: ``executed`` counts n / top_k times the active expert GEMMs."""
    spec = load_spec("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    layer = spec.layers[0]
    n, k = next((b.dims.experts, b.dims.top_k) for b in layer.blocks if getattr(b.dims, "top_k", 0))
    active, executed = _fold(spec, layer), _fold(spec, layer, experts="executed")
    for a, e in zip(active, executed):
        assert e.flops == (a.flops * n // k if a.component == "experts" else a.flops), a.name
    assert sum(e.flops for e in executed) > sum(a.flops for a in active)
    with pytest.raises(TrainmathError, match="top_k"):
        linear_gemms_from_ops(layer_ops(spec, layer, batch=B, seq=S))
    with pytest.raises(TrainmathError, match="experts must be one of active, executed; got 'all'"):
        _fold(spec, layer, experts="all")
