"""Offline, a name the catalog lacks fails in about a second with one whole line and the nearest names.

The network is genuinely unreachable where CI runs (no route to the Hub); the test holds either way, since it
asks only for one line, the suggestions and the time."""

import os
import subprocess
import sys
import time

import pytest

from trainmath.sources import nearest_in_catalog


@pytest.mark.parametrize("name, first", [("qwen3-8", "Qwen/Qwen3-8B"), ("Qwen/Qwen3-8", "Qwen/Qwen3-8B"),
                                         ("llama-3.1-8", "meta-llama/Llama-3.1-8B"),
                                         ("deepseek-v3", "deepseek-ai/DeepSeek-V3"),
                                         ("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1")])
def test_nearest_catalog_names(name, first):
    assert nearest_in_catalog(name)[0] == first


def test_no_suggestion_for_unrelated_text():
    assert nearest_in_catalog("xyzzy") == []


@pytest.mark.parametrize("offline_env", [False, True])
@pytest.mark.parametrize("name", ["qwen3-8", "Qwen/Qwen3-8", "some-org/some-model"])
def test_unknown_name_fails_fast_in_one_whole_line(name, offline_env):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    if offline_env:
        env["HF_HUB_OFFLINE"] = "1"
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "trainmath", "params", name], capture_output=True, text=True,
                         timeout=30, env=env)
    elapsed = time.monotonic() - t
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainmath: error: ") and "Retrying" not in out.stderr
    assert repr(name) in lines[0]
    if name != "some-org/some-model":
        assert "did you mean Qwen/Qwen3-8B" in lines[0]
    # whole: ends with a full stop of a clause, not cut inside a word
    assert lines[0].rstrip().endswith((")", "?", "instead"))
    assert elapsed < 5, elapsed
