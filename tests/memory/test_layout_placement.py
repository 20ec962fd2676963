"""Layout validation (one error naming every problem) and placement (what a rank holds)."""

from __future__ import annotations

import pytest

from trainmath.errors import TrainmathError
from trainmath.layout import ParallelLayout, validate_layout
from trainmath.params import count_params
from trainmath.placement import place, stage_layers
from trainmath.sources import load_spec


@pytest.fixture(scope="module")
def qwen8b():
    return load_spec("qwen3-8b")  # 36 layers, 32 heads, 8 KV heads, untied head


@pytest.fixture(scope="module")
def qwen30b():
    return load_spec("qwen3-30b-a3b")  # 48 layers, 128 experts


def test_every_problem_in_one_message(qwen8b):
    lay = ParallelLayout(dp=2, tp=3, pp=40, world_size=7)
    with pytest.raises(TrainmathError) as e:
        validate_layout(lay, qwen8b)
    msg = str(e.value)
    assert "world size (7) must equal dp·tp·pp·cp = 2·3·40·1 = 240" in msg
    assert "pp (40) must not exceed the number of layers (36)" in msg
    assert "tp (3) must divide attention heads (32)" in msg
    assert "tp (3) must divide KV heads (8)" in msg


def test_expert_parallel_rules(qwen30b, qwen8b):
    with pytest.raises(TrainmathError, match=r"ep \(3\) must divide the routed experts \(128\)"):
        validate_layout(ParallelLayout(dp=3, ep=3), qwen30b)
    with pytest.raises(TrainmathError, match=r"ep \(4\) must divide dp·cp \(2·1 = 2\)"):
        validate_layout(ParallelLayout(dp=2, ep=4), qwen30b)
    with pytest.raises(TrainmathError, match="has no routed experts"):
        validate_layout(ParallelLayout(dp=2, ep=2), qwen8b)
    validate_layout(ParallelLayout(dp=4, cp=2, ep=8, tp=4), qwen30b)


def test_stage_split_rule():
    assert stage_layers(36, 4) == (range(0, 9), range(9, 18), range(18, 27), range(27, 36))
    assert [len(r) for r in stage_layers(10, 4)] == [3, 3, 2, 2]  # first L mod pp stages one longer


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-30b-a3b", "llama-3.2-1b", "gpt-oss-20b", "deepseek-v2-lite",
                                   "nemotron-h-56b-base-8k", "qwen3-next-80b-a3b-thinking", "openai-community/gpt2"])
def test_unsharded_rank_holds_the_whole_model(model):
    """Degree 1 equals the unsharded case: one rank holds exactly the parameter count."""
    spec = load_spec(model)
    assert place(spec, ParallelLayout()).params == count_params(spec).total_params


def test_stages_partition_the_model(qwen8b):
    stages = [place(qwen8b, ParallelLayout(pp=4), s) for s in range(4)]
    assert sum(p.params for p in stages) == count_params(qwen8b).total_params
    assert stages[0].unit_params()["embed"] == 151936 * 4096
    assert "head" in stages[3].unit_params() and "embed" not in stages[3].unit_params()


def test_tied_head_copied_to_last_stage():
    spec = load_spec("qwen3-0.6b")  # tied embeddings
    total = count_params(spec).total_params
    assert place(spec, ParallelLayout()).params == total
    two = [place(spec, ParallelLayout(pp=2), s).params for s in range(2)]
    assert sum(two) == total + spec.vocab_size * spec.hidden_size  # Megatron's shared embedding copy


def test_tensor_parallel_pinned(qwen8b):
    """Qwen3-8B at tp=2: every linear and the vocab split in half; norms (incl. q/k norms over one head)
    replicated. 36 layers × 4 norms-of-d/h_d ... computed by hand below."""
    d, h, kv, hd, ff, v, L = 4096, 32, 8, 128, 12288, 151936, 36
    per_layer_split = (h * hd * d + 2 * kv * hd * d + d * h * hd + 3 * d * ff) // 2
    per_layer_repl = 2 * d + 2 * hd
    expected = L * (per_layer_split + per_layer_repl) + 2 * (v * d) // 2 + d
    assert place(qwen8b, ParallelLayout(tp=2)).params == expected


def test_expert_parallel_pinned(qwen30b):
    full = place(qwen30b, ParallelLayout())
    ep8 = place(qwen30b, ParallelLayout(dp=8, ep=8))
    assert ep8.dense_params == full.dense_params
    assert ep8.expert_params * 8 == full.expert_params == 48 * 128 * 3 * 768 * 2048
