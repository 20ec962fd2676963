"""A model's decoder layers as a repeating pattern of layer types, and the config of a shorter model with the
same pattern: what ``--simulate-layers`` simulates for a model of several layer types.

**The pattern.** The layer types (``ModelSpec.layers``, told apart as ``layer_groups`` does) are read as
``prefix · unit^R · suffix``: a few layers before (DeepSeek-V3's three dense layers, ``first_k_dense_replace``), a
unit of P layers repeated R times (Gemma-2's sliding, full: P = 2; Gemma-3's five sliding and one full: P = 6;
Qwen3-Next's three linear-attention layers and one full: P = 4), and a few layers after (Gemma-3-1B's last two
sliding layers). A model of one type is P = 1 with no prefix or suffix. Of every such reading the one chosen
simulates the fewest layers (``choose``).

**The shorter model** keeps the prefix and the suffix and N repeats of the unit (``Pattern.keep``). Its config is
the original with ``num_hidden_layers`` and every per-layer list of the transformers config (``layer_types``,
Llama-4's ``no_rope_layers``, Nemotron-H's ``layers_block_type``) cut to the kept layers, and every list of layer
indices (``moe_layers``, ``mlp_only_layers``) renumbered (``shrink_config``); the calculator's reading of the cut
config is checked to have the kept layers' types, in order, or the fold refuses.

**Where a layer is.** ``Pattern.position`` names a layer for the segments of the step (``segments.Segments``):
``prefix j`` and ``suffix j`` for those layers; in the repeats, the repeat's place counted from both ends
(``bottom 0``, ``bottom 1``, ``top 1``, ``top 0``, else ``interior``) and, when P > 1, the layer's place in the
unit (``bottom 1 +3``). The fold (``trainmath.verify.fold``) reasons over these names.

torch and transformers are imported inside the functions (``simulate.hf_config``): the calculator never needs them.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.errors import TrainmathError
from trainmath.verify.segments import position_class

INDEX_LISTS = ("moe_layers", "mlp_only_layers")
"""Config keys that list layer indices (renumbered when layers are cut), not one value per layer."""


@dataclass(frozen=True)
class Pattern:
    """``prefix`` layers, a unit of ``period`` layers ``repeats`` times, ``suffix`` layers (module docstring)."""

    types: tuple[str, ...]
    """The type of every layer, in order (``LayerSpec.label``)."""
    prefix: int
    period: int
    repeats: int

    @property
    def suffix(self) -> int:
        return len(self.types) - self.prefix - self.period * self.repeats

    def keep(self, repeats: int) -> list[int]:
        """Indices of the layers of the model with ``repeats`` repeats of the unit."""
        unit_end = self.prefix + self.period * repeats
        return list(range(unit_end)) + list(range(len(self.types) - self.suffix, len(self.types)))

    def shrunk(self, repeats: int) -> Pattern:
        return Pattern(tuple(self.types[i] for i in self.keep(repeats)), self.prefix, self.period, repeats)

    def position(self, i: int) -> str:
        """Where layer ``i`` is (module docstring)."""
        if i < self.prefix:
            return f"prefix {i}"
        if i >= len(self.types) - self.suffix:
            return f"suffix {i - (len(self.types) - self.suffix)}"
        r, offset = divmod(i - self.prefix, self.period)
        where = position_class(r, self.repeats)
        return where if self.period == 1 or where == "interior" else f"{where} +{offset}"

    def describe(self) -> str:
        """The pattern in words: ``(sliding_attention + mlp ×5, full_attention + mlp) ×4 then sliding_attention +
        mlp ×2``."""
        unit = _runs(self.types[self.prefix:self.prefix + self.period])
        parts = [_runs(self.types[:self.prefix])] if self.prefix else []
        parts.append(f"({unit}) ×{self.repeats}" if self.period > 1 else f"{unit} ×{self.repeats}")
        if self.suffix:
            parts.append(_runs(self.types[len(self.types) - self.suffix:]))
        return " then ".join(parts)


def _runs(types) -> str:
    """``a ×3, b``: consecutive equal types counted."""
    out: list[list] = []
    for t in types:
        if out and out[-1][0] == t:
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return ", ".join(t if k == 1 else f"{t} ×{k}" for t, k in out)


def _repeats(types: tuple, start: int, period: int) -> int:
    """How many times the unit ``types[start:start + period]`` repeats from ``start``."""
    k = 0
    while start + (k + 1) * period <= len(types) and all(
            types[start + k * period + j] == types[start + j] for j in range(period)):
        k += 1
    return k


def choose(types: tuple[str, ...], n: int) -> Pattern | None:
    """The reading of ``types`` that simulates the fewest layers with ``n`` and ``n + 1`` repeats, among those with
    more than ``n + 1`` repeats (so that folding saves layers); None if there is none."""
    best = None
    for period in range(1, len(types) // (n + 2) + 1):
        for prefix in range(len(types) - period * (n + 2) + 1):
            r = _repeats(types, prefix, period)
            if r < n + 2:
                continue
            p = Pattern(types, prefix, period, r)
            cost = 2 * (p.prefix + p.suffix) + (2 * n + 1) * period
            if best is None or cost < best[0]:
                best = (cost, p)
    return best[1] if best else None


def shrink_config(config: dict, keep: list[int]) -> dict:
    """``config`` with only the decoder layers ``keep`` (module docstring). Per-layer lists are read from the
    transformers config, where defaults (Gemma-3's ``layer_types`` from ``sliding_window_pattern``) are filled
    in; a nested ``text_config`` (Llama-4) is cut likewise."""
    from trainmath.verify.simulate import hf_config

    cfg = hf_config(config)
    if isinstance(config.get("text_config"), dict):
        cfg = cfg.text_config
        return {**config, "text_config": _cut(config["text_config"], cfg.to_dict(), cfg.num_hidden_layers, keep)}
    return _cut(config, cfg.to_dict(), cfg.num_hidden_layers, keep)


def _cut(data: dict, filled: dict, layers: int, keep: list[int]) -> dict:
    out = dict(data)
    for key, value in {**filled, **data}.items():
        if key in INDEX_LISTS and isinstance(value, list):
            old = set(value)
            out[key] = [new for new, i in enumerate(keep) if i in old]
        elif isinstance(value, (list, str)) and len(value) == layers and key not in ("model_type", "hidden_act"):
            cut = [value[i] for i in keep]
            out[key] = "".join(cut) if isinstance(value, str) else cut
    out["num_hidden_layers"] = len(keep)
    return out


def layer_types(spec) -> tuple[str, ...]:
    """The type of every decoder layer of ``spec``: its label, numbered where two types share one."""
    names = {}
    for k, (layer, _) in enumerate(spec.layer_groups()):
        names[layer] = layer.label if sum(1 for other in names if other.label == layer.label) == 0 else \
            f"{layer.label} ({k + 1})"
    return tuple(names[layer] for layer in spec.layers)


def check_shrunk(config: dict, pattern: Pattern, repeats: int, name: str) -> dict:
    """The config of ``pattern`` with ``repeats`` repeats, checked to read back as the kept layers' types."""
    from trainmath.families import spec_from_config

    keep = pattern.keep(repeats)
    shrunk = shrink_config(config, keep)
    got = layer_types(spec_from_config(shrunk, name=name, source="--simulate-layers"))
    want = pattern.shrunk(repeats).types
    if got != want:
        raise TrainmathError(f"--simulate-layers: {name} cut to {len(keep)} layers reads as other layer types than "
                             f"its layers {keep[0]}..{keep[-1]}; run --simulate without it")
    return shrunk
