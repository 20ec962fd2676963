"""Issue 8's bad-input corpus through the real CLI: one ``trainmath: error:`` line naming the value, exit 2
(1 for a checkpoint that does not match), no traceback, no output file left behind, within a few seconds.

Cases run in-process (``trainmath.cli.main``, stdout and stderr captured), which keeps ~200 cases to seconds;
what needs a real process (a FIFO that would hang, torch blocked, signals) is in ``test_processes.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import time

import pytest

from trainmath.cli import main

from .corpus import CHECKPOINTS, CLI_CASES, CONFIGS, NEEDLES, _config_cases

pytestmark = pytest.mark.timeout(60)

CASES = _config_cases() + CLI_CASES
_PLACEHOLDER = re.compile(r"\{(cfg|ckpt):([a-z0-9_.\-]+)\}")


def _materialise(argv: list[str], tmp) -> list[str]:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    (out / "dir.png").mkdir(exist_ok=True)
    (out / "file").write_text("a file, not a directory")

    def fill(arg: str) -> str:
        m = _PLACEHOLDER.fullmatch(arg)
        if m and m.group(1) == "cfg":
            body = CONFIGS[m.group(2)]
            path = tmp / f"{m.group(2)}.json"
            path.write_text(body if isinstance(body, str) else json.dumps(body))
            return str(path)
        if m:
            folder = tmp / f"ckpt-{m.group(2)}"
            folder.mkdir(exist_ok=True)
            for name, data in CHECKPOINTS[m.group(2)].items():
                (folder / name).write_bytes(data)
            return str(folder)
        return arg.replace("{out}", str(out))

    return [fill(a) for a in argv]


def _files(folder) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs}


def test_corpus_is_large():
    assert len(CASES) >= 200
    assert len({c[0] for c in CASES}) == len(CASES)  # ids are unique


@pytest.mark.parametrize("case_id, argv, code, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(case_id, argv, code, needle, tmp_path):
    argv = _materialise(argv, tmp_path)
    before = _files(tmp_path)
    out, err = io.StringIO(), io.StringIO()
    t = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        got = main(argv)  # an uncaught exception (a traceback for a user) fails the test here
    elapsed = time.monotonic() - t
    errors = [line for line in err.getvalue().splitlines() if line.startswith("trainmath: error:")]
    if code == 1:  # a checkpoint that does not match: a report, no error
        assert got == 1 and errors == [] and "MISMATCH" in out.getvalue().upper()
    else:
        assert got == code, (got, out.getvalue()[-500:], err.getvalue()[-500:])
        assert len(errors) == 1, err.getvalue()
        assert len(errors[0]) < 2000
        assert out.getvalue() == ""
        needle = needle or NEEDLES.get(case_id, "")
        assert needle in errors[0], errors[0]
    assert "Traceback" not in err.getvalue()
    assert _files(tmp_path) == before  # nothing written, not even half-way
    assert elapsed < 5, elapsed


@pytest.mark.parametrize("repo", ["nvidia/Nemotron-H-56B-Base-8K"])
def test_published_infinity_still_loads(repo, capsys):
    # Nemotron-H's config.json holds the literal Infinity (time_step_limit) as published: not an integer field
    from trainmath.sources import catalog_entry

    assert math.isinf(catalog_entry(repo).config["time_step_limit"][1])
    assert main(["params", repo]) == 0
    assert main(["flops", repo, "--seq", "256"]) == 0
    assert "trainmath: error" not in capsys.readouterr().err


def test_a_typo_is_a_warning_without_strict(tmp_path, capsys):
    argv = _materialise(["params", "{cfg:typo}"], tmp_path)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "warning: unknown config key num_hiden_layers: did you mean num_hidden_layers?" in out
    assert "num_hidden_layers=32" in out  # Qwen3Config's default: the silent change the warning explains


def test_rope_model_beyond_its_positions_warns(capsys):
    assert main(["flops", "qwen3-0.6b", "--seq", "65536"]) == 0
    out = capsys.readouterr().out
    assert "warning: --seq 65536 is beyond max_position_embeddings 40960" in out
    assert main(["flops", "qwen3-0.6b", "--seq", "65536", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"][0].startswith("--seq 65536 is beyond")


def test_an_unused_window_of_zero_is_accepted(tmp_path, capsys):
    # transformers' own Qwen2MoeConfig writes sliding_window 0 when use_sliding_window is false: not an error
    from .corpus import QWEN3_MOE

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_MOE, "model_type": "qwen2_moe", "use_sliding_window": False,
                                "sliding_window": 0, "shared_expert_intermediate_size": 0}))
    assert main(["params", str(path)]) == 0
    assert "trainmath: error" not in capsys.readouterr().err
