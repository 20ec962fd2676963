"""Oracle: optimizer-state bytes equal the bytes of ``torch.optim`` state tensors after one step.

A tiny transformers model (built from a Qwen3 config, the same config the calculator reads) and a plain
``nn.Linear`` stack, in fp32 and bf16, one ``optimizer.step()`` each; the prediction comes from the spec's tensor
shapes (or the modules' shapes for the Linear stack) through ``trainmath.memory.optimizers``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.memory.optimizers import optimizer_state_bytes  # noqa: E402
from trainmath.model.spec import named_tensors  # noqa: E402

QWEN3_TINY = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 128, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}

MAKERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-3),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True),
    "adafactor": lambda ps: torch.optim.Adafactor(ps, lr=1e-3),
}
DTYPES = {"fp32": (torch.float32, 4), "bf16": (torch.bfloat16, 2)}


def measured_state_bytes(model, make) -> int:
    """One step of ``make(model.parameters())`` with a random gradient on every parameter; Σ nbytes of every
    tensor in ``optimizer.state``."""
    opt = make(model.parameters())
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def tiny_qwen3(dtype):
    cfg = transformers.AutoConfig.for_model(**QWEN3_TINY)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opt", MAKERS)
def test_transformers_model_state_bytes(opt, dtype):
    torch_dtype, nbytes = DTYPES[dtype]
    spec = spec_from_config(dict(QWEN3_TINY), name="tiny-qwen3", source="test")
    shapes = [shape for _, shape, _ in named_tensors(spec)]
    model = tiny_qwen3(torch_dtype)
    # the spec's shapes are the model's shapes (same names, same order is not needed)
    assert sorted(shapes) == sorted(tuple(p.shape) for p in model.parameters())
    predicted = optimizer_state_bytes(opt, shapes, state_bytes=nbytes)
    assert predicted == measured_state_bytes(model, MAKERS[opt])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opt", MAKERS)
def test_linear_stack_state_bytes(opt, dtype):
    torch_dtype, nbytes = DTYPES[dtype]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 80), torch.nn.ReLU(), torch.nn.Linear(80, 80, bias=False),
                                torch.nn.Linear(80, 3)).to(torch_dtype)
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert optimizer_state_bytes(opt, shapes, state_bytes=nbytes) == measured_state_bytes(model, MAKERS[opt])


def test_pinned_adam_numbers():
    """Adam on one (80, 48) weight and its (80,) bias in fp32: 2·3840·4 + 2·80·4 + two 4-byte steps."""
    assert optimizer_state_bytes("adam", [(80, 48), (80,)], state_bytes=4) == 2 * 3840 * 4 + 2 * 80 * 4 + 2 * 4
    # on the GPU the foreach step scalars stay on the CPU
    assert optimizer_state_bytes("adam", [(80, 48), (80,)], state_bytes=4, device_only=True) == 2 * 3920 * 4
