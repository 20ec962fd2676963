"""FSDP / ZeRO-3 per-unit communication (trainmath.perf.fsdp): bytes, the exposure closed form, the overlap."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmath.hardware import presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate
from trainmath.perf.compute import LayerTime
from trainmath.perf.fsdp import Unit, chain_exposed, micro_batch_time, rank_bytes, stage_units
from trainmath.perf.step import stage_params
from trainmath.sources import load_spec

GPT2 = load_spec("openai-community/gpt2")  # 12 layers, hidden 768, biases and LayerNorms
H100 = presets().gpu("h100")


def test_per_unit_bytes_are_the_layer_parameters_times_w_minus_one_over_w():
    h, ranks = 768, 16
    dense, expert, layer_p = stage_params(GPT2, 1, 1, 1, 0)
    t = LayerTime(forward_s=1.0, backward_s=2.0, recompute_s=0.0, attention_forward_s=0.0)
    units, root = stage_units(1.0, range(12), layer_p, dense + expert, dict.fromkeys(range(12), t), t)
    layer = 12 * h * h + 13 * h  # qkv 3h²+3h, proj h²+h, MLP 8h²+5h, two LayerNorms 4h
    assert [u.params for u in units] == [layer] * 12
    assert root.params == 50257 * h + 1024 * h + 2 * h  # tied token table, positions, final LayerNorm
    assert rank_bytes(units[0].params * 2, ranks) == layer * 2 * 15 / 16
    assert rank_bytes(1000, 1) == 0.0


def test_chain_exposed_hand_case():
    # gather[0] 0.5 exposed; during compute 0: gather[1] 2 − 1 = 1 exposed; compute 1: gather[2] + scatter[0]
    # 0.5 + 0.25 < 1 hidden; compute 2: scatter[1] 0.25 hidden; scatter[2] 0.3 after the end
    assert chain_exposed([1, 1, 1], [0.5, 2, 0.5], [0.25, 0.25, 0.3]) == 0.5 + 1 + 0.3


def test_micro_batch_closed_form_for_uniform_layers():
    n, f, b, hb = 6, 1.0, 2.0, 0.5
    a, r, a0, r0 = 1.5, 1.2, 0.7, 0.4  # per layer AG, RS; root AG, RS
    layers = [Unit(name=f"layer.{i}", params=100, forward_s=f, backward_s=b) for i in range(n)]
    root = Unit(name="root", params=30, forward_s=0.3, backward_s=hb)
    table = {("all_gather", 200): a, ("reduce_scatter", 400): r, ("all_gather", 60): a0, ("reduce_scatter", 120): r0}

    def time(op, size):
        return table[op, size]

    t = micro_batch_time(layers, root, 0.3, hb, 2, 4, time)  # bf16 weights, fp32 grads
    fwd = a0 + a + (n - 1) * max(0, a - f)
    bwd = max(0, a - hb) + max(0, a - b) + (n - 2) * max(0, a + r - b) + max(0, r - b) + r + r0
    assert abs(t.exposed_s - (fwd + bwd)) < 1e-12
    assert abs(t.total_s - (a0 + r0 + 2 * n * a + n * r)) < 1e-12
    assert (t.gathers, t.scatters) == (2 * n + 1, n + 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 10), st.floats(0, 10)), min_size=1, max_size=12))
def test_exposure_is_never_negative_and_never_above_the_collectives(rows):
    compute, gather, scatter = (list(x) for x in zip(*rows))
    e = chain_exposed(compute, gather, scatter)
    assert 0 <= e <= sum(gather) + sum(scatter) + 1e-9
    assert abs(chain_exposed([0.0] * len(rows), gather, scatter) - sum(gather) - sum(scatter)) < 1e-9


def test_overlap_shrinks_exposure_on_an_fsdp_job():
    spec = load_spec("meta-llama/Llama-3.1-8B")
    est = estimate(spec, ParallelLayout(dp=64, zero=3), Job(global_batch=128, seq=8192), H100, memory=False)
    item = next(c for c in est.comm if c.name == "zero3_comm")
    assert 0 < item.exposed_s < item.time_s
    assert est.breakdown["zero3_comm"] == item.exposed_s
    assert item.count == 2 * (2 * 32 + 1 + 32 + 1)  # 2 micro-batches, 65 gathers and 33 reduce-scatters each


def test_overhead_is_the_stated_closed_form_and_the_fit_reproduces_it():
    import pathlib
    import sys

    from trainmath.perf.fsdp import OVERHEAD, overhead_s

    c, d = OVERHEAD["hopper"]
    assert overhead_s("hopper", 33, 2, 3) == c + d * 33 * 2 * 3
    assert overhead_s("ampere", 33, 2, 3) == 0.0
    spec = load_spec("meta-llama/Llama-3.1-8B")
    est = estimate(spec, ParallelLayout(dp=64, zero=3), Job(global_batch=128, seq=8192), H100, memory=False)
    assert est.breakdown["fsdp_overhead"] == c + d * 33 * 2 * 2
    assert any("fixed overhead" in line for line in est.conventions)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    import fsdp_fit

    hopper = [r for r in fsdp_fit.rows() if r["gen"] == "hopper"]
    assert fsdp_fit.fit(hopper) == pytest.approx((c, d), abs=1e-12)  # the constant in the code is the fit's answer


def test_fsdp_shard_grad_op_pays_the_per_unit_overhead_and_deepspeed_zero2_does_not():
    from trainmath.perf.fsdp import overhead_s

    spec = load_spec("meta-llama/Llama-3.1-8B")
    lay = ParallelLayout(dp=64, zero=2)
    plain, fsdp = (estimate(spec, lay, Job(global_batch=128, seq=8192, fsdp=f), H100, memory=False)
                   for f in (False, True))
    assert plain.breakdown["fsdp_overhead"] == 0.0
    assert fsdp.breakdown["fsdp_overhead"] == overhead_s("hopper", 33, 2, 2)
    assert fsdp.step_time_s - plain.step_time_s == pytest.approx(overhead_s("hopper", 33, 2, 2), rel=1e-12)
