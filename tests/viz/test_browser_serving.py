"""The serving speed on the served page and in the report, in headless Chromium: the TPOT and TTFT shown are the
ones `trainmath infer --input --output --json` prints for the same setup."""

import json
import os

import pytest

from headless import CHROMIUM

if not os.path.exists(CHROMIUM):
    pytest.skip(f"needs {CHROMIUM} (Debian package chromium)", allow_module_level=True)

from trainmath.cli import main  # noqa: E402


def _cli(capsys, model, batch, context, output):
    capsys.readouterr()
    assert main(["infer", model, "--gpu", "h100", "--batch", str(batch), "--input", str(context), "--output",
                 str(output), "--dtype", "bf16", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _set(browser, name: str, value: str) -> None:
    browser.eval(f"(() => {{ const el = document.getElementById('setup').elements[{name!r}]; el.value = {value!r};"
                 f" el.dispatchEvent(new Event('input', {{bubbles: true}}));"
                 f" el.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")


def test_page_shows_serving_speed(browser, url, capsys):
    browser.open(url)
    browser.wait_for("document.getElementById('serving-speed').dataset.tpot")
    _set(browser, "model", "Qwen/Qwen3-1.7B")
    browser.wait_for("document.getElementById('model-name').textContent === 'Qwen/Qwen3-1.7B'")
    _set(browser, "serve-batch", "8")
    _set(browser, "context", "2048")
    _set(browser, "serve-output", "64")
    cli = _cli(capsys, "Qwen/Qwen3-1.7B", 8, 2048, 64)
    browser.wait_for(f"Math.abs(Number(document.getElementById('serving-speed').dataset.tpot) - {cli['tpot_s']})"
                     " < 1e-12")
    ttft = float(browser.eval("document.getElementById('serving-speed').dataset.ttft"))
    assert ttft == pytest.approx(cli["ttft_s"], rel=1e-12)
    assert "TPOT" in browser.eval("document.getElementById('serving-speed').textContent")
    assert browser.problems() == []


def test_report_shows_serving_speed(browser, tmp_path, capsys):
    out = tmp_path / "report.html"
    assert main(["report", "Qwen/Qwen3-1.7B", "--micro-batch", "1", "--seq", "4096", "--gpu", "h100",
                 "--serve-batch", "4", "--context", "1024", "--serve-output", "32", "-o", str(out)]) == 0
    browser.open(out.as_uri())
    assert browser.problems() == []
    tpot = float(browser.eval("document.getElementById('serving-speed').dataset.tpot"))
    assert tpot == pytest.approx(_cli(capsys, "Qwen/Qwen3-1.7B", 4, 1024, 32)["tpot_s"], rel=1e-12)
    assert "Serving speed" in browser.eval("document.body.textContent")
