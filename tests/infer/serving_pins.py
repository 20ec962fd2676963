"""Shared by the serving-accuracy pins: the published serving records priced once through
``benchmarks/serving_oracles.py`` (the script the figures in docs/benchmarks.md come from)."""

import importlib.util
import json
import statistics
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def oracle():
    spec = importlib.util.spec_from_file_location("serving_oracles", ROOT / "benchmarks" / "serving_oracles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@lru_cache(maxsize=1)
def priced():
    """(records, their raw steps, stored constants by generation)."""
    data = json.loads((ROOT / "tests" / "infer" / "published_serving.json").read_text(encoding="utf-8"))
    records, raws, skipped, defaults = oracle().load(data)
    return records, raws, defaults, skipped


def medians(errs) -> dict[str, float]:
    """Median |error| per metric, as a fraction."""
    by = defaultdict(list)
    for _, k, e in errs:
        by[k].append(abs(e))
    return {k: statistics.median(v) for k, v in by.items()}
