"""check-checkpoint on small safetensors files built here: exact match, each kind of mismatch, bad input, and
the guarantee that only headers are read."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from trainmath import checkpoint as ck
from trainmath.cli import main
from trainmath.params import count_params
from trainmath.sources import load_spec

from .build import TINY_QWEN3, ledger_shapes, write_checkpoint, write_raw

Q32 = 32_762_123_264  # Qwen3-32B: model.safetensors.index.json total_size / 2 (bf16)
Q235 = 235_093_634_560  # Qwen3-235B-A22B, likewise


def run(capsys, *argv):
    code = main(["check-checkpoint", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    return code, json.loads(out)


def tiny_ledger(config=TINY_QWEN3) -> int:
    from trainmath.families import spec_from_config

    return count_params(spec_from_config(config, name="t", source="t")).total_params


@pytest.fixture
def good(tmp_path):
    return write_checkpoint(tmp_path / "ckpt", TINY_QWEN3)


@pytest.mark.parametrize("which", ["dir", "index", "shards"])
def test_exact_match(capsys, good, which):
    paths = {"dir": [good], "index": [good / "model.safetensors.index.json"],
             "shards": sorted(good.glob("*.safetensors"))}[which]
    code, r = run_json(capsys, *paths)
    assert code == 0 and r["ok"] and r["verdict"] == "match"
    assert r["matched"] == r["expected"] == 25  # 2 + 2 layers × 11 + 1 (embed, norm, lm_head untied)
    assert r["checkpoint_params"] == r["ledger_params"] == tiny_ledger() == 90_496
    assert r["params_difference"] == 0 and r["shapes_checked"]
    assert r["missing"] == r["unexpected"] == r["shape_mismatches"] == r["quantised"] == []
    assert r["config"].endswith("config.json")


def test_human_output_lists_verdict(capsys, good):
    code, out, _ = run(capsys, good)
    assert code == 0
    assert "25 of 25 expected match by name and shape" in out
    assert "verdict     MATCH" in out and "untied" in out


def test_missing_tensor(capsys, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    d = write_checkpoint(tmp_path, TINY_QWEN3, drop=[name])
    code, r = run_json(capsys, d)
    assert code == 1 and not r["ok"]
    assert r["missing"] == [name] and r["matched"] == 24
    assert r["params_difference"] == -128 * 64
    code, out, _ = run(capsys, d)
    assert "missing in checkpoint (1):" in out and name in out


def test_unexpected_tensor(capsys, tmp_path):
    d = write_checkpoint(tmp_path, TINY_QWEN3, add={"model.layers.0.self_attn.rotary_emb.inv_freq": (8,)})
    code, r = run_json(capsys, d)
    assert code == 1
    assert r["unexpected"] == [{"name": "model.layers.0.self_attn.rotary_emb.inv_freq", "dtype": "F16",
                                "shape": [8]}]
    assert r["missing"] == [] and r["params_difference"] == 8


def test_wrong_shape(capsys, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    d = write_checkpoint(tmp_path, TINY_QWEN3, reshape={name: (64, 64)})
    code, r = run_json(capsys, d)
    assert code == 1
    assert r["shape_mismatches"] == [{"name": name, "expected": [32, 64], "found": [64, 64], "dtype": "F16"}]
    assert r["params_difference"] == 32 * 64
    code, out, _ = run(capsys, d)
    assert "(32, 64)  (64, 64)" in out


@pytest.mark.parametrize("stored", [False, True])
def test_tied_lm_head_stored_or_not(capsys, tmp_path, stored):
    cfg = {**TINY_QWEN3, "tie_word_embeddings": True}
    shapes = ledger_shapes(cfg, include_tied=stored)
    d = write_checkpoint(tmp_path, cfg, shapes=shapes)
    code, r = run_json(capsys, d)
    assert code == 0, r["verdict"]
    assert r["checkpoint_params"] == r["ledger_params"] == tiny_ledger(cfg) == 90_496 - 128 * 64
    assert r["expected"] == r["matched"] == 24
    assert ("stored in the checkpoint as a copy" in r["lm_head"]) == stored
    assert ("not stored" in r["lm_head"]) == (not stored)


def test_untied_config_against_tied_checkpoint(capsys, tmp_path):
    """A checkpoint saved tied (no lm_head) checked against an untied config: lm_head is missing."""
    d = write_checkpoint(tmp_path, TINY_QWEN3, drop=["lm_head.weight"])
    code, r = run_json(capsys, d)
    assert code == 1 and r["missing"] == ["lm_head.weight"]


def test_index_only_total_size(capsys, tmp_path, good):
    """The index alone (no shards beside it): names compared, parameters = total_size ÷ dtype bytes."""
    idx = json.loads((good / "model.safetensors.index.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(idx))
    code, r = run_json(capsys, tmp_path / "model.safetensors.index.json", "--config", good, "--dtype", "fp16")
    assert code == 0, r["verdict"]
    assert not r["shapes_checked"] and "--dtype fp16" in r["params_from"]
    assert r["checkpoint_params"] == 90_496
    code, r = run_json(capsys, tmp_path / "model.safetensors.index.json", "--config", good, "--dtype", "fp32")
    assert code == 1 and r["params_difference"] == 90_496 // 2 - 90_496


def _ledger_index(model: str, total_size: int) -> dict:
    from trainmath.model.spec import named_tensors

    spec = load_spec(model)
    names = [n for n, _, _ in named_tensors(spec)]
    return {"metadata": {"total_size": total_size},
            "weight_map": {n: f"model-{i % 17 + 1:05d}-of-00017.safetensors" for i, n in enumerate(names)}}


@pytest.mark.parametrize("model,params", [("Qwen/Qwen3-32B", Q32), ("Qwen/Qwen3-235B-A22B", Q235)])
def test_real_index_total_size(capsys, tmp_path, model, params):
    """An index with the real checkpoint's total_size (bf16 bytes) matches the catalog's ledger exactly."""
    p = tmp_path / "model.safetensors.index.json"
    p.write_text(json.dumps(_ledger_index(model, 2 * params)))
    code, r = run_json(capsys, p, "--config", model)
    assert code == 0, r["verdict"]
    assert r["checkpoint_params"] == r["ledger_params"] == params
    assert r["index_total_size"] == 2 * params and r["missing"] == []
    p.write_text(json.dumps(_ledger_index(model, 2 * params + 2 * 5120)))  # one d-vector too many
    code, r = run_json(capsys, p, "--config", model)
    assert code == 1 and r["params_difference"] == 5120


def test_index_total_size_disagrees_with_headers(capsys, good):
    p = good / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    idx["metadata"]["total_size"] += 2
    p.write_text(json.dumps(idx))
    code, r = run_json(capsys, good)
    assert code == 1 and any("total_size" in x for x in r["problems"])


def test_index_maps_tensor_to_wrong_shard(capsys, good):
    p = good / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    idx["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors"
    p.write_text(json.dumps(idx))
    code, r = run_json(capsys, good)
    assert code == 1 and any("model.norm.weight" in x for x in r["problems"])


# ---- bad input: one line on stderr, exit 2, no traceback ----------------------------------------------------

def _bad_inputs(tmp_path, good):
    st = good / "model-00001-of-00002.safetensors"
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(st.read_bytes()[:20])  # header length says more than the file holds
    notjson = tmp_path / "notjson.safetensors"
    notjson.write_bytes((9).to_bytes(8, "little") + b"{not json")
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"abc")
    badoff = tmp_path / "badoff.safetensors"
    write_raw(badoff, {"model.norm.weight": ("BF16", (64,), 100)})
    idx = tmp_path / "bad.index.json"
    idx.write_text("this is not json")
    noweights = tmp_path / "nomap.index.json"
    noweights.write_text(json.dumps({"metadata": {}}))
    empty = tmp_path / "empty"
    empty.mkdir()
    partial = tmp_path / "partial"
    write_checkpoint(partial, TINY_QWEN3)
    (partial / "model-00002-of-00002.safetensors").unlink()
    return {
        "truncated header": ([cut, "--config", good], "header length"),
        "header not JSON": ([notjson, "--config", good], "not valid UTF-8 JSON"),
        "shorter than 8 bytes": ([tiny, "--config", good], "shorter than the 8-byte"),
        "offsets disagree with shape": ([badoff, "--config", good], "needs 128"),
        "index not JSON": ([idx, "--config", good], "not a JSON index"),
        "index without weight_map": ([noweights, "--config", good], "no weight_map"),
        "config passed as index": ([good / "config.json"], "pass it with --config"),
        "missing file": ([tmp_path / "nope.safetensors", "--config", good], "no such file"),
        "empty directory": ([empty, "--config", good], "holds no"),
        "shard missing beside index": ([partial], "1 of 2 shard files are missing"),
        "no config": ([st.rename(tmp_path / "alone.safetensors")], "pass --config"),
        "bad --config": ([partial / "model-00001-of-00002.safetensors", "--config", tmp_path / "x.json"],
                         "not a file"),
    }


BAD = ["truncated header", "header not JSON", "shorter than 8 bytes", "offsets disagree with shape",
       "index not JSON", "index without weight_map", "config passed as index", "missing file", "empty directory",
       "shard missing beside index", "no config", "bad --config"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_one_line_exit_2(capsys, tmp_path, case):
    good = write_checkpoint(tmp_path / "good", TINY_QWEN3)
    argv, needle = _bad_inputs(tmp_path, good)[case]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("trainmath: error: ") and "Traceback" not in err
    assert needle in err


def test_bad_dtype_with_index_only(capsys, tmp_path, good):
    (tmp_path / "i.json").write_text((good / "model.safetensors.index.json").read_text())
    code, _, err = run(capsys, tmp_path / "i.json", "--config", good, "--dtype", "F4")
    assert code == 2 and "whole-byte" in err


def test_hub_id_offline_is_one_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run(capsys, "some-org/some-model")
    assert code == 2 and "pass their paths" in err and err.count("\n") == 1


def test_subprocess_exit_codes(tmp_path):
    """The installed entry point: exit 0 / 1 / 2 and no traceback."""
    good = write_checkpoint(tmp_path / "g", TINY_QWEN3)
    bad = write_checkpoint(tmp_path / "b", TINY_QWEN3, drop=["model.norm.weight"])
    (tmp_path / "x.safetensors").write_bytes(b"\xff" * 16)

    def cli(*a):
        return subprocess.run([sys.executable, "-m", "trainmath", "check-checkpoint", *map(str, a)],
                              capture_output=True, text=True, timeout=60)
    assert cli(good).returncode == 0
    assert cli(bad).returncode == 1
    p = cli(tmp_path / "x.safetensors", "--config", good)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1


# ---- headers only ---------------------------------------------------------------------------------------------

def test_header_read_when_data_is_cut_off(capsys, tmp_path):
    """A file cut right after its header still has every tensor read (shapes match); the cut is reported."""
    shapes = ledger_shapes(TINY_QWEN3)
    n = write_raw(tmp_path / "model.safetensors", {k: ("BF16", s, 2 * int(np.prod(s))) for k, s in shapes.items()},
                  data=b"")
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    code, r = run_json(capsys, tmp_path)
    assert r["matched"] == r["expected"] == 25 and r["checkpoint_params"] == r["ledger_params"] == 90_496
    assert r["params_by_dtype"] == {"BF16": 90_496}
    assert code == 1 and r["problems"] == [
        f"model.safetensors is truncated: its header needs {8 + n + 2 * 90_496:,} bytes, the file has {8 + n:,}"]


def test_reads_only_header_bytes(monkeypatch, tmp_path):
    """Count the bytes read: exactly 8 + N per file, however large the data region."""
    shapes = ledger_shapes(TINY_QWEN3)
    big = {n: ("F32", s, 4 * int(np.prod(s))) for n, s in shapes.items()}
    n = write_raw(tmp_path / "model.safetensors", big, pad=5)
    size = (tmp_path / "model.safetensors").stat().st_size
    read = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def read(self, k=-1):
            if k is None or k < 0:
                raise AssertionError("read() without a size would read tensor data")
            b = self.f.read(k)
            read.append(len(b))
            return b

    monkeypatch.setattr(ck, "open", lambda *a, **kw: Counting(real_open(*a, **kw)), raising=False)
    tensors, meta, problems = ck.read_header(tmp_path / "model.safetensors")
    assert sum(read) == 8 + n and size > 100 * (8 + n) // 10  # data is most of the file
    assert len(tensors) == 25 and problems == [] and meta == {}
    assert tensors["model.embed_tokens.weight"].nbytes == 4 * 128 * 64


def test_sub_byte_and_all_dtypes_sizes(tmp_path):
    """data_offsets must equal ceil(numel × bits / 8) for every dtype, sub-byte ones included."""
    for dtype, bits in ck.DTYPE_BITS.items():
        write_raw(tmp_path / "a.safetensors", {"x": (dtype, (3, 5), -(-15 * bits // 8))})
        (t,) = ck.read_header(tmp_path / "a.safetensors")[0].values()
        assert t.dtype == dtype and t.numel == 15


@pytest.mark.parametrize("stored", [False, True])
def test_index_only_tied_lm_head(capsys, tmp_path, stored):
    """Index alone: a stored copy of a tied lm_head is in total_size but not in the count."""
    cfg = {**TINY_QWEN3, "tie_word_embeddings": True}
    d = write_checkpoint(tmp_path / "full", cfg, shapes=ledger_shapes(cfg, include_tied=stored))
    (tmp_path / "model.safetensors.index.json").write_text((d / "model.safetensors.index.json").read_text())
    code, r = run_json(capsys, tmp_path / "model.safetensors.index.json", "--config", d, "--dtype", "F16")
    assert code == 0, r["verdict"]
    assert r["checkpoint_params"] == r["ledger_params"] == 90_496 - 128 * 64
    assert r["index_total_size"] == 2 * (90_496 - 128 * 64 * (not stored))


def test_stdlib_only():
    """The reader and the CLI module import neither torch, numpy, safetensors nor huggingface_hub."""
    code = ("import sys\nfor m in ('torch', 'numpy', 'safetensors', 'huggingface_hub'): sys.modules[m] = None\n"
            "import trainmath.checkpoint, trainmath.cli.check_checkpoint")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
