"""Small safetensors checkpoints written from a config's ledger, and hand-made headers for broken files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from trainmath.families import spec_from_config
from trainmath.model.spec import named_tensors

TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 128, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "hidden_act": "silu",
}


def ledger_shapes(config: dict, *, include_tied: bool = False, include_extras: bool = False) -> dict:
    spec = spec_from_config(config, name="test", source="test")
    return {n: tuple(s) for n, s, _ in named_tensors(spec, include_tied=include_tied, include_extras=include_extras)}


def write_checkpoint(root: Path, config: dict, *, shards: int = 2, shapes: dict | None = None,
                     drop=(), add: dict | None = None, reshape: dict | None = None, dtype=np.float16,
                     index: bool = True, write_config: bool = True) -> Path:
    """config.json + ``shards`` safetensors files (+ model.safetensors.index.json) holding zeros of the ledger's
    shapes, edited by ``drop`` (names), ``add`` (name → shape) and ``reshape`` (name → shape)."""
    root.mkdir(parents=True, exist_ok=True)
    shapes = dict(shapes or ledger_shapes(config))
    for n in drop:
        del shapes[n]
    shapes.update(reshape or {})
    shapes.update(add or {})
    names = list(shapes)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        part = {n: np.zeros(shapes[n], dtype=dtype) for n in names[k * per:(k + 1) * per]}
        save_file(part, str(root / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
        total += sum(a.nbytes for a in part.values())
    if index:
        (root / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    if write_config:
        (root / "config.json").write_text(json.dumps(config))
    return root


def write_raw(path: Path, tensors: dict, *, data: bytes | None = None, pad: int = 0) -> int:
    """A safetensors file from a header dict {name: (dtype, shape, nbytes)}; data defaults to zeros of the right
    length (pass b"" for a file cut after its header). Returns the header length."""
    header, off = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + (bytes(off) if data is None else data))
    return len(raw)
