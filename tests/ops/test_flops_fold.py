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
def test_ep2_leaves_each_ranks_gemms_unchanged(model):
    """Expert-parallel ranks are drawn from data parallelism: each brings its own micro-batch, and under balanced
    routing its n/ep experts receive T·top_k rows in all, so no GEMM of a rank changes (``ir.SHARDS``)."""
    spec = load_spec(model)
    for layer, _ in spec.layer_groups():
        one, two = _fold(spec, layer), _fold(spec, layer, Degrees(ep=2))
        assert (layer_top_k(layer) is None) == all(g.component != "experts" for g in one)
        assert [(g.name, g.m, g.k, g.n) for g in two] == [(g.name, g.m, g.k, g.n) for g in one]


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


@pytest.mark.parametrize("model", ["Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3", "nvidia/Nemotron-H-56B-Base-8K"])
def test_count_flops_reads_the_op_lists(model):
    """``trainmath flops`` takes the linears from the op fold (no fallback note for a catalog model with an op
    list), listing each layer's GEMMs block by block as from the spec."""
    from trainmath.flops import count_flops
    from trainmath.flops.gemm import block_gemms

    spec = load_spec(model)
    report = count_flops(spec, batch=B, seq=S)
    assert not [n for n in report.notes if "linears counted from the spec" in n]
    for lt, (layer, _) in zip(report.layer_types, spec.layer_groups()):
        assert list(lt.gemms) == [g for bl in layer.blocks for g in block_gemms(bl, batch=B, seq=S)]


def test_count_flops_notes_a_config_the_op_list_does_not_model():
    """MLA with equal q/k and v head dims: its op list refuses (SDPA's flash kernel's saved bytes are not
    modelled), so the linears come from the spec's blocks, with a note; the numbers are the same GEMMs."""
    from trainmath.flops import count_flops
    from trainmath.model import spec_from_config

    cfg = dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
               q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
               n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
               n_group=1, topk_group=1)
    spec = spec_from_config(cfg, name="tiny-mla", source="test")
    with pytest.raises(TrainmathError, match="equal q/k and v head dims"):
        layer_ops(spec, spec.layers[0], batch=B, seq=S)
    report = count_flops(spec, batch=B, seq=S)
    assert [n for n in report.notes if "linears counted from the spec's blocks" in n]
    linears = [g for lt in report.layer_types for g in lt.gemms if g.component != "attention_core"]
    assert linears == [g for layer, _ in spec.layer_groups() for bl in layer.blocks
                       for g in linear_gemms(bl, B * S)]
