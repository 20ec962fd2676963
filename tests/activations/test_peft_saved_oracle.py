"""Oracle: the bytes a peft LoRA model saves for backward, measured with ``saved_tensors_hooks`` on transformers'
real modeling code wrapped by peft, equal the calculator's fold of the op lists under ``ops.lora`` exactly (the
same measurement as ``test_hf_oracle``: distinct non-parameter storages held by the graph when forward ends)."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from tests.activations.test_hf_oracle import B, S, _measure, _model  # noqa: E402
from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.activations import activation_bytes, logits_bytes  # noqa: E402
from trainmath.memory.peft import PeftRun, head_saved_delta, layer_saved  # noqa: E402
from trainmath.memory.training import TrainingSetup  # noqa: E402
from trainmath.vocabulary import get_precision  # noqa: E402

PRECISION = {"bf16": "bf16", "autocast": "amp-bf16", "fp32": "fp32"}


EXTRA = {"gpt2": {"n_inner": 96}}  # GPT-2: Conv1D c_attn/c_proj/c_fc, gelu_new, dropouts kept at 0.1


def _peft_model(model_type, mode, targets, rank, dropout, input_grads):
    cfg, model = _model(model_type, "default", EXTRA.get(model_type, {}))
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    conf = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=dropout)
    model = peft.get_peft_model(model, conf)  # autocast_adapter_dtype=True: fp32 adapters on a bf16 base
    if input_grads:
        model.enable_input_require_grads()
    return cfg, model


def _predict(cfg, mode, targets, rank, dropout, input_grads):
    spec = spec_from_config(cfg.to_dict(), name="tiny", source="test")
    prec = get_precision(PRECISION[mode])
    job = PeftJob(method="lora", rank=rank, targets=targets if isinstance(targets, str) else tuple(targets))
    run = PeftRun(job=job, dropout=dropout, input_grads=input_grads)
    setup = TrainingSetup(micro_batch=B, seq=S, precision=PRECISION[mode], device="cpu", peft=run)
    act = activation_bytes(spec, micro_batch=B, seq=S, compute_dtype_bytes=prec.compute_bytes,
                           param_dtype_bytes=prec.weight_bytes, device="cpu")
    head = logits_bytes(spec, B, S, compute_dtype_bytes=prec.compute_bytes, param_dtype_bytes=prec.weight_bytes)
    layers = layer_saved(spec, setup, prec, run, range(spec.num_layers))
    emb = act.embedding.value if act.embedding else 0
    return (act.total_bytes - emb - sum(f - m for f, m in layers.values()) + head.saved_bytes
            - head_saved_delta(spec, setup, prec))


CASES = [
    ("llama", "bf16", ["q_proj", "v_proj"], 4, 0.0, False),
    ("llama", "bf16", "all-linear", 8, 0.0, True),
    ("llama", "fp32", ["q_proj", "v_proj"], 4, 0.0, True),
    ("llama", "autocast", "all-linear", 4, 0.0, False),
    ("qwen3", "bf16", "all-linear", 4, 0.0, False),
    ("qwen3", "bf16", ["gate_proj", "up_proj", "down_proj"], 4, 0.0, False),
    ("qwen2", "bf16", ["q_proj", "k_proj", "v_proj", "o_proj"], 4, 0.0, False),
    ("mistral", "bf16", ["q_proj", "v_proj"], 4, 0.1, True),
    ("olmo2", "bf16", "all-linear", 4, 0.0, False),
    ("gemma2", "bf16", "all-linear", 4, 0.0, False),
    ("gemma2", "bf16", ["q_proj"], 4, 0.0, False),  # eager attention: each bmm keeps only the other's operand
    ("gemma2", "bf16", ["down_proj"], 4, 0.0, False),  # layer 0's attention and first norms need no grad
    ("starcoder2", "fp32", "all-linear", 4, 0.0, False),
    ("gpt2", "fp32", "all-linear", 4, 0.0, False),
    ("gpt2", "bf16", ["c_fc"], 4, 0.0, False),  # gelu_new's tanh and last product need grad behind c_fc alone
]


@pytest.mark.parametrize("model_type,mode,targets,rank,dropout,input_grads", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2] if isinstance(c[2], str) else len(c[2])}-d{c[4]}-ig{int(c[5])}"
                              for c in CASES])
def test_lora_saved_bytes_exact(model_type, mode, targets, rank, dropout, input_grads):
    cfg, model = _peft_model(model_type, mode, targets, rank, dropout, input_grads)
    measured = _measure(model, "autocast" if mode == "autocast" else "none")
    assert _predict(cfg, mode, targets, rank, dropout, input_grads) == measured
