"""Oracle: transformers' ``grouped_mm`` expert path of gpt-oss and Qwen3-Next (``experts_implementation=
"grouped_mm"``, transformers 5's default) saves what the hf profile with ``experts="grouped"`` says, exactly
(the method of ``test_hf_oracle``: saved_tensors_hooks, distinct storages still held when the forward ends).

gpt-oss's grouped path differs from the standard one (``experts.grouped_experts(..., clamped=True)``): biased
experts (the bias gathers keep the sorted expert ids; ``add_`` in place), the clamped interleaved SwiGLU, and
under autocast fp32 rows throughout (``_grouped_mm`` casts its input to the fp32 weights). Qwen3-Next's is the
standard one. The routing of a tiny random model is its own: every expert must be hit for the grouped path to
equal the fold (the int32 offsets are per expert either way; no weight copies on this path).
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import test_hf_oracle as hf  # noqa: E402  (tests/activations is on sys.path under pytest)

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.activations import activation_bytes, logits_bytes  # noqa: E402
from trainmath.tree import check_sums  # noqa: E402

CASES = {
    "gpt_oss": ({"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48, "sliding_window": 8},
                "default"),  # eager attention with sinks: transformers has no SDPA path for it
    "qwen3_next": (hf.QWEN3_NEXT, "sdpa"),
}


def _grouped_model(model_type, extra, attn):
    cfg = transformers.AutoConfig.for_model(model_type, **{**hf.BASE, **hf.NO_IDS, **extra})
    torch.manual_seed(0)
    kw = {} if attn == "default" else {"attn_implementation": attn}
    model = transformers.AutoModelForCausalLM.from_config(cfg, experts_implementation="grouped_mm", **kw)
    return cfg, model


@pytest.mark.parametrize("checkpoint", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("mode", list(hf.PREC))
@pytest.mark.parametrize("model_type", list(CASES))
def test_grouped_path_exact(model_type, mode, checkpoint):
    extra, attn = CASES[model_type]
    cfg, model = _grouped_model(model_type, extra, attn)
    hit = hf._experts_hit(model)
    measured = hf._measure(model, mode, checkpoint=checkpoint)
    assert set(hit) <= {4}, f"precondition: every expert receives tokens ({hit})"
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    c, p = hf.PREC[mode]
    act = activation_bytes(spec, micro_batch=hf.B, seq=hf.S, recompute="full" if checkpoint else "none",
                           compute_dtype_bytes=c, param_dtype_bytes=p, experts="grouped")
    assert check_sums(act.tree()) == []
    predicted = act.total_bytes + logits_bytes(spec, hf.B, hf.S, compute_dtype_bytes=c,
                                         param_dtype_bytes=p).saved_bytes
    if checkpoint:
        predicted -= act.recompute_transient_bytes
    assert predicted == measured
    eager = activation_bytes(spec, micro_batch=hf.B, seq=hf.S, compute_dtype_bytes=c, param_dtype_bytes=p,
                             experts="eager")
    assert eager.total_bytes != act.total_bytes or checkpoint  # the two paths save differently
