"""The oracle: checkpoints written by transformers' own ``save_pretrained`` (tiny models on CPU, sharded, with
its index) must match the ledger exactly, tensor by tensor and in total."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from trainmath.cli import main  # noqa: E402

from .build import TINY_QWEN3  # noqa: E402
from .test_families import DEEPSEEK_V3, GPT_OSS, MIXTRAL, QWEN3_MOE  # noqa: E402

transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore")

CASES = {
    "qwen3 untied": TINY_QWEN3,
    "qwen3 tied": {**TINY_QWEN3, "tie_word_embeddings": True},
    "mixtral": MIXTRAL,
    "qwen3_moe": QWEN3_MOE,
    "deepseek_v3": DEEPSEEK_V3,
    "gpt_oss": GPT_OSS,
}


def save(config: dict, path):
    cfg = AutoConfig.for_model(config["model_type"], **{k: v for k, v in config.items() if k != "model_type"})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path, max_shard_size="100KB")
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_save_pretrained_matches_ledger(capsys, tmp_path, case):
    config = CASES[case]
    ckpt = save(config, tmp_path / "ckpt")
    assert len(list(ckpt.glob("*.safetensors"))) > 1  # sharded, with an index
    (tmp_path / "ours.json").write_text(json.dumps(config))
    code = main(["check-checkpoint", str(ckpt), "--config", str(tmp_path / "ours.json"), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0, (r["verdict"], r["missing"][:3], r["unexpected"][:3], r["shape_mismatches"][:3])
    assert r["matched"] == r["expected"] and r["checkpoint_params"] == r["ledger_params"]
    n_model = sum(p.numel() for p in AutoModelForCausalLM.from_config(
        AutoConfig.from_pretrained(ckpt)).parameters())
    assert r["ledger_params"] == n_model
    if "tied" in case:
        assert "tied" in r["lm_head"]


def test_qwen3_moe_config_as_transformers_5_writes_it(capsys, tmp_path):
    ckpt = save(QWEN3_MOE, tmp_path / "ckpt")
    assert "num_local_experts" in json.loads((ckpt / "config.json").read_text())
    code = main(["check-checkpoint", str(ckpt), "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0, r["verdict"]
