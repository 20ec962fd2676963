"""Hostile values for the newest flags (PEFT, offload, host memory, deadline, kernels), run in-process: every call
exits 0 or 2, and a failure is one line ``trainmath: error: ...`` on stderr with no traceback."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmath.cli import main

pytestmark = pytest.mark.timeout(60)

EST = ["estimate", "Qwen/Qwen3-0.6B", "--gpus", "8", "--gpu", "h100", "--seq", "1024", "--global-batch", "8"]
MEM = ["memory", "Qwen/Qwen3-0.6B", "--micro-batch", "1", "--seq", "1024", "--gpu", "h100"]
FLAGS = ["--lora-rank", "--lora-alpha", "--host-memory", "--mem-util", "--deadline", "--tokens", "--offload",
         "--flash-kernel", "--peft", "--lora-targets"]
VALUES = ["nan", "inf", "-inf", "-0", "0", "-1", "1e400", "9" * 30, "", "\u00e9\u4e2d", "0x10", "1_0", " 1"]


def run(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert rc in (0, 2, None), (argv, rc, err)
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("trainmath: error:"), (argv, err)
    return rc


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from([EST, MEM]), flag=st.sampled_from(FLAGS), value=st.sampled_from(VALUES))
def test_hostile_value(base, flag, value, capsys):
    extra = ["--peft", "lora"] if flag.startswith("--lora") else []
    run([*base, *extra, flag, value], capsys)

