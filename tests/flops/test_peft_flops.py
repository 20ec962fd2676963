"""Oracle: ``peft_flops`` equals ``FlopCounterMode`` on peft-wrapped tiny real models (the oracle of
``tests/flops/oracle.py``: eager attention, fp32), exactly: frozen Linears without weight-gradient GEMMs, the
adapters' GEMMs, layer 0 without gradients before its first adapter unless ``enable_input_require_grads``."""

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from tests.flops.oracle import FlopCounterMode, build_model, tiny_config  # noqa: E402
from trainmath.adapters import PeftJob, adapter_report  # noqa: E402
from trainmath.families import spec_from_config  # noqa: E402
from trainmath.flops import count_flops  # noqa: E402
from trainmath.flops.peft import LORA, peft_flops  # noqa: E402

B, S = 2, 16
CASES = [
    ("meta-llama/Llama-3.1-8B", ["q_proj", "v_proj"], False),
    ("meta-llama/Llama-3.1-8B", "all-linear", True),
    ("Qwen/Qwen3-8B", ["down_proj"], False),  # layer 0's attention runs no backward at all
    ("Qwen/Qwen3-8B", ["k_proj"], False),  # only K needs grad in layer 0's scores
    ("google/gemma-2-9b", "all-linear", False),
    ("Qwen/Qwen2.5-7B", ["q_proj", "k_proj", "v_proj"], False),  # biased addmm
    ("allenai/OLMo-2-1124-7B", ["o_proj", "gate_proj"], False),
    ("bigcode/starcoder2-7b", "all-linear", True),
]


@pytest.mark.parametrize("repo,targets,input_grads", CASES, ids=[f"{c[0].split('/')[1]}-{c[1]}-{c[2]}" for c in CASES])
def test_flop_counter_exact(repo, targets, input_grads):
    data = tiny_config(repo)
    job = PeftJob(method="lora", rank=4, targets=targets if isinstance(targets, str) else tuple(targets))
    assert_counter_exact(data, peft.LoraConfig(r=4, target_modules=targets), job, input_grads)


def assert_counter_exact(data, lora, job, input_grads):
    """``peft_flops`` of ``job`` equals FlopCounterMode's forward and forward + backward of the tiny real model
    ``data`` wrapped by peft with ``lora``."""
    model = peft.get_peft_model(build_model(dict(data)), lora)
    if input_grads:
        model.enable_input_require_grads()
    ids = torch.randint(0, data["vocab_size"], (B, S), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as fc:
        model(input_ids=ids)
    fwd = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        model(input_ids=ids).logits.sum().backward()
    spec = spec_from_config({k: v for k, v in data.items() if not k.startswith("_")}, name="tiny", source="test")
    r = peft_flops(spec, job, batch=B, seq=S, input_grads=input_grads).report
    assert r.forward.value == fwd
    assert r.training.value == fc.get_total_flops()


def test_lora_is_cheaper_than_full_training_and_adds_its_gemms():
    """Pinned by the rules: forward = full training's forward + the adapters'; the backward loses the weight
    gradients (about a third of full training's step), and QLoRA dequantises every use of its 4-bit weights."""
    from trainmath.sources import load_spec

    spec = load_spec("meta-llama/Llama-3.1-8B")
    full = count_flops(spec, batch=1, seq=4096)
    job = PeftJob(method="qlora", rank=16, targets="all-linear")
    p = peft_flops(spec, job, batch=1, seq=4096)
    adapters = p.report.forward.child(LORA).value
    assert adapters == sum(2 * 4096 * 16 * (m.in_features + m.out_features) * m.count
                           for m, _ in adapter_report(spec, job, 0).modules)
    assert p.report.forward.value == full.forward.value + adapters
    # the linears lose a third of their step (their weight gradients); the attention cores keep both backward
    # products; at 4k tokens the cores are about an eighth of Llama-3.1-8B's step
    assert 0.69 < p.report.training.value / full.training.value < 0.73
    layer_weights = sum(t.numel for ly in spec.layers for t in ly.tensors if t.kind == "linear")
    assert layer_weights < p.dequant_elements <= 2 * layer_weights
