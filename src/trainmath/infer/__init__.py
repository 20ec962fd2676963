"""Inference memory: weights in a serving format, the KV cache (and recurrent state) after a prefill, and what
fits a GPU. Pure: no torch, no I/O beyond the GPU presets' package data.

- ``dtypes``: bits per format and the quantisation-scale conventions (int8 per row, int4 per group, fp8 blocks);
- ``kv``: one function per cache term (attention K/V, MLA latent, Gated DeltaNet and Mamba-2 states);
- ``weights``: weight bytes of each tensor on a tensor-parallel rank;
- ``memory``: the total, and the largest batch / context that fit a GPU.
"""

from trainmath.infer.dtypes import WeightFormat
from trainmath.infer.kv import CacheFormat, cache_tree, kv_bytes_per_token
from trainmath.infer.memory import Fit, InferenceReport, InferenceSetup, infer_memory, max_batch, max_context
from trainmath.infer.weights import weights_tree

__all__ = ["CacheFormat", "Fit", "InferenceReport", "InferenceSetup", "WeightFormat", "cache_tree", "infer_memory",
           "kv_bytes_per_token", "max_batch", "max_context", "weights_tree"]
