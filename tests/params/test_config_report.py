"""How a config was read: keys taken from transformers' defaults, keys one edit from a known one, --strict."""

import json

import pytest

from trainmath.cli import main
from trainmath.model.config import _one_edit, known_keys, suspect_keys
from trainmath.sources import catalog_entry, catalog_index, load_spec


@pytest.mark.parametrize("repo", sorted(catalog_index()))
def test_catalog_configs_raise_no_false_typo_warning(repo):
    spec = load_spec(repo)
    assert spec.config_report.suspects == {}
    # every default named is one the config lacks
    assert not set(spec.config_report.defaulted) & set(catalog_entry(repo).config)


def test_catalog_count_is_41():
    assert len(catalog_index()) == 41


@pytest.mark.parametrize("a, b, near", [
    ("num_hiden_layers", "num_hidden_layers", True),   # deletion
    ("num_hidden_layerss", "num_hidden_layers", True),  # insertion
    ("num_hidden_layars", "num_hidden_layers", True),   # substitution
    ("num_hidden_lyaers", "num_hidden_layers", True),   # adjacent swap
    ("num_hidden_layers", "num_hidden_layers", False),  # equal
    ("num_hiden_layer", "num_hidden_layers", False),    # two edits
])
def test_one_edit(a, b, near):
    assert _one_edit(a, b) is near and _one_edit(b, a) is near


def _typo_config(tmp_path):
    cfg = dict(catalog_entry("meta-llama/Llama-3.1-70B").config)
    cfg["num_hiden_layers"] = cfg.pop("num_hidden_layers")
    cfg["intermediat_size"] = cfg.pop("intermediate_size")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_typos_are_named_and_the_defaults_they_caused(tmp_path, capsys):
    path = _typo_config(tmp_path)
    spec = load_spec(str(path))
    assert spec.config_report.suspects == {"num_hiden_layers": "num_hidden_layers",
                                           "intermediat_size": "intermediate_size"}
    # transformers' LlamaConfig defaults: 32 layers, 11008 wide — the silent 15.6 B of the issue
    assert spec.config_report.defaulted == {"num_hidden_layers": 32, "intermediate_size": 11008}
    assert spec.num_layers == 32
    assert main(["params", str(path)]) == 0
    out = capsys.readouterr().out
    assert "num_hiden_layers: did you mean num_hidden_layers?" in out
    assert "num_hidden_layers=32, intermediate_size=11008" in out
    assert main(["params", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["config"]
    assert got == {"defaults_used": {"num_hidden_layers": 32, "intermediate_size": 11008},
                   "unknown_keys": {"num_hiden_layers": "num_hidden_layers", "intermediat_size": "intermediate_size"}}


@pytest.mark.parametrize("command", [["params"], ["flops", "--seq", "16"], ["check-checkpoint", "--config"]])
def test_strict_refuses_typos_and_defaults(tmp_path, capsys, command):
    path = _typo_config(tmp_path)
    argv = [command[0], *(command[1:] if command[0] != "check-checkpoint" else [str(tmp_path), "--config"]),
            str(path), "--strict"]
    if command[0] == "check-checkpoint":
        (tmp_path / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trainmath: error: ")
    assert "unknown key num_hiden_layers (did you mean num_hidden_layers?)" in err
    assert "num_hidden_layers, intermediate_size" in err


def test_strict_accepts_a_complete_config(capsys):
    assert main(["params", "qwen3-8b", "--strict", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == {"defaults_used": {}, "unknown_keys": {}}


def test_strict_names_a_default_taken(capsys):
    assert main(["params", "meta-llama/Llama-2-7b-hf", "--strict"]) == 2
    assert "mlp_bias, attention_bias" in capsys.readouterr().err


def test_keys_of_other_families_are_not_typos():
    # n_group is DeepSeek's, n_groups Nemotron-H's: one edit apart, both real
    assert {"n_group", "n_groups"} <= known_keys("llama")
    assert suspect_keys({"n_group": 8, "n_groups": 8, "hidden_sise": 1}, "llama") == {"hidden_sise": "hidden_size"}
