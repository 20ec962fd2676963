"""Oracle: what torchtitan's op-level selective checkpointing keeps, for tiny models of every family.

``sac_oracle.measure`` runs forward with labels and backward under ``trainmath.runtime.checkpointing.
apply_selective`` and reports the bytes held after forward: the layers' inputs (as full recompute), each layer's
selective-checkpoint cache, and what is saved outside the layers. ``cache_rule`` below is the rule written out by
hand from the measured entries (no calculator code), in the config's symbols:

- the layer's bias-free linears run ``aten.mm`` (a biased one runs ``aten.addmm``, which the policy neither keeps
  nor counts); the 1st, 3rd, 5th, ... mm of the layer are kept (torchtitan recomputes every second mm);
- routed experts (eager path) run two mms per expert that receives tokens, gate_up (n_e, 2·f_e) then down
  (n_e, d): an even count, so the parity on entry decides: all gate_up outputs (T·k·2·f_e) or all down outputs
  (T·k·d), whatever the routing;
- CPU SDPA (``_scaled_dot_product_flash_attention_for_cpu``) keeps its output (T·h·hd, compute dtype) and its
  logsumexp (b·h·s, fp32); MLA runs SDPA's math fallback (q and v head dims differ), which keeps nothing.

The kept bytes are then exactly the full-recompute kept bytes plus the caches; both are asserted, and the
calculator's ``activation_bytes(..., recompute="selective")`` is checked against the same measurement. For the
other families (``test_selective_family``) the calculator is checked against the measurement alone: kept bytes
and recompute transient, exactly, with SDPA and eager attention, eager-loop and grouped experts.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import test_hf_oracle as hf  # noqa: E402
from sac_oracle import measure  # noqa: E402

from trainmath import families  # noqa: E402
from trainmath.errors import TrainmathError  # noqa: E402  (bad input below)

B, S = hf.B, hf.S
T = B * S
MODES = ("fp32", "bf16", "autocast")
COMPUTE = {"fp32": 4, "bf16": 2, "autocast": 2}
MIXTRAL = {"num_local_experts": 4, "num_experts_per_tok": 2}
GEMMA3 = {"layer_types": ["sliding_attention", "full_attention"]}
FAMILIES = {  # model_type: extra config (on test_hf_oracle.BASE)
    "llama": {}, "mistral": {}, "qwen3": {}, "olmo2": {}, "gemma3_text": GEMMA3, "qwen2": {}, "phi3": {},
    "qwen3_moe": hf.MOE, "mixtral": MIXTRAL,
}


def _kept_mms(seq) -> int:
    """Elements kept of a layer's mm sequence: ``("mm", n)`` is one mm of n output elements; ``("experts",
    gate_up, down)`` the routed experts' mms (an even count) with their total outputs."""
    count, kept = 0, 0
    for item in seq:
        if item[0] == "experts":
            kept += item[1] if count % 2 == 0 else item[2]
        else:
            kept += item[1] if count % 2 == 0 else 0
            count += 1
    return kept


def cache_rule(model_type: str, cfg: dict, mode: str, moe_layer: bool = True) -> int:
    """Bytes of one decoder layer's selective-checkpoint cache (see the module docstring)."""
    c = COMPUTE[mode]
    d, f = cfg["hidden_size"], cfg.get("intermediate_size")
    if model_type in ("deepseek_v3",):
        h, rope, nope, vd = (cfg[k] for k in ("num_attention_heads", "qk_rope_head_dim", "qk_nope_head_dim",
                                                 "v_head_dim"))
        attn = [("mm", T * cfg["q_lora_rank"]), ("mm", T * h * (nope + rope)),  # q_a_proj, q_b_proj
                ("mm", T * (cfg["kv_lora_rank"] + rope)), ("mm", T * h * (nope + vd)),  # kv_a, kv_b
                ("mm", T * d)]  # o_proj; attention: SDPA math fallback, nothing kept
        if not moe_layer:
            ffn = [("mm", T * f)] * 2 + [("mm", T * d)]
        else:
            fe, k, sh = cfg["moe_intermediate_size"], cfg["num_experts_per_tok"], cfg["n_shared_experts"]
            ffn = [("mm", T * cfg["n_routed_experts"]), ("experts", T * k * 2 * fe, T * k * d)]
            ffn += [("mm", T * fe * sh)] * 2 + [("mm", T * d)]  # shared experts: gate, up, down
        return c * _kept_mms(attn + ffn)
    h, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    sdpa = c * T * h * hd + 4 * B * h * S  # output + fp32 logsumexp
    if model_type == "phi3":
        attn = [("mm", T * (h + 2 * kv) * hd), ("mm", T * d)]  # fused qkv_proj, o_proj
        ffn = [("mm", T * 2 * f), ("mm", T * d)]  # fused gate_up_proj, down_proj
    else:
        qkv = [] if model_type == "qwen2" else [("mm", T * h * hd), ("mm", T * kv * hd), ("mm", T * kv * hd)]
        attn = qkv + [("mm", T * d)]  # qwen2: q/k/v have biases (addmm)
        if model_type in ("qwen3_moe", "mixtral"):
            e = cfg.get("num_experts") or cfg["num_local_experts"]
            fe, k = cfg.get("moe_intermediate_size") or cfg["intermediate_size"], cfg["num_experts_per_tok"]
            ffn = [("mm", T * e), ("experts", T * k * 2 * fe, T * k * d)]  # router, routed experts
        else:
            ffn = [("mm", T * f), ("mm", T * f), ("mm", T * d)]  # gate, up, down
    return c * _kept_mms(attn + ffn) + sdpa


def _router(data):
    """The router switches of a config dict under its family's config-class defaults."""
    return hf.Router.from_config(data, families.get(data["model_type"]).config_defaults)


def _ids():
    return torch.randint(0, 128, (B, S), generator=torch.Generator().manual_seed(1))


def _full_kept(cfg, mode, data=None, **kw):
    """The calculator's full-recompute kept bytes (exact against ``test_hf_oracle``), head included."""
    if data is None:
        act, predicted = hf._predict(cfg, mode, recompute="full", **kw)
    else:
        act, predicted = hf._predict_data(data, mode, recompute="full", **kw)
    return predicted - act.recompute_transient_bytes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_selective_kept_bytes(model_type, mode):
    cfg, model = hf._model(model_type, "sdpa", {**hf.NO_IDS, **FAMILIES[model_type]})
    hit = hf._experts_hit(model)
    m = measure(model, mode, _ids())
    assert set(hit) <= {4}, f"precondition: every expert receives tokens ({hit})"
    data = cfg.to_dict()
    if model_type == "qwen3_moe":
        data["num_experts"] = data["num_local_experts"]  # see test_hf_oracle._predict
    assert m.cache_bytes == [cache_rule(model_type, data, mode)] * cfg.num_hidden_layers
    assert m.total_bytes == _full_kept(cfg, mode) + sum(m.cache_bytes)
    # the recompute of a layer saves at most what the layer saves without checkpointing
    none, _ = hf._predict(cfg, mode)
    assert 0 < max(m.transient_bytes) <= none.tree().child("layers").value // cfg.num_hidden_layers
    # the calculator: a fold over the family's op list (ops.selective)
    act, predicted = hf._predict(cfg, mode, recompute="selective")
    assert predicted - act.recompute_transient_bytes == m.total_bytes
    assert act.recompute_transient_bytes == max(m.transient_bytes)


@pytest.mark.parametrize("mode", MODES)
def test_selective_kept_bytes_mla(mode):
    """DeepSeek-V3 (tiny): q LoRA, MLA through SDPA's math fallback, a dense first layer, then sigmoid-routed
    experts with a shared expert. Kept bytes and recompute transient exact.

    The transient used to measure 1,408 bytes (0.8%) above the fold in every precision: the oracle counted every
    tensor the recompute packed, but the checkpoint stores one only where the forward's node still holds its
    holder. The router's group selection (top-2 per group, top-k over groups, masked_fill) yields indices only:
    its nodes cannot reach the loss, die when forward ends, and their recomputed tensors die with the recomputed
    ops: (T, n_group, 2) + (T, topk_group) int64 indices and a (T, E) bool mask, 32·2·2·8 + 32·1·8 + 32·4 =
    1,408 bytes here. ``sac_oracle`` now counts the stored tensors only; asserted below with the old count."""
    data, model = hf._catalog_model("deepseek_v3")
    hit = hf._experts_hit(model)
    m = measure(model, mode, _ids())
    assert set(hit) == {4}, f"precondition: every expert receives tokens ({hit})"
    first = data["first_k_dense_replace"]
    assert m.cache_bytes == [cache_rule("deepseek_v3", data, mode, moe_layer=i >= first)
                             for i in range(data["num_hidden_layers"])]
    assert m.total_bytes == _full_kept(None, mode, data, router=_router(data)) + sum(m.cache_bytes)
    act, predicted = hf._predict_data(data, mode, recompute="selective", router=_router(data))
    assert predicted - act.recompute_transient_bytes == m.total_bytes
    assert act.recompute_transient_bytes == max(m.transient_bytes)
    assert max(m.packed_bytes) - max(m.transient_bytes) == T * 2 * 2 * 8 + T * 1 * 8 + T * 4


def test_every_second_mm_off_keeps_every_mm():
    """``every_second_mm=False``: every mm is kept (llama fp32: q, k, v, o, gate, up, down + SDPA)."""
    cfg, model = hf._model("llama", "sdpa", dict(hf.NO_IDS))
    m = measure(model, "fp32", _ids(), every_second_mm=False)
    h, kv, hd, d, f = 4, 2, 16, 64, 96
    assert m.cache_bytes == [4 * T * (2 * h * hd + 2 * kv * hd + d + 2 * f + d) + 4 * B * h * S] * 2


def test_force_recompute_router_shape():
    """torchtitan's ``per_op_sac_force_recompute_mm_shapes_by_fqns``: the router's mm (d → E) is recomputed and
    not counted, so the experts' gate_up outputs are kept instead of their down outputs (qwen3_moe fp32)."""
    cfg, model = hf._model("qwen3_moe", "sdpa", {**hf.NO_IDS, **hf.MOE})
    m = measure(model, "fp32", _ids(), per_op_sac_force_recompute_mm_shapes_by_fqns=("mlp.gate",))
    h, kv, hd, k, fe = 4, 2, 16, 2, 32
    assert m.cache_bytes == [4 * T * (h * hd + kv * hd + k * 2 * fe + h * hd) + 4 * B * h * S] * 2


@pytest.mark.parametrize("mode", MODES)
def test_selective_eager_attention(mode):
    """Eager attention runs ``bmm``s and a softmax, none of which the policy keeps: only the mms are cached
    (Qwen3: q, v, gate, down), and the calculator's eager profile folds the same. Eager layers also get the
    (b, 1, s, s) causal mask in the parameters' dtype, which the checkpoint holds as an argument (one storage
    for all layers): the fold's ``attention mask (checkpoint argument)``."""
    cfg, model = hf._model("qwen3", "eager", dict(hf.NO_IDS))
    m = measure(model, mode, _ids())
    h, kv, hd, d, f = 4, 2, 16, 64, 96
    assert m.cache_bytes == [COMPUTE[mode] * T * (h * hd + kv * hd + f + d)] * 2
    act, predicted = hf._predict(cfg, mode, profile="eager", recompute="selective")
    assert act.masks.value == hf.PREC[mode][1] * B * S * S
    assert predicted - act.recompute_transient_bytes == m.total_bytes
    assert act.recompute_transient_bytes == max(m.transient_bytes)


def test_apply_selective_bad_input():
    from trainmath.runtime.checkpointing import apply_selective

    _, model = hf._model("llama", "sdpa", dict(hf.NO_IDS))
    with pytest.raises(TrainmathError, match="policy 'every-layer' is unknown; use one of torchtitan-op"):
        apply_selective(model, policy="every-layer")
    with pytest.raises(TrainmathError, match="matched 'mlp.act_fn', a .* without a 2-D weight"):
        apply_selective(model, per_op_sac_force_recompute_mm_shapes_by_fqns=("act_fn",))
    assert not any(layer.gradient_checkpointing for layer in model.model.layers)  # nothing changed half-way
    with pytest.raises(TrainmathError, match="no transformers decoder layers"):
        apply_selective(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_selective_grouped_experts(model_type, mode):
    """transformers 5's default experts path (``grouped_mm``): ``aten._grouped_mm`` is not kept and not counted,
    so only the attention's mms, SDPA and the router's mm are cached; the fold with ``experts="grouped"``
    equals the measurement, transient included."""
    cfg = transformers.AutoConfig.for_model(model_type, **{**hf.BASE, **hf.NO_IDS, **FAMILIES[model_type]})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa",
                                                          experts_implementation="grouped_mm")
    m = measure(model, mode, _ids())
    h, kv, hd, e = 4, 2, 16, 4
    # q, v, the router's logits (the 5th mm), SDPA
    assert m.cache_bytes == [COMPUTE[mode] * T * (h * hd + kv * hd + e + h * hd) + 4 * B * h * S] * 2
    act, predicted = hf._predict(cfg, mode, recompute="selective", experts="grouped")
    assert predicted - act.recompute_transient_bytes == m.total_bytes
    assert act.recompute_transient_bytes == max(m.transient_bytes)


def _family_cases():
    """(id, build, attn, experts, mode): every family of the table not covered above, as ``test_hf_oracle`` builds
    it (eager-loop experts), plus eager attention, grouped experts and the other MLA variants. The first case of
    each (family, kernel) runs in every precision, the variants in one each (their byte-level differences are
    precision-independent)."""
    out, seen = [], set()

    def add(name, build, attn, experts="eager"):
        key = (name.split("-")[0], attn, experts)
        modes = MODES if key not in seen else (MODES[len(out) % 3],)
        seen.add(key)
        out.extend((f"{name}-{mode}", build, attn, experts, mode) for mode in modes)

    def family(model_type, extra, attn, experts="eager"):
        def build():
            if experts == "eager":
                cfg, model = hf._model(model_type, attn, {**hf.NO_IDS, **extra})
                return cfg.to_dict(), model
            cfg = transformers.AutoConfig.for_model(model_type, **{**hf.BASE, **hf.NO_IDS, **extra})
            torch.manual_seed(0)
            return cfg.to_dict(), transformers.AutoModelForCausalLM.from_config(
                cfg, attn_implementation=attn, experts_implementation="grouped_mm")
        return build

    def catalog(model_type, extra, experts="eager"):
        def build():
            data, model = hf._catalog_model(model_type, extra)
            if experts == "grouped":
                model.set_experts_implementation("grouped_mm")
            return data, model
        return build

    for i, (model_type, extra, attn) in enumerate(hf.FAMILY_CASES):
        add(f"{model_type}-{attn}-{i}", family(model_type, extra, attn), attn)
    for model_type, extra, _ in hf.FAMILY_CASES:
        if model_type in ("falcon", "starcoder2", "cohere") and (model_type, "eager", "eager") not in seen:
            add(f"{model_type}-eager", family(model_type, extra, "eager"), "eager")
    qwen2_moe = {**hf.MOE, "shared_expert_intermediate_size": 48, "num_hidden_layers": 3, "mlp_only_layers": [1]}
    glm = next(e for m, e, _ in hf.FAMILY_CASES if m == "glm4_moe")
    add("qwen2_moe", family("qwen2_moe", qwen2_moe, "sdpa"), "sdpa")
    add("qwen2_moe-grouped", family("qwen2_moe", qwen2_moe, "sdpa", "grouped"), "sdpa", "grouped")
    add("glm4_moe-grouped", family("glm4_moe", glm, "sdpa", "grouped"), "sdpa", "grouped")
    for i, (model_type, extra) in enumerate(hf.MLA_CASES):
        if i:  # deepseek_v3's first case: test_selective_kept_bytes_mla
            add(f"{model_type}-{i}", catalog(model_type, extra), "sdpa")
        if not extra:
            add(f"{model_type}-grouped", catalog(model_type, extra, "grouped"), "sdpa", "grouped")
    return out


FAMILY_CASES = _family_cases()


@pytest.mark.parametrize("case", FAMILY_CASES, ids=[c[0] for c in FAMILY_CASES])
def test_selective_family(case):
    """Kept bytes (layer inputs, attention masks, caches, what is saved outside the layers) and the recompute
    transient of the fold equal the measurement, for every family the hf profile models."""
    _, build, attn, experts, mode = case
    data, model = build()
    hit = hf._experts_hit(model)
    m = measure(model, mode, _ids())
    assert set(hit) <= {4}, f"precondition: every expert of the (4-expert) MoE layers receives tokens ({hit})"
    kw = {"router": _router(data)} if data["model_type"].startswith("deepseek") else {}
    act, predicted = hf._predict_data(data, mode, profile="eager" if attn == "eager" else "hf",
                                      recompute="selective", experts=experts, **kw)
    assert predicted - act.recompute_transient_bytes == m.total_bytes
    assert act.recompute_transient_bytes == max(m.transient_bytes)
