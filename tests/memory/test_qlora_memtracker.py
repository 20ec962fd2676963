"""Oracle: ``training_memory(..., peft=qlora)`` against MemTracker's peak of a real QLoRA step on the CPU (bitsandbytes
runs there on real tensors): a shrunk Llama saved, reloaded in NF4 with double quantisation (``BitsAndBytesConfig``),
wrapped by peft, ``loss = model(...).loss``, AdamW foreach over the adapters, second of two steps.

MemTracker sees no quant state (absmax, nested absmax, code tables are attributes of ``Params4bit``, neither
parameters nor buffers): the measured peak adds their storages. The prediction then exceeds it by less than one
dequantised weight: the timeline keeps the largest dequantised 4-bit weight as a transient at every event, while at
the loss (the peak) no Linear is running and none is alive. Less that transient, the prediction is 56 B over on this
model: the quant state predicted 1,080 B above the distinct storages found here (code tables shared between
weights?) and the activations 1,024 B under, neither explained yet: the test bounds the rest by 2 KiB."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.peft import PeftRun  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402

BASE = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, head_dim=32)
B, S, R = 2, 64, 4


class _Kept:
    def remove(self) -> None:
        pass


def _measured(cfg, tmp_path) -> tuple[int, int]:
    """(MemTracker's peak less buffers, the quant state's bytes) of the second QLoRA step."""
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(tmp_path)
    q = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                        bnb_4bit_compute_dtype=torch.bfloat16)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=q, dtype=torch.bfloat16,
                                                              device_map="cpu", attn_implementation="sdpa")
    model = peft.get_peft_model(model, peft.LoraConfig(r=R, lora_alpha=2 * R, target_modules="all-linear"))
    model.train()
    mt = MemTracker()
    for p in model.parameters():  # MemTracker hooks every parameter's gradient; a frozen (4-bit) one has none
        if not p.requires_grad:
            mt._param_to_grad_hook_handles[p] = (_Kept(), _Kept())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    mt.track_external(model, opt)

    def step() -> None:
        ids = torch.randint(0, cfg.vocab_size, (B, S))
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with mt:
        step()
        mt.reset_mod_stats()
        step()
        peak = next(iter(mt.get_tracker_snapshot("peak").values()))["Total"]
    seen: set[int] = set()
    state = 0
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        for t in (qs.absmax, qs.code, qs.state2.absmax, qs.state2.code) if qs is not None else ():
            if t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                state += t.untyped_storage().nbytes()
    buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    return peak - buffers, state


@pytest.mark.slow
def test_qlora_step_peak_bound(tmp_path):
    cfg = transformers.AutoConfig.for_model("llama", **BASE)
    tracked, state = _measured(cfg, tmp_path)
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    r = training_memory(spec, TrainingSetup(micro_batch=B, seq=S, precision="bf16", device="cpu", loop_keeps="loss",
                                            peft=PeftRun(job=PeftJob(method="qlora", rank=R, targets="all-linear"))))
    assert r.stages[0].phase == "backward: loss"
    assert state > 0
    dequant = r.breakdown.child("weight_copies_bytes").value
    measured = tracked + state
    assert 0 <= r.peak_bytes - measured - dequant <= 2048
