"""``trainmath train --recompute selective``: torchtitan's op-level policy on the decoder layers
(``runtime.checkpointing.apply_selective``) changes no arithmetic: cached outputs are the values forward computed,
the rest is recomputed by the same kernels, so the loss curve is bitwise the one without recompute."""

import pytest

from tests.train.runs import cached, losses


@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero3", "torch"), ("zero3", "trainmath")])
def test_selective_recompute_is_bitwise_no_recompute(strategy, impl):
    got = losses(cached(2, strategy=strategy, impl=impl, recompute="selective"))
    assert got == losses(cached(2, strategy=strategy, impl=impl))
    assert got[-1] != got[0]  # it trains


@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero3", "torch")])
def test_selective_flops_and_peak_as_predicted(strategy, impl):
    """FlopCounterMode sees the backward recompute k_proj, o_proj and up_proj (Qwen3: the 2nd, 4th and 6th mm of
    each layer) and not the attention core (SDPA's output is cached): the GEMM FLOPs are exact; the core as
    without recompute (flash backward: 7/6 of the calculator's); MemTracker's peak within the stated tolerance."""
    from tests.train.runs import config
    from trainmath.runtime.train.model import model_spec, shrunk_config
    from trainmath.verify.train import compare, predict

    res = cached(2, strategy=strategy, impl=impl, recompute="selective")
    cfg = config(strategy=strategy, impl=impl, recompute="selective", measure=True)
    pred = predict(model_spec(*shrunk_config(cfg.model, cfg.overrides)), cfg, 2)
    fields = compare(pred, {r: v["measured"] for r, v in res.items()}, cfg)
    gemm = [f for f in fields if f.name.startswith("gemm_flops")]
    core = [f for f in fields if f.name.startswith("attention_core_flops")]
    peaks = [f for f in fields if f.name.startswith("peak_bytes")]
    assert len(gemm) == len(core) == len(peaks) == 2
    assert all(f.measured == f.predicted > 0 for f in gemm)
    assert all(f.measured * 6 == f.predicted * 7 for f in core)
    assert all(f.ok for f in peaks), [(f.name, f.rel_error) for f in peaks]
    none = predict(model_spec(*shrunk_config(cfg.model, cfg.overrides)), config(strategy=strategy, impl=impl), 2)
    assert pred["gemm_flops"] > none["gemm_flops"]
