"""The MoE and hybrid families' op lists, for every catalog model of those families, beyond the single-device
oracle (``tests/activations``): each Linear weight of the spec is some linear op's weight, the autocast weight
copies equal the spec's weights, expert parallelism divides exactly the routed-expert tensors, tensor and
sequence parallelism divide what their rules say and nothing else."""

import pytest

from trainmath.errors import TrainmathError
from trainmath.memory.activations import activation_bytes
from trainmath.model.spec import MoEDims
from trainmath.ops.context import Ctx, Family, Router
from trainmath.ops.fold import layer_node, saved_storages
from trainmath.ops.ir import Degrees, Program
from trainmath.sources import load_spec
from trainmath.vocabulary import precision_of

MODELS = ["Qwen/Qwen3-30B-A3B", "Qwen/Qwen1.5-MoE-A2.7B", "mistralai/Mixtral-8x7B-v0.1", "deepseek-ai/DeepSeek-V3",
          "deepseek-ai/DeepSeek-V2-Lite", "zai-org/GLM-4.5", "openai/gpt-oss-20b",
          "meta-llama/Llama-4-Scout-17B-16E-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking",
          "nvidia/Nemotron-H-56B-Base-8K"]
PREC = {"autocast": (2, 4), "bf16": (2, 2), "fp32": (4, 4)}
B, S = 2, 96


def _programs(model, mode="autocast", experts="eager", s=S):
    spec = load_spec(model)
    config, defaults = spec.options, spec.family.config_defaults
    c, p = PREC[mode]
    ctx = Ctx(b=B, s=s, d=spec.hidden_size, p=precision_of(compute_bytes=c, weight_bytes=p), experts=experts,
              router=Router.from_config(config, defaults),
              family=Family.from_config(config, defaults))
    for layer, _ in spec.layer_groups():
        prog = Program()
        spec.family.layer(prog, ctx, layer, spec.family.style)
        yield spec, layer, prog.ops


def _paths(model):
    return ["eager"] if not load_spec(model).family.row.experts_grouped else ["eager", "grouped"]


CASES = [(m, e) for m in MODELS for e in _paths(m)]


@pytest.mark.parametrize("model,experts", CASES)
def test_every_linear_weight_is_an_op_weight(model, experts):
    """FLOPs and the autocast copies fold from the linear ops: each spec Linear is one's weight, none is missing."""
    for spec, layer, ops in _programs(model, experts=experts):
        linears = {t.name for bl in layer.blocks for t in bl.tensors if t.kind == "linear"}
        used = {op.weight.name for op in ops if op.kind == "linear" and op.weight is not None}
        assert linears == used, (layer.label, linears ^ used)
        assert all(op.weight is not None for op in ops if op.kind == "linear" and op.name.endswith("_proj"))


@pytest.mark.parametrize("model,experts", CASES)
def test_autocast_weight_copies_are_the_spec_weights(model, experts):
    """Under autocast: c bytes per weight element, a routed expert's weights once per expert (eager loop, all
    hit) and never on the grouped_mm path (it reads the fp32 weights); depthwise conv weights are cast too."""
    for spec, layer, ops in _programs(model, experts=experts):
        node = layer_node(layer.label, ops)
        copies = next((c.value for c in node.children if c.name == "autocast weight copies"), 0)
        want = 0
        for bl in layer.blocks:
            for t in bl.tensors:
                if t.kind == "linear":
                    want += 2 * t.numel * (0 if t.experts and experts == "grouped" else t.copies)
                elif t.kind == "conv":
                    want += 2 * t.numel
        assert copies == want, layer.label


@pytest.mark.parametrize("model,experts", CASES)
def test_expert_parallelism_halves_the_per_expert_tensors_only(model, experts):
    """ep = 2: the storages with one entry per routed expert (their autocast weight copies, grouped_mm's
    per-expert offsets) halve exactly; the routed rows do not (each EP rank brings its own micro-batch and, under
    balanced routing, computes T·k rows for its experts: ``ops.ir.SHARDS``), nor does any other storage; degree 1
    is the single device."""
    any_moe = False
    for spec, layer, ops in _programs(model, experts=experts):
        one = {id(st): (t, st) for t, st in saved_storages(ops)}
        assert layer_node("l", ops, Degrees(tp=1, cp=1, ep=1)).value == layer_node("l", ops).value
        routed = 0
        for t, st in one.values():
            split = any(a.shard == "expert" for a in st.axes)
            per_expert = st.kind == "weight_copy" or st.name.endswith(".offsets")
            assert split == (".experts." in st.name and per_expert), st.name
            if split:
                routed += st.nbytes()
                assert 2 * st.nbytes(Degrees(ep=2)) == st.nbytes(), st.name
            else:
                assert st.nbytes(Degrees(ep=2)) == st.nbytes(), st.name
        whole = layer_node("l", ops).value
        assert whole - layer_node("l", ops, Degrees(ep=2)).value == routed // 2
        moe = any(isinstance(bl.dims, MoEDims) for bl in layer.blocks)
        assert (routed > 0) == moe, layer.label
        any_moe |= moe
    assert any_moe or model == "nvidia/Nemotron-H-56B-Base-8K"  # the catalog Nemotron-H has no MoE layer


@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallelism_splits_heads_and_widths_not_the_router_or_routed_rows(model):
    """tp = 2 (no sequence parallelism): the router's logits, probabilities and top-k stay whole, the routed
    rows' indices too; the norms and the layer input stay whole; expert activations of width f halve."""
    for spec, layer, ops in _programs(model, mode="bf16"):
        tp = Degrees(tp=2)
        for t, st in saved_storages(ops):
            n, n2 = st.nbytes(), st.nbytes(tp)
            router = (".router." in st.name or ".gate." in st.name) and not st.name.startswith("self_attn.")
            if router or "layernorm" in st.name \
                    or st.name.endswith(("topk_indices", "token_slot_indices", "token_indices", "slot_indices")) \
                    or st.name.startswith(("layer.input", "attention.residual")):
                assert n2 == n, st.name
            if st.name.endswith(("experts.act_out", "experts.down_proj.input", "experts.relu_out")):
                assert 2 * n2 == n, st.name
            assert n2 <= n


@pytest.mark.parametrize("model", ["Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-20b"])
def test_sequence_parallelism_splits_the_norms_and_gathers_before_the_router(model):
    """tp = 2 with sp: the norms' saved tensors halve; the MoE input is all-gathered, so the router and the
    experts read a whole-sequence storage of their own (bf16: without sp it is the norm's output itself)."""
    for spec, layer, ops in _programs(model, mode="bf16"):
        sp = Degrees(tp=2, sp=True)
        names = {st.name: st for _, st in saved_storages(ops, sp)}
        assert "mlp.input.gathered" in names
        assert "mlp.input.gathered" not in {st.name for _, st in saved_storages(ops)}
        for t, st in saved_storages(ops, sp):
            if st.name.startswith(("input_layernorm.", "post_attention_layernorm.")) and "weight" not in st.name:
                assert 2 * st.nbytes(sp) == st.nbytes(), st.name


@pytest.mark.parametrize("model", [m for m in MODELS if not load_spec(m).family.row.experts_grouped])
def test_unmodelled_grouped_path_is_one_line(model):
    spec = load_spec(model)
    moe = any(isinstance(bl.dims, MoEDims) for layer in spec.layers for bl in layer.blocks)
    if not moe:
        assert activation_bytes(spec, micro_batch=1, seq=16, experts="grouped").total_bytes \
            == activation_bytes(spec, micro_batch=1, seq=16, experts="eager").total_bytes
        return
    with pytest.raises(TrainmathError, match=f"grouped_mm expert path of {spec.model_type} is not modelled"):
        activation_bytes(spec, micro_batch=1, seq=16, experts="grouped")
