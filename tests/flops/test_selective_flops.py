"""Oracle: ``count_flops(..., recompute="selective")`` against FlopCounterMode over a real training step of
transformers' code under ``trainmath.runtime.checkpointing.apply_selective`` (torchtitan's op-level policy).

The recompute FLOPs are measured as the difference of two steps of the same model, forward with labels and
backward, counted in separate steps (one without checkpointing, one with it; no ModuleTracker state is shared):
FlopCounterMode sees the recomputed mm/addmm/bmm/convolutions of backward and nothing of the cached ops. CPU
SDPA's kernel is invisible to the counter in both steps, and the fold says its output is cached (no core
recompute), so the SDPA cases compare the linears; eager attention recomputes its two bmms, the forward
attention core (``test_eager_core_recomputed``). The fold also checks torch's early stop: the layer's last saving
linear (Phi-3's, Qwen2's and Falcon's down projections, each a 2nd/4th mm) is never run again.
"""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "activations"))

import test_hf_oracle as hf  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.flops.model import count_flops  # noqa: E402
from trainmath.runtime.checkpointing import apply_selective  # noqa: E402
from trainmath.sources import load_spec  # noqa: E402


def _step(model, ids) -> int:
    with FlopCounterMode(display=False) as fc:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return fc.get_total_flops()


def _recompute_measured(model) -> int:
    model.train()
    ids = torch.randint(0, 128, (hf.B, hf.S), generator=torch.Generator().manual_seed(1))
    base = _step(model, ids)
    apply_selective(model)
    return _step(model, ids) - base


def _fold(data):
    return count_flops(spec_from_config(data, name="tiny", source="test"), batch=hf.B, seq=hf.S,
                       recompute="selective")


def _family(model_type, extra=(), attn="sdpa"):
    def build():
        cfg, model = hf._model(model_type, attn, {**hf.NO_IDS, **dict(extra)})
        data = cfg.to_dict()
        if model_type == "qwen3_moe":
            data["num_experts"] = data["num_local_experts"]  # see test_hf_oracle._predict
        return data, model
    return build


def _case(model_type, index):
    model_type, extra, attn = [c for c in hf.FAMILY_CASES if c[0] == model_type][index]
    return _family(model_type, extra, attn)


def _catalog(model_type, i):
    return lambda: hf._catalog_model(model_type, hf.MLA_CASES[i][1])


CASES = {
    "llama": _family("llama"), "qwen2": _family("qwen2"), "olmo2": _family("olmo2"),
    "phi3": _case("phi3", 0), "gemma2": _case("gemma2", 0), "gemma3_text": _case("gemma3_text", 0),
    "cohere": _case("cohere", 0), "starcoder2": _case("starcoder2", 0), "gpt2": _case("gpt2", 0),
    "falcon-mqa": _case("falcon", 1), "falcon-new": _case("falcon", 2), "glm4_moe": _case("glm4_moe", 0),
    "gpt_oss": _case("gpt_oss", 0), "qwen3_next": _case("qwen3_next", 0), "nemotron_h": _case("nemotron_h", 0),
    "qwen3_moe": _family("qwen3_moe", hf.MOE), "mixtral": _family("mixtral", {"num_local_experts": 4,
                                                                            "num_experts_per_tok": 2}),
    "qwen2_moe": _family("qwen2_moe", {**hf.MOE, "shared_expert_intermediate_size": 48, "num_hidden_layers": 3,
                                       "mlp_only_layers": [1]}),
    "deepseek_v3": _catalog("deepseek_v3", 0), "deepseek_v2": _catalog("deepseek_v2", 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_selective_recompute_flops_equal_flop_counter(name):
    """Exact, for every family with its default attention kernel (Gemma-2 and gpt-oss: eager) and the eager
    expert loop (``grouped_mm`` is invisible to the counter)."""
    data, model = CASES[name]()
    assert _fold(data).recomputed.value == _recompute_measured(model)


def test_early_stop_spares_the_last_linear():
    """Phi-3: qkv (kept), o, gate_up (kept), down: down is a 2nd mm, not cached, yet never recomputed: the
    checkpoint stops at the last tensor backward needs, down's input, packed before the mm runs."""
    data, _ = CASES["phi3"]()
    rec = _fold(data).recomputed
    d, layers = 64, 2
    assert rec.value == layers * 2 * hf.B * hf.S * d * d  # o_proj only
    assert {k for k, v in rec.flat().items() if v} == {"attention"}


@pytest.mark.parametrize("model_type", ["qwen3", "phi3"])
def test_eager_core_recomputed(model_type):
    """Eager attention's bmms are not in the policy's list: the recompute runs the attention core forward again
    (``count_flops`` folds the family's default kernel, SDPA, whose output is cached)."""
    data, model = _family(model_type, attn="eager")()
    fold = _fold(data)
    assert _recompute_measured(model) == fold.recomputed.value + fold.forward.flat()["attention_core"]


def test_llama4_counts_active_experts():
    """Llama 4 runs every routed expert over every token (``bmm``, recomputed); the fold counts the active
    T·top_k rows, so the counter sees n / top_k times the routed experts' recompute."""
    data, model = _case("llama4_text", 0)()
    fold = _fold(data)
    n, k = data["num_local_experts"], data["num_experts_per_tok"]
    experts = fold.recomputed.flat()["experts"]
    assert _recompute_measured(model) == fold.recomputed.value + (n // k - 1) * experts


def test_selective_of_a_family_running_another_family_code():
    """Kimi K2 runs DeepSeek-V3's modeling code (``FamilyDef.runs_as``): its selective recompute is that op
    list's, equal to the same spec counted as deepseek_v3, and more than none's zero."""
    import dataclasses

    kimi = load_spec("moonshotai/Kimi-K2-Instruct")
    got = count_flops(kimi, batch=1, seq=16, recompute="selective").recomputed.value
    want = count_flops(dataclasses.replace(kimi, model_type="deepseek_v3"), batch=1, seq=16,
                       recompute="selective").recomputed.value
    assert got == want > 0
