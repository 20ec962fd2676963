"""Oracle: the hf profile equals the bytes autograd saves for backward in transformers' own modeling code.

Each case builds a tiny model, runs forward (with labels, so the loss path is included) under
``torch.autograd.graph.saved_tensors_hooks`` and sums the sizes of the distinct storages packed, parameters excluded.
The prediction is ``activation_bytes(...)`` + the saved part of ``logits_bytes(...)``; equality is exact.
"""

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainmath import families  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.activations import Router, activation_bytes, logits_bytes  # noqa: E402
from trainmath.sources import catalog_entry  # noqa: E402
from trainmath.tree import check_sums  # noqa: E402

B, S = 2, 16
BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, head_dim=16)
MOE = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1)
PREC = {"autocast": (2, 4), "bf16": (2, 2), "fp32": (4, 4)}


UNSET = None.__class__.__name__ + ":unset"  # an extra's value that removes a BASE key (Falcon has no head_dim)


def _model(model_type, attn, extra):
    cfg = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in {**BASE, **extra}.items() if v != UNSET})
    moe = "moe" in model_type or model_type in ("mixtral", "gpt_oss", "llama4_text", "qwen3_next", "nemotron_h")
    kw = {"experts_implementation": "eager"} if moe else {}
    torch.manual_seed(0)
    if attn != "default":  # "default": what transformers picks (Gemma-2: eager, it cannot soft-cap in SDPA)
        kw["attn_implementation"] = attn
    model = transformers.AutoModelForCausalLM.from_config(cfg, **kw)
    return cfg, model


def _layers(model):
    """The decoder layers (GPT-2 and Falcon keep them in ``transformer.h``)."""
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def _measure(model, mode, *, checkpoint=False):
    """Bytes of distinct non-parameter storages saved for backward and still held by the graph when the forward
    ends (plus, under checkpointing, the storages each checkpointed layer keeps as its inputs: hidden states,
    rotary cos/sin and the attention mask where the layer gets one). A node whose output cannot reach the loss (a
    router's top-k over groups, whose indices are all that is used) is freed with its saved tensors at the end of
    forward: such tensors are packed but not kept, so each packed tensor is tracked by a weak reference (the graph
    holds the very object the pack hook returns)."""
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    if checkpoint:
        model.gradient_checkpointing_enable()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, list] = {}
    kept = []  # checkpoint inputs are held by the checkpoint frames, not by weak references

    def note(t, strong=False):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen.setdefault(st.data_ptr(), []).append((weakref.ref(t), st.nbytes()))
            if strong:
                kept.append(t)

    def pack(t):
        note(t)
        return t

    hooks = []
    if checkpoint:
        def pre(_module, args, kwargs):
            note(args[0], strong=True)
            pe = kwargs.get("position_embeddings", ())  # GPT-2: none
            for t in (pe,) if isinstance(pe, torch.Tensor) else pe:  # DeepSeek-V2: one complex tensor
                note(t, strong=True)
            mask = kwargs.get("attention_mask")  # eager attention, Falcon, Llama 4's chunked layers
            if isinstance(mask, torch.Tensor):
                note(mask, strong=True)
        hooks = [layer.register_forward_pre_hook(pre, with_kwargs=True) for layer in _layers(model)]
    ids = torch.randint(0, model.config.vocab_size, (B, S), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "autocast"):
            out = model(input_ids=ids, labels=ids, use_cache=False)
    for h in hooks:
        h.remove()
    gc.collect()
    total = 0
    for refs in seen.values():
        alive = [n for r, n in refs if r() is not None]
        total += max(alive, default=0)
    out.loss.backward()  # the graph is complete and usable
    return total


def _predict(cfg, mode, profile="hf", recompute="none", **kw):
    data = cfg.to_dict()
    if "num_local_experts" in data and cfg.model_type == "qwen3_moe":
        # transformers 5.24 saves qwen3_moe's num_experts as num_local_experts (attribute_map); the Hub configs
        # (and the spec builder) use num_experts
        data["num_experts"] = data["num_local_experts"]
    spec = spec_from_config(data, name="tiny", source="test")
    c, p = PREC[mode]
    act = activation_bytes(spec, micro_batch=B, seq=S, profile=profile, recompute=recompute,
                           compute_dtype_bytes=c, param_dtype_bytes=p, **kw)
    assert check_sums(act.tree()) == []
    head = logits_bytes(spec, B, S, compute_dtype_bytes=c, param_dtype_bytes=p)
    return act, act.total_bytes + head.saved_bytes


CASES = [
    ("llama", {}, "sdpa"),
    ("llama", {"num_key_value_heads": 4}, "sdpa"),
    ("qwen3", {}, "sdpa"),
    ("qwen3", {}, "eager"),
    ("mistral", {}, "sdpa"),
    ("qwen2", {}, "sdpa"),  # q/k/v biases
    ("olmo2", {}, "sdpa"),  # post-norms, full-width q/k norms, fp32 norm products and cos/sin
    ("olmo2", {}, "eager"),
]


@pytest.mark.parametrize("mode", list(PREC))
@pytest.mark.parametrize("model_type,extra,attn", CASES, ids=[f"{m}-{a}-{len(e)}" for m, e, a in CASES])
def test_dense_saved_bytes_exact(model_type, extra, attn, mode):
    cfg, model = _model(model_type, attn, extra)
    _, predicted = _predict(cfg, mode, profile="hf" if attn == "sdpa" else "eager")
    assert predicted == _measure(model, mode)


@pytest.mark.parametrize("mode", list(PREC))
@pytest.mark.parametrize("model_type", ["llama", "qwen3", "olmo2"])
def test_full_recompute_exact(model_type, mode):
    """gradient_checkpointing_enable() (use_reentrant=False): layer inputs and cos/sin are what is kept."""
    cfg, model = _model(model_type, "sdpa", {})
    act, predicted = _predict(cfg, mode, recompute="full")
    transient = act.recompute_transient_bytes
    assert predicted - transient == _measure(model, mode, checkpoint=True)
    # the transient is one layer recomputed: exactly one layer's no-recompute bytes
    none, _ = _predict(cfg, mode)
    assert transient * cfg.num_hidden_layers == none.tree().child("layers").value


@pytest.mark.parametrize("mode", list(PREC))
@pytest.mark.parametrize("norm_topk", [False, True])
def test_qwen3_moe_exact(mode, norm_topk):
    cfg, model = _model("qwen3_moe", "sdpa", {**MOE, "norm_topk_prob": norm_topk})
    hit = []
    for layer in model.model.layers:
        layer.mlp.gate.register_forward_hook(lambda m, i, o: hit.append(o[2].unique().numel()))
    measured = _measure(model, mode)
    assert hit == [MOE["num_experts"]] * cfg.num_hidden_layers, "precondition: every expert receives tokens"
    _, predicted = _predict(cfg, mode, norm_topk_prob=norm_topk)
    assert predicted == measured


# Catalog configs shrunk to tiny sizes (pad/bos/eos ids, rope scaling and quantisation dropped). Head dims differ
# from S = 16 so that no two saved terms can be confused by size.
CATALOG = {"deepseek_v3": "deepseek-ai/DeepSeek-V3", "deepseek_v2": "deepseek-ai/DeepSeek-V2-Lite"}
TINY = {
    "deepseek_v3": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4,
                        n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, q_lora_rank=48,
                        kv_lora_rank=32, qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10,
                        first_k_dense_replace=1, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                        vocab_size=128, max_position_embeddings=64),
    "deepseek_v2": dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4,
                        n_shared_experts=2, num_experts_per_tok=2, q_lora_rank=None, kv_lora_rank=32,
                        qk_nope_head_dim=12, qk_rope_head_dim=8, v_head_dim=10, first_k_dense_replace=1,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                        max_position_embeddings=64),
}
DROP = ("pad_token_id", "bos_token_id", "eos_token_id", "rope_scaling", "rope_parameters", "layer_types",
        "quantization_config", "auto_map", "torch_dtype", "dtype", "model_type")


def _catalog_model(model_type, extra=(), attn="sdpa"):
    data = {k: v for k, v in catalog_entry(CATALOG[model_type]).config.items()
            if not k.startswith("_") and k not in DROP}
    data.update(TINY[model_type], **dict(extra))
    cfg = transformers.AutoConfig.for_model(model_type, **data)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn,
                                                          experts_implementation="eager")
    return {**data, "model_type": model_type}, model


def _experts_hit(model):
    """Distinct experts each MoE layer routes to (the autocast weight copies are per hit expert)."""
    hit = []
    for layer in _layers(model):
        if hasattr(getattr(layer, "mlp", None), "experts"):
            gate = layer.mlp.gate if hasattr(layer.mlp, "gate") else layer.mlp.router  # gpt-oss: router
            gate.register_forward_hook(lambda m, i, o: hit.append(o[-1].unique().numel()))
    return hit


def _predict_data(data, mode, **kw):
    spec = spec_from_config(data, name="tiny", source="test")
    c, p = PREC[mode]
    act = activation_bytes(spec, micro_batch=B, seq=S, compute_dtype_bytes=c, param_dtype_bytes=p, **kw)
    assert check_sums(act.tree()) == []
    head = logits_bytes(spec, B, S, compute_dtype_bytes=c, param_dtype_bytes=p)
    assert check_sums(head.tree()) == []
    return act, act.total_bytes + head.saved_bytes


MLA_CASES = [
    ("deepseek_v3", ()),  # q LoRA, sigmoid router: 2 groups of 2, top-1 group, top-2 experts; norm_topk_prob
    ("deepseek_v3", (("norm_topk_prob", False), ("n_shared_experts", 2), ("n_group", 1), ("topk_group", 1))),
    ("deepseek_v2", ()),  # no q LoRA, greedy softmax router, 2 shared experts, complex rotary
    ("deepseek_v2", (("topk_method", "group_limited_greedy"), ("n_group", 2), ("topk_group", 1))),
]


@pytest.mark.parametrize("checkpoint", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("mode", list(PREC))
@pytest.mark.parametrize("model_type,extra", MLA_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(MLA_CASES)])
def test_mla_exact(model_type, extra, mode, checkpoint):
    """MLA attention (CPU SDPA math fallback), first-k-dense layers, DeepSeek routers, shared experts."""
    data, model = _catalog_model(model_type, extra)
    hit = _experts_hit(model)
    measured = _measure(model, mode, checkpoint=checkpoint)
    assert set(hit) == {data["n_routed_experts"]}, f"precondition: every expert receives tokens ({hit})"
    act, predicted = _predict_data(data, mode, recompute="full" if checkpoint else "none",
                                   router=Router.from_config(data, families.get(data["model_type"]).config_defaults))
    if checkpoint:
        predicted -= act.recompute_transient_bytes
    assert predicted == measured


@pytest.mark.parametrize("checkpoint", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("mode", list(PREC))
def test_mixtral_exact(mode, checkpoint):
    """Mixtral keeps its routing weights in fp32 (the renormalised softmax top-k values): 2·T·k bytes per layer
    more than Qwen3-MoE in bf16/autocast."""
    cfg, model = _model("mixtral", "sdpa", {"num_local_experts": 4, "num_experts_per_tok": 2})
    hit = _experts_hit(model)
    measured = _measure(model, mode, checkpoint=checkpoint)
    assert set(hit) == {4}, f"precondition: every expert receives tokens ({hit})"
    act, predicted = _predict(cfg, mode, recompute="full" if checkpoint else "none")
    if checkpoint:
        predicted -= act.recompute_transient_bytes
    assert predicted == measured


@pytest.mark.parametrize("checkpoint", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("mode", list(PREC))
def test_qwen2_moe_exact(mode, checkpoint):
    """Qwen2-MoE: the shared expert is gated by sigmoid(shared_expert_gate(x)), a (T, 1) Linear whose product keeps
    the shared expert's output (c·T·d) and the sigmoid (c·T); under autocast the gate also casts its input. The
    second layer is dense (mlp_only_layers). norm_topk_prob is left at the config default (False)."""
    cfg, model = _model("qwen2_moe", "sdpa", {**MOE, "shared_expert_intermediate_size": 48,
                                              "num_hidden_layers": 3, "mlp_only_layers": [1]})
    hit = _experts_hit(model)
    measured = _measure(model, mode, checkpoint=checkpoint)
    assert set(hit) == {4} and len(hit) == (4 if checkpoint else 2), \
        f"precondition: every expert receives tokens ({hit})"
    act, predicted = _predict(cfg, mode, recompute="full" if checkpoint else "none")
    if checkpoint:
        predicted -= act.recompute_transient_bytes
    assert predicted == measured


NO_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
FALCON = {"head_dim": UNSET, "ffn_hidden_size": 96}  # head_dim is a read-only property of FalconConfig
LLAMA4 = {"num_hidden_layers": 3, "no_rope_layers": [1, 0, 1], "moe_layers": [1, 2], "num_local_experts": 4,
          "num_experts_per_tok": 1, "intermediate_size_mlp": 80, "intermediate_size": 32}
QWEN3_NEXT = {"num_hidden_layers": 2, "full_attention_interval": 2, "num_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "linear_num_key_heads": 2,
              "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12,
              "linear_conv_kernel_dim": 4, "mlp_only_layers": [0]}
NEMOTRON_H = {"layers_block_type": ["mamba", "mlp", "attention", "moe"], "num_hidden_layers": 4,
              "mamba_num_heads": 4, "mamba_head_dim": 12, "n_groups": 2, "ssm_state_size": 8, "conv_kernel": 4,
              "chunk_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "moe_shared_expert_intermediate_size": 48}
FAMILY_CASES = [
    # fused qkv_proj (value keeps the whole output) and gate_up_proj; cat-based rotary makes o_proj's input a copy
    ("phi3", {}, "sdpa"),
    ("phi3", {"partial_rotary_factor": 0.75}, "sdpa"),  # Phi-4-mini: cos/sin 12 wide
    ("phi3", {}, "eager"),
    # four (1 + w) RMSNorms, GELU-tanh MLP, sqrt(d)-scaled embedding; Gemma-2: eager attention with the tanh of the
    # soft-capped scores, final logit soft-capping; Gemma-3: per-head q/k norms, one cos/sin pair per layer type
    ("gemma2", {"layer_types": ["sliding_attention", "full_attention"]}, "default"),
    ("gemma3_text", {"layer_types": ["sliding_attention", "full_attention"]}, "default"),
    ("gemma3_text", {"layer_types": ["sliding_attention", "sliding_attention"],
                     "final_logit_softcapping": 30.0}, "eager"),
    # DeepSeek-V3's sigmoid router with correction bias, shared experts, first-k-dense, q/k norms, qkv biases,
    # partial rotary (0.5, cat-based: o_proj's input is a copy)
    ("glm4_moe", {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                  "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1,
                  "num_hidden_layers": 3, "use_qk_norm": True, "attention_bias": True}, "sdpa"),
    # LayerNorm with bias (input, mean, rstd in the input dtype), plain GELU-tanh MLP with biases
    ("starcoder2", {}, "sdpa"),
    # parallel attention + MLP from one bias-free Cohere LayerNorm (x - mean saved twice), per-head q/k LayerNorms,
    # fp32 interleaved rotary, logit_scale (a Python-float product: nothing saved)
    ("cohere", {"use_qk_norm": True}, "sdpa"),
    # fused c_attn (q, k, v are views of one output), Conv1D (addmm), learned positions, gelu_new written as tensor
    # ops, tied head; dropouts set to 0 (nonzero dropout adds masks the profile does not model)
    ("gpt2", {"n_inner": 96, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, "sdpa"),
    ("gpt2", {"n_inner": 96, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, "eager"),
    # fused query_key_value, rotary, SDPA keeping the (b, 1, s, s) mask per layer, GELU MLP, LayerNorms with bias:
    # multi-head (value keeps the whole fused output), multi-query (math fallback: 1 kv head without enable_gqa),
    # new decoder architecture (k/v broadcast to h heads; two norms), sequential layers, and a single-norm new
    # architecture with one kv head that only the config flag (Family) tells from multi-query
    ("falcon", {**FALCON, "multi_query": False}, "sdpa"),
    ("falcon", FALCON, "sdpa"),
    ("falcon", {**FALCON, "new_decoder_architecture": True, "num_kv_heads": 2}, "sdpa"),
    ("falcon", {**FALCON, "multi_query": False, "parallel_attn": False}, "sdpa"),
    ("falcon", {**FALCON, "new_decoder_architecture": True, "num_kv_heads": 1, "num_ln_in_parallel_attn": 1}, "sdpa"),
    # eager attention with sinks (softmax over s + 1 columns, row-max indices), half-width cos/sin, fp32-weight
    # RMSNorms, biased router and experts (autocast: bf16 product + fp32 bias is fp32), clamped interleaved SwiGLU;
    # a sliding layer (window 8 < s) and a full one
    ("gpt_oss", {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48, "sliding_window": 8},
     "default"),
    # Llama 4 text: every routed expert runs over all T tokens (scores 0 for unselected ones), shared expert,
    # complex RoPE + weightless fp32 L2 q/k norm on chunked layers, temperature-tuned query on the no-RoPE layer;
    # chunk 8 <= s: a chunked mask per layer and k/v repeated to h heads; chunk 32 > s: no mask, native GQA
    ("llama4_text", {**LLAMA4, "attention_chunk_size": 8}, "sdpa"),
    ("llama4_text", {**LLAMA4, "attention_chunk_size": 32, "num_experts_per_tok": 2, "use_qk_norm": False,
                     "attn_temperature_tuning": False, "moe_layers": [0, 1, 2]}, "sdpa"),
    ("llama4_text", {**LLAMA4, "attention_chunk_size": 16, "num_key_value_heads": 4}, "sdpa"),
    # Qwen3-Next: Gated DeltaNet (torch fallback: conv1d, chunked delta rule padded to 64) then gated attention
    # (q_proj emits query and gate, partial cat rotary); (1 + w) RMSNorms; dense first layer, then a softmax-routed
    # MoE with a sigmoid-gated shared expert
    ("qwen3_next", QWEN3_NEXT, "sdpa"),
    # Nemotron-H: Mamba-2 (torch path: conv1d, fp32 chunked scan, gated group RMSNorm), relu² MLP, attention
    # without rotary, MoE with DeepSeek-V3's sigmoid router over non-gated relu² experts and a shared expert
    ("nemotron_h", NEMOTRON_H, "sdpa"),
]


def _family_case(model_type, extra, attn, mode, checkpoint):
    cfg, model = _model(model_type, attn, {**NO_IDS, **extra})
    hit = _experts_hit(model)
    measured = _measure(model, mode, checkpoint=checkpoint)
    data = cfg.to_dict()
    spec = spec_from_config(data, name="tiny", source="test")
    c, p = PREC[mode]
    # No family/router passed: the switches must come from the spec itself (``spec.options``), as on the CLI.
    act = activation_bytes(spec, micro_batch=B, seq=S, profile="eager" if attn == "eager" else "hf",
                           recompute="full" if checkpoint else "none", compute_dtype_bytes=c, param_dtype_bytes=p)
    assert check_sums(act.tree()) == []
    head = logits_bytes(spec, B, S, compute_dtype_bytes=c, param_dtype_bytes=p)
    assert check_sums(head.tree()) == []
    predicted = act.total_bytes + head.saved_bytes
    if checkpoint:
        predicted -= act.recompute_transient_bytes
    return hit, predicted, measured


@pytest.mark.parametrize("checkpoint", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("mode", list(PREC))
@pytest.mark.parametrize("model_type,extra,attn", FAMILY_CASES,
                         ids=[f"{m}-{a}-{i}" for i, (m, e, a) in enumerate(FAMILY_CASES)])
def test_family_exact(model_type, extra, attn, mode, checkpoint):
    if checkpoint and attn == "eager":
        pytest.skip("checkpointing is covered with SDPA")
    hit, predicted, measured = _family_case(model_type, extra, attn, mode, checkpoint)
    assert set(hit) <= {4}, f"precondition: every expert of the (4-expert) MoE layers receives tokens ({hit})"
    assert predicted == measured


@pytest.mark.parametrize("mode", list(PREC))
def test_qwen3_next_two_chunks_exact(mode, monkeypatch):
    """s = 80 > 64: the delta rule runs two chunks, so the recurrent state carries gradient (decayed q/k, states,
    per-chunk casts under autocast)."""
    monkeypatch.setitem(globals(), "S", 80)
    hit, predicted, measured = _family_case("qwen3_next", {**QWEN3_NEXT, "mlp_only_layers": [0, 1]}, "sdpa", mode,
                                            False)
    assert predicted == measured


@pytest.mark.parametrize("seq", [64, 80])
@pytest.mark.parametrize("mode", list(PREC))
def test_nemotron_h_several_chunks_exact(mode, seq, monkeypatch):
    """Mamba-2 chunk 32: s = 64 (two chunks, no padding) and s = 80 (three, padded): the einsums then copy x·dt
    and all-but-the-last states (views with one chunk)."""
    monkeypatch.setitem(globals(), "S", seq)
    hit, predicted, measured = _family_case("nemotron_h", NEMOTRON_H, "sdpa", mode, False)
    assert predicted == measured
