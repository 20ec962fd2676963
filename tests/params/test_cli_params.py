"""The params CLI and API: pinned figures, JSON shape, explain, bad input (one line, exit 2)."""

import json
import subprocess
import sys

import pytest

from trainmath.cli import main
from trainmath.families import spec_from_config
from trainmath.params import count_params
from trainmath.sources import load_spec, resolve
from trainmath.tree import check_sums

# Real checkpoints: model.safetensors.index.json total_size / 2 (bf16)
PINNED = {
    "Qwen/Qwen3-32B": (32_762_123_264, 32_762_123_264),
    "Qwen/Qwen3-235B-A22B": (235_093_634_560, 22_190_763_520),
}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("model", sorted(PINNED))
def test_pinned_checkpoint_sizes(capsys, model):
    code, out, _ = run_cli(capsys, "params", model, "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["total_params"], data["activated_params"]) == PINNED[model]
    assert data["model"] == model
    assert sum(data["components"].values()) == data["total_params"]


def test_seed_activated_figure_is_wrong():
    """The seed's 22.14456064e9 counts the router as k·d; the module tree gives n·d per MoE layer."""
    report = count_params(load_spec("Qwen/Qwen3-235B-A22B"))
    assert report.activated_params - 22_144_560_640 == 94 * (128 - 8) * 4096


def test_tied_embeddings_count_once():
    tied = count_params(load_spec("Qwen/Qwen3-0.6B"))
    assert tied.components.child("lm_head").value == 0
    assert tied.total_params == 596_049_920


@pytest.mark.parametrize("model", ["qwen3-32b", "QWEN3-32B", "Qwen/Qwen3-32B"])
def test_catalog_names_case_insensitive(model):
    assert resolve(model).name == "Qwen/Qwen3-32B"


def test_config_file_and_directory(tmp_path):
    cfg = resolve("Qwen/Qwen3-8B").config
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = count_params(load_spec(str(tmp_path))).total_params
    b = count_params(load_spec(str(tmp_path / "config.json"))).total_params
    assert a == b == 8_190_735_360


def test_every_tree_sums():
    for model in ("Qwen/Qwen3-235B-A22B", "deepseek-ai/DeepSeek-V3", "nvidia/Nemotron-H-56B-Base-8K"):
        report = count_params(load_spec(model))
        assert check_sums(report.components) == []
        assert check_sums(report.activated) == []
        assert sum(lt.params for lt in report.layer_types) + sum(
            report.components.child(c).value for c in ("embed_tokens", "pos_embed", "lm_head")
        ) + sum(t.numel for t in load_spec(model).post if t.component == "norms") == report.total_params


def test_explain_reproduces_seed_formula(capsys):
    code, out, _ = run_cli(capsys, "params", "Qwen/Qwen3-32B", "--explain")
    assert code == 0
    assert "N·(2d + 3d·d_ff + 2h·h_d·d + 2h_kv·h_d·d + 2h_d) + d(2|V|+1) = 32,762,123,264" in out
    code, out, _ = run_cli(capsys, "params", "Qwen/Qwen3-235B-A22B", "--explain")
    assert "22,144,560,640" in out and "n·d + 3·n·d·d_ff = 128·4096 + 3·128·4096·1536" in out


def test_deepseek_v3_extras_reported_not_added():
    report = count_params(load_spec("deepseek-ai/DeepSeek-V3"))
    assert report.total_params == 671_026_404_352
    extras = {e.label: e.params for e in report.extras}
    assert extras["router e_score_correction_bias"] == 58 * 256
    # checkpoint total (685B on the model card) = model + MTP layer + correction biases
    assert 684e9 < report.total_params + sum(extras.values()) < 686e9


def test_nemotron_infinity_loads():
    assert count_params(load_spec("nvidia/Nemotron-H-56B-Base-8K")).total_params == 56_324_350_464


BAD = [
    ("not json", "{not json", "is not valid JSON"),
    ("array", "[1, 2]", "must hold a JSON object"),
    ("no model_type", json.dumps({"hidden_size": 8}), "has no model_type"),
    ("unknown type", json.dumps({"model_type": "bert"}), "'bert' is not supported; supported: cohere"),
    ("missing keys", json.dumps({"model_type": "qwen3", "hidden_size": None, "vocab_size": None}), None),
    ("kv heads", json.dumps({"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 6}),
     "num_key_value_heads (6) must divide num_attention_heads (32)"),
    ("negative", json.dumps({"model_type": "llama", "hidden_size": -4096}),
     "hidden_size must be an integer in 1.."),
    ("absurd", json.dumps({"model_type": "llama", "num_hidden_layers": 10**15}), "num_hidden_layers must be"),
    ("top_k", json.dumps({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8}),
     "num_experts_per_tok (8) must not exceed num_local_experts (4)"),
    ("float size", json.dumps({"model_type": "llama", "hidden_size": 4096.5}), "hidden_size must be an integer"),
]


@pytest.mark.parametrize("label,text,message", BAD, ids=[b[0] for b in BAD])
def test_bad_config_one_line_exit_2(tmp_path, capsys, label, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    code, out, err = run_cli(capsys, "params", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("trainmath: error: ")
    if message:
        assert message in err


def test_every_problem_listed_together():
    from trainmath.errors import TrainmathError

    with pytest.raises(TrainmathError) as e:
        spec_from_config({"model_type": "qwen3", "num_attention_heads": 3, "num_key_value_heads": 2,
                          "hidden_size": 0, "vocab_size": None, "intermediate_size": None}, name="x", source="x")
    msg = str(e.value)
    assert "missing keys: vocab_size (null), intermediate_size (null)" in msg
    assert "num_key_value_heads (2) must divide num_attention_heads (3)" in msg
    assert "hidden_size must be an integer in 1.." in msg


def test_unknown_model_offline_says_how_to_pass_a_file(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(capsys, "params", "someorg/some-model")
    assert code == 2 and "pass the file's path" in err


def test_core_imports_without_torch_or_matplotlib():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['matplotlib'] = None; "
            "import trainmath, trainmath.params, trainmath.sources, trainmath.explain, trainmath.cli; "
            "from trainmath.cli import main; main(['params', 'Qwen/Qwen3-32B', '--json'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["total_params"] == 32_762_123_264


def test_cli_start_path_imports_no_heavy_modules():
    code = ("import sys; from trainmath.cli import main; main(['params', 'qwen3-0.6b']); "
            "heavy = [m for m in ('torch', 'matplotlib', 'rich', 'huggingface_hub', 'transformers') "
            "if m in sys.modules]; "
            "print('HEAVY', heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("HEAVY []")


@pytest.mark.parametrize("model,key,value", [
    ("microsoft/Phi-4-mini-instruct", "partial_rotary_factor", 0.75),
    ("google/gemma-2-9b", "final_logit_softcapping", 30.0),
    ("google/gemma-2-9b", "attn_logit_softcapping", 50.0),
    ("Qwen/Qwen1.5-MoE-A2.7B", "norm_topk_prob", False),
    ("Qwen/Qwen3-30B-A3B", "norm_topk_prob", True),
    ("CohereForAI/aya-23-8B", "logit_scale", 0.0625),
    ("deepseek-ai/DeepSeek-V2-Lite", "topk_method", "greedy"),
])
def test_spec_carries_config_switches(model, key, value):
    """Switches that change computation but no parameter travel with the spec (FLOPs/activations read them)."""
    assert load_spec(model).options[key] == value


def test_activations_read_switches_from_spec():
    from trainmath.memory.activations import Family, activation_bytes

    spec = load_spec("microsoft/Phi-4-mini-instruct")
    implicit = activation_bytes(spec, micro_batch=1, seq=64).total_bytes
    explicit = activation_bytes(spec, micro_batch=1, seq=64, family=Family(partial_rotary_factor=0.75)).total_bytes
    assert implicit == explicit != activation_bytes(spec, micro_batch=1, seq=64, family=Family()).total_bytes
