"""`trainmath serve` without a browser: the form's fields are the CLI's flags, the answers are the CLI's
numbers and error lines, requests are bounded, only the catalog or a dropped config is read."""

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

import pytest

from trainmath.cli import main
from trainmath.serve.app import MAX_BODY_BYTES, calc, make_server

FIELDS = {"model": "Qwen/Qwen3-0.6B", "micro-batch": "2", "seq": "1024", "zero": "1", "dp": "4", "gpu": "h100"}


@pytest.fixture(scope="module")
def url():
    server = make_server("127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _cli_json(argv, capsys) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_calc_equals_the_cli(capsys):
    out = calc(FIELDS)
    assert out["ok"]
    mem = _cli_json(["memory", "qwen3-0.6b", "--micro-batch", "2", "--seq", "1024", "--zero", "1", "--dp", "4",
                     "--json"], capsys)
    assert out["summary"]["peak_bytes"] == mem["peak_bytes"]
    assert out["summary"]["breakdown"] == mem["breakdown"]
    inf = _cli_json(["infer", "qwen3-0.6b", "--batch", "1", "--context", "1024", "--json"], capsys)
    assert out["summary"]["kv_cache_bytes"] == inf["kv_cache_bytes"]
    assert set(out["charts"]) == {"params", "memory", "timeline", "serving"}


@pytest.mark.parametrize("change", [{"micro-batch": "0"}, {"seq": "abc"}, {"precision": "fp4"}, {"gpu": "h1000"},
                                    {"tp": "3"}])
def test_bad_value_is_the_cli_line(change, capsys, tmp_path):
    fields = {**FIELDS, **change}
    out = calc(fields)
    assert not out["ok"] and "\n" not in out["error"]
    argv = ["report", "qwen3-0.6b"] + [x for k, v in fields.items() if k != "model" for x in (f"--{k}", v)]
    try:
        code = main([*argv, "-o", str(tmp_path / "r.html")])
    except SystemExit as e:  # argparse's own errors exit from parse_args
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    # the CLI's line ('trainmath: error: [report: ]MESSAGE[ (see `trainmath report --help`)]'), same MESSAGE
    cli = err.splitlines()[-1].split("error: ", 1)[1].removeprefix("report: ").split(" (see `trainmath")[0]
    assert cli == out["error"].split("error: ", 1)[1]


def test_only_catalog_models_or_a_dropped_config(tmp_path):
    assert "not in the catalog" in calc({**FIELDS, "model": "/etc/passwd"})["error"]
    assert "not in the catalog" in calc({**FIELDS, "model": "someorg/somemodel"})["error"]
    assert "unknown field 'output'" in calc({**FIELDS, "output": "/tmp/x.html"})["error"]
    from trainmath.sources import CATALOG_DIR

    text = open(f"{CATALOG_DIR}/Qwen3-0.6B.json").read().replace('"num_hidden_layers": 28', '"num_hidden_layers": 2')
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    dropped = calc({**FIELDS, "model": "", "config": text, "config_name": "config.json"})
    assert dropped["ok"] and dropped["summary"]["model"] == "config.json"
    from trainmath.layout import ParallelLayout
    from trainmath.memory.training import TrainingSetup, training_memory
    from trainmath.sources import load_spec

    expect = training_memory(load_spec(str(cfg)), TrainingSetup(micro_batch=2, seq=1024), ParallelLayout(dp=4, zero=1))
    assert dropped["summary"]["peak_bytes"] == expect.peak_bytes
    assert "config.json" in calc({**FIELDS, "config": "{not json"})["error"]


def _post(url, path, data: bytes, headers=None):
    req = urllib.request.Request(url + path, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_http_routes(url):
    with urllib.request.urlopen(url + "/", timeout=30) as r:
        page = r.read().decode()
        assert r.status == 200 and "script-src 'unsafe-inline'" in r.headers["Content-Security-Policy"]
    for flag in ("micro-batch", "seq", "precision", "zero", "tp", "gpu", "serve-batch", "kv-dtype"):
        assert f'name="{flag}"' in page
    status, body = _post(url, "/api/calc", urlencode(FIELDS).encode())
    assert status == 200 and json.loads(body)["ok"]
    status, body = _post(url, "/report", urlencode(FIELDS).encode())
    assert status == 200 and body.startswith("<!DOCTYPE html>") and 'id="peak-bytes"' in body
    status, body = _post(url, "/report", urlencode({**FIELDS, "seq": "0"}).encode())
    assert status == 400 and "trainmath: error: seq must be a positive integer" in body
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url + "/nothing", timeout=30)
    assert e.value.code == 404


def test_request_size_is_bounded(url):
    status, body = _post(url, "/api/calc", b"x", headers={"Content-Length": str(MAX_BODY_BYTES + 1)})
    assert status == 413 and "at most" in body


def test_serve_binds_loopback_by_default():
    from trainmath.cli import build_parser

    args = build_parser("serve").parse_args(["serve"])
    assert args.host == "127.0.0.1"


def test_report_and_serve_never_import_matplotlib_or_torch(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None; sys.modules['torch'] = None\n"
            "from trainmath.serve.app import calc; from trainmath.serve.page import page\n"
            "from trainmath.cli import main\n"
            "out = calc({'model': 'qwen3-0.6b', 'micro-batch': '1', 'seq': '512', 'gpu': 'h100'})\n"
            "assert out['ok'] and page().startswith('<!DOCTYPE html>')\n"
            f"d = {str(tmp_path)!r}\n"
            "assert main(['report', 'qwen3-0.6b', '--micro-batch', '1', '--seq', '512', '-o', d + '/r.html']) == 0\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("ok"), out.stderr


def test_serve_command_starts_answers_and_stops():
    """`trainmath serve --port 0` prints its URL, answers, and ends cleanly on Ctrl-C (SIGINT)."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "trainmath", "serve", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("trainmath serve: http://127.0.0.1:")
        base = line.split()[2].rstrip("/")
        with urllib.request.urlopen(base + "/", timeout=30) as r:
            assert r.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


@pytest.mark.parametrize("argv,needle", [(["--port", "70000"], "--port must be in 0..65535"),
                                         (["--host", "203.0.113.9"], "cannot listen on 203.0.113.9")])
def test_serve_bad_address_is_one_line(argv, needle, capsys):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_every_weight_format_of_infer_is_offered(capsys, tmp_path):
    """The report and the page take their serving formats from `trainmath infer`'s own lists (mxfp4 included),
    and give infer's bytes for them."""
    from trainmath.infer.dtypes import KV_DTYPES, WEIGHT_DTYPES
    from trainmath.serve.page import page

    html = page()
    for name in WEIGHT_DTYPES + KV_DTYPES:
        assert f"<option>{name}</option>" in html or f"<option selected>{name}</option>" in html
    fields = {**FIELDS, "model": "openai/gpt-oss-20b", "serve-batch": "2", "context": "1024",
              "weights-dtype": "mxfp4", "kv-dtype": "fp8"}
    out = calc(fields)
    assert out["ok"], out.get("error")
    inf = _cli_json(["infer", "gpt-oss-20b", "--batch", "2", "--context", "1024", "--dtype", "mxfp4",
                     "--kv-dtype", "fp8", "--json"], capsys)
    assert out["summary"]["serving_weights_bytes"] == inf["weights_bytes"]
    assert out["summary"]["kv_cache_bytes"] == inf["kv_cache_bytes"]
    report = tmp_path / "r.html"
    assert main(["report", "gpt-oss-20b", "--micro-batch", "1", "--seq", "1024", "--serve-batch", "2",
                 "--weights-dtype", "mxfp4", "--kv-dtype", "fp8", "-o", str(report)]) == 0
    text = report.read_text()
    assert "weights mxfp4" in text and f"{inf['total_bytes']:,}" in text


def test_gpu_count_adds_the_planners_layouts(capsys):
    """The `gpus` field (`report --gpus`) adds `trainmath plan`'s best layouts, the same ones in the same order;
    without it there is no planner; its bad values get the CLI's line."""
    job = ["--gpus", "8", "--gpu", "h100", "--seq", "1024", "--global-batch", "16"]
    best = _cli_json(["plan", "qwen3-0.6b", *job, "--top", "3", "--json"], capsys)["layouts"]
    out = calc({**FIELDS, "dp": "1", "zero": "0", "gpus": "8", "global-batch": "16"})
    assert out["ok"], out.get("error")
    assert out["plan"] == best and len(best) == 3
    assert "Planner: best layouts on 8 × H100-SXM-80GB" in out["plan_html"]
    plain = calc(FIELDS)
    assert plain["plan"] is None and plain["plan_html"] == ""
    assert calc({**FIELDS, "gpus": "0"})["error"] == "trainmath: error: --gpus must be a positive integer, got 0"
    assert "--gpus needs --gpu" in calc({**FIELDS, "gpus": "8", "gpu": ""})["error"]
    t = time.monotonic()
    huge = calc({**FIELDS, "gpus": str(2**40)})  # the planner would run for minutes: refused at once
    assert huge["error"] == "trainmath: error: --gpus must be at most 1,048,576 (2**20) for the planner, got " \
                            "1,099,511,627,776" and time.monotonic() - t < 5
