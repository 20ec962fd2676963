"""``--simulate-layers`` on models of several layer types: the fold over repeats of the type pattern against the full
simulation, to the byte, for each multi-type family the simulation runs.

Oracle: the full simulation (transformers' own code on fake tensors under MemTracker) of the same config. Every
segment outside the interior (``trainmath.verify.fold``) is compared, not only the peak, so the test checks the
argument's premise (each segment affine in the repeats) as well as its conclusion; the interior segments of the
full run are checked to lie below the folded peak (they are the ones the fold does not extrapolate).

Configs: the catalog entry of each family, its published switches kept (windows, softcapping, MLA ranks, the
Mamba mixer, ``first_k_dense_replace``), narrowed to a width the full simulation runs in seconds, with enough
layers for six repeats of the unit (the fold simulates four and five); Qwen3-Next's unit is cut from three linear
layers and one full to one of each (``full_attention_interval=2``), which halves its time (Gemma-3 keeps its five
sliding layers and one full, the unit with runs of a type).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainmath.families import spec_from_config  # noqa: E402
from trainmath.layout import ParallelLayout  # noqa: E402
from trainmath.memory.training import TrainingSetup  # noqa: E402
from trainmath.model.spec import MoEDims  # noqa: E402
from trainmath.sources import catalog_entry  # noqa: E402

NARROW = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=128,
              head_dim=16)
MLA = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1, n_group=1,
           topk_group=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=24,
           num_key_value_heads=4, head_dim=8)
FAMILIES = {  # repo, layers, overrides, the pattern as fold.py reads it
    "gemma2": ("google/gemma-2-9b", 12, {}, "(sliding_attention + mlp, full_attention + mlp) ×6"),
    "gemma3": ("google/gemma-3-1b-it", 38, {},
               "(sliding_attention + mlp ×5, full_attention + mlp) ×6 then sliding_attention + mlp ×2"),
    "gpt_oss": ("openai/gpt-oss-20b", 12, dict(num_local_experts=4, num_experts_per_tok=2),
                "(sliding_attention + moe, full_attention + moe) ×6"),
    "qwen3_next": ("Qwen/Qwen3-Next-80B-A3B-Thinking", 12, dict(
        full_attention_interval=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16), "(linear_attention + moe, full_attention + moe) ×6"),
    "nemotron_h": ("nvidia/Nemotron-H-56B-Base-8K", 18, dict(
        hybrid_override_pattern="M*-" * 6, mamba_num_heads=4, mamba_head_dim=8, n_groups=2, ssm_state_size=8,
        chunk_size=64), "(mamba, full_attention, mlp) ×6"),
    "deepseek_v3": ("deepseek-ai/DeepSeek-V3", 9, dict(MLA, first_k_dense_replace=3),
                    "mla + mlp ×3 then mla + moe ×6"),
}


def narrow(repo: str, layers: int, **overrides) -> dict:
    """The catalog config of ``repo`` at NARROW width with ``layers`` layers (the per-layer lists dropped, so
    transformers and the calculator derive them for that count from the published rule)."""
    cfg = {k: v for k, v in catalog_entry(repo).config.items() if not k.startswith("_")}
    for key in ("layer_types", "pad_token_id", "bos_token_id", "eos_token_id", "rope_scaling", "rope_parameters"):
        cfg.pop(key, None)
    return {**cfg, **NARROW, **overrides, "num_hidden_layers": layers, "pad_token_id": 0}


def fold_against_full(config: dict, setup: TrainingSetup, layout: ParallelLayout = ParallelLayout()):
    from trainmath.verify.fold import FoldPlan, simulate_folded
    from trainmath.verify.pattern import choose, layer_types
    from trainmath.verify.simulate import simulate

    spec = spec_from_config(config, name="narrow", source="test")
    moe = any(isinstance(b.dims, MoEDims) for layer in spec.layers for b in layer.blocks)
    pattern = choose(layer_types(spec), 4)
    plan = FoldPlan(4, len(spec.layers), pattern)  # run the fold even where it simulates more than the model
    folded = simulate_folded(config, setup, layout, moe=moe, plan=plan)
    full = simulate(config, setup, layout, moe=moe, position=pattern.position)
    return pattern, folded, full


def check(folded, full) -> None:
    kept = {k: v for k, v in full.segments.items() if "interior" not in k[2]}
    assert folded.segments == kept  # every extrapolated segment, bytes and kinds, to the byte
    assert (folded.peak_bytes, folded.by_kind, folded.buffers_bytes) == (full.peak_bytes, full.by_kind,
                                                                         full.buffers_bytes)
    assert max(v[0] for k, v in full.segments.items() if "interior" in k[2]) <= folded.peak_bytes


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fold_equals_the_full_simulation(family):
    """The defaults (mixed-bf16, AdamW foreach, one device) with the attention each family's code allows."""
    repo, layers, overrides, words = FAMILIES[family]
    setup = TrainingSetup(micro_batch=1, seq=32, attention="eager", device="cpu")
    pattern, folded, full = fold_against_full(narrow(repo, layers, **overrides), setup)
    assert pattern.describe() == words
    check(folded, full)
    a, b = len(pattern.keep(4)), len(pattern.keep(5))
    assert f"simulated {a} and {b} of {layers} layers, read as {words}" in folded.folded


@pytest.mark.parametrize("setup, layout", [
    (TrainingSetup(micro_batch=1, seq=32, attention="eager", optimizer_impl="forloop", device="cpu"),
     ParallelLayout(dp=4, zero=3)),
    (TrainingSetup(micro_batch=1, seq=32, attention="eager", precision="bf16", recompute="full", device="cpu"),
     ParallelLayout()),
], ids=["fsdp2", "bf16-full-recompute"])
def test_fold_under_fsdp2_and_recompute(setup, layout):
    """Gemma-2's alternating layers under FSDP2's per-layer prefetch (a sliding layer's neighbours are full
    layers) and under full recompute."""
    repo, layers, overrides, _ = FAMILIES["gemma2"]
    _, folded, full = fold_against_full(narrow(repo, layers, **overrides), setup, layout)
    check(folded, full)


def test_cli_says_which_layers_ran(capsys, tmp_path):
    """The CLI on a narrow Gemma-2: 20 layers fold (8 + 10 simulated, said in the JSON); 12 layers would simulate
    more than the model, so it runs whole and says so; N = 3 is one line, exit 2."""
    import json

    from trainmath.cli import main

    repo, _, overrides, words = FAMILIES["gemma2"]
    argv = ["--micro-batch", "1", "--seq", "32", "--attention", "eager", "--simulate", "--simulate-layers"]
    path = str(tmp_path / "gemma2.json")
    with open(path, "w") as f:
        json.dump(narrow(repo, 20, **overrides), f)
    assert main(["memory", path, *argv, "4", "--json"]) == 0
    out, err = capsys.readouterr()
    d = json.loads(out)["simulation"]
    assert d["layers"] == 20 and d["folded"].startswith(
        "simulated 8 and 10 of 20 layers, read as (sliding_attention + mlp, full_attention + mlp) ×10")
    assert "estimated" in err and "for 8 + 10 layers" in err
    with open(path, "w") as f:
        json.dump(narrow(repo, 12, **overrides), f)
    assert main(["memory", path, *argv, "4"]) == 0
    out = capsys.readouterr().out
    assert f"simulated all 12 layers: folding ({words}) would simulate 8 + 10 layers" in out
    assert main(["memory", path, *argv, "3"]) == 2
    err = capsys.readouterr().err
    assert "--simulate-layers must be at least 4" in err and err.count("\n") == 1


def test_fold_on_a_multimodal_wrapper():
    """Llama-4's config wraps its text model (``text_config``): the simulation builds the text model the calculator
    reads, and the fold over its (chunked ×3, full) unit equals the full simulation to the byte."""
    wrapper = {k: v for k, v in catalog_entry("meta-llama/Llama-4-Scout-17B-16E-Instruct").config.items()
               if not k.startswith("_")}
    text = {k: v for k, v in wrapper["text_config"].items()
            if k not in ("layer_types", "no_rope_layers", "rope_scaling", "moe_layers")}
    text.update(NARROW, intermediate_size=32, intermediate_size_mlp=96, num_local_experts=4, num_hidden_layers=24,
                attention_chunk_size=16, pad_token_id=0)
    config = {**wrapper, "text_config": text}
    from trainmath.memory.training import experts_path

    setup = TrainingSetup(micro_batch=1, seq=32, attention="eager", device="cpu")
    setup = TrainingSetup(micro_batch=1, seq=32, attention="eager", device="cpu",
                          experts=experts_path(spec_from_config(config, name="narrow", source="test"), setup))
    pattern, folded, full = fold_against_full(config, setup)
    assert pattern.describe() == "(chunked_attention + moe ×3, full_attention + moe) ×6"
    check(folded, full)
