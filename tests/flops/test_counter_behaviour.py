"""What FlopCounterMode sees, pinned because the oracle depends on it (torch 2.13.0, CPU).

With ``attn_implementation="sdpa"`` on CPU, torch dispatches to ``_scaled_dot_product_flash_attention_for_cpu``,
which the counter has no formula for: the attention core disappears from its count, forward and backward. That
is why the oracle runs eager attention, whose two matmuls the counter sees as bmm and which our default
``causal="executed"`` reproduces exactly. (On GPU the flash/efficient SDPA kernels are counted, also as full s × s.)
"""

from trainmath.families import spec_from_config
from trainmath.flops import count_flops

from .oracle import AutoConfig, AutoModelForCausalLM, measured_flops, tiny_config


def test_cpu_sdpa_attention_core_is_invisible_to_the_counter():
    cfg = tiny_config("meta-llama/Llama-3.1-8B")
    data = {k: v for k, v in cfg.items() if not k.startswith("_")}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(data.pop("model_type"), **data),
                                             attn_implementation="sdpa")
    r = count_flops(spec_from_config(cfg, name="llama", source="llama"), batch=2, seq=7)
    fwd, fwd_bwd = measured_flops(model, batch=2, seq=7)
    core = r.forward.child("attention_core").value
    assert core > 0
    assert fwd == r.forward.value - core
    assert fwd_bwd == r.forward.value + r.backward.value - 3 * core


def test_default_grouped_mm_experts_are_invisible_to_the_counter():
    """transformers 5.24 defaults MoE experts to ``grouped_mm`` (``config._experts_implementation``), a custom op
    the counter has no formula for; ``from_config(cfg, experts_implementation="eager")`` selects the per-expert
    loop of ``nn.functional.linear`` calls the counter sees, which the oracle uses."""
    from .test_oracle import CASES

    repo, ov = CASES["mixtral"]
    cfg = tiny_config(repo, **ov)
    data = {k: v for k, v in cfg.items() if not k.startswith("_")}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(data.pop("model_type"), **data),
                                             attn_implementation="eager")
    assert model.config._experts_implementation == "grouped_mm"
    r = count_flops(spec_from_config(cfg, name="mixtral", source="mixtral"), batch=2, seq=7)
    fwd, _ = measured_flops(model.float(), batch=2, seq=7)
    assert fwd == r.forward.value - r.forward.child("experts").value
