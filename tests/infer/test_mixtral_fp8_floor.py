"""The FP8 assumption of TensorRT-LLM 0.9.0's Mixtral records, checked against the physical floor.

TensorRT-LLM's release notes put "Added FP8 quantization support for Mixtral" under Release 0.10.0
(NVIDIA/TensorRT-LLM _sources/release-notes.md.txt@0ef30309d65342fa076e6b088263164e2c0f4b7c), yet the 0.9.0 page
lists Mixtral under "H100 GPUs (FP8)". The page's own batch-1 first-token latency decides it: a 128-token prefill
of Mixtral-8x7B at TP 2 touches every expert (1 − (1 − 2/8)^128 ≈ 1), so each rank streams its half of the
weights at least once. In fp16 that alone takes longer than the published latency; in fp8 it does not."""

from __future__ import annotations

import json
from pathlib import Path

from trainmath.hardware import gpu
from trainmath.infer import CacheFormat, InferenceSetup, WeightFormat
from trainmath.infer.speed import fixed_batch
from trainmath.sources import load_spec

RECORDS = {r["id"]: r for r in json.loads(Path(__file__).with_name("published_serving.json").read_text())["records"]}


def _floor_s(dtype: str) -> float:
    spec = load_spec("mistralai/Mixtral-8x7B-v0.1")
    setup = InferenceSetup(batch=1, context=129, tp=2, weights=WeightFormat(dtype=dtype),
                           cache=CacheFormat(kv_dtype=dtype))
    return fixed_batch(spec, setup, gpu("h100"), input=128, output=1).prefill_floor.time_s


def test_fp16_weights_cannot_meet_the_published_first_token_latency():
    published = RECORDS["trtllm090-ttft-h100-mixtral8x7b-tp2-128"]["ttft_s"]
    assert published == 0.0134
    assert _floor_s("fp16") > published  # 14.3 ms: 46.6 GB per rank at 3.35 TB/s
    assert _floor_s("fp8") < published  # 7.4 ms


def test_mixtral_records_state_the_check():
    mixtral = [r for r in RECORDS.values() if r["source"] == "trtllm-0.9.0-static" and "Mixtral" in r["model"]
               and r["weights_dtype"] == "fp8"]
    assert len(mixtral) == 18
    assert all(any("0.10.0" in a for a in r["assumptions"]) for r in mixtral)
