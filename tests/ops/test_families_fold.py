"""Op lists of the ported families (OLMo-2, Gemma-2/3, Cohere, StarCoder2, GPT-2, Falcon) and the model-level ops
(embedding, rotary tables, head) beyond what the transformers oracle in ``tests/activations`` sees: full-size
catalog configs pinned, every Linear weight a linear op, and per-rank folds derived rule by rule."""

import pytest

from trainmath.families import spec_from_config
from trainmath.memory.activations import activation_bytes, logits_bytes
from trainmath.ops.context import Ctx, Family
from trainmath.ops.fold import layer_node
from trainmath.ops.ir import SINGLE, Degrees, Program
from trainmath.sources import catalog_index, load_spec
from trainmath.tree import check_sums
from trainmath.vocabulary import precision_of

PREC = [(2, 4), (2, 2), (4, 4)]
# activation_bytes(b=1, s=128) and logits_bytes' saved part per precision (autocast, bf16, fp32): the values of the
# per-family functions these op lists replaced (equal for every catalog model, b=2 s=64 and b=1 s=16 too, hf and
# eager, all layers or one, recompute none or full), which the oracle checked on tiny configs.
PINNED = {
    "CohereForAI/aya-23-8B": [(14882063360, 2235565572), (789660672, 138429956), (1376404480, 139462148)],
    "allenai/OLMo-2-1124-7B": [(14152303616, 878708228), (1099629568, 56624644), (1661666304, 57673220)],
    "bigcode/starcoder2-7b": [(14580188160, 481691652), (537560064, 27526660), (1074529280, 29886468)],
    "google/gemma-2-27b": [(55358731268, 2561822212), (3102618626, 202526212), (5140591620, 269241860)],
    "google/gemma-2-9b": [(18339992580, 2036219396), (1577063426, 201211396), (2446988292, 267664900)],
    "google/gemma-3-1b-it": [(1792919556, 739678212), (374130690, 135698436), (590792708, 135993348)],
    "openai-community/gpt2": [(240748544, 103518212), (66148352, 26126340), (132220928, 26520068)],
    "tiiuae/falcon-180B": [(360051411200, 1975650308), (4573546752, 40896004), (9137588480, 48498692)],
    "tiiuae/falcon-7b": [(14108165632, 627722244), (781764096, 35620356), (1191282176, 37947396)],
}


DROPOUT = ("bigcode/starcoder2-7b", "openai-community/gpt2")
"""Catalog configs with dropout 0.1 (the pins above predate dropout): on CUDA (the default device) each layer's two
residual dropouts and the embedding's keep a bool (T, d) mask; the attention's dropout adds nothing to SDPA's
fused kernels (``ops.kernels.dropout``)."""


@pytest.mark.parametrize("model", sorted(PINNED))
def test_catalog_pinned(model):
    spec = load_spec(model)
    masks = (2 * spec.num_layers + 1) * 128 * spec.hidden_size if model in DROPOUT else 0
    for (c, p), (act, head) in zip(PREC, PINNED[model]):
        a = activation_bytes(spec, micro_batch=1, seq=128, compute_dtype_bytes=c, param_dtype_bytes=p)
        h = logits_bytes(spec, 1, 128, compute_dtype_bytes=c, param_dtype_bytes=p)
        assert check_sums(a.tree()) == [] and check_sums(h.tree()) == []
        # micro-batch 1: the shifted labels are a view of the padded (1, s + 1) labels (8 bytes more, labels_pad)
        assert (a.total_bytes, h.saved_bytes) == (act + masks, head + 8)


def _emit(spec, layer, *, b=2, s=16, c=2, p=2, eager=False):
    st = spec.family.style
    ctx = Ctx(b=b, s=s, d=spec.hidden_size, p=precision_of(compute_bytes=c, weight_bytes=p),
              eager=eager or st.attention == "eager",
              family=Family.from_config(spec.options, spec.family.config_defaults))
    prog = Program()
    spec.family.layer(prog, ctx, layer, st)
    return prog.ops


DENSE = ("llama", "mistral", "qwen2", "qwen3", "phi3", "olmo2", "gemma2", "gemma3_text", "cohere", "starcoder2",
         "gpt2", "falcon")
CATALOG = sorted(m for m in catalog_index() if load_spec(m).model_type in DENSE)


@pytest.mark.parametrize("model", CATALOG)
def test_every_linear_weight_is_a_linear_op(model):
    """The autocast weight copies fold from the linear ops: each Linear weight of a layer is one op's weight, and
    a degree-1 layout folds to the single device."""
    spec = load_spec(model)
    for layer, _ in spec.layer_groups():
        ops = _emit(spec, layer, p=4)
        linears = sorted(t.name for t in layer.tensors if t.kind == "linear")
        assert sorted(op.weight.name for op in ops if op.kind == "linear") == linears
        assert all(op.weight is None for op in ops if op.kind != "linear" and op.kind != "norm")
        one = Degrees(tp=1, sp=False, cp=1, ep=1, vocab_parallel=True)
        assert layer_node(layer.label, ops, one) == layer_node(layer.label, ops, SINGLE)


def _tiny(model_type, **extra):
    base = {"gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, vocab_size=128, n_positions=64),
            "olmo2": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)}[model_type]
    return spec_from_config({"model_type": model_type, **base, **extra}, name="tiny", source="test")


B, S, D, F, H = 2, 16, 64, 96, 4
T = B * S


@pytest.mark.parametrize("c,p", [(2, 2), (2, 4)])
def test_gpt2_layer_per_rank_rule_by_rule(c, p):
    """GPT-2 at tp=2 (column-wise c_attn/c_fc, row-wise c_proj): what is inside the tensor-parallel region halves
    (the fused qkv, the attention output and logsumexp per head, the MLP width), the LayerNorms and the Linears'
    inputs stay whole; with sequence parallelism the LayerNorms halve too and each Linear's input is its own
    all-gathered copy (whole). GPT-2's default dropouts (0.1) on CUDA: the two residual dropouts keep a bool mask
    each on the residual stream's axes, as the LayerNorms."""
    spec = _tiny("gpt2")
    layer = spec.layers[0]
    r = p  # residual stream dtype
    norms = 2 * (r * T * D + 2 * r * T) + 2 * T * D  # two LayerNorms: input, mean, rstd; two dropout masks
    inputs = 2 * c * T * D  # c_attn's and c_fc's input (the norm outputs, or their casts)
    inside = c * T * 3 * D + c * T * D + 4 * B * H * S + 5 * c * T * F  # qkv, output, lse; c_fc, gelu_new, c_proj
    copies = c * (D * 3 * D + D * D + D * F + F * D) if p > c else 0
    ops = _emit(spec, layer, c=c, p=p)
    assert layer_node("l", ops).value == norms + inputs + inside + copies
    assert layer_node("l", ops, Degrees(tp=2)).value == norms + inputs + inside // 2 + copies // 2
    assert layer_node("l", ops, Degrees(tp=2, sp=True)).value == norms // 2 + inputs + inside // 2 + copies // 2
    assert layer_node("l", ops, Degrees(cp=2)).value == (norms + inputs + inside) // 2 + copies


def test_olmo2_layer_per_rank_rule_by_rule():
    """OLMo-2 at tp=2 in bf16: no input norm, so q/k/v and gate/up read the residual stream (whole, gathered under
    sequence parallelism); the full-width q/k norms keep per-head-sharded values but whole per-row rsqrt; the
    post-norms act on the reduced outputs, on the residual stream's axes (halved only with sequence parallelism)."""
    spec = _tiny("olmo2")
    q, kv = D, D // 2
    inputs = 2 * 2 * T * D  # the residual read by q/k/v, and the one read by gate/up
    qk_rows = 2 * 4 * T  # q_norm and k_norm rsqrt per token (a norm over the whole projection)
    inside = (2 * 4 * T * q + 2 * 4 * T * kv  # q/k norms: fp32 x and normalised y
              + 2 * T * (q + 2 * kv) + 2 * T * q + 4 * B * H * S  # SDPA: q, k, v, output, logsumexp
              + 4 * 2 * T * F)  # gate, act, up, product
    post = 2 * (2 * 4 * T * D + 4 * T)  # two post-norms: fp32 x, fp32 y, rsqrt
    ops = _emit(spec, spec.layers[0])
    assert layer_node("l", ops).value == inputs + qk_rows + inside + post
    assert layer_node("l", ops, Degrees(tp=2)).value == inputs + qk_rows + inside // 2 + post
    assert layer_node("l", ops, Degrees(tp=2, sp=True)).value == inputs + qk_rows + inside // 2 + post // 2


@pytest.mark.parametrize("model", ["tiiuae/falcon-7b", "tiiuae/falcon-180B"])
def test_falcon_variants_keep_their_kernels(model):
    """Falcon-7B (multi-query: 1 kv head, no enable_gqa) runs SDPA's math fallback and keeps no mask; the new
    decoder architecture (180B) broadcasts k/v to h heads and SDPA keeps its (b, 1, s, s) mask."""
    spec = load_spec(model)
    ops = _emit(spec, spec.layers[0])
    att = next(op for op in ops if op.kind == "attention")
    names = {t.name for t in att.saved}
    if model.endswith("7b"):
        assert att.kernel == "sdpa_math" and "sdpa.attn_mask" not in names
    else:
        assert att.kernel == "sdpa" and "sdpa.attn_mask" in names
        mask = next(t for t in att.saved if t.name == "sdpa.attn_mask")
        assert mask.nbytes() == 2 * B * S * S and mask.nbytes(Degrees(cp=2)) == 2 * B * S * S // 2
    index = [op for op in ops if op.kind == "index"]
    assert len(index) == 1 and sum(t.nbytes(Degrees(tp=8)) for t in index[0].saved) == 16


def _leaves(node):
    return {n.name: n.value for _, n in node.walk() if not n.children}


def test_rotary_tables_per_rank():
    """Gemma-3: one cos/sin pair per kind of layer on the rank (sliding and full); Llama 4: a rank holding only
    no-RoPE layers keeps no freqs_cis; OLMo-2: cos/sin in fp32 in a bf16 model; GPT-2: learned positions, no
    table, but the (1, s) position ids."""
    s = 64
    g = load_spec("google/gemma-3-1b-it")
    hd = g.layers[0].blocks[0].dims.head_dim
    kinds = {i: any(bl.dims.sliding_window is not None for bl in layer.blocks if bl.kind == "attention")
             for i, layer in enumerate(g.layers)}
    sliding, full = next(i for i, w in kinds.items() if w), next(i for i, w in kinds.items() if not w)
    for layers, sets in (([sliding], 1), ([sliding, full], 2)):
        rot = activation_bytes(g, micro_batch=1, seq=s, layers=layers).rotary
        assert _leaves(rot) == {"cos": sets * 4 * s * hd, "sin": sets * 4 * s * hd}
    l4 = load_spec("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    nope = [i for i, layer in enumerate(l4.layers)
            if all(bl.dims.sliding_window is None for bl in layer.blocks if bl.kind == "attention")]
    rope = next(i for i in range(l4.num_layers) if i not in nope)
    assert activation_bytes(l4, micro_batch=1, seq=s, layers=nope[:1]).rotary is None
    hd4 = next(bl.dims.head_dim for bl in l4.layers[rope].blocks if bl.kind == "attention")
    assert _leaves(activation_bytes(l4, micro_batch=1, seq=s, layers=[rope]).rotary) == {
        "freqs_cis": 8 * s * hd4 // 2}
    o = load_spec("allenai/OLMo-2-1124-7B")
    hdo = o.layers[0].blocks[0].dims.head_dim
    rot = activation_bytes(o, micro_batch=1, seq=s, compute_dtype_bytes=2, param_dtype_bytes=2).rotary
    assert _leaves(rot) == {"cos": 4 * s * hdo, "sin": 4 * s * hdo}
    gpt2 = activation_bytes(load_spec("openai-community/gpt2"), micro_batch=2, seq=s)
    assert gpt2.rotary is None
    assert _leaves(gpt2.embedding) == {"input_ids": 8 * 2 * s, "position_ids": 8 * s,
                                                "embedding.dropout.mask": 2 * s * 768}  # embd_pdrop 0.1, CUDA


@pytest.mark.parametrize("model,softcap", [("google/gemma-2-9b", True), ("CohereForAI/aya-23-8B", False)])
def test_head_quirks(model, softcap):
    """Gemma-2's final soft-capping keeps the tanh (c·T·V); Cohere's logit_scale, a Python-float product, keeps
    nothing; both halve their vocabulary terms over a vocabulary-parallel tp=2."""
    spec = load_spec(model)
    V, d, b, s = spec.vocab_size, spec.hidden_size, 1, 32
    one, two = logits_bytes(spec, b, s), logits_bytes(spec, b, s, tp=2)
    assert ("softcap_tanh" in _leaves(one.tree())) == softcap
    vocab = 2 * V * d + 4 * b * s * V + (2 * b * s * V if softcap else 0)  # weight cast, log-probs, tanh
    assert one.saved_bytes - two.saved_bytes == vocab - vocab // 2
    assert _leaves(one.tree().child("not saved")) == {"logits": 2 * b * s * V, "logits_fp32 (transient)": 4 * b * s * V}
