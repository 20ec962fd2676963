"""check-checkpoint beyond dense models: routed experts, DeepSeek-V3's extras (MTP layer, correction bias),
and quantised storage (gpt-oss MXFP4 blocks/scales, FP8 with weight_scale_inv)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trainmath.cli import main

from .build import TINY_QWEN3, ledger_shapes, write_checkpoint, write_raw

BASE = {k: TINY_QWEN3[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
                                   "rms_norm_eps")}
QWEN3_MOE = {**BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "tie_word_embeddings": False}
MIXTRAL = {**BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": 4,
           "num_experts_per_tok": 2, "tie_word_embeddings": False}
DEEPSEEK_V3 = {**BASE, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
               "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
               "first_k_dense_replace": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
               "qk_rope_head_dim": 8, "v_head_dim": 16, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
               "num_nextn_predict_layers": 1, "tie_word_embeddings": False}
GPT_OSS = {**BASE, "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": 4,
           "num_experts_per_tok": 2, "sliding_window": 16, "attention_bias": True, "tie_word_embeddings": False,
           "layer_types": ["sliding_attention", "full_attention"]}


def run_json(capsys, *argv):
    code = main(["check-checkpoint", *map(str, argv), "--json"])
    out, err = capsys.readouterr()
    assert err == ""
    return code, json.loads(out)


@pytest.mark.parametrize("config,expert_name", [
    (QWEN3_MOE, "model.layers.1.mlp.experts.3.down_proj.weight"),
    (MIXTRAL, "model.layers.1.block_sparse_moe.experts.3.w2.weight"),
])
def test_moe_exact_and_missing_expert(capsys, tmp_path, config, expert_name):
    code, r = run_json(capsys, write_checkpoint(tmp_path / "a", config, shards=3))
    assert code == 0, r["verdict"]
    assert r["checkpoint_params"] == r["ledger_params"] and r["matched"] == r["expected"]
    assert expert_name in ledger_shapes(config)
    code, r = run_json(capsys, write_checkpoint(tmp_path / "b", config, drop=[expert_name]))
    assert code == 1 and r["missing"] == [expert_name]


def test_deepseek_extras_reported_apart(capsys, tmp_path):
    """MTP layer 2 and the correction biases are matched in their own section, never in the total."""
    all_shapes = ledger_shapes(DEEPSEEK_V3, include_extras=True)
    main_shapes = ledger_shapes(DEEPSEEK_V3)
    extra = {n: s for n, s in all_shapes.items() if n not in main_shapes}
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in extra
    assert "model.layers.2.eh_proj.weight" in extra and "model.layers.2.mlp.experts.3.up_proj.weight" in extra

    code, r = run_json(capsys, write_checkpoint(tmp_path / "full", DEEPSEEK_V3, shapes=all_shapes))
    assert code == 0, r["verdict"]
    assert r["checkpoint_params"] == r["ledger_params"]  # extras not added
    assert r["unexpected"] == []
    groups = {e["label"]: e for e in r["extras"]}
    assert all(e["found"] == e["expected"] and e["params_found"] == e["params_expected"] for e in groups.values())
    assert sum(e["params_found"] for e in groups.values()) == sum(int(np.prod(s)) for s in extra.values())

    # as transformers saves it: biases kept, MTP layer dropped: still a match
    no_mtp = {n: s for n, s in all_shapes.items() if not n.startswith("model.layers.2.")}
    code, r = run_json(capsys, write_checkpoint(tmp_path / "nomtp", DEEPSEEK_V3, shapes=no_mtp))
    assert code == 0, r["verdict"]

    # half an MTP layer: a mismatch in the extras section only
    half = dict(no_mtp, **{"model.layers.2.eh_proj.weight": extra["model.layers.2.eh_proj.weight"]})
    code, r = run_json(capsys, write_checkpoint(tmp_path / "half", DEEPSEEK_V3, shapes=half))
    assert code == 1 and "extras groups incomplete" in r["verdict"]
    assert r["missing"] == [] and r["unexpected"] == [] and r["params_difference"] == 0


def test_gpt_oss_mxfp4_is_stored_quantised(capsys, tmp_path):
    """gpt-oss ships experts as MXFP4 *_blocks (U8, two 4-bit values per byte, 32 per block) + *_scales (U8)."""
    shapes = ledger_shapes(GPT_OSS)
    header = {}
    n_exp, d, f = 4, 64, 128
    quant = {"gate_up_proj": (n_exp, 2 * f, d), "down_proj": (n_exp, d, f)}  # (experts, out, in)
    for name, s in shapes.items():
        base = name.rsplit(".", 1)[-1]
        if base in quant:
            e, out, inp = quant[base]
            header[name + "_blocks"] = ("U8", (e, out, inp // 32, 16), e * out * inp // 2)
            header[name + "_scales"] = ("U8", (e, out, inp // 32), e * out * inp // 32)
        else:
            header[name] = ("BF16", s, 2 * int(np.prod(s)))
    write_raw(tmp_path / "model.safetensors", header)
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS))
    code, r = run_json(capsys, tmp_path)
    assert code == 1 and "4 stored quantised" in r["verdict"]
    assert r["missing"] == r["unexpected"] == r["shape_mismatches"] == []
    by_name = {q["name"]: q for q in r["quantised"]}
    gu = by_name["model.layers.0.mlp.experts.gate_up_proj"]
    assert gu["expected"] == [n_exp, d, 2 * f] and gu["logical_params"] == n_exp * d * 2 * f
    assert [s["name"].rsplit(".", 1)[-1] for s in gu["stored"]] == ["gate_up_proj_blocks", "gate_up_proj_scales"]
    left_out = 2 * (n_exp * d * 2 * f + n_exp * f * d)
    assert r["quantised_left_out_params"] == left_out
    assert r["checkpoint_params"] == r["compared_ledger_params"] == r["ledger_params"] - left_out


def test_fp8_weights_with_scales(capsys, tmp_path):
    """DeepSeek-V3-style FP8: F8_E4M3 weights of the right shape + F32 weight_scale_inv per 128×128 block.
    Names and shapes match; the scales are listed as quantised storage and not counted."""
    shapes = ledger_shapes(TINY_QWEN3)
    header = {}
    for name, s in shapes.items():
        if name.endswith("proj.weight"):
            header[name] = ("F8_E4M3", s, int(np.prod(s)))
            header[name[:-len("weight")] + "weight_scale_inv"] = ("F32", (1, 1), 4)
        else:
            header[name] = ("BF16", s, 2 * int(np.prod(s)))
    write_raw(tmp_path / "model.safetensors", header)
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    code, r = run_json(capsys, tmp_path)
    assert code == 1 and len(r["quantised"]) == 2 * 7  # q k v o gate up down per layer
    assert r["missing"] == r["unexpected"] == r["shape_mismatches"] == []
    assert r["checkpoint_params"] == r["ledger_params"] and r["quantised_left_out_params"] == 0
    assert r["params_by_dtype"]["F32"] == 14


def test_fp8_extras_are_listed_as_quantised(capsys, tmp_path):
    """An FP8 DeepSeek-V3 checkpoint quantises the MTP layer too: its scales are listed, labelled as extras."""
    shapes = ledger_shapes(DEEPSEEK_V3, include_extras=True)
    header = {n: ("BF16", s, 2 * int(np.prod(s))) for n, s in shapes.items()}
    name = "model.layers.2.eh_proj.weight"
    header[name] = ("F8_E4M3", shapes[name], int(np.prod(shapes[name])))
    header["model.layers.2.eh_proj.weight_scale_inv"] = ("F32", (1, 1), 4)
    write_raw(tmp_path / "model.safetensors", header)
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    code, r = run_json(capsys, tmp_path)
    assert code == 1 and r["unexpected"] == []
    (q,) = r["quantised"]
    assert q["name"] == name and q["extras"].startswith("multi-token prediction")
    assert [s["dtype"] for s in q["stored"]] == ["F8_E4M3", "F32"]
    assert r["checkpoint_params"] == r["ledger_params"]
