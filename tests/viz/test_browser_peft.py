"""The fine-tuning fields of the served page, in headless Chromium: picking LoRA shows the trainable parameters
`trainmath params --peft --json` prints, with the note saying whose memory and FLOPs are beside them (the
fine-tune's where the calculator models its step, else full training's); back to full training hides them."""

import json
import os

import pytest

from headless import CHROMIUM

if not os.path.exists(CHROMIUM):
    pytest.skip(f"needs {CHROMIUM} (Debian package chromium)", allow_module_level=True)

from trainmath.cli import main  # noqa: E402


def _set(browser, name: str, value: str) -> None:
    browser.eval(f"(() => {{ const el = document.getElementById('setup').elements[{name!r}]; el.value = {value!r};"
                 f" el.dispatchEvent(new Event('input', {{bubbles: true}}));"
                 f" el.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")


def test_page_shows_the_adapters(browser, url, capsys):
    capsys.readouterr()
    assert main(["params", "Qwen/Qwen3-8B", "--peft", "lora", "--lora-rank", "16", "--lora-targets", "all-linear",
                 "--json"]) == 0
    want = json.loads(capsys.readouterr().out)["trainable_params"]
    browser.open(url)
    browser.wait_for("document.getElementById('model-name').textContent === 'Qwen/Qwen3-8B'")
    assert browser.eval("document.getElementById('peft-card').hidden") is True
    _set(browser, "lora-rank", "16")
    _set(browser, "lora-targets", "all-linear")
    _set(browser, "peft", "lora")
    browser.wait_for("!document.getElementById('peft-card').hidden")
    shown = browser.eval("document.getElementById('trainable-params').textContent")
    assert int(shown.replace(",", "")) == want
    from trainmath.report.peft import FINE_TUNE_NOTE

    note = browser.eval("document.getElementById('peft-note').textContent")
    assert note == FINE_TUNE_NOTE or "full training's" in note
    _set(browser, "peft", "none")  # the rank and targets are still set: the CLI's one line, on the page
    browser.wait_for("document.getElementById('error').textContent.includes('needs --peft lora')")
    assert browser.problems() == []
