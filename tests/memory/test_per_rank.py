"""The hf profile per rank of a TP / SP / CP / EP / PP layout, checked against a rule-by-rule derivation written
here, independently of the kernels' axis rules.

The derivation is the layout's meaning (``parallelize_module`` on transformers' decoder layers: column-wise
q/k/v/gate/up, row-wise o/down; norms, residual stream, embedding, head and loss whole; ``--sp`` cuts the norms
and the residual stream on the sequence and each column-wise Linear saves its all-gathered input; ``--cp`` keeps
s/cp positions of every per-token tensor; ``--vocab-parallel`` cuts the vocabulary), applied to each saved
tensor of the single-device fold: a rank keeps it whole, ÷tp, ÷tp on the sequence with SP, ÷cp, or a product.
"""

from __future__ import annotations

import json

import pytest

from trainmath.cli import main
from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout, layout_problems
from trainmath.memory.activations import activation_bytes, logits_bytes
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.ops.ir import Degrees
from trainmath.params import count_params
from trainmath.placement import place
from trainmath.sources import catalog_index, load_spec
from trainmath.tree import check_sums

B, S = 2, 64
PRECISIONS = {"autocast": (2, 4), "bf16": (2, 2), "fp32": (4, 4)}

RESIDUAL = ("layer.input", "attention.residual", "input_layernorm.", "post_attention_layernorm.")
"""Saved tensors of the residual stream and the norms on it: outside the tensor-parallel region."""
GATHERED = ("self_attn.input.gathered", "mlp.input.gathered", "q_proj.input_cast", "k_proj.input_cast",
            "v_proj.input_cast", "gate_proj.input_cast", "up_proj.input_cast")
"""What a column-wise Linear saves of its input: the whole sequence of the tensor-parallel group."""


def divisor(name: str, deg: Degrees) -> int:
    """How many ways a rank of ``deg`` divides the single-device tensor ``name`` (the layout's meaning)."""
    sp = deg.tp if deg.sp else 1
    if name in ("input_ids", "cos", "sin"):
        return deg.cp  # per position: the lookup and the rotary table run before the sequence is cut by SP
    if name.endswith("weight_cast"):
        return deg.tp  # every Linear of a decoder layer is column- or row-wise: its weight (and cast) / tp
    if name.startswith(RESIDUAL):
        return deg.cp * sp
    if name.endswith(GATHERED):
        return deg.cp
    return deg.cp * deg.tp  # inside attention and the MLP: heads or MLP width / tp, positions / cp


def leaves(node):
    return [(n.name, n.value) for _, n in node.walk() if not n.children]


LAYOUTS = [Degrees(tp=2), Degrees(tp=4), Degrees(tp=8), Degrees(tp=2, sp=True), Degrees(tp=8, sp=True),
           Degrees(cp=2), Degrees(cp=4), Degrees(tp=2, sp=True, cp=2), Degrees(tp=4, cp=2),
           Degrees(tp=2, vocab_parallel=True)]


def _kw(deg: Degrees) -> dict:
    return dict(tp=deg.tp, sp=deg.sp, cp=deg.cp, ep=deg.ep, vocab_parallel=deg.vocab_parallel)


@pytest.mark.parametrize("model", ["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B"])
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_saved_bytes_per_rank_rule_by_rule(model, precision, recompute):
    spec = load_spec(model)
    c, p = PRECISIONS[precision]
    kw = dict(micro_batch=B, seq=S, compute_dtype_bytes=c, param_dtype_bytes=p, recompute=recompute)
    one = leaves(activation_bytes(spec, **kw).tree())
    for deg in LAYOUTS:
        rank = activation_bytes(spec, **kw, **_kw(deg)).tree()
        assert check_sums(rank) == []
        got = leaves(rank)
        assert [n for n, _ in got] == [n for n, _ in one]
        for (name, whole), (_, mine) in zip(one, got):
            if name == "layer input (checkpoint)":
                d = deg.cp * (deg.tp if deg.sp else 1)  # torch.utils.checkpoint keeps the rank's layer input
            else:
                d = divisor(name, deg)
            assert whole % d == 0 and mine == whole // d, (deg, name, whole, mine)


def test_qwen3_8b_layer_pinned():
    """Qwen3-8B, 1 × 4096, bf16 autocast, tp 2 with SP: one layer by hand. d 4096, q 4096, kv 1024, f 12288.
    Residual stream and norms at s/2, the four column-wise input casts at s, heads and width / 2."""
    spec = load_spec("Qwen/Qwen3-8B")
    t, d, q, kv, f, h = 4096, 4096, 4096, 1024, 12288, 32
    half = t // 2
    # the two norms: rsqrt per row, the fp32 normalized x; their fp32 input is the residual stream itself
    norms = 2 * (4 * half + 4 * half * d)
    residual = 4 * half * d + 4 * half * d  # layer.input, attention.residual (fp32)
    casts = 5 * 2 * t * d  # q, k, v, gate, up: bf16 casts of the all-gathered input
    # per-head q/k norms on the rank's heads: fp32 copy of the bf16 projection, rsqrt per head row, bf16 normalized
    qk_norms = (4 * t * q // 2 + 4 * t * h // 2 + 2 * t * q // 2) + (4 * t * kv // 2 + 4 * t * 8 // 2 + 2 * t * kv // 2)
    attn = 2 * t * q // 2 + 2 * t * kv // 2 + 2 * t * kv // 2 + 2 * t * q // 2 + 4 * h // 2 * t  # q, k, v, out, lse
    mlp = 4 * 2 * t * f // 2
    weights = 2 * (q * d + 2 * kv * d + q * d + 3 * d * f) // 2
    per_layer = norms + residual + casts + qk_norms + attn + mlp + weights
    act = activation_bytes(spec, micro_batch=1, seq=t, tp=2, sp=True)
    assert [(g.layers, g.bytes_each) for g in act.groups] == [(tuple(range(36)), per_layer)]
    assert act.total_bytes == 36 * per_layer + 8 * t + 2 * 4 * t * 128  # ids, fp32 cos and sin


@pytest.mark.parametrize("sp, vocab_parallel, cp", [(False, False, 1), (True, False, 1), (False, True, 1),
                                                    (True, True, 2), (False, False, 2)])
def test_logits_per_rank(sp, vocab_parallel, cp):
    """Head and loss: whole on every rank unless vocabulary-parallel (V/tp); the final norm / tp with SP; the head's
    (all-gathered) input and the labels whole; every term at s/cp."""
    spec = load_spec("Qwen/Qwen3-8B")
    tp, d, V = 4, spec.hidden_size, spec.vocab_size
    one = dict(leaves(logits_bytes(spec, B, S).tree()))
    rank = logits_bytes(spec, B, S, tp=tp, sp=sp, cp=cp, vocab_parallel=vocab_parallel).tree()
    assert check_sums(rank) == []
    got = dict(leaves(rank))
    for name, whole in one.items():
        if name == "total_weight":
            d_ = 1
        elif name.startswith("norm."):
            d_ = cp * (tp if sp else 1)
        elif name.startswith(("log_softmax", "logits", "lm_head.weight")):
            d_ = (tp if vocab_parallel else 1) * (1 if name.startswith("lm_head.weight") else cp)
        else:  # lm_head.input_cast, labels
            d_ = cp
        assert got[name] * d_ == whole, name
    assert got["log_softmax_fp32"] == 4 * B * (S // cp) * (V // tp if vocab_parallel else V)
    assert got["lm_head.weight_cast"] == 2 * d * (V // tp if vocab_parallel else V)


def test_plain_tp_keeps_embedding_and_head_whole():
    """parallelize_module on the decoder layers only: each rank holds the whole embedding and LM head; with
    --vocab-parallel (and Megatron's rule, placement's default) V/tp rows of each."""
    spec = load_spec("Qwen/Qwen3-8B")
    vd = spec.vocab_size * spec.hidden_size
    megatron = place(spec, ParallelLayout(tp=2)).params
    assert place(spec, ParallelLayout(tp=2), vocab_parallel=False).params == megatron + 2 * vd // 2
    hf = training_memory(spec, TrainingSetup(micro_batch=1, seq=256, precision="bf16"), ParallelLayout(tp=2))
    vp = training_memory(spec, TrainingSetup(micro_batch=1, seq=256, precision="bf16"),
                         ParallelLayout(tp=2, vocab_parallel=True))
    whole, halves = (r.stages[0].at("step start").child("weights_bytes").value for r in (hf, vp))
    assert whole - halves == 2 * 2 * vd // 2  # bf16: the other half of the embedding and of the head
    full = count_params(spec).total_params
    assert place(spec, ParallelLayout(), vocab_parallel=False).params == full


@pytest.mark.parametrize("layout", [ParallelLayout(tp=2), ParallelLayout(tp=2, sp=True),
                                    ParallelLayout(tp=4, sp=True, vocab_parallel=True), ParallelLayout(cp=2, dp=1),
                                    ParallelLayout(tp=2, sp=True, pp=3, vocab_parallel=True)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_timeline_uses_the_rank_figures(layout, recompute):
    """The step's timeline on each stage: the saved bytes at the last forward event are the rank's activation
    fold over the stage's layers × the micro-batches in flight (1F1B, one per stage behind); the last stage's
    logits are the per-rank head."""
    spec = load_spec("Qwen/Qwen3-8B")
    setup = TrainingSetup(micro_batch=1, seq=512, precision="bf16", recompute=recompute)
    r = training_memory(spec, setup, layout)
    assert len(r.stages) == layout.pp
    kw = dict(micro_batch=1, seq=512, compute_dtype_bytes=2, param_dtype_bytes=2, tp=layout.tp, sp=layout.sp,
              cp=layout.cp, vocab_parallel=layout.vocab_parallel, recompute=recompute)
    for m in r.stages:
        assert m.in_flight == layout.pp - m.stage
        act = activation_bytes(spec, layers=list(m.layers), **kw)
        per_mb = act.total_bytes
        if recompute == "full":  # the recompute transient is not kept; checkpoint also keeps the position ids
            per_mb += 8 * (512 // layout.cp) - act.recompute_transient_bytes
        last = m.at(f"forward layer {m.layers[-1]}").child("activations_bytes").value
        assert last == m.in_flight * per_mb
    head = logits_bytes(spec, 1, 512, compute_dtype_bytes=2, param_dtype_bytes=2, tp=layout.tp, sp=layout.sp,
                        cp=layout.cp, vocab_parallel=layout.vocab_parallel)
    upcast = head.logits_fp32_bytes
    loss = r.stages[-1].at("forward: loss")
    assert loss.child("logits_bytes").value == head.total_bytes - upcast + 4  # saved, the logits, the fp32 loss scalar
    tv = (512 // layout.cp) * (spec.vocab_size // layout.tp if layout.vocab_parallel else spec.vocab_size)
    assert upcast == 4 * tv
    # loss_parallel()'s log-softmax keeps its shifted fp32 logits beside the upcast while it runs
    assert loss.child("logits_fp32_bytes").value == upcast + (4 * tv if layout.vocab_parallel else 0)
    ce = r.stages[-1].at("backward: loss").child("cross_entropy_grad_bytes").value
    assert ce == (3 if layout.vocab_parallel else 2) * 4 * tv  # its fused backward: three fp32 buffers at once


@pytest.mark.parametrize("model", sorted(m for m in catalog_index() if load_spec(m).family.layer is not None))
def test_degree_one_is_the_single_device(model):
    """Every catalog model whose layers have op lists: degrees of 1 give the single-device tree, and at a tp that
    divides its heads every saved tensor is either whole or exactly 1/tp of it, the total smaller."""
    spec = load_spec(model)
    one = activation_bytes(spec, micro_batch=1, seq=32).tree()
    assert activation_bytes(spec, micro_batch=1, seq=32, tp=1, sp=False, cp=1, ep=1).tree().to_dict() == one.to_dict()
    tp = 2
    if layout_problems(ParallelLayout(tp=tp), spec):  # heads, KV heads, linear-attention or Mamba heads
        return
    if spec.family.style.fused_projections:  # refused (tests/memory/test_cp_layouts.py)
        with pytest.raises(TrainmathError, match="fused"):
            activation_bytes(spec, micro_batch=1, seq=32, tp=tp)
        return
    rank = activation_bytes(spec, micro_batch=1, seq=32, tp=tp).tree()
    for (name, whole), (_, mine) in zip(leaves(one), leaves(rank)):
        assert mine in (whole, -(-whole // tp)), name
    assert rank.value < one.value


def _cli(capsys, *argv):
    code = main(["memory", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_tp_prints_per_rank_figures(capsys):
    code, out, err = _cli(capsys, "Qwen/Qwen3-8B", "--micro-batch", "1", "--seq", "4096", "--tp", "2", "--explain")
    assert code == 0 and err == ""
    assert "dp=1 tp=2 pp=1 cp=1 ep=1 sp=False zero=0  (2 GPUs)" in out
    assert "embedding, LM head and loss whole on every rank" in out
    # bf16 activations + the head's saved tensors of one rank (benchmarks/per_rank.py), the logits and the loss;
    # one sequence: the padded labels' 8 bytes (ops.model.head_ops)
    assert "saved for backward on this rank at 'forward: loss': 24,579,096,592 bytes" in out
    assert 24_579_096_592 == 23_334_436_868 + 2 * 4096 * 151936 + 4 + 8
    code, out, _ = _cli(capsys, "Qwen/Qwen3-8B", "--micro-batch", "1", "--seq", "4096", "--tp", "2", "--sp",
                        "--vocab-parallel", "--json")
    d = json.loads(out)
    assert code == 0 and d["layout"]["tp"] == 2 and d["layout"]["sp"] and d["layout"]["vocab_parallel"]
    assert d["peak_bytes"] == sum(d["breakdown"].values())
    assert any("vocabulary-parallel embedding, head and loss" in c for c in d["conventions"])


@pytest.mark.parametrize("argv, message", [
    (["--sp"], "--sp needs --tp 2 or more"),
    (["--vocab-parallel"], "--vocab-parallel needs --tp 2 or more"),
    (["--tp", "16"], "tp (16) must divide KV heads (8): a column-wise k_proj/v_proj would give a rank part of a KV "
                     "head (parallelize_module and Megatron do not replicate KV heads); pass --tp 1, 2, 4, 8"),
    (["--tp", "3"], "tp (3) must divide attention heads (32); tp (3) must divide KV heads (8): a column-wise "
                    "k_proj/v_proj would give a rank part of a KV head (parallelize_module and Megatron do not "
                    "replicate KV heads); pass --tp 1, 2, 4, 8"),
    (["--tp", "2", "--sp", "--seq", "4097"], "--seq (4097) must be a multiple of --tp (2) with --sp"),
    (["--cp", "2", "--attention", "eager"], "--attention eager with --cp 2 is not modelled"),
    (["--dp", "3", "--ep", "3", "--model", "Qwen/Qwen3-30B-A3B"], "ep (3) must divide the routed experts (128)"),
])
def test_bad_layout_one_line_exit_2(capsys, argv, message):
    model = "Qwen/Qwen3-8B"
    if "--model" in argv:
        i = argv.index("--model")
        model, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    base = ["--micro-batch", "1"] + ([] if "--seq" in argv else ["--seq", "4096"])
    code, out, err = _cli(capsys, model, *base, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("precision", ["autocast", "bf16"])
def test_expert_parallel_keeps_the_rows_and_divides_the_experts(ep, precision):
    """Qwen3-30B-A3B (48 MoE layers, 128 experts, moe f 768, d 2048), eager expert loop: an EP rank holds 128/ep
    experts, so under autocast only 128/ep experts' weight casts (3·f·d each) are kept; its routed rows are its own
    micro-batch's T·k (balanced routing), so every other saved tensor is the single device's."""
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    c, p = PRECISIONS[precision]
    kw = dict(micro_batch=1, seq=256, experts="eager", compute_dtype_bytes=c, param_dtype_bytes=p)
    one = activation_bytes(spec, **kw).total_bytes
    rank = activation_bytes(spec, **kw, ep=ep).total_bytes
    copies = 48 * (128 - 128 // ep) * c * 3 * 768 * 2048 if p > c else 0
    assert one - rank == copies


@pytest.mark.parametrize("tp", [3, 5, 12])
def test_bad_tp_offers_one_list_of_degrees_that_divide_every_head_count(capsys, tp):
    """Qwen3-8B: 32 query heads, 8 KV heads; the degrees that work are the divisors of gcd(32, 8) = 8, named once."""
    code = main(["memory", "Qwen/Qwen3-8B", "--micro-batch", "1", "--seq", "8", "--tp", str(tp)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("pass --tp") == 1 and err.rstrip().endswith("pass --tp 1, 2, 4, 8")
