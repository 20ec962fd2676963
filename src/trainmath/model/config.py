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
from dataclasses import dataclass, field
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


# Integers longer than this are refused while parsing (Python's int() refuses 4,300 digits with a ValueError,
# and no real dimension has more than a dozen).
_MAX_INT_DIGITS = 40


class HugeNumber(str):
    """An integer literal of more than 40 digits, kept as text so that it can be named in an error."""

    def __repr__(self) -> str:
        return f"an integer of {len(self.lstrip('-')):,} digits"


def _parse_int(text: str) -> int | HugeNumber:
    return int(text) if len(text) <= _MAX_INT_DIGITS else HugeNumber(text)


def parse_config_text(text: str, source: str) -> dict[str, object]:
    """Parse config JSON; ``Infinity``/``NaN`` literals (as published for Nemotron-H) are accepted as floats,
    integers of more than 40 digits become ``HugeNumber`` (refused where a number is read), and nesting too
    deep for the parser is one error."""
    try:
        data = json.loads(text, parse_int=_parse_int,
                          parse_constant=lambda c: {"Infinity": math.inf, "-Infinity": -math.inf}.get(c, math.nan))
    except json.JSONDecodeError as e:
        raise TrainmathError(f"{source} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise TrainmathError(f"{source} is nested too deeply to be a config.json (arrays or objects inside each "
                             f"other hundreds of levels deep)") from None
    if not isinstance(data, dict):
        raise TrainmathError(f"{source} must hold a JSON object (a config.json), not {type(data).__name__}")
    return data


# Bounds tighter than 2**40 where a count is expanded into objects (layers, one per-expert tensor name each):
# a config claiming 1e8 layers is refused instead of building a 1e8-tuple. The largest published models have
# ~130 layers and 512 experts.
MAX_LAYERS = 100_000
MAX_EXPERTS = 65_536
_MAXIMA = {"num_hidden_layers": MAX_LAYERS, "n_layer": MAX_LAYERS, "num_experts": MAX_EXPERTS,
           "num_local_experts": MAX_EXPERTS, "n_routed_experts": MAX_EXPERTS}


def show(value: object) -> str:
    """A config value as quoted in an error: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:50] + f"... ({len(text):,} characters)"


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
        self.defaulted: dict[str, object] = {}
        """Keys the config lacks whose value was taken from transformers' class defaults, with that value."""

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
                self.defaulted.setdefault(name, self.defaults[name])
                return self.defaults[name]
        if default is _MISSING:
            self.missing.append(key)
            return None
        return default

    def has(self, key: str) -> bool:
        return key in self.data or key in self.defaults

    def int(self, key: str, default: object = _MISSING, *, minimum: int = 1, maximum: int | None = None) -> int:
        """A positive (or ≥ minimum) integer that fits a real model (at most 2**40; layers and experts at most
        ``MAX_LAYERS``, ``MAX_EXPERTS``); records a problem and returns a value in range otherwise (so that
        building can go on and every problem is reported at once)."""
        maximum = maximum if maximum is not None else _MAXIMA.get(key, 2**40)
        value = self.get(key, default)
        if value is None:
            return 1 if default is _MISSING else default
        fallback = max(1, minimum)
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or (isinstance(value, float) and (not math.isfinite(value) or value != int(value)))):
            self.invalid.append(f"{key} must be an integer in {minimum}..{maximum:,}, got {show(value)}")
            return fallback
        value = int(value)
        if not minimum <= value <= maximum:
            self.invalid.append(f"{key} must be an integer in {minimum}..{maximum:,}, got {show(value)}")
            return fallback
        return value

    def opt_int(self, key: str, *, minimum: int = 1) -> int | None:
        """An optional integer: None when absent or null."""
        value = self.get(key, None)
        return None if value is None else self.int(key, minimum=minimum)

    def window(self, key: str = "sliding_window") -> int | None:
        """An attention window: a positive integer of tokens, or None (absent or null) for none."""
        value = self.get(key, None)
        if value is None:
            return None
        if (isinstance(value, bool) or not isinstance(value, int | float) or value != value
                or (isinstance(value, float) and (not math.isfinite(value) or value != int(value))) or value < 1
                or value > 2**40):
            self.invalid.append(f"{key} must be a positive integer (tokens) or null, got {show(value)}")
            return None
        return int(value)

    def bool(self, key: str, default: object = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            if value is None:
                return False
            self.invalid.append(f"{key} must be true or false, got {show(value)}")
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


# Keys trainmath itself reads or writes beside transformers' fields: the catalog's provenance, and legacy names
# the families accept (NVIDIA's mamba_chunk_size, GPT-2's n_ctx).
_OWN_KEYS = frozenset({"_source", "_reconstruction", "mamba_chunk_size", "n_ctx", "layers_block_type"})


@cache
def known_keys(model_type: str) -> frozenset[str]:
    """Keys a config.json of ``model_type`` may hold: its config class's fields, PretrainedConfig's common keys,
    attribute-map aliases and the fields of every other supported family (a key of another family is not a typo)."""
    data = _defaults_file()
    keys = set(data.get("_common_keys", ())) | _OWN_KEYS
    for fields in data.get("_fields", {}).values():
        keys |= set(fields)
    for amap in data.get("_attribute_map", {}).values():
        keys |= set(amap) | set(amap.values())
    for table in transformers_defaults().values():
        keys |= set(table)
    return frozenset(keys)


def _one_edit(a: str, b: str) -> bool:
    """True when ``a`` becomes ``b`` by one insertion, deletion, substitution or swap of adjacent characters."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i in range(len(short)) if short[i] != long_[i]), len(short))
    return short[i:] == long_[i + 1:]


def suspect_keys(data: dict[str, object], model_type: str) -> dict[str, str]:
    """Unknown keys one edit away from a known one: {typo: the known key}, e.g. num_hiden_layers →
    num_hidden_layers. Preference goes to the model type's own fields."""
    known = known_keys(model_type)
    own = (set(_defaults_file().get("_fields", {}).get(model_type, ()))
           | set(transformers_defaults().get(model_type, {})))
    out: dict[str, str] = {}
    for key in data:
        if not isinstance(key, str) or key in known or len(key) > 100:
            continue
        near = sorted((k for k in known if _one_edit(key, k)), key=lambda k: (k not in own, k))
        if near:
            out[key] = near[0]
    return out


@dataclass(frozen=True, kw_only=True)
class ConfigReport:
    """How a config was read: keys taken from transformers' defaults because the config lacks them, and keys
    that look misspelt. Shown with every result (``--strict`` makes either an error)."""

    model_type: str
    defaulted: dict = field(default_factory=dict)
    """{key: value} of every key the result read that the config lacks (transformers' class default)."""
    suspects: dict = field(default_factory=dict)
    """{unknown key: the known key one edit away}."""

    def to_dict(self) -> dict[str, object]:
        return {"defaults_used": dict(self.defaulted), "unknown_keys": dict(self.suspects)}

    def lines(self) -> list[str]:
        """Human lines: a ``warning:`` per suspect key and one ``defaults:`` line."""
        out = [f"warning: unknown config key {k}: did you mean {v}? (ignored)" for k, v in self.suspects.items()]
        if self.defaulted:
            out.append(f"defaults: not in the config, taken from transformers' {self.model_type} defaults: "
                       + ", ".join(f"{k}={show(v)}" for k, v in self.defaulted.items()))
        return out

    def strict_problems(self) -> list[str]:
        """What ``--strict`` refuses, one clause each."""
        out = [f"unknown key {k} (did you mean {v}?)" for k, v in self.suspects.items()]
        if self.defaulted:
            out.append("keys missing from the config (transformers' defaults would be used): "
                       + ", ".join(self.defaulted))
        return out
