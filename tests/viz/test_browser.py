"""The report and the served page in a real headless Chromium (Debian's `chromium`, driven over the DevTools
pipe by tests/viz/headless.py): no console errors, screenshots, and the page driven like a user — choose a model,
change the batch, read the new peak, compare it with `trainmath memory --json`."""

import json
import os

import pytest

from headless import CHROMIUM

if not os.path.exists(CHROMIUM):
    pytest.skip(f"needs {CHROMIUM} (Debian package chromium)", allow_module_level=True)

from PIL import Image  # noqa: E402  (pillow comes with matplotlib in the test extra)

from trainmath.cli import main  # noqa: E402


def _peak(browser) -> int:
    return int(browser.eval("document.getElementById('peak-bytes').dataset.bytes || 0"))


def _cli_peak(argv, capsys) -> int:
    capsys.readouterr()
    assert main(["memory", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["peak_bytes"]


def _set(browser, name: str, value: str) -> None:
    """Set a form control as a user would and fire the events the page listens to."""
    browser.eval(f"(() => {{ const el = document.getElementById('setup').elements[{name!r}]; el.value = {value!r};"
                 f" el.dispatchEvent(new Event('input', {{bubbles: true}}));"
                 f" el.dispatchEvent(new Event('change', {{bubbles: true}})); }})()")


def _check_png(path, min_w: int, min_h: int) -> None:
    img = Image.open(path).convert("L")
    assert img.size[0] >= min_w and img.size[1] >= min_h
    lo, hi = img.getextrema()
    assert hi - lo > 100  # not blank


def test_report_opens_clean(browser, tmp_path, capsys):
    out = tmp_path / "report.html"
    argv = ["qwen3-30b-a3b", "--micro-batch", "1", "--seq", "4096", "--dp", "8", "--ep", "8", "--zero", "3",
            "--gpu", "h100"]
    assert main(["report", *argv, "-o", str(out)]) == 0
    browser.open(out.as_uri())
    assert browser.problems() == []
    assert browser.eval("performance.getEntriesByType('resource').length") == 0  # nothing fetched
    assert browser.eval("document.querySelectorAll('svg.chart').length") == 4
    shown = int(browser.eval("document.getElementById('peak-bytes').dataset.bytes"))
    assert shown == _cli_peak(argv[:-2], capsys)
    # the step's timeline as drawn: the calculator's events and bytes, every text inside the chart's box
    points = browser.eval("[...document.querySelectorAll('#chart-timeline circle.point')].map("
                          "c => [c.dataset.label, Number(c.dataset.y)])")
    assert main(["memory", *argv[:-2], "--timeline", "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    assert [[e["event"], e["bytes"]] for e in events] == [[name, y * 2**30] for name, y in points]
    outside = browser.eval("(() => { const box = document.getElementById('chart-timeline').getBoundingClientRect();"
                           " return [...document.querySelectorAll('#chart-timeline text')].filter(t => {"
                           " const r = t.getBoundingClientRect(); return r.left < box.left - 1 || r.right > "
                           "box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1; })"
                           ".map(t => t.textContent); })()")
    assert outside == []
    _check_png(browser.screenshot(str(tmp_path / "report.png")), 1000, 2000)


def test_page_opens_clean(browser, url, tmp_path):
    browser.open(url)
    browser.wait_for("document.getElementById('peak-bytes').dataset.bytes")
    assert browser.problems() == []
    assert browser.eval("document.querySelectorAll('svg.chart').length") == 4
    assert browser.eval("document.getElementById('error').textContent") == ""
    _check_png(browser.screenshot(str(tmp_path / "page.png")), 1000, 1500)


def test_drive_the_page(browser, url, capsys):
    browser.open(url)
    browser.wait_for("document.getElementById('peak-bytes').dataset.bytes")
    _set(browser, "model", "Qwen/Qwen3-1.7B")
    browser.wait_for("document.getElementById('model-name').textContent === 'Qwen/Qwen3-1.7B'")
    before = _peak(browser)
    assert before == _cli_peak(["qwen3-1.7b", "--micro-batch", "1", "--seq", "4096"], capsys)
    _set(browser, "micro-batch", "3")
    browser.wait_for(f"document.getElementById('peak-bytes').dataset.bytes !== '{before}'")
    assert _peak(browser) == _cli_peak(["qwen3-1.7b", "--micro-batch", "3", "--seq", "4096"], capsys)
    verdict = browser.eval("document.getElementById('verdict').textContent")
    assert verdict.startswith(("fits on H100-SXM-80GB", "does not fit on H100-SXM-80GB"))
    assert browser.problems() == []


def test_bad_value_shows_the_cli_line(browser, url, tmp_path, capsys):
    browser.open(url)
    browser.wait_for("document.getElementById('peak-bytes').dataset.bytes")
    _set(browser, "micro-batch", "0")
    shown = browser.wait_for("document.getElementById('error').textContent")
    capsys.readouterr()
    assert main(["report", "qwen3-8b", "--micro-batch", "0", "--seq", "4096", "-o", str(tmp_path / "r.html")]) == 2
    assert shown == capsys.readouterr().err.strip()
    assert browser.eval("document.body.classList.contains('stale')")
    assert browser.problems() == []


def test_drop_a_config(browser, url, tmp_path, capsys):
    from trainmath.sources import CATALOG_DIR

    text = open(os.path.join(CATALOG_DIR, "Qwen3-0.6B.json")).read()
    cfg = tmp_path / "config.json"
    cfg.write_text(text.replace('"num_hidden_layers": 28', '"num_hidden_layers": 3'))
    browser.open(url)
    browser.wait_for("document.getElementById('peak-bytes').dataset.bytes")
    browser.set_files("#config-file", [str(cfg)])
    browser.wait_for("document.getElementById('model-name').textContent === 'config.json'")
    assert _peak(browser) == _cli_peak([str(cfg), "--micro-batch", "1", "--seq", "4096"], capsys)
    assert browser.problems() == []


def test_the_harness_sees_console_errors(browser):
    """The clean-console checks above can fail: an error, an exception and a failed load are all recorded."""
    browser.open("data:text/html,<img src='http://127.0.0.1:9/x.png'><script>console.error('boom'); nope()</script>")
    browser.wait_for("document.readyState === 'complete'")
    found = " | ".join(browser.problems())
    assert "console.error: boom" in found and "nope is not defined" in found


def test_report_prints(browser, tmp_path):
    """The print stylesheet gives a real multi-page PDF (Chromium's own print path)."""
    import base64
    import re

    out = tmp_path / "report.html"
    assert main(["report", "qwen3-8b", "--micro-batch", "1", "--seq", "4096", "--gpu", "h100", "-o", str(out)]) == 0
    browser.open(out.as_uri())
    pdf = base64.b64decode(browser.call("Page.printToPDF", {"paperWidth": 8.27, "paperHeight": 11.69},
                                        session=True)["data"])
    assert pdf.startswith(b"%PDF-")
    pages = len(re.findall(rb"/Type\s*/Page[^s]", pdf))
    assert 2 <= pages <= 8
    assert browser.problems() == []


def test_report_button_posts_the_same_setup(browser, url):
    """The page's report button posts the form to /report: the report shows the page's peak."""
    browser.open(url)
    browser.wait_for("document.getElementById('peak-bytes').dataset.bytes")
    _set(browser, "model", "Qwen/Qwen3-4B")
    browser.wait_for("document.getElementById('model-name').textContent === 'Qwen/Qwen3-4B'")
    form = browser.eval("[document.getElementById('setup').action, document.getElementById('setup').method, "
                        "document.getElementById('setup').target]")
    assert form == [url + "report", "post", "_blank"]
    html = browser.eval("fetch('/report', {method: 'POST', body: new URLSearchParams(new FormData("
                        "document.getElementById('setup')))}).then(r => r.text())")
    assert f'id="peak-bytes" data-bytes="{_peak(browser)}"' in html and "Qwen/Qwen3-4B" in html


def test_gpu_count_shows_the_planners_layouts(browser, url, capsys):
    """Typing a GPU count shows `trainmath plan`'s best layouts for the page's setup, in its order; clearing it
    hides them."""
    browser.open(url)
    browser.wait_for("document.getElementById('peak-bytes').dataset.bytes")
    assert browser.eval("document.getElementById('plan').hidden")
    _set(browser, "model", "Qwen/Qwen3-0.6B")
    browser.wait_for("document.getElementById('model-name').textContent === 'Qwen/Qwen3-0.6B'")
    _set(browser, "gpus", "8")
    browser.wait_for("!document.getElementById('plan').hidden")
    rows = browser.eval("[...document.querySelectorAll('#slot-plan table.plan tbody tr')].map("
                        "r => [...r.cells].map(c => c.textContent))")
    capsys.readouterr()
    assert main(["plan", "qwen3-0.6b", "--gpus", "8", "--gpu", "h100", "--seq", "4096", "--global-batch", "8",
                 "--top", "3", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["layouts"]
    assert len(rows) == len(best) == 3
    for row, d in zip(rows, best):
        assert row[1] == (f"dp={d['dp']} tp={d['tp']} pp={d['pp']} cp={d['cp']} ep={d['ep']} sp={d['sp']} "
                          f"zero={d['zero']}")
        assert row[5] == f"{d['step_time_s']:.3f}"
    _set(browser, "gpus", "")
    browser.wait_for("document.getElementById('plan').hidden")
    assert browser.problems() == []
