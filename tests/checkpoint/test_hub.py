"""Hub ids: headers come from huggingface_hub.get_safetensors_metadata (faked here: tests never go online)."""

from __future__ import annotations

import json

import pytest

hub = pytest.importorskip("huggingface_hub")
from huggingface_hub.utils._safetensors import (  # noqa: E402
    SafetensorsFileMetadata,
    SafetensorsRepoMetadata,
    TensorInfo,
)

from trainmath.cli import main  # noqa: E402
from trainmath.model.spec import named_tensors  # noqa: E402
from trainmath.params import count_params  # noqa: E402
from trainmath.sources import load_spec  # noqa: E402


def fake_metadata(model: str, shards: int = 3) -> SafetensorsRepoMetadata:
    """What the Hub would answer for a bf16 checkpoint holding exactly the ledger's tensors."""
    files: dict[str, dict] = {}
    offsets: dict[str, int] = {}
    for i, (name, shape, _) in enumerate(named_tensors(load_spec(model))):
        fname = f"model-{i % shards + 1:05d}-of-{shards:05d}.safetensors"
        n = 2
        for s in shape:
            n *= s
        start = offsets.get(fname, 0)
        files.setdefault(fname, {})[name] = TensorInfo(dtype="BF16", shape=list(shape),
                                                       data_offsets=(start, start + n))
        offsets[fname] = start + n
    fm = {f: SafetensorsFileMetadata(metadata={"format": "pt"}, tensors=t) for f, t in files.items()}
    return SafetensorsRepoMetadata(metadata={"total_size": sum(offsets.values())}, sharded=True,
                                   weight_map={n: f for f, t in files.items() for n in t}, files_metadata=fm)


def test_hub_headers_match_catalog_ledger(capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("trainmath.sources.hub_reachable", lambda *a, **k: True)  # the fake answers instead
    monkeypatch.setattr(hub, "get_safetensors_metadata", lambda repo_id, **kw: fake_metadata(repo_id))
    code = main(["check-checkpoint", "Qwen/Qwen3-0.6B", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert code == 0, r["verdict"]
    assert r["config"] == "Qwen/Qwen3-0.6B" and r["checkpoint"] == "hub:Qwen/Qwen3-0.6B"
    assert r["checkpoint_params"] == r["ledger_params"] == 596_049_920
    assert r["index_total_size"] == 2 * 596_049_920 and "not stored" in r["lm_head"]
    assert r["ledger_params"] == count_params(load_spec("Qwen/Qwen3-0.6B")).total_params


def test_hub_unreachable_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("trainmath.sources.hub_reachable", lambda *a, **k: True)  # the fake answers instead

    def boom(repo_id, **kw):
        raise ConnectionError("Failed to resolve 'huggingface.co'\nmore detail")
    monkeypatch.setattr(hub, "get_safetensors_metadata", boom)
    code = main(["check-checkpoint", "some-org/some-model"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "ConnectionError: Failed to resolve" in err and "pass their paths" in err
