"""``--hardware FILE``: every value's type, sign and finiteness and the document's shape are checked before use;
a file that is not a regular file is never opened, and the size read is bounded. Each case is one
``trainmath: error:`` line naming the file and the field, exit 2."""

from __future__ import annotations

import json
import os
import threading

import pytest

from trainmath.cli import main
from trainmath.hardware import presets, read_hardware_file
from trainmath.sources import CATALOG_DIR

pytestmark = pytest.mark.timeout(60)

_BUNDLED = json.loads(open(os.path.join(CATALOG_DIR, "..", "hardware", "gpus.json"), encoding="utf-8").read())
PRESET = _BUNDLED["gpus"][0]["name"]
GPU = {**_BUNDLED["gpus"][0], "name": "Lab-GPU", "aliases": ["lab"]}
GEN = dict(_BUNDLED["generations"][GPU["generation"]])
JOB = ["estimate", "Qwen/Qwen3-0.6B", "--gpus", "8", "--gpu", "lab", "--seq", "512", "--global-batch", "8"]


def _gpu(**change) -> dict:
    return {"gpus": [{**GPU, **change}]}


BAD_DOCS = {
    "zero_bandwidth": (_gpu(hbm_bytes_per_s=0), "hbm_bytes_per_s"),
    "zero_link": (_gpu(interconnect_bidirectional_bytes_per_s=0), "interconnect_bidirectional_bytes_per_s"),
    "zero_nic": (_gpu(nic_gbps=0), "nic_gbps"),
    "gpus_object": ({"gpus": {"Lab-GPU": GPU}}, "'gpus' must be a list"),
    "gpus_entry_string": ({"gpus": ["Lab-GPU"]}, "GPU entry 0 must be an object"),
    "generations_list": ({"generations": [GEN]}, "'generations' must be an object"),
    "top_list": ([GPU], "expected a JSON object"),
    "memory_zero": (_gpu(memory_bytes=0), "memory_bytes"),
    "memory_negative": (_gpu(memory_bytes=-1), "memory_bytes"),
    "memory_string": (_gpu(memory_bytes="80GB"), "memory_bytes"),
    "memory_bool": (_gpu(memory_bytes=True), "memory_bytes"),
    "memory_float": (_gpu(memory_bytes=8.5e10), "memory_bytes"),
    "peak_huge": (_gpu(bf16_flops_per_s=10**30), "bf16_flops_per_s"),
    "gpus_per_node_zero": (_gpu(gpus_per_node=0), "gpus_per_node"),
    "latency_negative": (_gpu(intra_node_latency_s=-1e-6), "intra_node_latency_s"),
    "sharp_string": (_gpu(nvlink_sharp="yes"), "nvlink_sharp"),
    "name_number": (_gpu(name=7), "name"),
    "aliases_string": (_gpu(aliases="lab"), "aliases"),
    "fraction_seven": ({"generations": {"hopper": {**GEN, "gemm_peak_fraction": 7.0}}}, "gemm_peak_fraction"),
    "fraction_zero": ({"generations": {"hopper": {**GEN, "link_fraction": 0}}}, "link_fraction"),
    "fraction_string": ({"generations": {"hopper": {**GEN, "hbm_fraction": "0.8"}}}, "hbm_fraction"),
    "generation_unknown_key": ({"generations": {"hopper": {**GEN, "gemm_peak": 0.5}}}, "unknown gemm_peak"),
}

RAW = {
    "nan_memory": (json.dumps(_gpu()).replace(str(GPU["memory_bytes"]), "NaN"), "NaN"),
    "nan_fraction": (json.dumps({"generations": {"hopper": {**GEN, "gemm_peak_fraction": 0.5}}})
                     .replace("0.5", "NaN"), "NaN"),
    "inf_bandwidth": (json.dumps(_gpu()).replace(str(GPU["hbm_bytes_per_s"]), "Infinity"), "Infinity"),
    "float_1e400": (json.dumps(_gpu()).replace(str(GPU["hbm_bytes_per_s"]), "1e400"), "beyond the range"),
    "digits_400": (json.dumps(_gpu()).replace(str(GPU["memory_bytes"]), "9" * 400), "400 digits"),
    "deep": ('{"gpus": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "not_json": ('{"gpus": [', "is not JSON"),
}


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("trainmath: error: hardware file"), err
    assert needle in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_bad_values_are_one_line(case, tmp_path, capsys):
    doc, needle = BAD_DOCS[case]
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(doc))
    _one_line(*_run([*JOB, "--hardware", str(path)], capsys), needle)


@pytest.mark.parametrize("case", sorted(RAW))
def test_bad_text_is_one_line(case, tmp_path, capsys):
    text, needle = RAW[case]
    path = tmp_path / f"{case}.json"
    path.write_text(text)
    _one_line(*_run([*JOB, "--hardware", str(path)], capsys), needle)


def test_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"gpus": [{"name": "Caf\xe9"}]}')
    _one_line(*_run([*JOB, "--hardware", str(path)], capsys), "not UTF-8")


def test_ten_megabytes_is_not_read(tmp_path, capsys):
    path = tmp_path / "big.json"
    path.write_text(" " * (10 << 20) + json.dumps(_gpu()))
    _one_line(*_run([*JOB, "--hardware", str(path)], capsys), "larger than")


@pytest.mark.parametrize("path", ["/dev/zero", "/proc", "/dev/null"])
def test_non_regular_files_are_never_opened(path, capsys):
    _one_line(*_run([*JOB, "--hardware", path], capsys), "not a regular file")


def test_fifo_is_never_opened(tmp_path, capsys):
    fifo = tmp_path / "hw.fifo"
    os.mkfifo(fifo)
    result = {}
    worker = threading.Thread(target=lambda: result.update(r=_run([*JOB, "--hardware", str(fifo)], capsys)),
                              daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "w"):
            pass
        pytest.fail("--hardware FIFO blocked")
    _one_line(*result["r"], "not a regular file")


def test_a_valid_file_still_adds_a_gpu(tmp_path, capsys):
    """The oracle that the checks refuse nothing valid: the bundled entry under a new name estimates exactly as the
    preset it copies."""
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(_gpu()))
    hw = read_hardware_file(str(path))
    assert hw.gpu("lab").memory_bytes == presets().gpu(PRESET).memory_bytes
    code, out, err = _run([*JOB, "--hardware", str(path), "--json"], capsys)
    assert code == 0, err
    preset = JOB[:5] + [PRESET] + JOB[6:]
    code2, out2, err2 = _run([*preset, "--json"], capsys)
    assert code2 == 0, err2
    a, b = json.loads(out), json.loads(out2)
    assert a["step_time_s"] == b["step_time_s"]
