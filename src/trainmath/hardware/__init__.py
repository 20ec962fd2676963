"""GPU presets: data in ``gpus.json`` (one entry per GPU, each with its datasheet source), loaded into frozen
dataclasses. No number about a GPU lives in code; the conventions (binary memory units, dense FLOP/s without the
sparsity doubling, bidirectional link bandwidth) are stated in the JSON's ``_conventions`` and repeated in the
field docstrings below.

Reading a package data file is the one impure thing here; it is done once, lazily, with ``importlib.resources``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from trainmath.errors import TrainmathError


@dataclass(frozen=True, kw_only=True, slots=True)
class GPU:
    """One accelerator as its datasheet describes it."""

    name: str
    """Canonical preset name (``H100-SXM-80GB``)."""
    aliases: tuple[str, ...]
    """Other names accepted on the command line (case-insensitive)."""
    memory_bytes: int
    """Device memory: the datasheet's 'GB' read as GiB (HBM/GDDR are binary-sized); the driver shows a little less."""
    memory_type: str
    bf16_flops_per_s: int
    """Dense BF16 tensor-core peak (no 2:4 sparsity doubling)."""
    fp8_flops_per_s: int | None
    """Dense FP8 tensor-core peak, or None when the chip has no FP8 (A100)."""
    hbm_bytes_per_s: int
    """Peak device-memory bandwidth (decimal units as quoted)."""
    interconnect: str
    """Name of the GPU-to-GPU link."""
    interconnect_bidirectional_bytes_per_s: int
    """Per-GPU link bandwidth as vendors quote it: both directions of all links summed."""
    source: str
    """Datasheet the numbers come from."""

    @property
    def interconnect_bytes_per_s(self) -> int:
        """Per-GPU link bandwidth in one direction (half the quoted bidirectional figure): what a ring step uses."""
        return self.interconnect_bidirectional_bytes_per_s // 2

    def to_dict(self) -> dict:
        return {f: getattr(self, f) if f != "aliases" else list(self.aliases) for f in self.__slots__}


@lru_cache(maxsize=1)
def _load() -> tuple[tuple[GPU, ...], dict]:
    data = json.loads(resources.files(__package__).joinpath("gpus.json").read_text(encoding="utf-8"))
    gpus = tuple(GPU(**{**g, "aliases": tuple(g.get("aliases", ()))}) for g in data["gpus"])
    return gpus, data.get("_conventions", {})


def all_gpus() -> tuple[GPU, ...]:
    """Every preset, in file order."""
    return _load()[0]


def conventions() -> dict:
    """The units and conventions the preset numbers follow (``_conventions`` in gpus.json)."""
    return dict(_load()[1])


def gpu(name: str) -> GPU:
    """The preset called ``name`` or one of its aliases (case-insensitive)."""
    key = name.strip().lower()
    for g in all_gpus():
        if key == g.name.lower() or key in (a.lower() for a in g.aliases):
            return g
    known = ", ".join(g.name for g in all_gpus())
    raise TrainmathError(f"unknown GPU {name!r}; known presets: {known}")
