"""``trainmath flops``: JSON keys and exact integers, human table, one-line errors with exit code 2."""

import json

from trainmath.cli import main
from trainmath.flops import count_flops
from trainmath.sources import load_spec


def test_json_has_forward_backward_training_and_closed_form(capsys):
    assert main(["flops", "Qwen/Qwen3-32B", "--batch", "8", "--seq", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    r = count_flops(load_spec("Qwen/Qwen3-32B"), batch=8, seq=4096)
    assert out["forward_flops"] == r.forward.value
    assert out["backward_flops"] == 2 * out["forward_flops"]
    assert out["training_flops"] == out["forward_flops"] + out["backward_flops"] + out["recompute_flops"]
    assert out["training"]["per_sequence"] * 8 == out["training_flops"]
    assert out["training"]["per_token"] == out["training_flops"] / (8 * 4096)
    assert 0.9999 < out["closed_form"]["ratio_exact_over_closed"] <= 1
    assert out["tree"]["value"] == out["training_flops"]
    assert {g["name"] for g in out["layer_types"][0]["gemms"]} >= {"attention.scores", "attention.values"}


def test_human_output_and_options(capsys):
    assert main(["flops", "qwen3-0.6b", "--seq", "64", "--recompute", "selective", "--causal", "half",
                 "--gemms"]) == 0
    text = capsys.readouterr().out
    assert "attention_core" in text and "closed form 6N + attention" in text
    assert "recompute=selective" in text and "causal=half" in text
    assert "self_attn.q_proj" in text and "lm_head" in text


def test_bad_input_is_one_line_and_exit_2(capsys):
    assert main(["flops", "qwen3-0.6b", "--seq", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --seq: must be an integer in 1..1,099,511,627,776, got '0'" in err


def test_mamba_chunk_read_from_config(tmp_path, capsys):
    from trainmath.sources import catalog_entry

    cfg = dict(catalog_entry("nvidia/Nemotron-H-56B-Base-8K").config, chunk_size=256)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["flops", str(path), "--seq", "1000", "--json"]) == 0
    from_config = json.loads(capsys.readouterr().out)
    assert main(["flops", str(path), "--seq", "1000", "--json", "--mamba-chunk", "256"]) == 0
    explicit = json.loads(capsys.readouterr().out)
    assert main(["flops", str(path), "--seq", "1000", "--json", "--mamba-chunk", "128"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert from_config["forward_flops"] == explicit["forward_flops"] != other["forward_flops"]
