"""The recipe switches the published runs state, each checked against its derivation (memory/recipe_options.py,
memory/megatron_recompute.py, memory/te_fp8.py): what each one removes or adds, in bytes, on the step's
timeline or in the megatron profile's per-layer terms."""

import pytest

from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout
from trainmath.memory.megatron import activations_megatron, layer_terms
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.placement import place
from trainmath.sources import load_spec

SEQ = 512


def _llama():
    return load_spec("meta-llama/Llama-3.2-1B")


def _forward(spec, **kw):
    setup = TrainingSetup(micro_batch=1, seq=SEQ, profile="megatron", **kw)
    events = training_memory(spec, setup, ParallelLayout()).stages[0].timeline
    return [e.bytes for e in events if e.name.startswith("forward layer")]


def _terms(layer, **kw):
    kept, core = layer_terms(layer, b=1, s=SEQ, d=2048, **kw)
    return {n.name: n.value for n in kept + core}


def test_remat_policy_keeps_the_named_tensors_beside_the_layer_input():
    """MaxText's save_qkv_proj: each layer keeps its input and its q, k, v projections (2 bytes each)."""
    spec = _llama()
    fwd = _forward(spec, recompute="full",
                   recompute_saves=("core attention: q", "core attention: k", "core attention: v"))
    att = spec.layers[0].blocks[0].dims
    q, kv = att.heads * att.head_dim, att.kv_heads * att.head_dim
    assert {b - a for a, b in zip(fwd, fwd[1:])} == {2 * SEQ * (spec.hidden_size + q + 2 * kv)}
    with pytest.raises(TrainmathError, match="name no tensor"):
        _forward(spec, recompute="full", recompute_saves=("core attention: z",))


def test_offloaded_layers_save_nothing_on_the_gpu_and_hold_it_again_in_backward():
    spec = _llama()
    plain, off = _forward(spec), _forward(spec, offload_layers=4)
    whole = plain[1] - plain[0]
    assert off[1] - off[0] == 0 and off[3] - off[2] == 0  # layers 1-3 of the first four: on the host
    assert off[4] - off[3] == whole  # layer 4 onward: on the GPU

    def acts(offload):  # at layer 3's backward: the saved activations of layers 0-3, layer 3 reloaded if offloaded
        setup = TrainingSetup(micro_batch=1, seq=SEQ, profile="megatron", offload_layers=offload)
        stage = training_memory(spec, setup, ParallelLayout()).stages[0]
        return stage.at("backward layer 3").flat()["activations_bytes"]

    assert acts(0) == 4 * whole and acts(4) == whole
    with pytest.raises(TrainmathError, match="below the rank's layer count"):
        _forward(spec, offload_layers=len(spec.layers))


def test_recompute_modules_drop_what_megatron_core_recomputes():
    spec = load_spec("Qwen/Qwen1.5-MoE-A2.7B")
    layer = spec.layers[0]
    idx = list(range(len(spec.layers)))
    terms = _terms(layer)
    one = lambda mods: activations_megatron(spec, micro_batch=1, seq=SEQ, recompute="selective",  # noqa: E731
                                            layers=idx, recompute_modules=mods).groups[0].one.value
    act = sum(v for k, v in terms.items() if k.startswith("experts: ") and k.endswith("(linear_fc2 input)"))
    norms = terms["linear_qkv: input"] + terms["router: input"]
    core = terms["core attention: softmax logsumexp (fp32)"]
    whole = sum(terms.values())
    assert one(()) == one(("core_attn",)) == whole - core
    assert one(("moe_act",)) == whole - act
    assert one(("layernorm", "moe_act")) == whole - act - norms
    with pytest.raises(TrainmathError, match="not Megatron-Core's"):
        one(("attn",))


def test_fp8_linears_save_their_inputs_in_one_byte():
    """TE's FP8 linears: linear_qkv, linear_fc1 and linear_fc2 inputs at 1 byte; linear_proj's FP8 copy beside the
    attention output the flash kernel keeps."""
    spec = _llama()
    layer = spec.layers[0]
    bf16, fp8 = sum(_terms(layer).values()), sum(_terms(layer, fp8=True).values())
    f = layer.blocks[1].dims.intermediate
    o = layer.blocks[0].dims.heads * layer.blocks[0].dims.v_head_dim
    assert bf16 - fp8 == SEQ * (2 * spec.hidden_size + f) - SEQ * o


def test_fused_cross_entropy_keeps_no_fp32_logits():
    spec = _llama()

    def loss(fusion):
        setup = TrainingSetup(micro_batch=1, seq=SEQ, profile="megatron", cross_entropy_fusion=fusion)
        stage = training_memory(spec, setup, ParallelLayout()).stages[0]
        return stage.at("forward: loss").flat(), stage.at("backward: loss").flat()

    (fwd, _), (fwd_te, bwd_te), (_, bwd_fa) = loss("none"), loss("te"), loss("flash-attn")
    logits = 2 * SEQ * spec.vocab_size
    assert fwd["logits_fp32_bytes"] > 0 and fwd_te.get("logits_fp32_bytes", 0) == 0
    assert bwd_te.get("cross_entropy_grad_bytes", 0) == 0  # the gradient written into the logits
    assert bwd_fa["cross_entropy_grad_bytes"] == logits  # flash-attn's dlogits = torch.empty_like(logits)


def test_fp8_copies_of_a_sharded_rank_and_fp8_parameters():
    spec = _llama()
    linear = sum(t.params for t in place(spec, ParallelLayout()).tensors if t.spec.kind == "linear")

    def flat(layout, **kw):
        setup = TrainingSetup(micro_batch=1, seq=SEQ, profile="megatron", precision="fp8", **kw)
        return training_memory(spec, setup, layout).stages[0].at("forward layer 0").flat()

    assert flat(ParallelLayout(dp=4, zero=3))["weight_copies_bytes"] == 2 * linear // 4  # the shard's FP8 copies
    plain, fp8p = flat(ParallelLayout(dp=2, zero=1)), flat(ParallelLayout(dp=2, zero=1), fp8_param_gather=True)
    assert plain["weights_bytes"] - fp8p["weights_bytes"] == linear  # bf16 → FP8 weights
    assert plain["weight_copies_bytes"] - fp8p["weight_copies_bytes"] == linear  # the FP8 copy is the weight


def test_megatron_buffers_have_no_bucket():
    spec = _llama()

    def overhead(impl):
        setup = TrainingSetup(micro_batch=1, seq=SEQ, profile="megatron", zero_impl=impl)
        return training_memory(spec, setup, ParallelLayout(dp=2, zero=1)).stages[0].breakdown.flat().get(
            "framework_overhead_bytes", 0)

    assert overhead("deepspeed") > 0 and overhead("megatron") == 0


def test_expert_tp_one_routes_the_ranks_own_tokens():
    layer = load_spec("Qwen/Qwen1.5-MoE-A2.7B").layers[0]
    folded = _terms(layer, t=2, sp=True, expert_tp=1)
    split = _terms(layer, t=2, sp=True)
    for name in ("experts: permuted rows (linear_fc1 input)", "unpermute: expert output"):
        assert 2 * folded[name] == split[name]
    fc1 = [k for k in split if k.startswith("experts: linear_fc1 output")]
    assert fc1 and all(folded[k] == split[k] for k in fc1)
