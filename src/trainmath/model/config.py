"""Reading a Hugging Face ``config.json``: typed getters with transformers' defaults, and one error listing
every problem.

A key absent from a config means what transformers' config class defaults it to (that is how every HF tool reads
it); the defaults live in ``defaults.json`` beside this file, one table per ``model_type``, checked against
transformers' own config classes by a test. A ``ConfigView`` collects all missing or invalid keys and raises
them together, so a user fixes a config in one pass.
"""

from __future__ import annotations

import json
import math
import os
from functools import cache

from trainmath.errors import TrainmathError

_MISSING = object()


@cache
def _defaults_file() -> dict:
    # A plain path, not importlib.resources or pathlib: those imports alone cost ~5 ms of the CLI's start-up.
    with open(os.path.join(os.path.dirname(__file__), "defaults.json")) as f:
        return json.load(f)


@cache
def transformers_defaults() -> dict[str, dict[str, object]]:
    """model_type → {key: default} as transformers' config classes define them (see ``defaults.json``)."""
    return {k: v for k, v in _defaults_file().items() if not k.startswith("_")}


def parse_config_text(text: str, source: str) -> dict[str, object]:
    """Parse config JSON; ``Infinity``/``NaN`` literals (as published for Nemotron-H) are accepted as floats."""
    try:
        data = json.loads(text, parse_constant=lambda c: {"Infinity": math.inf, "-Infinity": -math.inf}.get(c, math.nan))
    except json.JSONDecodeError as e:
        raise TrainmathError(f"{source} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise TrainmathError(f"{source} must hold a JSON object (a config.json), not {type(data).__name__}")
    return data


@cache
def attribute_aliases() -> dict[str, dict[str, tuple[str, ...]]]:
    """model_type → {key: other names of the same setting}, from transformers' ``attribute_map`` (e.g. qwen3_moe
    reads ``num_experts`` and writes ``num_local_experts``; GPT-2's ``n_embd`` is ``hidden_size``)."""
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for mt, amap in _defaults_file().get("_attribute_map", {}).items():
        table: dict[str, tuple[str, ...]] = {}
        for alias, real in amap.items():
            table[alias] = table.get(alias, ()) + (real,)
            table[real] = table.get(real, ()) + (alias,)
        out[mt] = table
    return out


class ConfigView:
    """Typed, defaulted access to one config dict, collecting every problem before raising.

    Use ``int``/``opt_int``/``bool``/``get`` while building a spec, then ``check()`` once: it raises one
    ``TrainmathError`` naming every missing or invalid key with the value found.
    """

    def __init__(self, data: dict[str, object], *, model_type: str, source: str):
        self.data = data
        self.model_type = model_type
        self.source = source
        self.defaults = transformers_defaults().get(model_type, {})
        self.aliases = attribute_aliases().get(model_type, {})
        self.missing: list[str] = []
        self.invalid: list[str] = []

    def get(self, key: str, default: object = _MISSING) -> object:
        """The config's value (under its name or an alias), else transformers' default, else ``default``;
        records a missing key otherwise."""
        if key not in self.data:
            for other in self.aliases.get(key, ()):
                if other in self.data:
                    return self.get(other, default)
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if key in self.data:  # an explicit null means "not set": fine for optional keys (q_lora_rank: null)
            if default is _MISSING:
                self.missing.append(f"{key} (null)")
            return None if default is _MISSING else default
        for name in (key, *self.aliases.get(key, ())):
            if name in self.defaults:
                return self.defaults[name]
        if default is _MISSING:
            self.missing.append(key)
            return None
        return default

    def has(self, key: str) -> bool:
        return key in self.data or key in self.defaults

    def int(self, key: str, default: object = _MISSING, *, minimum: int = 1, maximum: int = 2**40) -> int:
        """A positive (or ≥ minimum) integer that fits a real model; records a problem and returns 1 otherwise."""
        value = self.get(key, default)
        if value is None:
            return 1 if default is _MISSING else default
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            self.invalid.append(f"{key} must be an integer, got {value!r}")
            return 1
        value = int(value)
        if not minimum <= value <= maximum:
            self.invalid.append(f"{key} must be between {minimum} and {maximum:,}, got {value}")
            return max(1, minimum)
        return value

    def opt_int(self, key: str, *, minimum: int = 1) -> int | None:
        """An optional integer: None when absent or null."""
        value = self.get(key, None)
        return None if value is None else self.int(key, minimum=minimum)

    def bool(self, key: str, default: object = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            if value is None:
                return False
            self.invalid.append(f"{key} must be true or false, got {value!r}")
            return False
        return value

    def require(self, condition: bool, message: str) -> None:
        """Record a contradiction between keys (e.g. heads not divisible by KV heads)."""
        if not condition:
            self.invalid.append(message)

    def check(self) -> None:
        """Raise one error listing every missing and invalid key, if any."""
        problems = []
        if self.missing:
            problems.append("missing keys: " + ", ".join(dict.fromkeys(self.missing)))
        problems.extend(dict.fromkeys(self.invalid))
        if problems:
            raise TrainmathError(f"{self.source} ({self.model_type}): " + "; ".join(problems))
