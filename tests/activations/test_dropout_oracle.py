"""Oracle: training dropout (GPT-2's ``*_pdrop``, StarCoder2's ``*_dropout``) as the CPU runs it.

Saved bytes: the hf profile with ``device="cpu"`` equals the distinct storages autograd keeps in transformers'
own code (``test_hf_oracle._measure``: saved_tensors_hooks, parameters excluded), exactly, with every dropout of
the config at 0.1: each dropout keeps its noise in the input's dtype, and SDPA with dropout runs the fp32 math
fallback. Whole step: the predicted peak with ``--device cpu`` equals MemTracker's of a real step of a tiny GPT-2
with its default dropouts (the full-width ``memory_sim.py --families --only gpt2`` was 10.4% low before dropout
was modelled). CUDA keeps a bool mask instead (``kernels.dropout``); no CUDA oracle here.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import test_hf_oracle as hf  # noqa: E402

from trainmath.errors import TrainmathError  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.activations import activation_bytes, logits_bytes  # noqa: E402
from trainmath.memory.training import TrainingSetup, training_memory  # noqa: E402
from trainmath.tree import check_sums  # noqa: E402

DROP = {"gpt2": {"n_inner": 96, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
        "starcoder2": {"residual_dropout": 0.1, "embedding_dropout": 0.1, "attention_dropout": 0.1}}


def _predict(cfg, mode, attn, device="cpu", recompute="none"):
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    c, p = hf.PREC[mode]
    act = activation_bytes(spec, micro_batch=hf.B, seq=hf.S, profile="eager" if attn == "eager" else "hf",
                           recompute=recompute, compute_dtype_bytes=c, param_dtype_bytes=p, device=device)
    assert check_sums(act.tree()) == []
    head = logits_bytes(spec, hf.B, hf.S, compute_dtype_bytes=c, param_dtype_bytes=p)
    predicted = act.total_bytes + head.saved_bytes
    return predicted - (act.recompute_transient_bytes if recompute == "full" else 0)


@pytest.mark.parametrize("mode", list(hf.PREC))
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("model_type", list(DROP))
def test_dropout_saved_bytes_exact(model_type, attn, mode):
    cfg, model = hf._model(model_type, attn, DROP[model_type])
    measured = hf._measure(model, mode)
    assert _predict(cfg, mode, attn) == measured
    # the same config without dropout saves less: the dropout terms are not free
    zero = {k: v if k == "n_inner" else 0.0 for k, v in DROP[model_type].items()}
    assert _predict(hf._model(model_type, attn, zero)[0], mode, attn) < measured


@pytest.mark.parametrize("mode", ["bf16", "autocast"])
def test_dropout_full_recompute_exact(mode):
    """Checkpointed GPT-2 layers keep their inputs; the embedding's dropout (outside them) keeps its noise."""
    cfg, model = hf._model("gpt2", "sdpa", DROP["gpt2"])
    assert _predict(cfg, mode, "sdpa", recompute="full") == hf._measure(model, mode, checkpoint=True)


def test_cuda_keeps_bool_masks():
    """On CUDA each dropout keeps a 1-byte mask and SDPA keeps its fused-kernel tensors: less than the CPU."""
    cfg, _ = hf._model("gpt2", "sdpa", DROP["gpt2"])
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    cpu, cuda, none = (activation_bytes(spec, micro_batch=hf.B, seq=hf.S, compute_dtype_bytes=2, param_dtype_bytes=2,
                                        device=dev, family=fam)
                       for dev, fam in (("cpu", None), ("cuda", None), ("cuda", _no_dropout(spec))))
    d, T, layers = 64, hf.B * hf.S, 2
    # per layer two residual dropouts (T·d masks); the embedding one more
    assert cuda.total_bytes - none.total_bytes == (2 * layers + 1) * T * d
    assert cpu.total_bytes > cuda.total_bytes


def _no_dropout(spec):
    import dataclasses

    from trainmath.ops.context import Family

    fam = Family.from_config(spec.options, spec.family.config_defaults)
    return dataclasses.replace(fam, attention_dropout=0.0, residual_dropout=0.0, embedding_dropout=0.0)


def test_unmodelled_dropout_refused():
    spec = spec_from_config({**hf.BASE, "model_type": "llama", "attention_dropout": 0.1}, name="tiny", source="test")
    with pytest.raises(TrainmathError, match="attention_dropout=0.1"):
        activation_bytes(spec, micro_batch=1, seq=8)


@pytest.mark.parametrize("precision", ["bf16", "amp-bf16"])
def test_gpt2_step_peak_with_dropout(precision):
    """A real CPU step of a tiny GPT-2 with its default dropouts (0.1), tied head: MemTracker's peak equals the
    prediction (``--device cpu``) within the 4-byte gradient of the loss, at the loss's backward (bf16: the
    CPU's fp32 SDPA math fallback dominates) or at the tied embedding's backward."""
    from torch.distributed._tools.mem_tracker import MemTracker

    cfg = transformers.AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4, n_inner=96, vocab_size=512,
                                            n_positions=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    batch = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(1))

    def step():
        ids = batch.clone()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp-bf16"):
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    with MemTracker() as mt:
        mt.track_external(model, opt)
        step()
        mt.reset_mod_stats()
        step()
        peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    r = training_memory(spec, TrainingSetup(loop_keeps="output", micro_batch=2, seq=64, precision=precision,
                                            device="cpu",
                                            optimizer_impl="foreach"))
    assert 0 <= peak - r.peak_bytes <= 4, (r.stages[0].phase, peak, r.peak_bytes)


@pytest.mark.parametrize("model_type,extra", [("qwen3", {}), ("gpt2", DROP["gpt2"])])
def test_one_sequence_keeps_padded_labels(model_type, extra, monkeypatch):
    """b = 1: ``labels[..., 1:]`` of the padded (1, s + 1) labels is contiguous, so nll_loss keeps the padded
    storage, 8 bytes more than the (b, s) labels a b > 1 batch copies (``ops.model.head_ops``)."""
    monkeypatch.setattr(hf, "B", 1)
    cfg, model = hf._model(model_type, "sdpa", extra)
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    head = logits_bytes(spec, 1, hf.S, compute_dtype_bytes=4, param_dtype_bytes=4)
    assert {n.name: n.value for n in head.saved}["labels_pad"] == 8
    assert _predict(cfg, "fp32", "sdpa") == hf._measure(model, "fp32")
