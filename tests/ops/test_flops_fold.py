"""GEMM FLOPs as folds over the op lists (``trainmath.ops.flops``): the linears equal ``ops.gemm``'s count from
the ModelSpec's blocks for every catalog model and layer type (``tests/flops`` checks both against
FlopCounterMode), and every GEMM, linears and cores, is divided per rank exactly as the op tensors' sharding
rules say."""

from collections import Counter

import pytest

from trainmath import families
from trainmath.errors import TrainmathError
from trainmath.ops.flops import core_gemms_from_ops, layer_ops, layer_top_k, linear_gemms_from_ops
from trainmath.ops.gemm import linear_gemms
from trainmath.ops.ir import Degrees
from trainmath.sources import catalog_index, load_spec

B, S = 2, 64
ALL = sorted(catalog_index())
EMITTED = [m for m in ALL if load_spec(m).family.layer is not None]


def test_only_kimi_lacks_an_op_list():
    """The catalog models without a layer emitter of their own (they run another family's: ``RUNS_AS``)."""
    assert sorted({load_spec(m).model_type for m in ALL if load_spec(m).family.layer is None}) == ["kimi_k2"]


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


@pytest.mark.parametrize("model", ["Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3", "nvidia/Nemotron-H-56B-Base-8K",
                                   "Qwen/Qwen3-Next-80B-A3B-Thinking", "moonshotai/Kimi-K2-Instruct"])
def test_count_flops_reads_the_op_lists(model):
    """``trainmath flops`` takes every layer GEMM from the op folds (no fallback note, Kimi K2 included through
    DeepSeek-V3's op list), listing each block's linears, then the mixer's core after the mixer's linears."""
    from trainmath.flops import count_flops
    from trainmath.flops.model import MIXERS

    spec = load_spec(model)
    report = count_flops(spec, batch=B, seq=S)
    assert not [n for n in report.notes if "spec" in n]
    for lt, (layer, _) in zip(report.layer_types, spec.layer_groups()):
        ops = layer_ops(spec, layer, batch=B, seq=S)
        linears = _fold(spec, layer)
        core = core_gemms_from_ops(ops)
        expect = []
        for bl in layer.blocks:
            mine = {g.name for g in linear_gemms(bl, B * S)}
            expect += [g for g in linears if g.name in mine] + (core if bl.kind in MIXERS else [])
        assert list(lt.gemms) == expect and len(expect) == len(linears) + len(core)
        assert bool(core) == any(bl.kind in MIXERS for bl in layer.blocks)


def test_kimi_k2_runs_deepseek_v3s_op_list():
    v3 = families.get("deepseek_v3")
    assert families.emitter("kimi_k2") == (v3.layer, v3.style)
    with pytest.raises(TrainmathError, match="no op list for model_type 'bert'; modelled: cohere, deepseek_v2"):
        families.emitter("bert")


@pytest.mark.parametrize("model", ALL)
def test_core_gemms_per_rank_divide_heads_and_channels(model):
    """At tp the attention core, conv and scan GEMMs of a rank keep their (m, k, n) and run count / tp products:
    the query heads, conv channels and value/Mamba heads are ``tp`` axes (the catalog's divide every tp here)."""
    from trainmath.infer.weights import validate_tp

    spec = load_spec(model)
    for tp in (2, 8):
        try:
            validate_tp(spec, tp)
        except TrainmathError:
            continue
        for layer, _ in spec.layer_groups():
            ops = layer_ops(spec, layer, batch=B, seq=S)
            for causal in ("executed", "half"):
                one, many = core_gemms_from_ops(ops, causal=causal), core_gemms_from_ops(ops, Degrees(tp=tp),
                                                                                      causal=causal)
                assert [(g.name, g.m, g.k, g.n, g.count // tp) for g in one] == \
                       [(g.name, g.m, g.k, g.n, g.count) for g in many]
                assert all(g.count % tp == 0 for g in one)


def test_core_gemms_refuse_context_parallel_ranks():
    spec = load_spec("Qwen/Qwen3-0.6B")
    with pytest.raises(TrainmathError, match="per context-parallel rank are not modelled"):
        core_gemms_from_ops(layer_ops(spec, spec.layers[0], batch=B, seq=S), Degrees(cp=2))


def test_shapes_only_emits_what_the_saved_bytes_fold_refuses():
    """MLA with equal q/k and v head dims: the memory profile's emission refuses (SDPA's flash kernel's saved
    bytes are not modelled); the shapes-only op list has every linear of the spec's blocks and the attention op
    (FlopCounterMode checks its FLOPs in ``tests/flops/test_oracle_shapes_only.py``)."""
    from trainmath.families import spec_from_config
    from trainmath.ops.context import Ctx
    from trainmath.ops.ir import Program
    from trainmath.vocabulary import precision_of

    cfg = dict(model_type="deepseek_v3", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
               q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=24,
               n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
               n_group=1, topk_group=1)
    spec = spec_from_config(cfg, name="tiny-mla", source="test")
    layer = spec.layers[0]
    with pytest.raises(TrainmathError, match="equal q/k and v head dims"):
        v3 = families.get("deepseek_v3")
        v3.layer(Program(), Ctx(b=B, s=S, d=64, p=precision_of(compute_bytes=2, weight_bytes=2)), layer, v3.style)
    ops = layer_ops(spec, layer, batch=B, seq=S)
    got = [(g.name, g.m, g.k, g.n) for g in _fold(spec, layer)]
    assert Counter(got) == Counter((g.name, g.m, g.k, g.n) for bl in layer.blocks for g in linear_gemms(bl, B * S))
    (att,) = [op for op in ops if op.kind == "attention"]
    assert att.kernel == "sdpa" and att.saved == () and [t.name for t in att.cache] == \
        ["latent_kv", "rope_keys", "keys", "values"]
