"""``--peft`` on ``trainmath report`` and the web page: the adapters are ``trainmath params --peft``'s (which
tests/params/test_peft_oracle.py checks against peft), the same flags, the same one-line errors."""

import json
import re

import pytest

from trainmath.cli import main
from trainmath.serve.app import calc

PEFT = {"peft": "lora", "lora-rank": "16", "lora-targets": "all-linear"}
FIELDS = {"model": "meta-llama/Llama-3.1-8B", "micro-batch": "1", "seq": "4096", "gpu": "rtx-4090", **PEFT}


def _params(capsys) -> dict:
    capsys.readouterr()
    assert main(["params", "meta-llama/Llama-3.1-8B", "--json", *[x for k, v in PEFT.items()
                                                                  for x in (f"--{k}", v)]]) == 0
    return json.loads(capsys.readouterr().out)


def test_page_shows_the_adapters_of_params(capsys):
    out = calc(FIELDS)
    assert out["ok"], out.get("error")
    want = _params(capsys)
    got = out["summary"]["peft"]
    assert {k: got[k] for k in ("trainable_params", "adapter_params", "total_params")} == {
        k: want[k] for k in ("trainable_params", "adapter_params", "total_params")}
    assert got["trainable_params"] == 41_943_040
    from trainmath.report.peft import FINE_TUNE_NOTE

    assert got["memory_note"] == FINE_TUNE_NOTE or "full training's" in got["memory_note"]


def test_page_flops_are_flops_peft(capsys):
    """The page's training FLOPs are ``trainmath flops --peft``'s for the same micro-batch, not full training's."""
    out = calc(FIELDS)
    assert out["ok"], out.get("error")
    capsys.readouterr()
    assert main(["flops", FIELDS["model"], "--batch", "1", "--seq", "4096", "--json",
                 *[x for k, v in PEFT.items() for x in (f"--{k}", v)]]) == 0
    want = json.loads(capsys.readouterr().out)["training"]["per_step"]
    assert out["summary"]["training_flops"] == want
    capsys.readouterr()
    assert main(["flops", FIELDS["model"], "--batch", "1", "--seq", "4096", "--json"]) == 0
    assert want < json.loads(capsys.readouterr().out)["training"]["per_step"]


def test_full_training_has_no_peft_part():
    out = calc({k: v for k, v in FIELDS.items() if k not in PEFT})
    assert out["ok"] and out["summary"]["peft"] is None


def test_report_section_equals_params(capsys, tmp_path):
    want = _params(capsys)
    path = tmp_path / "r.html"
    argv = ["report", "meta-llama/Llama-3.1-8B", "--micro-batch", "1", "--seq", "4096", "-o", str(path)]
    assert main([*argv, *[x for k, v in PEFT.items() for x in (f"--{k}", v)]]) == 0
    html = path.read_text()
    shown = re.search(r'id="trainable-params">([0-9,]+)<', html).group(1)
    assert int(shown.replace(",", "")) == want["trainable_params"]
    assert 'id="peft"' in html and 'id="peft-memory-note"' in html and "peft&#x27;s LoraConfig" in html
    assert main([*argv]) == 0 and 'id="peft"' not in path.read_text()


@pytest.mark.parametrize("change,needle", [({"peft": "none"}, "needs --peft lora"),
                                           ({"lora-targets": "c_attn"}, "no such Linear module"),
                                           ({"lora-rank": "0"}, "the rank must be a positive integer")])
def test_bad_value_is_the_cli_line(change, needle, capsys, tmp_path):
    fields = {**FIELDS, **change}
    out = calc(fields)
    assert not out["ok"] and needle in out["error"] and "\n" not in out["error"]
    argv = ["report", fields["model"]] + [x for k, v in fields.items() if k != "model" for x in (f"--{k}", v)]
    capsys.readouterr()
    assert main([*argv, "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == out["error"]
    assert not (tmp_path / "r.html").exists()


def test_page_memory_is_what_its_note_says(capsys):
    """The fine-tune's peak (``memory --peft``) where the calculator models the step, else full training's."""
    from trainmath.report.peft import FINE_TUNE_NOTE

    out = calc(FIELDS)
    assert out["ok"], out.get("error")
    fine_tune = out["summary"]["peft"]["memory_note"] == FINE_TUNE_NOTE
    argv = ["memory", FIELDS["model"], "--micro-batch", "1", "--seq", "4096", "--json"]
    if fine_tune:
        argv += [x for k, v in PEFT.items() for x in (f"--{k}", v)]
    capsys.readouterr()
    assert main(argv) == 0
    assert out["summary"]["peak_bytes"] == json.loads(capsys.readouterr().out)["peak_bytes"]


def test_report_planner_is_plan_peft(capsys, tmp_path):
    """With --gpus the page's planner is ``trainmath plan --peft``'s: the same top layout and step time."""
    path = tmp_path / "r.html"
    job = ["--seq", "4096", "--precision", "bf16", *[x for k, v in PEFT.items() for x in (f"--{k}", v)]]
    assert main(["report", "meta-llama/Llama-3.1-8B", "--micro-batch", "1", "--profile", "hf", "--gpu", "h100",
                 "--gpus", "8", *job, "-o", str(path)]) == 0
    html = path.read_text()
    capsys.readouterr()
    assert main(["plan", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--gpus", "8", "--global-batch", "8",
                 "--top", "3", "--json", *job]) == 0
    top = json.loads(capsys.readouterr().out)["layouts"][0]
    assert "hf profile" in html and f"<td>{top['step_time_s']:.3f}</td>" in html
