"""Per-rank parameter, gradient and optimizer-state bytes: the calculator predicts the measured tensors exactly.

Oracle: the bytes of the real tensors each strategy holds after backward (DTensors by their local shards),
walked by ``measure.state_bytes``; the prediction is ``trainmath.memory.training_memory`` through
``verify.train``. Padded shards are exercised: vocab 67 and 42 intermediate rows do not divide by 2 or 4.
"""

from dataclasses import replace

import pytest

from tests.train.runs import STRATEGIES, cached, config
from trainmath.runtime.train.model import model_spec, shrunk_config
from trainmath.verify.train import STATE_FIELDS, compare, peak_tolerance, predict, zero_impl


def _fields(nproc, strategy, impl):
    res = cached(nproc, strategy=strategy, impl=impl)
    cfg = config(strategy=strategy, impl=impl, measure=True)
    name, conf = shrunk_config(cfg.model, cfg.overrides)
    pred = predict(model_spec(name, conf), cfg, nproc)
    measured = {r: v["measured"] for r, v in res.items()}
    return pred, measured, compare(pred, measured, cfg)


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy,impl", STRATEGIES)
def test_state_bytes_exact_on_every_rank(strategy, impl, nproc):
    pred, measured, fields = _fields(nproc, strategy, impl)
    state = {f.name: f for f in fields if f.name.split(" ")[0] in STATE_FIELDS or "(sum over ranks)" in f.name}
    assert len(state) == (3 * nproc + 1 if (strategy, impl) == ("zero1", "torch") else 4 * nproc)
    for name, f in state.items():
        if (strategy, impl) == ("zero2", "torch") and name.startswith("weights_bytes"):
            # FSDP2 with reshard_after_forward=False still reshards after backward: between steps a rank holds
            # its 1/n shard of the weights, ZeRO-3's figure (``zero_impl="fsdp2"``), not DeepSpeed ZeRO-2's whole
            zero3 = predict(model_spec(*shrunk_config(config().model, config().overrides)),
                            config(strategy="zero3"), nproc)["weights_bytes"]
            assert f.measured == f.predicted == zero3
        if f.upper_bound:  # FSDP2's optimizer states on ranks > 0: unpadded local shards
            assert (strategy, impl) in (("zero2", "torch"), ("zero3", "torch")) and f.ok, name
            continue
        assert f.ok and f.measured == f.predicted, name
    bounded = [f for f in state.values() if f.upper_bound]
    assert not bounded or any(f.measured < f.predicted for f in bounded)  # the padding FSDP2 does not allocate
    if (strategy, impl) == ("zero1", "torch"):  # whole parameters per rank: the shares differ, the sum does not
        shares = [m["optimizer_states_bytes"] for m in measured.values()]
        assert len(set(shares)) > 1 and sum(shares) < pred["optimizer_states_bytes"] * nproc  # no padding


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy,impl", [("ddp", "torch"), ("zero3", "torch"), ("zero3", "trainmath")])
def test_gemm_flops_exact_and_attention_as_stated(strategy, impl, nproc):
    _, _, fields = _fields(nproc, strategy, impl)
    gemm = [f for f in fields if f.name.startswith("gemm_flops")]
    core = [f for f in fields if f.name.startswith("attention_core_flops")]
    assert len(gemm) == len(core) == nproc
    assert all(f.measured == f.predicted > 0 for f in gemm)
    # flash attention's backward recomputes QKᵀ: 1 + 2.5 = 3.5 forward units where the calculator counts 3
    assert all(f.measured * 6 == f.predicted * 7 and f.ok for f in core)


RECOMPUTED = [("ddp", "torch"), ("zero2", "trainmath"), ("zero3", "trainmath"), ("zero3", "torch")]
"""Strategies also measured with full recompute."""


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy,impl,recompute", [(s, i, "none") for s, i in STRATEGIES]
                         + [(s, i, "full") for s, i in RECOMPUTED])
def test_peak_within_stated_tolerance(strategy, impl, nproc, recompute):
    """The peak of step 2 (MemTracker) against the calculator's timeline peak, within ``peak_tolerance`` and its
    reason (``verify.PEAK_TOLERANCE``): DDP, torch's ZeRO-1 and our ZeRO-1/2/3 within 5%, and within 1% where
    the peak is not a unit's reduce inside a layer's backward (0.4% for DDP at 4 ranks, one sequence each; our ZeRO-1
    had been 35% above at 4 ranks: it kept the full gradients beside their reduced shard and the ring kept a copy of the
    whole gradient buffer; with recompute the FLOP counter's module hooks had kept every recomputed layer alive: 17-45%
    above on the benchmark's model); FSDP2 (torch's ZeRO-2/3, ``memory/fsdp2.py``) within 0.1% on the benchmark's
    model and 1% on this tinier one on rank 0 (it had been 1-10% below the measurement)."""
    res = cached(nproc, strategy=strategy, impl=impl, **({"recompute": recompute} if recompute != "none" else {}))
    cfg = config(strategy=strategy, impl=impl, measure=True, recompute=recompute)
    name, conf = shrunk_config(cfg.model, cfg.overrides)
    pred = predict(model_spec(name, conf), cfg, nproc)
    fields = compare(pred, {r: v["measured"] for r, v in res.items()}, cfg)
    peaks = [f for f in fields if f.name.startswith("peak_bytes")]
    assert len(peaks) == nproc and all(f.measured > 0 for f in peaks)
    tol, kind = peak_tolerance(cfg)
    assert all(f.ok and f.tolerance == tol for f in peaks), [(f.name, f.rel_error) for f in peaks]
    phase = _phase(cfg, nproc)
    if impl == "torch" and strategy in ("zero2", "zero3"):  # FSDP2: a rank whose collective completes late holds
        # one more unit's buffer (``verify.PEAK_TOLERANCE["fsdp2_gloo"]``); on the modelled schedule a rank is
        # within 1% (rank 0 holds full ⌈d/n⌉-row chunks; later ranks' optimizer states follow their unpadded
        # local shards: at 4 ranks rank 3's peak is 0.4-1% lower)
        assert kind == "fsdp2_gloo" and min(f.rel_error for f in peaks) < 0.01, \
            [(f.name, f.rel_error) for f in peaks]
    elif kind == "modelled" and not (phase.startswith("backward layer") and phase.endswith("done")):
        assert all(f.rel_error < 0.01 for f in peaks), (phase, [(f.name, f.rel_error) for f in peaks])


@pytest.mark.parametrize("strategy,impl", RECOMPUTED)
def test_gemm_flops_exact_with_full_recompute(strategy, impl):
    """transformers' gradient checkpointing is torch's non-reentrant checkpoint, which stops before each layer's
    last GEMM (``down_proj``: nothing after it saves a tensor): the calculator's ``checkpoint="torch"`` recompute
    equals FlopCounterMode's count (it was 4.8% over when the whole layer was counted)."""
    res = cached(2, strategy=strategy, impl=impl, recompute="full")
    cfg = config(strategy=strategy, impl=impl, measure=True, recompute="full")
    pred = predict(model_spec(*shrunk_config(cfg.model, cfg.overrides)), cfg, 2)
    gemm = [f for f in compare(pred, {r: v["measured"] for r, v in res.items()}, cfg)
            if f.name.startswith("gemm_flops")]
    assert len(gemm) == 2 and all(f.measured == f.predicted > 0 for f in gemm)


def _phase(cfg, nproc) -> str:
    """The event where the calculator's timeline of the run peaks."""
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup, training_memory

    spec = model_spec(*shrunk_config(cfg.model, cfg.overrides))
    setup = TrainingSetup(micro_batch=cfg.micro_batch_for(nproc), seq=cfg.seq, precision=cfg.precision,
                          optimizer_impl="forloop", recompute=cfg.recompute, device="cpu", loop_keeps="loss",
                          zero_impl=zero_impl(cfg))
    r = training_memory(spec, setup, ParallelLayout(dp=nproc, zero=cfg.zero))
    return r.stages[0].phase


def test_flat_zero1_peaks_at_its_reduce():
    """Our ZeRO-1 at 4 ranks on the tiny model peaks when its flat buffer is allocated beside every full
    gradient (the timeline's ``gradient pack``, modelled by ``memory.flat_zero``): within 0.1% (4-byte ``step``
    scalars, one per tensor in the calculator, one per flat shard in ours; the before-fix peak was 35% above)."""
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup, training_memory

    res = cached(4, strategy="zero1", impl="trainmath")
    cfg = config(strategy="zero1", impl="trainmath", measure=True)
    spec = model_spec(*shrunk_config(cfg.model, cfg.overrides))
    setup = TrainingSetup(micro_batch=1, seq=cfg.seq, precision="fp32", optimizer_impl="forloop", device="cpu",
                          loop_keeps="loss", zero_impl="trainmath")
    r = training_memory(spec, setup, ParallelLayout(dp=4, zero=1))
    assert r.stages[0].phase == "gradient pack"
    assert all(abs(m["measured"]["peak_bytes"] / r.peak_bytes - 1) < 1e-3 for m in res.values())
    deepspeed = training_memory(spec, replace(setup, zero_impl="deepspeed"), ParallelLayout(dp=4, zero=1))
    assert deepspeed.peak_bytes > r.peak_bytes  # DeepSpeed's bucket lives through forward and backward


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_our_collective_bytes(strategy, nproc):
    """Buffer bytes of one step: one reduce-scatter of the padded gradients; all-gathers of the padded weights —
    once after the step (ZeRO-1/2), twice per layer and once for the root per step (ZeRO-3: forward, backward)."""
    res = cached(nproc, strategy=strategy, impl="trainmath")
    pred, _, _ = _fields(nproc, strategy, "trainmath")
    padded = pred["optimizer_states_bytes"] // 2 * nproc  # AdamW: two fp32 states per element of the shard
    comm = res[0]["measured"]["collective_bytes"]
    assert comm["reduce_scatter"] == padded
    if strategy != "zero3":
        assert comm["all_gather"] == padded
    else:
        assert padded < comm["all_gather"] < 2 * padded


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy", ["ddp", "zero1"])
def test_ddp_all_reduces_every_gradient_once_per_step(strategy, nproc):
    res = cached(nproc, strategy=strategy, impl="torch")
    pred, _, _ = _fields(nproc, strategy, "torch")
    assert res[0]["measured"]["collective_bytes"] == {"all_reduce": pred["gradients_bytes"]}


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy,impl,recompute", [
    ("ddp", "torch", "none"), ("zero1", "torch", "none"), ("zero1", "trainmath", "none"),
    ("zero2", "trainmath", "none"), ("zero3", "trainmath", "none"), ("zero3", "trainmath", "full")])
def test_collective_bytes_fields_exact(strategy, impl, nproc, recompute):
    """verify's per-step collective bytes (``trainmath.comm.volume``) equal what every rank counted, per
    collective; ZeRO-3's backward gathers are not repeated by the recompute."""
    kw = {"recompute": recompute} if recompute != "none" else {}
    res = cached(nproc, strategy=strategy, impl=impl, **kw)
    cfg = config(strategy=strategy, impl=impl, measure=True, recompute=recompute)
    name, conf = shrunk_config(cfg.model, cfg.overrides)
    pred = predict(model_spec(name, conf), cfg, nproc)
    fields = [f for f in compare(pred, {r: v["measured"] for r, v in res.items()}, cfg)
              if f.name.startswith("collective_bytes")]
    ops = {"ddp": 1, "zero1": 1}.get(strategy, 2) if impl == "torch" else 2
    assert len(fields) == ops * nproc
    assert all(f.ok and f.measured == f.predicted > 0 for f in fields)


def test_fsdp2_collectives_not_compared():
    pred, _, fields = _fields(2, "zero3", "torch")
    assert pred["collective_bytes"] is None and not [f for f in fields if f.name.startswith("collective")]
