"""The one fit rule (``trainmath.usable``): the same usable bytes, flag and default in memory, estimate, plan,
infer, report and the web page, printed with every verdict."""

import json

import pytest

from trainmath.cli import main
from trainmath.hardware import gpu
from trainmath.usable import CUDA_CONTEXT_BYTES, MEM_UTIL_PERCENT, usable_bytes

H100 = gpu("h100")


def test_rule_pinned():
    assert MEM_UTIL_PERCENT == 95 and CUDA_CONTEXT_BYTES == 300 * 2**20
    assert usable_bytes(80 * 2**30) == 81_604_378_624 - 314_572_800 == 81_289_805_824
    assert usable_bytes(80 * 2**30, 90) == 77_309_411_328 - 314_572_800


COMMANDS = {
    "memory": ["memory", "qwen3-0.6b", "--micro-batch", "1", "--seq", "512", "--gpu", "h100", "--json"],
    "estimate": ["estimate", "qwen3-0.6b", "--gpus", "8", "--gpu", "h100", "--seq", "512", "--global-batch", "8",
                 "--json"],
    "plan": ["plan", "qwen3-0.6b", "--gpus", "8", "--gpu", "h100", "--seq", "512", "--global-batch", "8", "--top", "1",
             "--json"],
    "infer": ["infer", "qwen3-0.6b", "--batch", "1", "--context", "512", "--gpu", "h100", "--json"],
}


def _usable(name, out):
    if name == "memory":
        return out["capacity_bytes"], out["fit_rule"]
    if name == "estimate":
        return out["usable_bytes"], out["fit_rule"]
    if name == "plan":
        return out["usable_bytes"], out["fit_rule"]
    return out["fit"]["usable_bytes"], out["conventions"][-1]


@pytest.mark.parametrize("util", [None, 80])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_applies_the_same_rule(name, util, capsys):
    argv = COMMANDS[name] + ([] if util is None else ["--mem-util", str(util)])
    main(argv)
    out = json.loads(capsys.readouterr().out)
    usable, rule = _usable(name, out)
    pct = MEM_UTIL_PERCENT if util is None else util
    assert usable == 80 * 2**30 * pct // 100 - 300 * 2**20
    assert f"{pct}% (--mem-util)" in rule and f"{usable:,} bytes" in rule


def test_report_and_page_share_the_flag():
    from trainmath.report.gather import gather
    from trainmath.report.options import training_from_args
    from trainmath.serve.app import parser
    from trainmath.sources import load_spec

    args = parser().parse_args(["--micro-batch", "1", "--seq", "512", "--gpu", "h100", "--mem-util", "85"])
    setup, layout, g = training_from_args(args)
    data = gather(load_spec("qwen3-0.6b"), setup, layout, gpu=g, mem_util_percent=args.mem_util)
    assert data.fit["usable_bytes"] == usable_bytes(H100.memory_bytes, 85) == data.serving.fit.usable_bytes
    assert parser().parse_args(["--micro-batch", "1", "--seq", "8"]).mem_util == MEM_UTIL_PERCENT


@pytest.mark.parametrize("bad", ["0", "101", "nan", "-5", "95.5"])
def test_bad_mem_util_is_one_line(bad, capsys):
    assert main(COMMANDS["memory"][:-1] + ["--mem-util", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainmath: error:") and "--mem-util" in err[0]
