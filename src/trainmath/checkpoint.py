"""Compare a safetensors checkpoint with the ledger of its config, tensor by tensor, reading headers only.

An impure edge (it reads files and, for Hub ids, the network), standard library only. A safetensors file is
8 bytes (little-endian u64 N) + N bytes of UTF-8 JSON ``{name: {dtype, shape, data_offsets}, "__metadata__": {}}``
+ the tensor data (https://huggingface.co/docs/safetensors/index#format). Only the first 8 + N bytes are read;
the data region is never touched (its length is checked with ``os.stat``). A ``model.safetensors.index.json``
gives ``weight_map`` (name → shard file) and ``metadata.total_size`` (bytes of tensor data, headers excluded).

Conventions, stated in the report:
- the ledger is ``named_tensors(spec, include_extras=True)``; tensors transformers does not build
  (``spec.extras``: DeepSeek-V3's MTP layer, router correction biases) are matched in their own section and
  never added to either total;
- a tied lm_head may or may not be stored; stored, it is a copy of embed_tokens and is not counted;
- quantised storage (MXFP4 ``*_blocks``/``*_scales``, FP8 ``weight_scale_inv``, packed ints) is a mismatch of its
  own kind: its tensors are listed, scale tensors are not counted, and a quantised weight stored under another
  name is left out of both totals (the report says how many ledger parameters that leaves out).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

from trainmath.arith import numel
from trainmath.errors import TrainmathError
from trainmath.model.spec import ModelSpec, named_tensors

# Bits per element of every safetensors dtype (safetensors 0.6+ adds sub-byte floats F4/F6 and F8_E8M0).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
    "C64": 64,
}
INT_DTYPES = ("U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64")
# --dtype names → safetensors dtype, for deriving parameters from an index's total_size.
DTYPE_ALIASES = {"bf16": "BF16", "fp16": "F16", "f16": "F16", "fp32": "F32", "f32": "F32", "fp8": "F8_E4M3",
                 "f8": "F8_E4M3", "fp64": "F64"}
MAX_HEADER_BYTES = 100_000_000  # safetensors refuses larger headers (its N_MAX_HEADER)
# Tensors that quantised checkpoints store beside or instead of a weight: suffix → the ledger name's suffix.
QUANT_SUFFIXES = (
    ("_blocks", ""), ("_scales", ""),  # MXFP4 (gpt-oss): gate_up_proj_blocks (U8, 2 values/byte) + _scales
    (".weight_scale_inv", ".weight"), (".weight_scale_2", ".weight"), (".weight_scale", ".weight"),
    (".input_scale", ".weight"), (".weight_packed", ".weight"), (".weight_shape", ".weight"),
    (".qweight", ".weight"), (".qzeros", ".weight"), (".scales", ".weight"), (".g_idx", ".weight"),
    (".biases", ".weight"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class StoredTensor:
    """One tensor as a safetensors header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str

    @property
    def numel(self) -> int:
        return numel(self.shape)


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint:
    """What was read: tensors with shapes (from headers) or, for an index alone, names only."""

    source: str
    files: tuple[str, ...]
    names: tuple[str, ...]
    tensors: dict[str, StoredTensor] | None
    """None when only an index was read (no shard beside it): names are known, shapes are not."""
    index_total_size: int | None = None
    config_dir: str | None = None
    """Where a config.json would sit beside the checkpoint; None for Hub ids."""
    hub_id: str | None = None
    problems: tuple[str, ...] = ()
    """Defects found while reading (truncated data, index and headers disagreeing): each is a mismatch."""


def _bad(path: object, why: str) -> TrainmathError:
    return TrainmathError(f"{path}: {why}")


def _entry(path: object, name: str, info: object, file: str) -> StoredTensor:
    """Validate one header entry: dtype known, shape non-negative ints, data_offsets consistent with both."""
    if not isinstance(info, dict):
        raise _bad(path, f"header entry {name!r} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r} (known: {', '.join(DTYPE_BITS)})")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
        raise _bad(path, f"tensor {name!r} has invalid shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise _bad(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    t = StoredTensor(name=name, dtype=dtype, shape=tuple(shape), nbytes=offsets[1] - offsets[0], file=file)
    want = -(-t.numel * DTYPE_BITS[dtype] // 8)  # ceil: sub-byte dtypes pad the last byte
    if t.nbytes != want:
        raise _bad(path, f"tensor {name!r}: data_offsets span {t.nbytes} bytes but {dtype} {list(shape)} "
                         f"needs {want}")
    return t


def _open_regular(path: Path):
    """Open ``path`` for reading only if it is a regular file: a FIFO, socket or device named ``*.safetensors``
    would block ``open`` (a FIFO waits for a writer) or never end, so it is opened non-blocking, checked, refused."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a directory" if stat.S_ISDIR(mode)
                    else "not a regular file")
            raise _bad(path, f"is {kind}, not a regular file")
    finally:
        os.close(fd)
    return open(path, "rb")  # a regular file: opened again in the ordinary (buffered, blocking) way


def _clause(e: Exception) -> str:
    """An exception's first line, cut at a word (never mid-word) past 100 characters."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text if len(text) <= 100 else text[:100].rsplit(" ", 1)[0] + " ..."


def _int(text: str) -> int:
    if len(text) > 40:  # Python's int() refuses 4,300 digits; no shape, offset or size has 40
        raise ValueError(f"an integer of {len(text.lstrip('-')):,} digits")
    return int(text)


def _loads(raw: str | bytes):
    """json.loads that turns nesting too deep for the parser, and integers of more than 40 digits, into a
    ValueError like any other bad JSON."""
    try:
        return json.loads(raw, parse_int=_int)
    except RecursionError:
        raise ValueError("nested too deeply (arrays or objects hundreds of levels inside each other)") from None


def read_header(path: str | Path) -> tuple[dict[str, StoredTensor], dict, list[str]]:
    """Tensors, ``__metadata__`` and problems of one safetensors file, reading only its 8 + N header bytes."""
    path = Path(path)
    try:
        with _open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise _bad(path, f"not a safetensors file: {size} bytes, shorter than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise _bad(path, f"not a safetensors file or truncated: header length {n:,} bytes but the file "
                                 f"has {size:,} bytes")
            raw = f.read(n)
    except OSError as e:
        raise _bad(path, f"cannot read: {e.strerror or e}") from None
    try:
        header = _loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(path, f"header is not valid UTF-8 JSON ({_clause(e)})") from None
    if not isinstance(header, dict):
        raise _bad(path, f"header is a JSON {type(header).__name__}, not an object")
    meta = header.pop("__metadata__", None) or {}
    tensors = {name: _entry(path, name, info, path.name) for name, info in header.items()}
    problems = []
    data_end = 8 + n + max((info["data_offsets"][1] for info in header.values()), default=0)
    if data_end > size:  # os.fstat only: the data itself is never read
        problems.append(f"{path.name} is truncated: its header needs {data_end:,} bytes, the file has {size:,}")
    return tensors, meta, problems


def _read_index(path: Path) -> tuple[dict[str, str], int | None]:
    try:
        with _open_regular(path) as f:
            data = _loads(f.read(MAX_HEADER_BYTES + 1).decode("utf-8"))
    except OSError as e:
        raise _bad(path, f"cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(path, f"not a JSON index ({_clause(e)})") from None
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if wm is None and isinstance(data, dict) and "model_type" in data:
        raise _bad(path, "this is a model config, not a safetensors index; pass it with --config")
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise _bad(path, "not a safetensors index: no weight_map object of tensor name → file name")
    total = (data.get("metadata") or {}).get("total_size")
    if total is not None and (type(total) is not int or total < 0):
        raise _bad(path, f"metadata.total_size is {total!r}, not a byte count")
    return wm, total


def _merge(found: dict[str, StoredTensor], more: dict[str, StoredTensor]) -> None:
    for name, t in more.items():
        if name in found:
            raise TrainmathError(f"tensor {name!r} is stored twice: in {found[name].file} and {t.file}")
        found[name] = t


def _from_index(path: Path) -> Checkpoint:
    wm, total = _read_index(path)
    shards = sorted(set(wm.values()))
    present = [s for s in shards if (path.parent / s).is_file()]
    base = dict(source=str(path), index_total_size=total, config_dir=str(path.parent))
    if not present:  # the index alone: names and total_size, no shapes
        return Checkpoint(files=(str(path),), names=tuple(wm), tensors=None, **base)
    if len(present) < len(shards):
        absent = [s for s in shards if s not in present]
        raise _bad(path, f"{len(absent)} of {len(shards)} shard files are missing beside the index "
                         f"(first: {absent[0]}); pass all of them, or the index alone")
    found: dict[str, StoredTensor] = {}
    problems: list[str] = []
    for s in shards:
        tensors, _, probs = read_header(path.parent / s)
        _merge(found, tensors)
        problems += probs
    for name, s in wm.items():
        if name not in found or found[name].file != Path(s).name:
            where = found[name].file if name in found else "no shard"
            problems.append(f"index maps {name} to {s}, but it is in {where}")
    problems += [f"{name} is in {found[name].file} but not in the index" for name in found if name not in wm]
    stored = sum(t.nbytes for t in found.values())
    if total is not None and total != stored:
        problems.append(f"index total_size {total:,} bytes ≠ {stored:,} bytes of tensors in the shard headers")
    return Checkpoint(files=tuple(str(path.parent / s) for s in shards), names=tuple(found), tensors=found,
                      problems=tuple(problems), **base)


def looks_like_hub_id(arg: str) -> bool:
    return (arg.count("/") == 1 and not arg.startswith((".", "/", "~")) and not arg.endswith((".json", ".safetensors"))
            and not Path(arg).exists())


def load_checkpoint(paths: list[str]) -> Checkpoint:
    """Read an index (with its shards when present), safetensors files, a directory, or a Hub id's headers."""
    if len(paths) == 1 and looks_like_hub_id(paths[0]):
        return from_hub(paths[0])
    files: list[Path] = []
    index: Path | None = None
    for arg in paths:
        p = Path(arg).expanduser()
        if p.is_dir():
            idx = sorted(p.glob("*.safetensors.index.json"))
            if idx:
                index = next((i for i in idx if i.name == "model.safetensors.index.json"), idx[0])
            else:
                st = sorted(p.glob("*.safetensors"))
                if not st:
                    raise _bad(arg, "directory holds no *.safetensors.index.json and no *.safetensors file")
                files += st
        elif p.is_file():
            if p.name.endswith(".json"):
                index = p if index is None else index
                if index != p:
                    raise TrainmathError(f"pass one index at a time (got {index} and {p})")
            else:
                files.append(p)
        elif p.exists():
            raise _bad(arg, "is not a regular file or a directory (a FIFO, socket or device?)")
        else:
            raise _bad(arg, "no such file or directory")
    if index is not None:
        if files:
            raise TrainmathError(f"pass an index or safetensors files, not both (index {index}, file {files[0]})")
        return _from_index(index)
    found: dict[str, StoredTensor] = {}
    problems: list[str] = []
    for f in files:
        tensors, _, probs = read_header(f)
        _merge(found, tensors)
        problems += probs
    src = str(files[0]) if len(files) == 1 else f"{len(files)} safetensors files in {files[0].parent}"
    return Checkpoint(source=src, files=tuple(map(str, files)), names=tuple(found), tensors=found,
                      config_dir=str(files[0].parent), problems=tuple(problems))


def from_hub(repo_id: str) -> Checkpoint:
    """Headers of a Hub repo via ``huggingface_hub.get_safetensors_metadata`` (HTTP range reads, no data)."""
    from trainmath.sources import call_hub

    meta = call_hub("get_safetensors_metadata", f"{repo_id!r} is no local path, and its safetensors headers could "
                    f"not be read from the Hugging Face Hub; download its model.safetensors.index.json or "
                    f".safetensors files and pass their paths instead", repo_id)
    found: dict[str, StoredTensor] = {}
    for fname, fm in sorted(meta.files_metadata.items()):
        _merge(found, {name: _entry(f"hub:{repo_id}/{fname}", name, {"dtype": ti.dtype, "shape": list(ti.shape),
                                                                     "data_offsets": list(ti.data_offsets)}, fname)
                       for name, ti in fm.tensors.items()})
    total = (meta.metadata or {}).get("total_size") if meta.sharded else None
    problems = []
    stored = sum(t.nbytes for t in found.values())
    if isinstance(total, int) and total != stored:
        problems.append(f"index total_size {total:,} bytes ≠ {stored:,} bytes of tensors in the shard headers")
    return Checkpoint(source=f"hub:{repo_id}", files=tuple(sorted(meta.files_metadata)), names=tuple(found),
                      tensors=found, index_total_size=total if isinstance(total, int) else None, hub_id=repo_id,
                      problems=tuple(problems))


# ---- comparison with the ledger -------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class ExtrasCheck:
    """One ``spec.extras`` group against the checkpoint. Present in full or absent: both fine; partly: mismatch."""

    label: str
    why: str
    expected: int
    found: int
    missing: tuple[str, ...]
    shape_mismatches: tuple[dict, ...]
    params_expected: int
    params_found: int
    """Parameters of the group's tensors found in the checkpoint (header shapes, else ledger shapes)."""

    @property
    def ok(self) -> bool:
        return not self.shape_mismatches and self.found in (0, self.expected)


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckReport:
    """Every expected tensor falls in exactly one of matched / missing / shape_mismatches / quantised."""

    model: str
    model_type: str
    checkpoint: str
    files: tuple[str, ...]
    shapes_checked: bool
    params_from: str
    expected: int
    matched: int
    missing: tuple[str, ...]
    unexpected: tuple[dict, ...]
    shape_mismatches: tuple[dict, ...]
    quantised: tuple[dict, ...]
    extras: tuple[ExtrasCheck, ...]
    lm_head: str
    ledger_params: int
    quantised_left_out_params: int
    """Ledger parameters of quantised tensors whose stored form cannot be counted as parameters (packed, renamed):
    left out of both totals."""
    checkpoint_params: int | None
    """Unique parameters in the checkpoint: no extras, no tied copy, no quantisation scales; None if unknown."""
    index_total_size: int | None
    params_by_dtype: dict[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def compared_ledger_params(self) -> int:
        return self.ledger_params - self.quantised_left_out_params

    @property
    def params_difference(self) -> int | None:
        return None if self.checkpoint_params is None else self.checkpoint_params - self.compared_ledger_params

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.shape_mismatches or self.quantised or self.problems
                    or self.params_difference or not all(e.ok for e in self.extras))

    @property
    def verdict(self) -> str:
        if self.ok:
            return "match"
        parts = [f"{n} {what}" for n, what in (
            (len(self.missing), "missing"), (len(self.unexpected), "unexpected"),
            (len(self.shape_mismatches), "shape mismatches"), (len(self.quantised), "stored quantised"),
            (sum(not e.ok for e in self.extras), "extras groups incomplete"), (len(self.problems), "file problems"),
        ) if n]
        if self.params_difference:
            parts.append(f"params differ by {self.params_difference:+,}")
        return "mismatch: " + ", ".join(parts)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "extras"}
        out.update(files=list(self.files), missing=list(self.missing), unexpected=list(self.unexpected),
                   shape_mismatches=list(self.shape_mismatches), quantised=list(self.quantised),
                   problems=list(self.problems), notes=list(self.notes),
                   extras=[{k: getattr(e, k) for k in e.__slots__} | {"ok": e.ok} for e in self.extras],
                   compared_ledger_params=self.compared_ledger_params, params_difference=self.params_difference,
                   ok=self.ok, verdict=self.verdict)
        return out


def _quant_base(name: str, known) -> str | None:
    for suffix, repl in QUANT_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)] + repl
            return base if base in known else None
    return None


# Expected tensor names are expanded one by one (experts × layers); a config claiming more than this is refused
# before they are (the largest published checkpoints hold ~100,000 tensors).
MAX_EXPECTED_TENSORS = 5_000_000


def _check_size(spec: ModelSpec) -> None:
    per_layer = {id(layer): sum(t.experts if t.experts and "{e}" in t.name else 1 for t in layer.tensors)
                 for layer in spec.layers}
    n = len(spec.pre) + len(spec.post) + sum(per_layer[id(layer)] for layer in spec.layers)
    if n > MAX_EXPECTED_TENSORS:
        raise TrainmathError(f"{spec.name}: its config implies {n:,} checkpoint tensors; check-checkpoint compares "
                             f"at most {MAX_EXPECTED_TENSORS:,}")


def _desc(t: StoredTensor) -> dict:
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def compare(spec: ModelSpec, ckpt: Checkpoint, *, ledger_params: int, dtype: str = "bf16") -> CheckReport:
    """Match ``ckpt`` against ``named_tensors(spec)`` by name and shape, and its parameters against the ledger.

    ``dtype`` is used only when the index alone was read: total_size ÷ bytes per element = parameters."""
    st = DTYPE_ALIASES.get(dtype.lower(), dtype.upper())
    if st not in DTYPE_BITS or DTYPE_BITS[st] % 8:
        raise TrainmathError(f"--dtype {dtype!r} is not a whole-byte dtype; use one of "
                             f"{', '.join(DTYPE_ALIASES)} or a safetensors dtype such as BF16")
    _check_size(spec)
    main = {n: (tuple(s), t) for n, s, t in named_tensors(spec, include_tied=True)}
    groups = [(e, {n: tuple(s) for n, s, _ in named_tensors(replace(spec, pre=(), layers=(), post=(), extras=(e,)),
                                                               include_extras=True)}) for e in spec.extras]
    known = set(main).union(*(g for _, g in groups))
    stored, tensors = set(ckpt.names), ckpt.tensors
    quant: dict[str, list[str]] = {}
    for name in ckpt.names:
        if name not in known and (base := _quant_base(name, known)) is not None:
            quant.setdefault(base, []).append(name)
    quant_names = {n for v in quant.values() for n in v}

    matched, missing, mism, quantised, notes = 0, [], [], [], list(spec.notes)
    left_out, params, lm_head = 0, 0, "untied: its own tensor"
    for name, (shape, t) in main.items():
        found = tensors.get(name) if tensors is not None else None
        if t.tied:
            if name in stored:
                lm_head = "tied to embed_tokens; stored in the checkpoint as a copy (not counted)"
                if found is not None and found.shape != shape:
                    mism.append({"name": name, "expected": list(shape), "found": list(found.shape),
                                 "dtype": found.dtype})
            else:
                lm_head = "tied to embed_tokens; not stored in the checkpoint (transformers re-ties it on load)"
            continue
        packed = found is not None and found.shape != shape and (found.dtype in INT_DTYPES
                                                                 or DTYPE_BITS[found.dtype] < 8)
        if name in quant or packed:
            parts = ([found] if found is not None else []) + [tensors[q] for q in quant.get(name, ()) if tensors]
            entry = {"name": name, "expected": list(shape), "stored": [_desc(p) for p in parts] or
                     [{"name": q} for q in quant.get(name, ())]}
            if found is not None and found.shape == shape:
                params += found.numel  # an FP8 weight with its scales: a parameter per element
            elif name in stored and tensors is None:
                params += numel(shape)
            else:
                left_out += numel(shape)
                blocks = next((p for p in parts if p.name.endswith("_blocks") and p.dtype == "U8"), None)
                if blocks is not None:  # MXFP4: two 4-bit values per byte
                    entry["logical_params"] = 2 * blocks.numel
            quantised.append(entry)
        elif name not in stored:
            missing.append(name)
        elif found is None:  # index only: the name is there, the shape unknown
            matched += 1
            params += numel(shape)
        elif found.shape != shape:
            mism.append({"name": name, "expected": list(shape), "found": list(found.shape), "dtype": found.dtype})
            params += found.numel
        else:
            matched += 1
            params += found.numel

    for e, names in groups:  # quantised tensors of the extras (an FP8 checkpoint's MTP layer)
        for name in names:
            if name in quant:
                parts = ([tensors[name]] if tensors is not None and name in tensors else []) + (
                    [tensors[q] for q in quant[name]] if tensors is not None else [])
                quantised.append({"name": name, "expected": list(names[name]), "extras": e.label,
                                  "stored": [_desc(p) for p in parts] or [{"name": q} for q in quant[name]]})

    extras = []
    extras_found_params = 0
    for e, names in groups:
        present = [n for n in names if n in stored]
        bad = [{"name": n, "expected": list(names[n]), "found": list(tensors[n].shape), "dtype": tensors[n].dtype}
               for n in present if tensors is not None and tensors[n].shape != names[n]]
        got = sum(tensors[n].numel if tensors is not None else numel(names[n]) for n in present)
        extras_found_params += got
        extras.append(ExtrasCheck(label=e.label, why=e.why, expected=len(names), found=len(present),
                                  missing=tuple(n for n in names if n not in stored) if present else (),
                                  shape_mismatches=tuple(bad), params_expected=sum(map(numel, names.values())),
                                  params_found=got))
    extra_names = set().union(*(g for _, g in groups))
    unexpected = [(_desc(tensors[n]) if tensors is not None else {"name": n}) for n in ckpt.names
                  if n not in main and n not in extra_names and n not in quant_names]

    problems = list(ckpt.problems)
    by_dtype: dict[str, int] = {}
    if tensors is not None:
        params += sum(tensors[u["name"]].numel for u in unexpected)
        for t in tensors.values():
            by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + t.numel
        checkpoint_params = params
        params_from = "safetensors headers (shapes)"
    else:
        width = DTYPE_BITS[st] // 8
        params_from = f"index total_size ÷ {width} bytes (--dtype {dtype}, assumed for every tensor; shapes unread)"
        if ckpt.index_total_size is None:
            checkpoint_params = None
            notes.append("the index has no metadata.total_size: parameter totals not compared")
        else:
            if ckpt.index_total_size % width:
                problems.append(f"index total_size {ckpt.index_total_size:,} bytes is not a multiple of {width} "
                                f"({dtype}): the checkpoint is not all {dtype}; pass --dtype or the shard files")
            tied_copy = sum(numel(s) for n, (s, t) in main.items() if t.tied and n in stored)
            checkpoint_params = ckpt.index_total_size // width - extras_found_params - tied_copy
        if quantised:
            checkpoint_params = None
            notes.append("quantised tensors behind an index alone: bytes are not parameters, totals not compared")
        notes.append("shapes are not checked: only the index was read (pass the shard files beside it to check)")
    return CheckReport(
        model=spec.name, model_type=spec.model_type, checkpoint=ckpt.source, files=ckpt.files,
        shapes_checked=tensors is not None, params_from=params_from, expected=len(main) - sum(
            t.tied for _, t in main.values()), matched=matched, missing=tuple(missing),
        unexpected=tuple(unexpected), shape_mismatches=tuple(mism), quantised=tuple(quantised),
        extras=tuple(extras), lm_head=lm_head, ledger_params=ledger_params, quantised_left_out_params=left_out,
        checkpoint_params=checkpoint_params, index_total_size=ckpt.index_total_size, params_by_dtype=by_dtype,
        problems=tuple(problems), notes=tuple(notes))
