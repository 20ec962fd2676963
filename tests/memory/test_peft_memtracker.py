"""Oracle: ``training_memory(..., peft=...)`` against MemTracker's peak of a real LoRA step of transformers' code
wrapped by peft (``trainmath.verify.peft_sim``: ``loss = model(...).loss``, AdamW foreach over the adapters,
set_to_none), on small CPU models. Exact at the loss, with and without ``enable_input_require_grads`` and gradient
checkpointing. MemTracker's module hooks would keep each step's embedding-output leaf and its gradient alive into the
next step (``peft_sim.release``); ``test_tracker_keeps_the_leaf`` shows the loop alone frees them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.peft import PeftRun  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402
from trainmath.verify.peft_sim import peft_step_peak  # noqa: E402

BASE = dict(vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, head_dim=16)
B, S = 2, 64


def _both(model_type, precision, targets, recompute="none", input_grads=None):
    cfg = transformers.AutoConfig.for_model(model_type, **BASE)
    m = peft_step_peak(cfg, micro_batch=B, seq=S, precision=precision, targets=targets, rank=4, recompute=recompute,
                       input_grads=input_grads)
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    run = PeftRun(job=PeftJob(method="lora", rank=4, targets=targets if isinstance(targets, str) else tuple(targets)),
                  input_grads=input_grads)
    r = training_memory(spec, TrainingSetup(micro_batch=B, seq=S, precision=precision, device="cpu",
                                            recompute=recompute, loop_keeps="loss", peft=run))
    return m, r


@pytest.mark.parametrize("model_type,precision,targets", [
    ("llama", "bf16", ["q_proj", "v_proj"]), ("llama", "amp-bf16", "all-linear"), ("qwen3", "fp32", "all-linear"),
    ("qwen2", "bf16", "all-linear"), ("olmo2", "bf16", ["q_proj", "v_proj"]),
])
def test_loss_peak_exact(model_type, precision, targets):
    m, r = _both(model_type, precision, targets)
    assert r.stages[0].phase == "backward: loss"
    assert m["peak_bytes"] - m["buffers_bytes"] == r.peak_bytes
    assert m["trainable_params"] * 4 * 2 <= r.breakdown.child("optimizer_states_bytes").value


@pytest.mark.parametrize("model_type,precision,recompute", [("llama", "bf16", "full"), ("qwen3", "fp32", "full"),
                                                             ("llama", "bf16", "none")])
def test_input_grads_exact(model_type, precision, recompute):
    """The embedding output becomes a leaf requiring grad: held by its AccumulateGrad node without recompute (one
    (T, d) more than a frozen layer 0 saves), and the very storage layer 0's checkpoint keeps under full recompute
    (not a second one)."""
    m, r = _both(model_type, precision, "all-linear", recompute=recompute, input_grads=True)
    assert r.stages[0].phase == "backward: loss"
    assert m["peak_bytes"] - m["buffers_bytes"] == r.peak_bytes


@pytest.mark.parametrize("tracked", [False, True])
def test_tracker_keeps_the_leaf(tracked):
    """Why ``peft_sim`` releases each step's embedding output: under MemTracker it survives the step (its module
    tracker's gradient hooks close a cycle through the graph), in the bare loop it is freed when the loss dies."""
    import contextlib
    import gc
    import weakref

    import peft
    from torch.distributed._tools.mem_tracker import MemTracker

    cfg = transformers.AutoConfig.for_model("llama", **BASE)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    mt = MemTracker()
    mt._track_module_params_and_buffers(model, install_grad_hooks=True)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    model.enable_input_require_grads()
    refs = []
    model.get_input_embeddings().register_forward_hook(lambda m, i, out: refs.append(weakref.ref(out)))
    with mt if tracked else contextlib.nullcontext():
        ids = torch.randint(0, cfg.vocab_size, (B, S))
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        gc.collect()
        assert (refs[0]() is not None) == tracked


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_fake_step_is_the_real_step(recompute):
    """On fake tensors the step takes the real tensors' masking path (no explicit causal mask, no K/V repeated for
    GQA): the same peak to the byte, so the full-width rows of ``benchmarks/peft_memory.py`` measure the real code."""
    cfg = transformers.AutoConfig.for_model("llama", **BASE)
    kw = dict(micro_batch=B, seq=S, precision="bf16", targets="all-linear", rank=4, recompute=recompute)
    assert peft_step_peak(cfg, fake=True, **kw)["peak_bytes"] == peft_step_peak(cfg, **kw)["peak_bytes"]
