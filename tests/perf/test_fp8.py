"""FP8 training as Transformer Engine runs it: which GEMMs run in FP8, their realised speed-up per shape, and the
cast overhead as HBM bytes over bandwidth."""

import pytest

from trainmath.hardware import gpu, presets
from trainmath.layout import ParallelLayout
from trainmath.perf import Job, estimate
from trainmath.perf.compute import FP8_CAST_TRANSPOSE_BYTES, fp8_speedup, layer_times
from trainmath.sources import load_spec

L70 = load_spec("meta-llama/Llama-3.1-70B")  # h 8192, ffn 28672, 64 heads, 8 KV heads of 128, 80 layers
H100 = gpu("h100")
EFF = presets().efficiency(H100)


def _job(precision, **kw):
    return Job(global_batch=128, seq=8192, precision=precision, virtual_stages=5, **kw)


def test_fp8_step_is_faster_than_bf16_but_not_twice():
    lay = ParallelLayout(dp=2, tp=4, pp=4, cp=2, sp=True, zero=1)
    bf16 = estimate(L70, lay, _job("mixed-bf16"), H100, memory=False).step_time_s
    fp8 = estimate(L70, lay, _job("fp8"), H100, memory=False)
    assert bf16 / 2 < fp8.step_time_s < bf16
    assert fp8.breakdown["fp8_cast"] > 0 and "Transformer Engine" in " ".join(fp8.conventions)
    with_head = estimate(L70, lay, _job("fp8", fp8_head=True), H100, memory=False).step_time_s
    assert with_head < fp8.step_time_s  # the LM head is BF16 unless asked


def _roofline(m, k, n, peak, in_bytes, out_bytes):
    h = EFF.gemm_half_dim
    shape = m / (m + h) * k / (k + h) * n / (n + h)
    compute = 2 * m * k * n / (peak * EFF.gemm_peak_fraction * shape)
    memory = ((m * k + k * n) * in_bytes + m * n * out_bytes) / (H100.hbm_bytes_per_s * EFF.hbm_fraction)
    return max(compute, memory)


@pytest.mark.parametrize("m,k,n", [(8192, 8192, 8192), (8192, 8192, 1024), (256, 8192, 8192), (16, 8192, 8192),
                                   (1, 4096, 4096)])
def test_fp8_speedup_per_gemm_is_the_roofline_at_both_peaks(m, k, n):
    expected = (_roofline(m, k, n, H100.bf16_flops_per_s, 2, 2)
                / _roofline(m, k, n, H100.fp8_flops_per_s, 1, 2))
    got = fp8_speedup(m, k, n, H100, EFF)
    assert got == pytest.approx(expected, rel=1e-12)
    assert 1 <= got <= H100.fp8_flops_per_s / H100.bf16_flops_per_s + 1e-12


def test_small_gemms_gain_less():
    """Compute-bound both ways: the datasheet's 2x. Near the FP8 ridge point (m of a few hundred tokens): less.
    Memory-bound both ways (a handful of tokens): the operand bytes halve, so close to 2x again."""
    big, small, tiny = (fp8_speedup(m, 8192, 8192, H100, EFF) for m in (8192, 128, 4))
    assert big == pytest.approx(H100.fp8_flops_per_s / H100.bf16_flops_per_s)
    assert small < 0.99 * big
    assert small < tiny < big


def test_fp8_share_per_gemm_of_a_layer():
    """The FP8 GEMMs of a decoder layer are exactly its seven linears, each at the FP8 roofline; attention
    and the head keep their BF16 time."""
    lay = ParallelLayout(tp=4, dp=1)
    kw = dict(micro_batch=1, seq=4096, layout=lay, gpu=H100, eff=EFF, recompute="none")
    bf_layers, bf_head = layer_times(L70, **kw)
    f8_layers, f8_head = layer_times(L70, **kw, fp8="linears")
    m, h, f, kv, t = 4096, 8192, 28672, 1024, 4
    # the model cuts the larger of k and n by tp (k on a tie), whatever the module's parallel style
    shapes = [(m, h / t, h), (m, h / t, kv), (m, h / t, kv), (m, h / t, h), (m, h, f / t), (m, h, f / t),
              (m, f / t, h)]
    fp8 = sum(_roofline(*s, H100.fp8_flops_per_s, 1, 2) for s in shapes)
    bf16 = sum(_roofline(*s, H100.bf16_flops_per_s, 2, 2) for s in shapes)
    assert f8_layers[0].fp8_gemm_s == pytest.approx(fp8, rel=1e-12)
    assert bf_layers[0].forward_s - f8_layers[0].forward_s == pytest.approx(bf16 - fp8, rel=1e-9)
    assert f8_head.forward_s == bf_head.forward_s and f8_head.fp8_gemm_s == 0
    assert layer_times(L70, **kw, fp8="linears+head")[1].forward_s < bf_head.forward_s


def test_cast_overhead_is_its_bytes_over_bandwidth():
    """4 bytes per element (read bf16, write fp8 and its transpose) for each linear's input (q/k/v and gate/up
    share theirs) and output gradient per micro-batch, and each weight once per step."""
    lay = ParallelLayout(tp=8, dp=1)
    job = Job(global_batch=4, seq=2048, precision="fp8")
    e = estimate(L70, lay, job, H100, memory=False)
    m, h, f, kv, t = 2048, 8192, 28672, 1024, 8
    # tensors as the model cuts them (the larger of k and n by tp): q, k, v (m, h/t, ·), o (m, h/t, h),
    # gate, up (m, h, f/t), down (m, f/t, h)
    inputs = m * h / t + m * h / t + m * h + m * f / t  # qkv, o, fc1, down
    grads = m * (h + 2 * kv) + m * h + 2 * m * f / t + m * h
    weights = (h * (h + 2 * kv) + h * h + 3 * h * f) / t
    per_layer_mb = FP8_CAST_TRANSPOSE_BYTES * (inputs + grads)
    total = 80 * (4 * per_layer_mb + FP8_CAST_TRANSPOSE_BYTES * weights)
    assert e.breakdown["fp8_cast"] == pytest.approx(total / (H100.hbm_bytes_per_s * EFF.hbm_fraction), rel=1e-12)
    assert estimate(L70, lay, Job(global_batch=4, seq=2048), H100, memory=False).breakdown["fp8_cast"] == 0
