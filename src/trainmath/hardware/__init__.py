"""GPU presets: data in ``gpus.json`` (one entry per GPU, each with its datasheet source), loaded into frozen
dataclasses. No number about a GPU lives in code; the conventions (binary memory units, dense FLOP/s without the
sparsity doubling, bidirectional link bandwidth) are stated in the JSON's ``_conventions`` and repeated in the
field docstrings below.

The same file holds, per GPU generation, the efficiency curve the step-time model uses (``generations``: the
achieved fraction of peak as a function of the GEMM shape, and how it was obtained). A user's JSON file with the
same fields (``--hardware FILE``) adds GPUs and generations, or replaces presets of the same name.

Reading a package data file is the one impure thing here; it is done once, lazily, with ``importlib.resources``;
a user's file is read by ``read_hardware_file`` (an I/O edge the CLI calls).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources

from trainmath.errors import TrainmathError


@dataclass(frozen=True, kw_only=True, slots=True)
class GPU:
    """One accelerator as its datasheet describes it, and the node and network it ships in."""

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
    generation: str
    """Architecture (``ampere``, ``hopper``, ...): selects the efficiency curve in ``generations``."""
    gpus_per_node: int
    """GPUs in one scale-up domain (NVLink / fabric): 8 for DGX/HGX servers, 72 for GB200 NVL72."""
    nvlink_generation: int | None
    """NVLink generation inside a node, None for PCIe or a non-NVIDIA fabric."""
    nvlink_sharp: bool
    """The NVSwitch reduces in the switch (NVLink SHARP / NVLS): an all-reduce sends each byte once."""
    intra_node_latency_s: float
    """α of one message inside a node (assumed, NCCL tuning constants' order; see ``_conventions``)."""
    nics_per_gpu: float
    """Scale-out NICs per GPU (0.5: one NIC shared by two GPUs)."""
    nic_gbps: float
    """Line rate of one NIC in Gb/s (1e9 bit/s)."""
    inter_node_latency_s: float
    """α of one message between nodes (assumed, see ``_conventions``)."""
    topology_source: str
    """Where the node and network figures come from."""

    @property
    def interconnect_bytes_per_s(self) -> int:
        """Per-GPU link bandwidth in one direction (half the quoted bidirectional figure): what a ring step uses."""
        return self.interconnect_bidirectional_bytes_per_s // 2

    @property
    def inter_node_bytes_per_s(self) -> float:
        """Per-GPU scale-out bandwidth in one direction: nics_per_gpu · nic_gbps · 1e9 / 8 bytes per second."""
        return self.nics_per_gpu * self.nic_gbps * 1e9 / 8

    def peak_flops_per_s(self, dtype: str = "bf16") -> int:
        """Dense tensor-core peak for ``dtype`` (``bf16`` or ``fp8``); an error when the chip has no such format."""
        peak = {"bf16": self.bf16_flops_per_s, "fp8": self.fp8_flops_per_s}.get(dtype)
        if peak is None:
            raise TrainmathError(f"{self.name} has no dense {dtype} tensor-core peak; use bf16")
        return peak

    def to_dict(self) -> dict:
        return {f: getattr(self, f) if f != "aliases" else list(self.aliases) for f in self.__slots__}


@dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """Achieved fraction of peak, per GPU generation: the step-time model's only calibrated numbers.

    A GEMM (m, k, n) runs at ``gemm_peak_fraction · u(m)·u(k)·u(n)`` of the dense peak, u(d) = d / (d +
    ``gemm_half_dim``): large GEMMs approach the plateau, a dimension near the tile size loses (wave and tile
    quantisation, cuBLAS' measured shape curves); and never faster than its operands stream from memory at
    ``hbm_fraction`` of the HBM bandwidth (roofline). Attention cores (flash kernels) run at
    ``attention_peak_fraction`` of peak; memory-bound work (norms, activations, optimizer) at ``hbm_fraction``
    of the bandwidth; collectives at ``link_fraction`` of each link's bandwidth (NCCL's achieved busbw).
    """

    generation: str
    gemm_peak_fraction: float
    gemm_half_dim: float
    attention_peak_fraction: float
    hbm_fraction: float
    link_fraction: float
    elementwise_bytes_per_token_per_hidden: float
    """Bytes of memory-bound traffic (norms, activation functions, residual adds, dropout, softmax outside flash)
    per token per hidden unit per layer, forward; backward moves twice as much."""
    how: str
    """How the numbers were obtained (the published runs they were fitted to)."""


_GPU_FIELDS = tuple(f.name for f in fields(GPU))
_EFF_FIELDS = tuple(f.name for f in fields(Efficiency) if f.name != "generation")


def _gpus_from(data: dict, where: str) -> tuple[GPU, ...]:
    from trainmath.hardware.check import GPU_RULES, check_document, check_values

    check_document(data, where)
    out = []
    for i, g in enumerate(data.get("gpus", [])):
        label = f"GPU {g['name']!r}" if isinstance(g.get("name"), str) else f"GPU entry {i}"
        check_values(g, GPU_RULES, label, where)
        missing = [f for f in _GPU_FIELDS if f not in g and f != "aliases"]
        unknown = sorted(set(g) - set(_GPU_FIELDS))
        if missing or unknown:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown {', '.join(unknown)}"] if unknown else [])
            raise TrainmathError(f"{where}: {label}: {'; '.join(parts)} (fields: {', '.join(_GPU_FIELDS)})")
        out.append(GPU(**{**g, "aliases": tuple(g.get("aliases", ()))}))
    return tuple(out)


def _generations_from(data: dict, where: str) -> dict[str, Efficiency]:
    from trainmath.hardware.check import EFFICIENCY_RULES, check_document, check_values

    check_document(data, where)
    out = {}
    for name, e in data.get("generations", {}).items():
        check_values(e, EFFICIENCY_RULES, f"generation {name!r}", where)
        missing = [f for f in _EFF_FIELDS if f not in e]
        unknown = sorted(set(e) - set(_EFF_FIELDS))
        if missing or unknown:
            parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
                [f"unknown {', '.join(unknown)}"] if unknown else [])
            raise TrainmathError(f"{where}: generation {name!r}: {'; '.join(parts)}")
        out[name] = Efficiency(generation=name, **{f: e[f] for f in _EFF_FIELDS})
    return out


@dataclass(frozen=True, slots=True)
class Hardware:
    """Every GPU and efficiency curve known: the presets, extended by a user's file."""

    gpus: tuple[GPU, ...]
    generations: dict

    def gpu(self, name: str) -> GPU:
        """The GPU called ``name`` or one of its aliases, case-insensitively, ``_`` and spaces read as ``-``."""
        key = _norm(name)
        for g in self.gpus:
            if key == _norm(g.name) or key in (_norm(a) for a in g.aliases):
                return g
        names = {_norm(n): g.name for g in self.gpus for n in (g.name, *g.aliases)}
        close = difflib.get_close_matches(key, names, n=4, cutoff=0.5)
        close += [k for k in names if key and (key in k or k in key) and k not in close]
        hint = f"did you mean {' or '.join(dict.fromkeys(names[c] for c in close))}? " if close else ""
        raise TrainmathError(f"unknown GPU {name!r}; {hint}known presets: {', '.join(g.name for g in self.gpus)}")

    def efficiency(self, gpu: GPU) -> Efficiency:
        try:
            return self.generations[gpu.generation]
        except KeyError:
            raise TrainmathError(f"GPU {gpu.name}: no efficiency curve for generation {gpu.generation!r}; "
                                 f"known: {', '.join(sorted(self.generations))}") from None

    def extended(self, data: dict, where: str = "hardware file") -> Hardware:
        """These presets plus a user's ``{"gpus": [...], "generations": {...}}`` (same fields); same names replace."""
        from trainmath.hardware.check import check_document

        check_document(data, where)
        if not ({"gpus", "generations"} & set(data)):
            raise TrainmathError(f"{where}: expected a JSON object with 'gpus' and/or 'generations'")
        new = _gpus_from(data, where)
        names = {_norm(g.name) for g in new}
        gpus = tuple(g for g in self.gpus if _norm(g.name) not in names) + new
        gens = {**self.generations, **_generations_from(data, where)}
        for g in new:
            if g.generation not in gens:
                raise TrainmathError(f"{where}: GPU {g.name!r}: generation {g.generation!r} has no efficiency "
                                     f"curve; known: {', '.join(sorted(gens))}")
        return Hardware(gpus, gens)


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@lru_cache(maxsize=1)
def _load() -> tuple[Hardware, dict]:
    data = json.loads(resources.files(__package__).joinpath("gpus.json").read_text(encoding="utf-8"))
    return Hardware(_gpus_from(data, "gpus.json"), _generations_from(data, "gpus.json")), data.get("_conventions", {})


def presets() -> Hardware:
    """The bundled GPUs and efficiency curves."""
    return _load()[0]


def read_hardware_file(path: str) -> Hardware:
    """The presets extended by the JSON file at ``path`` (the CLI's ``--hardware FILE``)."""
    from trainmath.jsonfile import read_json_file

    data = read_json_file(path, "hardware file", max_bytes=1 << 20)
    return presets().extended(data, where=f"hardware file {path!r}")


def all_gpus() -> tuple[GPU, ...]:
    """Every preset, in file order."""
    return presets().gpus


def conventions() -> dict:
    """The units and conventions the preset numbers follow (``_conventions`` in gpus.json)."""
    return dict(_load()[1])


def gpu(name: str) -> GPU:
    """The preset called ``name`` or one of its aliases (case-insensitive)."""
    return presets().gpu(name)
