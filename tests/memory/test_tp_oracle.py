"""Oracle: what transformers' decoder layers save for backward on one rank under torch tensor parallelism.

Measured on real gloo ranks (``tests/memory/tp_oracle.py``: ``apply_tp`` then ``saved_tensors_hooks``, DTensors
counted by their local storage) and asserted to the byte against ``derived``, a rule-by-rule derivation written
here independently of the calculator: every tensor a layer saves is whole on every rank, divided by tp on its
heads or width, divided by tp on its sequence under SP, or divided by tp on the vocabulary with the
vocabulary-parallel head (the table in docs/tensor-parallel.md). Degree 1 equals the single-device measurement.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import tp_oracle  # noqa: E402
from tp_oracle import BASE, B, S  # noqa: E402

RULES = ("whole", "heads", "width", "seq", "gathered", "vocab")
"""whole: the full tensor on every rank; heads / width: ÷tp (column-split output, the rank's heads or MLP
columns; autocast's bf16 copy of a split weight); seq: ÷tp on the sequence with SP, whole without; gathered: the
all-gathered input of a column-parallel linear under SP (whole; without SP the same tensor is simply whole);
vocab: ÷tp with the vocabulary-parallel head (without it the same tensors are counted as whole)."""


def derived(model_type: str, attn: str, mode: str, *, tp: int, sp: bool, vp: bool, b: int = B, s: int = S,
            d: int = BASE["hidden_size"], heads: int = BASE["num_attention_heads"],
            kv_heads: int = BASE["num_key_value_heads"], head_dim: int = BASE["head_dim"],
            ffn: int = BASE["intermediate_size"], vocab: int = BASE["vocab_size"],
            layers: int = BASE["num_hidden_layers"]) -> dict[str, int]:
    """Bytes one rank saves for backward, by rule (``RULES``), for the llama / mistral / qwen2 / qwen3 decoder
    (qwen3: per-head q/k RMSNorms) under ``apply_tp``. Derived from the modeling code, op by op
    (docs/tensor-parallel.md):

    - RMSNorm (``x.to(fp32)``; ``x * rsqrt(mean(x²) + eps)``; ``w * h.to(input_dtype)``) keeps the fp32 input
      (the fp32 residual stream itself, or its fp32 copy in bf16), the fp32 rsqrt (T × 1) and the normalised
      product in the stream dtype: ``seq``.
    - each linear keeps its input (the norm output; under autocast, each projection its own bf16 cast) —
      ``gathered`` — and, under autocast, its bf16 weight copy: ``width`` (``vocab`` for the head).
    - attention keeps rotary cos/sin once (whole); SDPA q, k, v, out (= o_proj's input) and the fp32 logsumexp;
      eager the bmm operands (q, k and v repeated to all heads, the fp32 softmax, its bf16 copy) and o_proj's
      contiguous input: ``heads``. qwen3's q/k norms keep the fp32 upcast, the rsqrt, the product: ``heads``.
    - SwiGLU keeps gate, up, silu(gate), their product (down_proj's input): ``width``.
    - the loss keeps the ids, the fp32 log-softmax (``vocab``), the shifted targets (with b = 1 the padded
      labels' storage, s + 1 long) and nll's total weight.
    """
    T = b * s
    q, kvw = heads * head_dim, kv_heads * head_dim
    c = 4 if mode == "fp32" else 2  # matmul outputs (autocast: bf16)
    stream = 2 if mode == "bf16" else 4  # the residual stream and cos/sin
    auto = mode == "autocast"
    out = dict.fromkeys(RULES, 0)
    Tseq = T // tp if sp else T

    def norm() -> None:
        out["seq"] += 4 * Tseq * d + 4 * Tseq + stream * Tseq * d

    def linear_inputs(n: int) -> None:  # n projections read the same normalised input
        out["gathered"] += n * 2 * T * d if auto else c * T * d

    for _ in range(layers):
        norm()
        linear_inputs(3)
        if model_type == "qwen3":  # q_norm, k_norm on the rank's heads
            out["heads"] += (4 * T * (q + kvw) + 4 * T * (heads + kv_heads) + c * T * (q + kvw)) // tp
        if attn == "sdpa":
            out["heads"] += (c * T * (2 * q + 2 * kvw) + 4 * b * heads * s) // tp
        else:
            probs = b * heads * s * s
            out["heads"] += (4 * c * T * q + 4 * probs + (0 if mode == "fp32" else 2 * probs)) // tp
        norm()
        linear_inputs(2)
        out["width"] += 4 * c * T * ffn // tp
        if auto:
            out["width"] += 2 * (2 * d * q + 2 * d * kvw + 3 * d * ffn) // tp
    out["whole"] += 2 * s * head_dim * stream  # cos, sin: (1, 1, s, head_dim), shared by the layers
    norm()  # the final norm
    linear_inputs(1)  # lm_head
    if auto:
        out["vocab" if vp else "whole"] += 2 * vocab * d // (tp if vp else 1)
    out["vocab" if vp else "whole"] += 4 * T * vocab // (tp if vp else 1)
    # ids; the shifted targets ``pad(labels, (0, 1))[..., 1:].contiguous()``, which with one sequence is already
    # contiguous, so the view keeps the padded (1, s + 1) storage; nll's total_weight
    out["whole"] += 8 * T + 8 * (s + 1 if b == 1 else T) + 4
    return out


def total(model_type, attn, mode, **kw) -> int:
    return sum(derived(model_type, attn, mode, **kw).values())


# tp = 2 on real gloo ranks: every family, both kernels, every precision, every layout at least twice
TP2 = [
    ("llama", "sdpa", "fp32", False, False), ("llama", "sdpa", "fp32", True, False),
    ("llama", "sdpa", "fp32", False, True), ("qwen3", "sdpa", "bf16", True, True),
    ("qwen3", "eager", "autocast", False, False), ("qwen3", "eager", "autocast", True, True),
    ("mistral", "sdpa", "autocast", True, False), ("qwen2", "eager", "bf16", False, True),
]
DERIVED = len(TP2)
"""The first cases are llama-like decoders, which ``derived`` describes; the rest are checked against the fold."""
TP2 += [
    ("gemma3_text", "sdpa", "bf16", True, True), ("olmo2", "sdpa", "fp32", False, False),
    ("olmo2", "sdpa", "autocast", True, True), ("starcoder2", "sdpa", "fp32", True, False),
    ("cohere", "sdpa", "bf16", False, True), ("qwen3_moe", "sdpa", "fp32", False, False),
    ("qwen3_moe:eager", "sdpa", "autocast", True, True), ("phi3", "sdpa", "fp32", True, True),
]
"""Families beyond llama's shape, each under at least two layouts: Gemma-3 (sandwich norms, per-head q/k norms
on (b, h, s, h_d)), OLMo-2 (q/k norms over the whole projection: ``FeatureShardedNorm``), StarCoder2 (LayerNorms
with bias, ``c_fc``/``c_proj``), Cohere (one norm feeding attention and MLP), Qwen3-MoE (routed experts split on
their width, grouped_mm and the eager loop), Phi-3 (fused qkv_proj / gate_up_proj, rows interleaved per rank)."""
PEAK = [("llama", "sdpa", "fp32", False, False), ("qwen3", "sdpa", "bf16", True, True)]
"""Cases whose full step is also measured under MemTracker (for the fake simulation's check)."""
IDS = ["-".join(str(x) for x in c) for c in TP2]
PRECISION = {"fp32": "fp32", "bf16": "bf16", "autocast": "amp-bf16"}


@pytest.fixture(scope="module")
def tp2():
    """One 2-rank gloo run of every TP2 case: ``{case: [rank 0's, rank 1's]}``."""
    return dict(zip(TP2, tp_oracle.run_tp(2, TP2, peak_cases=set(PEAK))))


@pytest.fixture(scope="module")
def single():
    """The single-device measurement (no process group) of each TP2 case's model."""
    return {c[:3]: tp_oracle.measure_case((*c[:3], False, False), peak=False) for c in TP2}


@pytest.mark.parametrize("case", TP2[:DERIVED], ids=IDS[:DERIVED])
def test_tp2_saved_bytes_equal_derivation(tp2, case):
    model_type, attn, mode, sp, vp = case
    want = total(model_type, attn, mode, tp=2, sp=sp, vp=vp)
    assert [r["saved"] for r in tp2[case]] == [want, want]


def fold(case, tp: int = 2) -> int:
    """The calculator's per-rank saved bytes (``activation_bytes`` + the saved part of ``logits_bytes``) for a
    case's tiny model, from its config as the CLI reads it."""
    from trainmath.families import spec_from_config
    from trainmath.memory.activations import activation_bytes, logits_bytes

    model_type, attn, mode, sp, vp = case
    model_type, _, experts = model_type.partition(":")
    data = tp_oracle.tiny_config(model_type).to_dict()
    if model_type == "qwen3_moe":  # transformers 5.24 writes num_experts as num_local_experts (attribute_map)
        data["num_experts"] = data["num_local_experts"]
    spec = spec_from_config(data, name="tiny", source="test")
    c, p = {"fp32": (4, 4), "bf16": (2, 2), "autocast": (2, 4)}[mode]
    kw = dict(compute_dtype_bytes=c, param_dtype_bytes=p, tp=tp, sp=sp)
    act = activation_bytes(spec, micro_batch=B, seq=S, profile="eager" if attn == "eager" else "hf",
                           experts="eager" if experts == "eager" else "grouped", vocab_parallel=vp, **kw)
    return act.total_bytes + logits_bytes(spec, B, S, vocab_parallel=vp, **kw).saved_bytes


@pytest.mark.parametrize("case", TP2, ids=IDS)
def test_tp2_saved_bytes_equal_the_fold(tp2, case):
    """Every case, every family: what each real rank saves is the calculator's per-rank fold, to the byte."""
    assert [r["saved"] for r in tp2[case]] == [fold(case)] * 2


FP32 = [c for c in TP2 if c[2] == "fp32"]


@pytest.mark.parametrize("case", FP32, ids=[i for c, i in zip(TP2, IDS) if c[2] == "fp32"])
def test_tp2_gradients_equal_the_single_device(tp2, single, case):
    """The plans compute the single device's gradients (fp32 cases): every parameter a rank holds whole has the
    single device's gradient on every rank (a replicated DTensor's ``Partial`` gradient taken in full), and the
    split ones' squared norms sum over the ranks to the single device's."""
    ref = {**single[case[:3]]["grads"]["whole"], **single[case[:3]]["grads"]["split"]}
    ranks = [r["grads"] for r in tp2[case]]
    assert all(g["whole"].keys() | g["split"].keys() == ref.keys() for g in ranks)
    for g in ranks:
        assert g["whole"] == pytest.approx({k: ref[k] for k in g["whole"]}, rel=1e-4)
    assert {k: ranks[0]["split"][k] + ranks[1]["split"][k] for k in ranks[0]["split"]} == pytest.approx(
        {k: ref[k] for k in ranks[0]["split"]}, rel=1e-4)


def test_derivation_at_degree_1_is_the_single_device_measurement(single):
    """The derivation at tp = 1 is the single-device oracle (``tests/activations/test_hf_oracle.py``'s method)."""
    keys = {c[:3] for c in TP2[:DERIVED]}
    assert {k: total(*k, tp=1, sp=False, vp=False) for k in keys} == {k: single[k]["saved"] for k in keys}


def test_fold_at_degree_1_is_the_single_device_measurement(single):
    """The calculator at tp = 1 is the single-device measurement for every family here (as in
    ``tests/activations/test_hf_oracle.py``)."""
    assert {k: fold((*k, False, False), tp=1) for k in single} == {k: v["saved"] for k, v in single.items()}


def test_one_sequence_keeps_the_padded_labels():
    """b = 1: the shifted targets are a view of the padded labels, 8 bytes more than b·s int64 (a whole tensor,
    the same on every rank)."""
    got = tp_oracle.measure_case(("qwen3", "sdpa", "bf16", False, False), peak=False, b=1)
    assert got["saved"] == total("qwen3", "sdpa", "bf16", tp=1, sp=False, vp=False, b=1)
    assert [8 * (S + 1), [S], "torch.int64", False] in got["rows"]  # 16 targets held by a 17-long storage


@pytest.mark.parametrize("case", [("llama", "sdpa", "fp32", True, True), ("qwen3", "eager", "autocast", True, True)],
                         ids=["llama", "qwen3"])
def test_degree_1_mesh_equals_single_device(single, case):
    """``apply_tp`` over a gloo mesh of one rank (SP and vocab-parallel plans, DTensors everywhere) saves what the
    plain model saves."""
    with tp_oracle.process_group("gloo", 1) as mesh:
        got = tp_oracle.measure_case(case, mesh, peak=False)
    assert got["saved"] == single[case[:3]]["saved"]


@pytest.mark.parametrize("case", [("llama", "sdpa", "bf16", False, True), ("qwen3", "sdpa", "autocast", True, False)],
                         ids=["llama", "qwen3"])
def test_tp4_saved_bytes_equal_derivation(case):
    """tp = 4 (4 KV heads): rank 0 over a fake process group of 4 with real tensors (collectives move no data,
    but what is saved depends on shapes only, for these dense models)."""
    with tp_oracle.process_group("fake", 4) as mesh:
        got = tp_oracle.measure_case(case, mesh, peak=False, num_key_value_heads=4)
    model_type, attn, mode, sp, vp = case
    assert got["saved"] == total(model_type, attn, mode, tp=4, sp=sp, vp=vp, kv_heads=4)


@pytest.mark.parametrize("case", PEAK, ids=["llama-tp", "qwen3-sp-vocab"])
def test_fake_simulation_equals_gloo_rank(tp2, case):
    """``simulate`` (full width on fake tensors, one rank over a fake process group) measures what rank 0 of the
    real gloo run measures: the step's peak and every kind of it, and the bytes saved by the forward — exactly,
    less the module buffers (a model built in bf16 keeps its rotary buffers fp32; ``.to(bfloat16)`` converts
    them)."""
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup
    from trainmath.verify.simulate import simulate

    model_type, attn, mode, sp, vp = case
    setup = TrainingSetup(loop_keeps="output", micro_batch=B, seq=S, precision=PRECISION[mode], attention=attn,
                          optimizer_impl="forloop", device="cpu")
    sim = simulate({"model_type": model_type, **BASE}, setup, ParallelLayout(tp=2, sp=sp, vocab_parallel=vp))
    real = tp2[case][0]
    assert sim.saved_bytes == real["saved"]
    # the gloo rank's peak is a real run's: on loaded cores a collective's small output (the loss-parallel
    # reductions, ≤ 256 B here) can outlive the peak op by one step (seen once in CI: 128 B), so the whole peak
    # and its activations and temporaries agree within that; parameters, gradients, optimizer states and the
    # saved bytes above exactly
    peak_sim, peak_real = sim.peak_bytes - sim.buffers_bytes, real["peak"]["Total"] - real["peak"]["buffers"]
    assert 0 <= peak_real - peak_sim <= 256, (peak_sim, peak_real)
    exact = {k: v for k, v in real["peak"].items() if k in ("Parameter", "Gradient", "Optstate")}
    assert {k: sim.by_kind[k] for k in exact} == exact
    assert sum(abs(sim.by_kind[k] - real["peak"].get(k, 0)) for k in ("Activation", "Temp")) <= 256


def test_cli_simulate_tp(tmp_path, capsys):
    """``memory --simulate --tp 2 --sp --vocab-parallel``: the simulated rank beside the hf profile's per-rank
    prediction (the CPU one, as the simulation runs on the CPU)."""
    import json

    from trainmath.cli import main

    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "qwen3", **BASE}))
    args = ["memory", str(f), "--micro-batch", "2", "--seq", "16", "--precision", "bf16", "--tp", "2", "--sp",
            "--vocab-parallel"]
    assert main(args + ["--simulate", "--optimizer-impl", "forloop", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulation"]["saved_bytes"] == total("qwen3", "sdpa", "bf16", tp=2, sp=True, vp=True)
    assert "prediction_error" not in out and out["layout"]["tp"] == 2 and out["layout"]["vocab_parallel"]
    assert out["simulation"]["predicted_cpu_peak_bytes"] > 0
    assert main(args) == 0
    capsys.readouterr()
    assert main(args + ["--simulate"]) == 2  # foreach AdamW on DTensors is refused before anything runs
    assert "--optimizer-impl forloop" in capsys.readouterr().err
    tp4 = [a if a != "2" or i != args.index("--tp") + 1 else "4" for i, a in enumerate(args)]
    assert main(tp4 + ["--simulate", "--optimizer-impl", "forloop"]) == 2  # the layout's own line, before running
    assert "tp (4) must divide KV heads (2)" in capsys.readouterr().err


def test_apply_tp_refuses_what_it_cannot_split():
    from trainmath.errors import TrainmathError
    from trainmath.runtime.tensor_parallel import check_tp

    cfg = tp_oracle.tiny_model("qwen3", "sdpa", "fp32").config
    with pytest.raises(TrainmathError, match=r"--tp 4 must divide the attention heads \(4\) and KV heads \(2\)"):
        check_tp(cfg, 4)
    with pytest.raises(TrainmathError, match="model_type 'gpt2'"):
        check_tp(type("C", (), {"model_type": "gpt2", "num_attention_heads": 4, "num_key_value_heads": 4})(), 2)


def test_measured_families_are_the_plans_families():
    """The calculator's "measured under TP" list (``FamilyDef.tp``, printed in the layout line) is the
    runtime's: every family ``apply_tp`` splits is in TP2 above, and nothing else is called measured."""
    from trainmath.families import tp_measured_families
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup, layout_text
    from trainmath.runtime.tensor_parallel import FAMILIES

    assert set(tp_measured_families()) == set(FAMILIES) == {c[0].partition(":")[0] for c in TP2}
    setup, layout = TrainingSetup(micro_batch=1, seq=16), ParallelLayout(tp=2)
    assert "olmo2: measured equal on gloo ranks" in layout_text(setup, layout, "olmo2")
    assert "deepseek_v3: derived from the op lists' axes, not measured" in layout_text(setup, layout, "deepseek_v3")
    # Cohere is measured without its q/k norm only (apply_tp refuses use_qk_norm: Command R+)
    assert "cohere: measured equal" in layout_text(setup, layout, "cohere", {"use_qk_norm": False})
    assert "cohere: derived from the op lists' axes" in layout_text(setup, layout, "cohere", {"use_qk_norm": True})


def test_cohere_qk_norm_refused():
    from trainmath.errors import TrainmathError
    from trainmath.runtime.tensor_parallel import check_tp

    with pytest.raises(TrainmathError, match="cohere with use_qk_norm"):
        check_tp(tp_oracle.tiny_config("cohere", use_qk_norm=True), 2)
    check_tp(tp_oracle.tiny_config("cohere"), 2)
