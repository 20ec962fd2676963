"""The published serving benchmarks file: every record names a source that exists, a catalog model, a GPU preset,
its layout and lengths, and positive finite figures in the stated units, each with the figure as published."""

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from trainmath.hardware import presets
from trainmath.sources import load_spec, resolve

PATH = Path(__file__).with_name("published_serving.json")
DATA = json.loads(PATH.read_text(encoding="utf-8"))
RECORDS = DATA["records"]
METRICS = ("ttft_s", "tpot_s", "output_tokens_per_s", "e2e_s")
DTYPES = {"bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "nvfp4"}
SOURCE_KEYS = {"name", "location", "engine", "latency_convention", "notes", "kv_heads", "kv_heads_source"}
RECORD_KEYS = {"id", "source", "where", "model", "gpu", "gpus", "tp", "ep", "weights_dtype", "kv_dtype", "batch",
               "concurrency", "input", "output", "published_raw"}


def test_top_level_shape():
    assert set(DATA) == {"_about", "sources", "records"}
    assert isinstance(DATA["_about"], str) and DATA["_about"]
    for sid, src in DATA["sources"].items():
        assert set(src) == SOURCE_KEYS, sid
        assert all(isinstance(src[k], str) and src[k].strip() for k in SOURCE_KEYS), sid
        assert src["kv_heads"] in ("model-code", "kv-heads"), sid


def test_enough_records_from_enough_sources():
    per_source = Counter(r["source"] for r in RECORDS)
    assert len(RECORDS) >= 60
    assert len(per_source) >= 4, per_source
    assert set(per_source) == set(DATA["sources"]), "every source is used and every record's source exists"


def test_ids_are_unique():
    dup = [k for k, n in Counter(r["id"] for r in RECORDS).items() if n > 1]
    assert not dup


@pytest.mark.parametrize("rec", RECORDS, ids=[r["id"] for r in RECORDS])
def test_record(rec):
    assert RECORD_KEYS <= set(rec), RECORD_KEYS - set(rec)
    extra = {"assumptions", "attention_dp"}
    assert set(rec) <= RECORD_KEYS | set(METRICS) | extra, set(rec) - RECORD_KEYS - set(METRICS)
    assert rec.get("attention_dp", True) is True  # present only where the source enables attention data parallel
    assert rec["source"] in DATA["sources"]
    assert isinstance(rec["where"], str) and rec["where"].strip()
    presets().gpu(rec["gpu"])  # raises when the GPU is not a preset
    assert rec["gpu"] in {g.name for g in presets().gpus}
    assert rec["weights_dtype"] in DTYPES and rec["kv_dtype"] in DTYPES
    for k in ("gpus", "tp", "ep", "input", "output"):
        assert isinstance(rec[k], int) and rec[k] >= 1, k
    assert rec["gpus"] % rec["tp"] == 0 and rec["ep"] <= rec["gpus"]
    # exactly one of a static batch and a continuous-batching concurrency
    assert (rec["batch"] is None) != (rec["concurrency"] is None)
    n = rec["batch"] if rec["batch"] is not None else rec["concurrency"]
    assert isinstance(n, int) and n >= 1
    present = [m for m in METRICS if m in rec]
    assert present, "at least one figure"
    for m in present:
        v = rec[m]
        assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (m, v)
    assert rec["published_raw"] and all(isinstance(v, str) and v for v in rec["published_raw"].values())
    if "assumptions" in rec:
        assert isinstance(rec["assumptions"], list) and all(isinstance(a, str) and a for a in rec["assumptions"])


def test_static_batch_figures_are_consistent():
    """Where a static-batch record gives both e2e and throughput, throughput is B*O/e2e."""
    both = [r for r in RECORDS if r["batch"] is not None and "e2e_s" in r and "output_tokens_per_s" in r]
    assert len(both) >= 9
    for r in both:
        assert r["output_tokens_per_s"] == pytest.approx(r["batch"] * r["output"] / r["e2e_s"], rel=0.02), r["id"]


def test_fixed_concurrency_figures_obey_littles_law():
    """With C requests always in flight, output tokens/s = C*O / (per-request e2e), e2e = TTFT + (O-1)*TPOT where
    the source gives those instead: a transcription slip in any of the three figures shows here."""
    checked = 0
    for r in RECORDS:
        if r["concurrency"] is None or "output_tokens_per_s" not in r:
            continue
        e2e = r.get("e2e_s")
        if e2e is None and "ttft_s" in r and "tpot_s" in r:
            e2e = r["ttft_s"] + (r["output"] - 1) * r["tpot_s"]
        if e2e is None:
            continue
        checked += 1
        assert r["output_tokens_per_s"] == pytest.approx(r["concurrency"] * r["output"] / e2e, rel=0.05), r["id"]
    assert checked >= 10


@pytest.mark.parametrize("model", sorted({r["model"] for r in RECORDS}))
def test_model_loads_through_the_catalog(model):
    spec = load_spec(model)
    assert spec.layers


def _config(model):
    return resolve(model).config


def test_moe_and_mla_models_are_included():
    models = {r["model"] for r in RECORDS}
    moe = [m for m in models if any(_config(m).get(k) for k in ("num_local_experts", "n_routed_experts",
                                                                  "num_experts"))]
    mla = [m for m in models if _config(m).get("kv_lora_rank")]
    assert moe and mla, (moe, mla)
