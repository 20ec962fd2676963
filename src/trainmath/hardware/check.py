"""The shape and value rules of a hardware document (``gpus.json`` and a user's ``--hardware FILE``), checked
before any value is used: each field's type, sign and finiteness, so that a zero bandwidth, a memory of -1 or a
GEMM fraction of 7 is one error naming the entry and the field, never a ``ZeroDivisionError`` or a nonsense
estimate later."""

from __future__ import annotations

import math

from trainmath.errors import TrainmathError

_BIG = 2**80
"""Larger than any figure of a real chip (bytes, FLOP/s): a bound, so a 1e300 peak is refused too."""


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v <= _BIG


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= _BIG


def _fraction(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= 1


def _text(v) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 10_000


# field → (rule, what is allowed)
GPU_RULES = {
    "name": (_text, "a non-empty string"),
    "aliases": (lambda v: isinstance(v, list) and len(v) <= 100 and all(_text(a) for a in v),
                "a list of non-empty strings"),
    "memory_bytes": (_positive_int, "a positive integer of bytes"),
    "memory_type": (_text, "a non-empty string"),
    "bf16_flops_per_s": (_positive_int, "a positive integer of FLOP/s"),
    "fp8_flops_per_s": (lambda v: v is None or _positive_int(v), "a positive integer of FLOP/s or null"),
    "hbm_bytes_per_s": (_positive_int, "a positive integer of bytes/s"),
    "interconnect": (_text, "a non-empty string"),
    "interconnect_bidirectional_bytes_per_s": (_positive_int, "a positive integer of bytes/s"),
    "source": (_text, "a non-empty string"),
    "generation": (_text, "a non-empty string"),
    "gpus_per_node": (lambda v: _positive_int(v) and v <= 2**20, "an integer in 1..1,048,576"),
    "nvlink_generation": (lambda v: v is None or (_positive_int(v) and v <= 100), "a positive integer or null"),
    "nvlink_sharp": (lambda v: isinstance(v, bool), "true or false"),
    "intra_node_latency_s": (lambda v: _positive(v) and v <= 1, "a finite number of seconds in (0, 1]"),
    "nics_per_gpu": (lambda v: _positive(v) and v <= 1024, "a finite number in (0, 1024]"),
    "nic_gbps": (lambda v: _positive(v) and v <= 1e9, "a finite number of Gb/s in (0, 1e9]"),
    "inter_node_latency_s": (lambda v: _positive(v) and v <= 1, "a finite number of seconds in (0, 1]"),
    "topology_source": (_text, "a non-empty string"),
}

EFFICIENCY_RULES = {
    "gemm_peak_fraction": (_fraction, "a fraction in (0, 1]"),
    "gemm_half_dim": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                      and 0 <= v <= 2**40, "a finite number in [0, 2**40]"),
    "attention_peak_fraction": (_fraction, "a fraction in (0, 1]"),
    "hbm_fraction": (_fraction, "a fraction in (0, 1]"),
    "link_fraction": (_fraction, "a fraction in (0, 1]"),
    "elementwise_bytes_per_token_per_hidden": (lambda v: _positive(v) and v <= 2**20, "a finite number in "
                                               "(0, 1,048,576]"),
    "how": (_text, "a non-empty string"),
}


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def json_type(v) -> str:
    """The JSON name of a parsed value's type (object, array, string, number, boolean, null)."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


def check_document(data, where: str) -> None:
    """The document's shape: an object, ``gpus`` a list of objects, ``generations`` an object of objects."""
    if not isinstance(data, dict):
        raise TrainmathError(f"{where}: expected a JSON object with 'gpus' and/or 'generations', "
                             f"got a JSON {json_type(data)}")
    if not isinstance(data.get("gpus", []), list):
        raise TrainmathError(f"{where}: 'gpus' must be a list of GPU objects, got a JSON "
                             f"{json_type(data['gpus'])}")
    if not isinstance(data.get("generations", {}), dict):
        raise TrainmathError(f"{where}: 'generations' must be an object of generation name → efficiency object, "
                             f"got a JSON {json_type(data['generations'])}")
    for i, g in enumerate(data.get("gpus", [])):
        if not isinstance(g, dict):
            raise TrainmathError(f"{where}: GPU entry {i} must be an object, got a JSON {json_type(g)}")
    for name, e in data.get("generations", {}).items():
        if not isinstance(e, dict):
            raise TrainmathError(f"{where}: generation {name!r} must be an object, got a JSON {json_type(e)}")


def check_values(entry: dict, rules: dict, label: str, where: str) -> None:
    """Every present field of ``entry`` against its rule (missing fields are reported by the caller)."""
    for key, (ok, allowed) in rules.items():
        if key in entry and not ok(entry[key]):
            raise TrainmathError(f"{where}: {label}: {key} must be {allowed}, got {_show(entry[key])}")
