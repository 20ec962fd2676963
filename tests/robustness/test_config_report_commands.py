"""Every command that reads a config says which keys came from transformers' defaults and which look like typos
(text and --json), and --strict refuses both — memory and infer as params and flops do."""

import json

import pytest

from trainmath.cli import main

ARGS = {"memory": ["--micro-batch", "1", "--seq", "128"], "infer": ["--batch", "1", "--context", "128"],
        "flops": ["--batch", "1", "--seq", "128"]}


@pytest.fixture
def typo_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3", "num_hiden_layers": 2, "hidden_size": 64,
                                "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "head_dim": 16, "vocab_size": 256}))
    return str(path)


@pytest.mark.parametrize("command", sorted(ARGS))
def test_defaults_and_typos_are_reported_and_strict_refuses(command, typo_config, capsys):
    assert main([command, typo_config, *ARGS[command], "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["config"]
    assert "num_hiden_layers" in report["unknown_keys"]
    assert "num_hidden_layers" in report["defaults_used"]
    assert main([command, typo_config, *ARGS[command]]) == 0
    assert "did you mean num_hidden_layers?" in capsys.readouterr().out
    assert main([command, typo_config, *ARGS[command], "--strict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_hiden_layers" in err[0]


@pytest.mark.parametrize("argv, flag", [(["memory", "qwen3-0.6b", "--micro-batch", "1", "--seq", "50000"], "--seq"),
                                        (["infer", "qwen3-0.6b", "--batch", "1", "--context", "50000"], "--context")])
def test_rotary_models_warn_beyond_their_positions(argv, flag, capsys):
    assert main([*argv, "--json"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert warning.startswith(f"{flag} 50000 is beyond max_position_embeddings 40960")


def test_learned_positions_refuse_longer_sequences(capsys):
    assert main(["memory", "gpt2", "--micro-batch", "1", "--seq", "4096"]) == 2
    assert "1024 learned positions" in capsys.readouterr().err
