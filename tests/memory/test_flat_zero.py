"""Our flat-buffer ZeRO-1/2 in the timeline (``zero_impl="trainmath"``, ``memory.flat_zero``) and the per-step
collective bytes (``comm.volume``). The measured oracle (MemTracker and the runtime's counters on gloo ranks) is
``tests/train/test_measure.py``; here: pinned arithmetic and the properties that tie the two models together."""

from __future__ import annotations

import pytest

from trainmath.comm import flat as cf
from trainmath.comm.volume import dp_step_collective_bytes
from trainmath.families import spec_from_config
from trainmath.layout import ParallelLayout
from trainmath.memory.training import TrainingSetup, training_memory
from trainmath.placement import place
from trainmath.tree import check_sums
from trainmath.vocabulary import get_precision

CONFIG = {"model_type": "qwen3", "vocab_size": 67, "hidden_size": 32, "intermediate_size": 42,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
          "tie_word_embeddings": True}


def _spec():
    return spec_from_config(dict(CONFIG), name="tiny", source="test")


def test_ring_window_pinned():
    # below 4 MiB a chunk is one segment: min(2, n - 1) chunks
    assert cf.ring_window_bytes(1000, 2, 4) == 4000
    assert cf.ring_window_bytes(1000, 4, 4) == 8000
    assert cf.ring_window_bytes(1000, 1, 4) == 0
    # 9 MiB of fp32 per chunk: k = 2 segments of ceil(c / 2) elements, 2 steps
    c = 9 * 2**20 // 4 + 1
    assert cf.ring_window_bytes(c, 8, 4) == 2 * 2 * -(-c // 2) * 4


def test_flat_units_pad_every_tensor_on_dim0():
    spec, prec, layout = _spec(), get_precision("fp32"), ParallelLayout(dp=4, zero=2)
    units = cf.flat_units(place(spec, layout, 0), layout, prec, 2)
    assert list(units) == ["layer.0", "layer.1", "root"]
    root = units["root"]  # tied embedding (67 rows -> 4 x 17) and the final norm (32 -> 4 x 8)
    assert root.shard_numel == 17 * 32 + 8
    assert root.buffer_bytes == 4 * root.shard_numel * 4 and root.full_grad_bytes == (67 * 32 + 32) * 4
    whole = cf.flat_units(place(spec, layout, 0), layout, prec, 1)["model"]
    assert whole.shard_numel == sum(u.shard_numel for u in units.values())


@pytest.mark.parametrize("zero", [1, 2])
@pytest.mark.parametrize("dp", [2, 4])
def test_flat_timeline_sums_and_has_no_bucket(zero, dp):
    spec = _spec()
    setup = TrainingSetup(micro_batch=1, seq=16, precision="fp32", optimizer_impl="forloop", device="cpu",
                          loop_keeps="loss", zero_impl="trainmath")
    r = training_memory(spec, setup, ParallelLayout(dp=dp, zero=zero))
    for e in r.stages[0].timeline:
        check_sums(r.stages[0].at(e.name))
    events = {e.name: e for e in r.stages[0].timeline}
    assert events["step start"].live.framework_overhead_bytes == 0
    assert "parameter all-gather" in events and ("gradient pack" in events) == (zero == 1)
    ds = training_memory(spec, TrainingSetup(**{**setup.__dict__, "zero_impl": "deepspeed"}),
                         ParallelLayout(dp=dp, zero=zero))
    bucket = ds.stages[0].timeline[0].live.framework_overhead_bytes
    assert bucket == place(spec, ParallelLayout(dp=dp, zero=zero), 0).params * 4 > 0  # min(5e8, Ψ) elements
    assert "flat padded buffers" in " ".join(r.conventions)


def test_zero_impl_ignored_by_ddp_and_our_zero3_prefetches_nothing():
    spec = _spec()
    a, b = (training_memory(spec, TrainingSetup(micro_batch=1, seq=16, precision="fp32", zero_impl=z),
                            ParallelLayout(dp=2, zero=0)).peak_bytes for z in ("deepspeed", "trainmath"))
    assert a == b
    fsdp, ours = (training_memory(spec, TrainingSetup(micro_batch=1, seq=16, precision="fp32", zero_impl=z),
                                  ParallelLayout(dp=4, zero=3)) for z in ("deepspeed", "trainmath"))
    layer = fsdp.stages[0].at("forward layer 0").flat()["zero3_gather_bytes"]
    assert layer - ours.stages[0].at("forward layer 0").flat()["zero3_gather_bytes"] > 0  # layer 1 prefetched
    assert "no prefetch" in " ".join(ours.conventions)


def test_bad_zero_impl_one_line():
    from trainmath.errors import TrainmathError

    with pytest.raises(TrainmathError, match="zero_impl must be one of deepspeed, trainmath"):
        training_memory(_spec(), TrainingSetup(micro_batch=1, seq=16, zero_impl="colossalai"))


def test_collective_volume():
    spec, prec = _spec(), get_precision("fp32")
    grads = sum(t.numel for t in place(spec, ParallelLayout(dp=2), 0).tensors) * 4
    assert dp_step_collective_bytes(place(spec, ParallelLayout(dp=2), 0), ParallelLayout(dp=2), prec,
                                    strategy="ddp") == {"all_reduce": grads}
    assert dp_step_collective_bytes(place(spec, ParallelLayout(), 0), ParallelLayout(), prec, strategy="ddp") == {}
    by_zero = {}
    for zero in (1, 2, 3):
        layout = ParallelLayout(dp=4, zero=zero)
        pl = place(spec, layout, 0)
        by_zero[zero] = dp_step_collective_bytes(pl, layout, prec, strategy="trainmath", micro_batches=2)
        padded = sum(u.buffer_bytes for u in cf.flat_units(pl, layout, prec, 2).values())
        assert padded > grads  # 67 vocabulary rows and 42 MLP rows pad to multiples of 4
    assert by_zero[1] == {"reduce_scatter": padded, "all_gather": padded}  # accumulates, reduces once
    assert by_zero[2] == {"reduce_scatter": 2 * padded, "all_gather": padded}
    layers = padded - cf.flat_units(pl, layout, prec, 2)["root"].buffer_bytes
    assert by_zero[3] == {"reduce_scatter": 2 * padded, "all_gather": 2 * (padded + layers)}


def test_ring_constants_equal_the_runtime():
    ring = pytest.importorskip("trainmath.runtime.ring")
    assert (cf.RING_SEGMENT_BYTES, cf.RING_MAX_SEGMENTS, cf.RING_WINDOW_STEPS) == (
        ring.SEGMENT_BYTES, ring.MAX_SEGMENTS, ring._RS_WINDOW_STEPS)
