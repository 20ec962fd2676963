"""Leave-one-source-out accuracy of the serving predictor (each source predicted by per-generation constants fitted
on the other sources only, the honest out-of-sample figure of docs/benchmarks.md), pinned."""

import pytest

from .serving_pins import medians, oracle, priced

PINNED = {"tpot_s": 0.040, "output_tokens_per_s": 0.110, "ttft_s": 0.153, "e2e_s": 0.243}
"""Median |error| leave-one-source-out (python benchmarks/serving_oracles.py, third table)."""


def test_leave_one_source_out_median_errors_are_pinned():
    records, raws, _, _ = priced()
    got = medians(oracle().loso(records, raws))
    for k, v in PINNED.items():
        assert got[k] == pytest.approx(v, abs=0.001), (k, got[k])
    assert got["tpot_s"] <= 0.12 and got["output_tokens_per_s"] <= 0.12
