"""Oracle: ``training_memory(..., device="cpu")`` against MemTracker's peak of a real training step.

Each case builds a tiny transformers model on the CPU, runs ``out = model(ids, labels=ids);
out.loss.backward(); opt.step(); opt.zero_grad()`` twice under
``torch.distributed._tools.mem_tracker.MemTracker`` (``reset_mod_stats()`` before the measured one, the batch
made inside the step as ``.to(device)`` would) and compares the peak of every kind of tensor it tracks with the
prediction. Three regimes, by where the peak falls:

- the loss (a vocabulary large beside the model) and the optimizer step (few tokens): exact, less the module
  buffers (rotary ``inv_freq``/``original_inv_freq``, which the calculator does not count);
- inside a layer's backward (small vocabulary, recompute): within 1%, because op-level transients inside one
  layer's backward (norm and attention gradients) are not events of the timeline; the MLP's are
  (``timeline.ffn_backward_transient``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, head_dim=16)
FAMILY = {
    "qwen3": {}, "llama": {}, "mistral": {}, "qwen2": {}, "olmo2": {},
    "qwen3_moe": dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
}


def measure(model_type, *, precision, vocab, b, s, recompute="none", impl="foreach", lifetime="set_to_none",
            experts="eager", keep="output", tied=False):
    """(MemTracker's peak total on the CPU, the model's buffer bytes, the prediction)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    extra = FAMILY[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, vocab_size=vocab, tie_word_embeddings=tied, **BASE, **extra)
    torch.manual_seed(0)
    kw = {"experts_implementation": {"eager": "eager", "grouped": "grouped_mm"}[experts]} \
        if model_type in ("qwen3_moe", "mixtral") else {}
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", **kw)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    if recompute == "full":
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=impl == "foreach", fused=impl == "fused")
    batch = torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(1))

    def step():
        ids = batch.clone()  # the batch arrives on the device inside the step
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp-bf16"):
            if keep == "output":
                out = model(input_ids=ids, labels=ids, use_cache=False)
                loss = out.loss
            else:  # the loop keeps the loss only (HF Trainer, trainmath train)
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=lifetime == "set_to_none")

    with MemTracker() as mt:
        mt.track_external(model, opt)
        step()
        mt.reset_mod_stats()
        step()
        peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    buffers = sum(x.untyped_storage().nbytes() for x in model.buffers())
    data = cfg.to_dict()
    if model_type == "qwen3_moe":  # transformers 5 stores num_experts as num_local_experts (see tests/activations)
        data["num_experts"] = data["num_local_experts"]
    spec = spec_from_config(data, name="tiny", source="test")
    setup = TrainingSetup(micro_batch=b, seq=s, precision=precision, optimizer="adamw", optimizer_impl=impl,
                          recompute=recompute, grad_lifetime=lifetime, device="cpu", experts=experts,
                          loop_keeps=keep)
    return peak["Total"], buffers, training_memory(spec, setup)


@pytest.mark.parametrize("precision, recompute", [("fp32", "none"), ("bf16", "full"), ("amp-bf16", "none")])
def test_loop_keeping_the_loss_only(precision, recompute):
    """``loss = model(...).loss`` (``--loop-keeps loss``): the logits are freed when the forward returns; exact at
    the loss's backward, and below the ``output`` loop by the logits held there."""
    measured, buffers, r = measure("qwen3", precision=precision, vocab=1024, b=2, s=64, recompute=recompute,
                                   keep="loss")
    held, _, kept = measure("qwen3", precision=precision, vocab=1024, b=2, s=64, recompute=recompute)
    assert r.stages[0].phase == "backward: loss"
    assert measured - buffers == r.peak_bytes < kept.peak_bytes == held - buffers


@pytest.mark.parametrize("model_type, precision", [(m, "amp-bf16") for m in sorted(FAMILY)]
                         + [(m, p) for m in ("qwen3", "olmo2") for p in ("fp32", "bf16")])
def test_loss_peak_exact(model_type, precision):
    """Every family exact, MoE included (its experts' optimizer step scalars are one per fused parameter)."""
    measured, buffers, r = measure(model_type, precision=precision, vocab=1024, b=2, s=64)
    assert r.stages[0].phase == "backward: loss"
    assert measured - buffers == r.peak_bytes


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_grouped_experts(model_type, precision):
    """``--experts grouped`` (transformers 5's default ``grouped_mm``) against the real grouped step."""
    measured, buffers, r = measure(model_type, precision=precision, vocab=1024, b=2, s=64, experts="grouped")
    assert r.stages[0].phase == "backward: loss"
    assert measured - buffers == r.peak_bytes


@pytest.mark.parametrize("precision, impl, lifetime", [
    ("fp32", "forloop", "set_to_none"), ("amp-bf16", "fused", "set_to_none"), ("bf16", "foreach", "zero"),
    ("fp32", "fused", "zero"),
])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_loss_peak_exact_across_impl_lifetime_recompute(precision, impl, lifetime, recompute):
    measured, buffers, r = measure("qwen3", precision=precision, vocab=1024, b=2, s=64, recompute=recompute,
                                   impl=impl, lifetime=lifetime)
    assert r.stages[0].phase == "backward: loss"
    assert measured - buffers == r.peak_bytes


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("lifetime", ["set_to_none", "zero"])
def test_optimizer_step_peak_exact(precision, lifetime):
    """Few tokens: the foreach step's temporaries (one state-sized tensor per parameter) make the peak."""
    measured, buffers, r = measure("qwen3", precision=precision, vocab=128, b=1, s=8, lifetime=lifetime)
    assert r.stages[0].phase == "optimizer step"
    assert measured - buffers == r.peak_bytes


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16"])
@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_layer_backward_peak_within_1_percent(model_type, precision):
    """Small vocabulary, full recompute: the peak is inside layer 0's recomputed backward."""
    measured, buffers, r = measure(model_type, precision=precision, vocab=128, b=2, s=64, recompute="full",
                                   impl="forloop")
    assert r.stages[0].phase.startswith("backward layer 0")
    assert abs(r.peak_bytes / (measured - buffers) - 1) < 0.01


@pytest.mark.parametrize("precision, recompute", [("fp32", "none"), ("bf16", "full"), ("amp-bf16", "none")])
def test_fake_simulation_equals_real_step(precision, recompute):
    """``--simulate`` (the same step on fake tensors) measures what the real step measures, to the byte, less the
    module buffers (a model built in bf16 keeps its rotary buffers fp32; ``.to(bfloat16)`` converts them)."""
    from trainmath.verify.simulate import simulate

    measured, buffers, r = measure("qwen3", precision=precision, vocab=1024, b=2, s=64, recompute=recompute)
    config = {"model_type": "qwen3", "vocab_size": 1024, **BASE}
    sim = simulate(config, r.setup)
    assert sim.peak_bytes - sim.buffers_bytes == measured - buffers


def test_cli_simulate(capsys, tmp_path):
    import json

    from trainmath.cli import main

    config = {"model_type": "qwen3", "vocab_size": 1024, **BASE}
    path = str(tmp_path / "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    assert main(["memory", path, "--micro-batch", "2", "--seq", "64", "--precision", "fp32", "--simulate",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["simulation"]
    assert d["difference_bytes"] == 0 and d["predicted_cpu_peak_event"] == "backward: loss"
    assert main(["memory", path, "--micro-batch", "2", "--seq", "64", "--simulate", "--dp", "2"]) == 2
    assert "--simulate cannot run layout" in capsys.readouterr().err


@pytest.mark.parametrize("world, precision", [(2, "fp32"), (4, "bf16")])
def test_fsdp2_rank_exact(world, precision):
    """ZeRO-3 as FSDP2 runs it: rank 0 of a ``world``-rank fake process group under FSDPMemTracker equals the
    timeline at its peak (the loss's backward: sharded states, the unsharded root, the last layer all-gathered
    for backward), less the buffers."""
    from trainmath.layout import ParallelLayout
    from trainmath.verify.simulate import simulate

    config = {"model_type": "qwen3", "vocab_size": 1024, **BASE}
    spec = spec_from_config(config, name="tiny", source="test")
    setup = TrainingSetup(micro_batch=2, seq=64, precision=precision, optimizer_impl="forloop", device="cpu")
    layout = ParallelLayout(dp=world, zero=3)
    r = training_memory(spec, setup, layout)
    sim = simulate(config, setup, layout)
    assert r.stages[0].phase == "backward: loss"
    assert sim.peak_bytes - sim.buffers_bytes == r.peak_bytes
    assert r.breakdown.flat()["zero3_gather_bytes"] == sim.by_kind["Unsharded Param"] + sim.by_kind["All Gather"]


def test_fsdp2_attention_backward_event():
    """A StarCoder2-like layer with dropout on the CPU (math SDPA): FSDP2's rank 0 peaks inside the last layer's
    attention backward, the MLP's full-size unsharded weight gradients already made, the MLP's saved tensors
    freed, and the math kernel's fp32 backward buffers alive (``fsdp2.MixerBackward``). Exact but for one fp32
    scalar (4 bytes) the timeline does not carry there (the other FSDP2 rows' 4 bytes)."""
    from trainmath.layout import ParallelLayout
    from trainmath.verify.simulate import simulate

    config = {"model_type": "starcoder2", "vocab_size": 128, "hidden_size": 256, "intermediate_size": 1024,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 256, "attention_dropout": 0.1, "residual_dropout": 0.1,
              "embedding_dropout": 0.0, "use_bias": True, "tie_word_embeddings": False, "bos_token_id": 0,
              "eos_token_id": 0}
    spec = spec_from_config(config, name="tiny", source="test")
    setup = TrainingSetup(loop_keeps="output", micro_batch=1, seq=64, precision="bf16", optimizer_impl="forloop",
                          device="cpu")
    layout = ParallelLayout(dp=4, zero=3)
    r = training_memory(spec, setup, layout)
    sim = simulate(config, setup, layout)
    assert r.stages[0].phase == "backward layer 1 attention"
    assert r.peak_bytes == 8_156_308
    assert sim.peak_bytes - sim.buffers_bytes - r.peak_bytes == 4


def test_fsdp2_input_norm_backward_event():
    """A Mistral-like layer under full recompute: FSDP2's rank 0 peaks inside layer 0's input RMSNorm backward
    (``pow``'s backward), every full-size unsharded gradient of the layer made, layer 1's reduce-scatter input
    alive, the recomputed saved tensors freed but the norm's fp32 x, and five fp32 tensors of x's shape
    (``fsdp2.NormBackward``). Exact but for one fp32 scalar (4 bytes) the timeline does not carry there."""
    from trainmath.layout import ParallelLayout
    from trainmath.verify.simulate import simulate

    config = {"model_type": "mistral", "vocab_size": 128, "hidden_size": 256, "intermediate_size": 1024,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 0}
    spec = spec_from_config(config, name="tiny", source="test")
    setup = TrainingSetup(loop_keeps="output", micro_batch=1, seq=64, precision="bf16", optimizer_impl="forloop",
                          device="cpu",
                          recompute="full")
    layout = ParallelLayout(dp=4, zero=3)
    r = training_memory(spec, setup, layout)
    sim = simulate(config, setup, layout)
    assert r.stages[0].phase == "backward layer 0 input norm"
    assert r.peak_bytes == 10_132_696
    assert sim.peak_bytes - sim.buffers_bytes - r.peak_bytes == 4


@pytest.mark.parametrize("bucket_view", [False, True])
@pytest.mark.parametrize("vocab, b, s", [(1024, 2, 64), (128, 1, 8)])
def test_ddp_buckets_exact(bucket_view, vocab, b, s):
    """torch DDP at dp = 2 (a fake process group; a comm hook that returns each bucket as it is, which is what an
    in-place all-reduce leaves): its buckets hold a copy of every gradient for the whole step, or, with
    ``gradient_as_bucket_view``, are the gradients. Exact at the loss's peak and at the optimizer step's."""
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn.parallel import DistributedDataParallel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from trainmath.layout import ParallelLayout

    config = {"model_type": "qwen3", "vocab_size": vocab, **BASE}
    cfg = transformers.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    model.train()
    batch = torch.randint(0, vocab, (b, s), generator=torch.Generator().manual_seed(1))

    def hook(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with MemTracker() as mt:
            mt.track_external(model)
            ddp = DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)  # buckets made in view
            ddp.register_comm_hook(None, hook)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

            def step():
                ids = batch.clone()
                out = ddp(input_ids=ids, labels=ids, use_cache=False)
                out.loss.backward()
                opt.step()
                opt.zero_grad()

            step()
            mt.reset_mod_stats()
            step()
            peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    finally:
        dist.destroy_process_group()
    buffers = sum(x.untyped_storage().nbytes() for x in model.buffers())
    spec = spec_from_config(config, name="tiny", source="test")
    r = training_memory(spec, TrainingSetup(loop_keeps="output", micro_batch=b, seq=s, precision="fp32", device="cpu",
                                            bucket_view=bucket_view), ParallelLayout(dp=2))
    assert peak["Total"] - buffers == r.peak_bytes
    assert r.breakdown.flat()["framework_overhead_bytes"] == (0 if bucket_view else r.stages[0].at(
        "optimizer step").flat()["gradients_bytes"])


@pytest.mark.parametrize("precision", ["fp32", "bf16", "amp-bf16"])
def test_tied_embedding_backward_peak(precision):
    """Tied embeddings, a vocabulary large beside the model, few tokens: the peak is the embedding's backward,
    where the weight holds the head's gradient, the lookup's backward makes a second and autograd's accumulation
    their sum (three V·d tensors; the full-width benchmark found it, ``memory_sim.py --families``)."""
    measured, buffers, r = measure("qwen3", precision=precision, vocab=4096, b=1, s=8, tied=True)
    assert r.stages[0].phase == "backward: embedding"
    assert abs(r.peak_bytes / (measured - buffers) - 1) < 0.01
    # by then the lookup's input gradient and the rotary tables are freed: exact but for the loss's 4-byte gradient
    assert 0 <= measured - buffers - r.peak_bytes <= 4
