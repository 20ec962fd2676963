"""Context parallelism per rank for the layers that are not attention: routed experts and scans.

Oracle: a rule-by-rule derivation written here. torch's ``context_parallel``
(``torch.distributed.tensor.experimental``) cannot be measured on this CPU: in torch 2.13 it replaces only the
CUDA SDPA ops (``_scaled_dot_product_flash_attention``, ``_efficient_attention``, ``_cudnn_attention`` and their
backwards, ``_context_parallel/_attention.py``), not the CPU kernel ``_scaled_dot_product_flash_attention_for_cpu``
that transformers' SDPA runs here, so no ring attention runs on gloo ranks. What the derivation says: under
context parallelism a rank holds b·s/cp tokens of every sequence (torch's ``context_parallel`` shards the buffers
``input_ids``, ``position_ids`` and ``labels`` on the sequence); the router and the experts are per-token modules,
so they see the rank's T/cp tokens and route T/cp·k rows. Every saved tensor of a MoE layer is then ÷cp except
what has no token axis: autocast's weight casts and the grouped path's per-expert offsets.
"""

from __future__ import annotations

import pytest

from trainmath.cli import main
from trainmath.errors import TrainmathError
from trainmath.memory.activations import activation_bytes
from trainmath.sources import load_spec
from trainmath.tree import check_sums

PRECISIONS = {"autocast": (2, 4), "bf16": (2, 2), "fp32": (4, 4)}
NO_TOKEN_AXIS = ("weight_cast", ".offsets", ".weight_fp32", ".one_plus_weight")
"""Saved tensors without a token axis (a weight's cast, the per-expert int32 offsets): whole under cp."""


def leaves(node):
    return [(n.name, n.value) for _, n in node.walk() if not n.children]


@pytest.mark.parametrize("model, experts", [("Qwen/Qwen3-30B-A3B", "grouped"), ("Qwen/Qwen3-30B-A3B", "eager"),
                                            ("mistralai/Mixtral-8x7B-v0.1", "grouped"),
                                            ("deepseek-ai/DeepSeek-V3", "grouped"),
                                            ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "eager")])
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_divides_every_token_row(model, experts, precision, cp):
    """Each saved tensor of one cp rank is the single device's ÷cp, routed rows included; weight casts and
    per-expert offsets are whole."""
    spec = load_spec(model)
    c, p = PRECISIONS[precision]
    kw = dict(micro_batch=2, seq=64, compute_dtype_bytes=c, param_dtype_bytes=p, experts=experts)
    one = leaves(activation_bytes(spec, **kw).tree())
    rank = activation_bytes(spec, **kw, cp=cp).tree()
    assert check_sums(rank) == []
    got = leaves(rank)
    assert [n for n, _ in got] == [n for n, _ in one]
    routed = 0
    for (name, whole), (_, mine) in zip(one, got):
        d = 1 if name.endswith(NO_TOKEN_AXIS) else cp
        assert whole % d == 0 and mine == whole // d, (name, whole, mine)
        routed += ".experts." in name
    assert routed > 0


def test_routed_rows_pinned():
    """Qwen3-30B-A3B, 1 × 4096, bf16, grouped_mm, cp 2: the first layer's sorted rows are the rank's 2048 tokens
    × top-8 routed rows × d 2048 in bf16; the sort permutation 2048·8 int64; the offsets 128 int32 (whole)."""
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    act = activation_bytes(spec, micro_batch=1, seq=4096, compute_dtype_bytes=2, param_dtype_bytes=2,
                           experts="grouped", cp=2)
    group = act.tree().child("layers").children[0]
    assert group.name.endswith("× 48")  # every layer is MoE; the group's leaves are 48 layers' bytes
    layer = {name: v // 48 for name, v in leaves(group)}
    assert layer["mlp.experts.gathered_input"] == 2048 * 8 * 2048 * 2
    assert layer["mlp.experts.sort_permutation"] == 2048 * 8 * 8
    assert layer["mlp.experts.offsets"] == 128 * 4
    assert layer["mlp.gate.softmax_fp32"] == 2048 * 128 * 4  # the router's rows: the rank's tokens


@pytest.mark.parametrize("model, kind", [("Qwen/Qwen3-Next-80B-A3B-Thinking", "Gated DeltaNet"),
                                         ("nvidia/Nemotron-H-56B-Base-8K", "Mamba-2")])
def test_scans_refuse_context_parallelism(model, kind, capsys):
    """No torch CP for scans: one line naming the layers and the fix, exit 2; cp 1 still works."""
    spec = load_spec(model)
    with pytest.raises(TrainmathError, match=f"--cp 2 with {kind} layers is not modelled.*pass --cp 1"):
        activation_bytes(spec, micro_batch=1, seq=128, cp=2)
    assert activation_bytes(spec, micro_batch=1, seq=128, cp=1).total_bytes > 0
    code = main(["memory", model, "--micro-batch", "1", "--seq", "4096", "--cp", "2"])
    out = capsys.readouterr()
    assert code == 2 and out.out == "" and out.err.count("\n") == 1 and kind in out.err


@pytest.mark.parametrize("model, modules", [("openai-community/gpt2", "c_attn"),
                                            ("tiiuae/falcon-180B", "query_key_value")])
def test_fused_projections_refuse_tensor_parallelism(model, modules, capsys):
    """A column-wise split of a fused q/k/v (gate/up) weight is not a split by heads: the hf profile refuses
    ``--tp`` for these families in one line (exit 2) rather than fold a plan nobody runs; tp 1 and the megatron
    profile still answer. (Phi-3's fused projections are split per rank by ``apply_tp`` and measured.)"""
    spec = load_spec(model)
    with pytest.raises(TrainmathError, match=f"--tp 2 with {spec.model_type}'s fused {modules} is not modelled"):
        activation_bytes(spec, micro_batch=1, seq=64, tp=2)
    assert activation_bytes(spec, micro_batch=1, seq=64, tp=1).total_bytes > 0
    argv = ["memory", model, "--micro-batch", "1", "--seq", "1024", "--tp", "2"]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "pass --tp 1, or --profile megatron" in out.err
    assert main(argv + ["--profile", "megatron"]) == 0


@pytest.mark.parametrize("model, seq", [("meta-llama/Llama-4-Scout-17B-16E-Instruct", 16384),
                                       ("tiiuae/falcon-180B", 512)])
def test_explicit_attention_masks_refuse_context_parallelism(model, seq):
    """A layer whose SDPA is given an explicit mask (Llama 4's chunked layers once s ≥ the chunk, Falcon's every
    layer) cannot run under torch's context_parallel, whose ring kernels take is_causal only: one line."""
    spec = load_spec(model)
    with pytest.raises(TrainmathError, match="--cp 2 with .* explicit attention mask .* pass --cp 1"):
        activation_bytes(spec, micro_batch=1, seq=seq, cp=2)
    assert activation_bytes(spec, micro_batch=1, seq=seq).total_bytes > 0
    if model.startswith("meta-llama"):  # below the chunk (8192) no mask: context parallelism is modelled
        assert activation_bytes(spec, micro_batch=1, seq=4096, cp=2).total_bytes > 0
