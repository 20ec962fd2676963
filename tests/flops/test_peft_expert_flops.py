"""Oracle: ``peft_flops`` with routed-expert and router targets (peft's ``target_parameters``, ``ParamWrapper``)
equals ``FlopCounterMode`` on peft-wrapped tiny real MoE models (eager experts and attention, fp32), exactly:
the experts' GEMMs now take their weight's gradient (per routed token), and the wrapper's ``baddbmm`` (W + B·A)
is 2·E·a·b·r per evaluation, evaluated twice per forward (torch's register_parametrization checks it once), its
backward 4·E·a·b·r."""

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from tests.flops.oracle import tiny_config  # noqa: E402
from tests.flops.test_oracle import MOE, QWEN_MOE  # noqa: E402
from tests.flops.test_peft_flops import assert_counter_exact  # noqa: E402
from trainmath.adapter_params import hf_parameters  # noqa: E402
from trainmath.adapters import PeftJob  # noqa: E402
from trainmath.flops.peft import LORA, peft_flops  # noqa: E402

EXPERTS = ("experts.gate_up_proj", "experts.down_proj")
CASES = [
    ("Qwen/Qwen3-30B-A3B", dict(QWEN_MOE, head_dim=16), (), EXPERTS, False),  # layer 0: no input gradient
    ("Qwen/Qwen3-30B-A3B", dict(QWEN_MOE, head_dim=16, mlp_only_layers=[1]), ("q_proj",),
     ("experts.down_proj", "gate.weight"), True),
    ("mistralai/Mixtral-8x7B-v0.1", MOE, ("w1", "w3"), (), False),  # v4 names converted: gate_up_proj at 2r
    ("Qwen/Qwen1.5-MoE-A2.7B", dict(QWEN_MOE, shared_expert_intermediate_size=48), ("v_proj",), EXPERTS, False),
    ("openai/gpt-oss-20b", dict(MOE, head_dim=16, sliding_window=4), ("q_proj",), EXPERTS + ("router.weight",),
     False),  # (E, in, out) stacks, is_transposed, with biases
]


@pytest.mark.parametrize("repo,overrides,modules,params,input_grads", CASES,
                         ids=[f"{c[0].split('/')[1]}-{'+'.join(c[2] + c[3])}" for c in CASES])
def test_flop_counter_exact(repo, overrides, modules, params, input_grads):
    lora = peft.LoraConfig(r=4, target_modules=list(modules), target_parameters=list(params))
    job = PeftJob(method="lora", rank=4, targets=modules or "none", target_parameters=params)
    assert_counter_exact(tiny_config(repo, **overrides), lora, job, input_grads)


def test_delta_product_is_per_layer_not_per_token():
    """The wrapper's product does not grow with the tokens; the experts' weight gradients do (pinned by the
    rule: 2 × 2·E·a·b·r forward, 4·E·a·b·r backward, per MoE layer)."""
    from trainmath.sources import load_spec

    spec = load_spec("Qwen/Qwen3-30B-A3B")
    job = PeftJob(method="lora", rank=16, targets="none", target_parameters=EXPERTS)
    one, two = (peft_flops(spec, job, batch=1, seq=s) for s in (1024, 2048))
    per_layer = sum(2 * p.experts * p.in_features * p.out_features * 16 for p in hf_parameters(spec).values()
                    if p.name.endswith(EXPERTS))
    for f in (one, two):
        assert f.report.forward.child(LORA).value == 2 * per_layer * spec.num_layers
        assert f.report.backward.child(LORA).value == 2 * per_layer * spec.num_layers
    experts = [f.report.backward.child("experts").value for f in (one, two)]
    assert experts[1] == 2 * experts[0]
