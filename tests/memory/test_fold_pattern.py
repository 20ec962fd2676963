"""How ``--simulate-layers`` reads a model of several layer types (``trainmath.verify.pattern``) and what it runs
(``trainmath.verify.fold.check_foldable``), on the catalog's multi-type models.

Oracles: the catalog configs' own layer types (the calculator's ledger), which a reading must reproduce layer for
layer, and the cut configs read back through both transformers and the calculator (``check_shrunk``). The fold's
exactness is ``test_simulate_fold_types.py``'s (the full simulation).
"""

from __future__ import annotations

import pytest

from trainmath.errors import TrainmathError
from trainmath.sources import load_spec
from trainmath.verify.fold import check_foldable, extrapolate
from trainmath.verify.pattern import Pattern, choose, layer_types

READINGS = {  # repo: (prefix, unit length, repeats, suffix) at N = 4
    "google/gemma-2-9b": (0, 2, 21, 0),
    "openai/gpt-oss-20b": (0, 2, 12, 0),
    "Qwen/Qwen3-Next-80B-A3B-Thinking": (0, 4, 12, 0),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": (0, 4, 12, 0),
    "deepseek-ai/DeepSeek-V3": (3, 1, 58, 0),
    "zai-org/GLM-4.5": (3, 1, 89, 0),
    "nvidia/Nemotron-H-56B-Base-8K": (0, 11, 10, 8),  # 52 + 63 layers simulated of 118
}


def rebuilt(p: Pattern) -> tuple:
    unit = p.types[p.prefix:p.prefix + p.period]
    return p.types[:p.prefix] + unit * p.repeats + p.types[len(p.types) - p.suffix:]


@pytest.mark.parametrize("repo", list(READINGS))
def test_reading_reproduces_every_layer(repo):
    types = layer_types(load_spec(repo))
    p = choose(types, 4)
    assert (p.prefix, p.period, p.repeats, p.suffix) == READINGS[repo]
    assert rebuilt(p) == types
    plan = check_foldable(load_spec(repo), 4)
    assert plan.pattern == p and sum(plan.runs()) < len(types)


def test_gemma2_positions_and_words():
    p = choose(layer_types(load_spec("google/gemma-2-9b")), 4)
    assert p.describe() == "(sliding_attention + mlp, full_attention + mlp) ×21"
    assert [p.position(i) for i in (0, 1, 2, 3, 4, 39, 40, 41)] == [
        "bottom 0 +0", "bottom 0 +1", "bottom 1 +0", "bottom 1 +1", "interior", "top 1 +1", "top 0 +0", "top 0 +1"]
    assert p.keep(4) == list(range(8))


def test_suffix_and_prefix_positions():
    """A Gemma-3-like 38 layers: (5 sliding, 1 full) ×6 then 2 sliding; DeepSeek-V3's 3 dense layers first."""
    types = tuple(("s" * 5 + "f") * 6 + "ss")
    p = choose(types, 4)
    assert (p.prefix, p.period, p.repeats, p.suffix) == (0, 6, 6, 2)
    assert p.describe() == "(s ×5, f) ×6 then s ×2"
    assert p.keep(4) == list(range(24)) + [36, 37] and p.position(37) == "suffix 1"
    d = choose(layer_types(load_spec("deepseek-ai/DeepSeek-V3")), 4)
    assert d.keep(4) == list(range(7)) and d.position(2) == "prefix 2" and d.position(3) == "bottom 0"


@pytest.mark.parametrize("repo, why", [
    ("google/gemma-3-1b-it", "simulated all 26 layers: no unit of its layer types (sliding_attention + mlp ×22, "
                             "full_attention + mlp ×4) repeats the 6 times folding 4 and 5 repeats needs"),
    ("google/gemma-2-9b", None),
])
def test_too_short_to_gain_is_simulated_whole(repo, why):
    if why is None:  # Gemma-2-9B at N = 10: 20 + 22 layers against 42
        plan = check_foldable(load_spec(repo), 10)
        assert plan.pattern is None and plan.why == ("simulated all 42 layers: folding ((sliding_attention + mlp, "
                                                     "full_attention + mlp) ×21) would simulate 20 + 22 layers")
        return
    plan = check_foldable(load_spec(repo), 4)
    assert plan.pattern is None and plan.why == why and plan.runs() == [len(load_spec(repo).layers)]


@pytest.mark.parametrize("repo", ["google/gemma-2-9b", "google/gemma-3-1b-it", "openai/gpt-oss-20b",
                                  "Qwen/Qwen3-Next-80B-A3B-Thinking", "deepseek-ai/DeepSeek-V3",
                                  "meta-llama/Llama-4-Scout-17B-16E-Instruct", "nvidia/Nemotron-H-56B-Base-8K"])
def test_cut_config_reads_back_as_the_kept_layers(repo):
    """transformers fills the per-layer lists; the cut config gives the calculator the kept layers' types, in order
    (``check_shrunk`` raises otherwise), and transformers builds that many layers from it."""
    pytest.importorskip("transformers")
    from trainmath.sources import resolve
    from trainmath.verify.pattern import check_shrunk
    from trainmath.verify.simulate import hf_config

    types = layer_types(load_spec(repo))
    p = choose(types, 4) or choose(types, 1)
    cut = check_shrunk(resolve(repo).config, p, 2, repo)
    cfg = hf_config(cut)
    assert getattr(cfg, "text_config", cfg).num_hidden_layers == len(p.keep(2))


def test_refusals_are_one_line():
    with pytest.raises(TrainmathError, match="--simulate-layers must be at least 4"):
        check_foldable(load_spec("google/gemma-2-9b"), 3)
    small = {(2, "forward", "bottom 0", ""): (10, {}), (2, "forward", "top 0 +1", ""): (12, {})}
    large = {(2, "forward", "bottom 0", ""): (11, {}), (2, "forward", "interior", ""): (9, {})}
    with pytest.raises(TrainmathError, match="different segments .* so the fold would not be exact") as e:
        extrapolate(small, large, 4, 10)
    assert "\n" not in str(e.value)
