"""``plot timeline|comm|plan FILE``: the file is read bounded from a regular file only, and its schema is checked
(a name that is a number, bytes that are text, NaN, 400 digits, deep nesting): one ``trainmath: error:`` line
naming the entry and the field, exit 2, no chart written."""

from __future__ import annotations

import importlib.util
import json
import os
import threading

import pytest

from trainmath.cli import main

pytest.importorskip("matplotlib")
_spec = importlib.util.spec_from_file_location("vizdata", os.path.join(os.path.dirname(__file__), "..", "viz",
                                                                        "vizdata.py"))
vizdata = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vizdata)

pytestmark = pytest.mark.timeout(60)

GOOD = {"timeline": vizdata.timeline(), "comm": vizdata.comm_rows(), "plan": vizdata.plan()}


def _timeline(**change):
    doc = vizdata.timeline()
    doc["timeline"][1] = {**doc["timeline"][1], **change}
    return doc


def _comm(**change):
    rows = vizdata.comm_rows()
    rows[0] = {**rows[0], **change}
    return rows


def _plan(**change):
    doc = vizdata.plan()
    doc["layouts"][0] = {**doc["layouts"][0], **change}
    return doc


BAD = {
    "timeline_event_number": ("timeline", _timeline(event=7), "event must be a string"),
    "timeline_bytes_string": ("timeline", _timeline(bytes="3 GiB"), "bytes must be an integer"),
    "timeline_bytes_negative": ("timeline", _timeline(bytes=-1), "bytes must be"),
    "timeline_bytes_float": ("timeline", _timeline(bytes=1.5), "bytes must be"),
    "timeline_margin_string": ("timeline", {**vizdata.timeline(), "margin_bytes": "lots"}, "margin_bytes"),
    "timeline_peak_event_list": ("timeline", {**vizdata.timeline(), "peak_event": []}, "peak_event"),
    "comm_size_string": ("comm", _comm(size_bytes="1M"), "size_bytes"),
    "comm_nproc_zero": ("comm", _comm(nproc=0), "nproc"),
    "comm_op_number": ("comm", _comm(op=3), "op must be a string"),
    "comm_busbw_string": ("comm", _comm(busbw_bytes_per_s="fast"), "busbw_bytes_per_s"),
    "plan_step_string": ("plan", _plan(step_time_s="1s"), "step_time_s"),
    "plan_peak_string": ("plan", _plan(peak_bytes="80GB"), "peak_bytes"),
    "plan_fits_string": ("plan", _plan(fits="no"), "fits"),
    "plan_breakdown_text": ("plan", _plan(breakdown={"compute": "a lot"}), "breakdown"),
    "plan_rejected_list": ("plan", {**vizdata.plan(), "rejected": ["memory"]}, "rejected"),
}

RAW = {
    "timeline_nan": ("timeline", json.dumps(vizdata.timeline()).replace('"bytes": 10737418240', '"bytes": NaN', 1),
                     "NaN"),
    "timeline_400_digits": ("timeline", json.dumps(vizdata.timeline()).replace("10737418240", "9" * 400, 1),
                            "400 digits"),
    "plan_1e400": ("plan", json.dumps(vizdata.plan()).replace('"step_time_s": ', '"step_time_s": 1e400, "x": ', 1),
                   "beyond the range"),
    "comm_deep": ("comm", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "timeline_deep": ("timeline", '{"timeline": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "plan_not_utf8": ("plan", None, "not UTF-8"),
}


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _refused(kind: str, path, out_png, capsys, needle: str) -> None:
    code, out, err = _run(["plot", kind, str(path), "-o", str(out_png)], capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("trainmath: error:") and "Traceback" not in err, err
    assert needle in err, err
    assert not out_png.exists()


@pytest.mark.parametrize("case", sorted(BAD))
def test_wrong_field_types_are_one_line(case, tmp_path, capsys):
    kind, doc, needle = BAD[case]
    path = tmp_path / "in.json"
    path.write_text(json.dumps(doc))
    _refused(kind, path, tmp_path / "out.svg", capsys, needle)


@pytest.mark.parametrize("case", sorted(RAW))
def test_bad_text_is_one_line(case, tmp_path, capsys):
    kind, text, needle = RAW[case]
    path = tmp_path / "in.json"
    if text is None:
        path.write_bytes(json.dumps(vizdata.plan()).encode().replace(b'"', b'"\xff', 1))
    else:
        assert text != json.dumps(GOOD[kind])  # the replacement took place
        path.write_text(text)
    _refused(kind, path, tmp_path / "out.svg", capsys, needle)


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_devices_are_never_read(kind, tmp_path, capsys):
    _refused(kind, "/dev/zero", tmp_path / "out.svg", capsys, "not a regular file")


def test_fifo_does_not_hang(tmp_path, capsys):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=_run(["plot", "plan", str(fifo), "-o",
                                                                     str(tmp_path / "o.svg")], capsys)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        with open(fifo, "w"):
            pass
        pytest.fail("plot plan FIFO blocked")
    code, _, err = result["r"]
    assert code == 2 and "not a regular file" in err, err


@pytest.mark.parametrize("kind", sorted(GOOD))
def test_the_valid_documents_still_draw(kind, tmp_path, capsys):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(GOOD[kind]))
    code, out, err = _run(["plot", kind, str(path), "-o", str(tmp_path / "out.svg")], capsys)
    assert code == 0, err
    assert (tmp_path / "out.svg").stat().st_size > 1000
