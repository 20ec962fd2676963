"""Per-rank parameter, gradient and optimizer-state bytes: the calculator predicts the measured tensors exactly.

Oracle: the bytes of the real tensors each strategy holds after backward (DTensors by their local shards),
walked by ``measure.state_bytes``; the prediction is ``trainmath.memory.training_memory`` through
``runtime.train.verify``. Padded shards are exercised: vocab 67 and 42 intermediate rows do not divide by 2 or 4.
"""

import pytest

from tests.train.runs import STRATEGIES, cached, config
from trainmath.runtime.train.model import model_spec, shrunk_config
from trainmath.runtime.train.verify import compare, predict


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
    state = {f.name: f for f in fields if f.name.split(" ")[0].endswith("_bytes") and not f.name.startswith("peak")}
    assert len(state) == (3 * nproc + 1 if (strategy, impl) == ("zero1", "torch") else 4 * nproc)
    for name, f in state.items():
        if (strategy, impl) == ("zero2", "torch") and name.startswith("weights_bytes"):
            # FSDP2 with reshard_after_forward=False still reshards after backward: between steps a rank holds
            # its 1/n shard of the weights (the full ones only during forward and backward). The calculator's
            # ZeRO-2 keeps full weights; the measurement is exactly ZeRO-3's figure instead.
            zero3 = predict(model_spec(*shrunk_config(config().model, config().overrides)),
                            config(strategy="zero3"), nproc)["weights_bytes"]
            assert f.measured == zero3 < f.predicted
            continue
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


@pytest.mark.parametrize("nproc", [2, 4])
@pytest.mark.parametrize("strategy,impl", STRATEGIES)
def test_peak_within_stated_tolerance(strategy, impl, nproc):
    """The peak of step 2 (MemTracker) against the calculator's timeline peak, within ``PEAK_TOLERANCE`` — except
    our ZeRO-1 at 4 ranks, which the calculator under-predicts by about a third: its flat padded gradient buffer
    and all-gather staging are not ZeRO-1 as the calculator models it (gradients sharded into DeepSpeed's layout),
    and on this tiny model such fixed buffers weigh most. Asserted as it is, so a change shows up. (torch's ZeRO-1
    was over-predicted by 21-27% before the timeline counted gradients only while they live; now within.)"""
    _, measured, fields = _fields(nproc, strategy, impl)
    peaks = [f for f in fields if f.name.startswith("peak_bytes")]
    assert len(peaks) == nproc and all(f.measured > 0 for f in peaks)
    if (strategy, impl, nproc) == ("zero1", "trainmath", 4):
        assert all(f.measured > f.predicted and not f.ok for f in peaks)
    else:
        assert all(f.ok for f in peaks), [(f.name, f.rel_error) for f in peaks]


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
