"""Properties of the FLOP tree (totals are sums, linear in batch, backward 2×, recompute options, causal pairs),
each with a pinned example, and the calculator importing without torch."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmath.errors import TrainmathError
from trainmath.flops import count_flops
from trainmath.ops.gemm import attended_pairs
from trainmath.sources import catalog_index, load_spec
from trainmath.tree import check_sums

CATALOG = sorted(catalog_index())


def test_llama_3_1_8b_pinned_by_hand():
    """Llama-3.1-8B (d 4096, 32 layers, 32 heads, 8 KV heads, head 128, d_ff 14336, vocab 128256), 1 × 2048:
    forward = t·2·(32·(d·d + 2·d·1024 + d·d + 3·d·d_ff) + d·V) + 32 layers · 2 products · 2·32·s·s·128."""
    t, s, d = 2048, 2048, 4096
    per_token = 2 * (32 * (d * d + 2 * d * 1024 + d * d + 3 * d * 14336) + d * 128256)
    attention = 32 * 2 * 2 * 32 * s * s * 128
    r = count_flops(load_spec("meta-llama/Llama-3.1-8B"), batch=1, seq=s)
    assert r.forward.value == t * per_token + attention == 32_938_104_193_024
    assert r.training.value == 3 * r.forward.value


@pytest.mark.parametrize("model", CATALOG)
def test_tree_sums_linear_in_batch_and_backward_twice_forward(model):
    spec = load_spec(model)
    one = count_flops(spec, batch=1, seq=300)
    three = count_flops(spec, batch=3, seq=300, recompute="full")
    assert check_sums(one.training) == [] and check_sums(three.training) == []
    assert three.forward.value == 3 * one.forward.value
    assert three.per_sequence(three.forward) == one.forward.value
    assert one.backward.value == 2 * one.forward.value
    assert one.recomputed.value == 0
    # full recompute: every decoder layer's forward again, not the LM head
    assert three.recomputed.value == three.forward.value - three.forward.child("lm_head").value


def test_selective_recompute_is_every_second_linear():
    """torchtitan's op-level policy on Qwen3-8B: per layer the 2nd, 4th and 6th mm (k, o, up) run again;
    q, v, gate, down and SDPA are cached, so no attention core (FlopCounterMode: tests/flops/test_selective_flops)."""
    spec = load_spec("Qwen/Qwen3-8B")
    r = count_flops(spec, batch=2, seq=4096, recompute="selective")
    T, d, kv, f, L = 2 * 4096, 4096, 8 * 128, 12288, 36
    assert r.recomputed.value == L * 2 * T * (d * kv + d * d + d * f)
    assert r.recomputed.flat()["attention_core"] == 0
    assert r.training.value == r.forward.value + r.backward.value + r.recomputed.value


def test_causal_half_counts_attended_pairs():
    spec = load_spec("Qwen/Qwen3-8B")
    s = 4096
    full = count_flops(spec, batch=1, seq=s)
    half = count_flops(spec, batch=1, seq=s, causal="half")
    core_full, core_half = full.forward.child("attention_core").value, half.forward.child("attention_core").value
    assert core_half * s * s == core_full * (s * (s + 1) // 2)
    assert full.forward.value - core_full == half.forward.value - core_half


def test_sliding_window_executed_in_full_but_windowed_when_half():
    spec = load_spec("google/gemma-2-9b")  # alternating 4096-token windows
    s = 8192
    full = count_flops(spec, batch=1, seq=s).forward.child("attention_core").value
    half = count_flops(spec, batch=1, seq=s, causal="half").forward.child("attention_core").value
    per_pair = full // (spec.num_layers * s * s)
    window_pairs = 4096 * 4097 // 2 + (s - 4096) * 4096
    assert half == per_pair * (spec.num_layers // 2) * (s * (s + 1) // 2 + window_pairs)


@settings(max_examples=200, deadline=None)
@given(seq=st.integers(1, 300), extra=st.integers(0, 50), window=st.one_of(st.none(), st.integers(1, 400)))
def test_attended_pairs_equals_brute_force(seq, extra, window):
    kv = seq + extra
    brute = sum(1 for i in range(seq) for j in range(kv)
                if j <= i + extra and (window is None or i + extra - j < window))
    assert attended_pairs(seq, kv, causal="half", window=window) == brute
    assert attended_pairs(seq, kv, causal="executed", window=window) == seq * kv


@pytest.mark.parametrize("kwargs", [dict(batch=0, seq=8), dict(batch=1, seq=-1), dict(batch=1, seq=8, causal="x"),
                                    dict(batch=1, seq=8, recompute="some"), dict(batch=1, seq=8, mamba_chunk=0)])
def test_bad_arguments_raise_one_error(kwargs):
    with pytest.raises(TrainmathError):
        count_flops(load_spec("Qwen/Qwen3-0.6B"), **kwargs)


def test_calculator_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from trainmath.flops import count_flops, closed_form_flops\n"
            "import trainmath.cli.flops\n"
            "from trainmath.sources import load_spec\n"
            "s = load_spec('Qwen/Qwen3-0.6B'); print(count_flops(s, batch=1, seq=8).training.value)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 0
