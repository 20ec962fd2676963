"""Storage formats for serving: bits per element, and the quantisation conventions for weights.

Bytes are always exact integers: a tensor of n elements at b bits takes ``ceil_div(n·b, 8)`` bytes (int4 packs
two elements per byte). Quantised weights also carry scales; which ones, and how many, is the convention below
(and is printed with every result, because serving stacks disagree):

- ``int8``: one scale per output row (per-channel symmetric; bitsandbytes LLM.int8 keeps an fp32 ``SCB`` per row,
  Dettmers et al. 2022 §3.1). Default scale dtype fp32.
- ``int4``: one scale per group of ``group_size`` consecutive input features of each output row (GPTQ, Frantar
  et al. 2023 §4 "lazy batch"/grouping; AWQ, Lin et al. 2024), fp16 scales, symmetric (no zero points) unless
  ``zero_point`` is set, which adds one 4-bit zero per group (GPTQ's packed ``qzeros``).
- ``fp8`` (e4m3): one scale per ``group_size`` × ``group_size`` block of the (out, in) weight, fp32 — DeepSeek-V3's
  checkpoint format (``weight_scale_inv`` of shape (⌈out/128⌉, ⌈in/128⌉), DeepSeek-V3 report §3.3.2).

Only ``linear`` weights of the decoder layers are quantised. Embeddings, the LM head, MoE routers, norms, biases,
convolution weights and per-head parameters stay at ``keep_dtype`` (default bf16) — the convention of GPTQ/AWQ
checkpoints and of DeepSeek-V3's fp8 release, which keep these tensors in 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError

# Bits per element of each storage format.
DTYPE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float": "fp32",
           "float8": "fp8", "fp8_e4m3": "fp8", "e4m3": "fp8"}
QUANTISED = ("fp8", "int8", "int4")
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")


def dtype_name(name: str, allowed: tuple[str, ...] = tuple(DTYPE_BITS), what: str = "dtype") -> str:
    """The canonical name of a storage format (``bfloat16`` → ``bf16``), checked against ``allowed``."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in allowed:
        raise TrainmathError(f"unknown {what} {name!r}; choose one of {', '.join(allowed)}")
    return key


def dtype_bits(name: str) -> int:
    return DTYPE_BITS[dtype_name(name)]


def tensor_bytes(numel: int, bits: int) -> int:
    """Bytes of ``numel`` elements stored at ``bits`` each, packed: ⌈numel·bits / 8⌉."""
    return ceil_div(numel * bits, 8)


@dataclass(frozen=True, kw_only=True, slots=True)
class WeightFormat:
    """How weights are stored for serving. See the module docstring for the scale conventions."""

    dtype: str = "bf16"
    """Format of the quantised (decoder ``linear``) weights: fp32, bf16, fp16, fp8, int8 or int4."""
    keep_dtype: str = "bf16"
    """Format of every tensor that is not quantised (embeddings, lm_head, routers, norms, biases, conv, params).
    Ignored (set equal to ``dtype``) when ``dtype`` is itself a 16/32-bit float."""
    group_size: int = 128
    """int4: input features per scale group; fp8: side of the square scale block. Unused for int8 (per row)."""
    scale_dtype: str | None = None
    """Format of the scales; None for the default of the dtype (int8 fp32, int4 fp16, fp8 fp32)."""
    zero_point: bool = False
    """int4 only: asymmetric quantisation with a packed 4-bit zero point per group."""

    def __post_init__(self) -> None:
        if self.group_size <= 0:
            raise TrainmathError(f"group size must be positive, got {self.group_size}")

    @property
    def quantised(self) -> bool:
        return self.dtype in QUANTISED

    @property
    def scale_name(self) -> str | None:
        """The scales' format: ``scale_dtype`` or the dtype's default (int8 fp32, int4 fp16, fp8 fp32)."""
        if not self.quantised:
            return None
        return self.scale_dtype or {"int8": "fp32", "int4": "fp16", "fp8": "fp32"}[self.dtype]

    @property
    def scale_bits(self) -> int:
        return DTYPE_BITS[self.scale_name] if self.quantised else 0

    @property
    def kept_bits(self) -> int:
        return DTYPE_BITS[self.keep_dtype if self.quantised else self.dtype]

    def convention(self) -> str:
        """One line saying what is stored, for the output."""
        if not self.quantised:
            return f"weights: every tensor at {self.dtype}"
        scale = self.scale_name
        g = self.group_size
        how = {
            "int8": f"one {scale} scale per output row",
            "int4": f"one {scale} scale{' and one 4-bit zero point' if self.zero_point else ''} per group of {g} "
                    f"input features per output row",
            "fp8": f"one {scale} scale per {g}x{g} block",
        }[self.dtype]
        return (f"weights: decoder linear weights at {self.dtype} with {how}; embeddings, lm_head, routers, norms, "
                f"biases, conv and per-head params at {self.keep_dtype}")


def scale_count(out_features: int, in_features: int, fmt: WeightFormat) -> int:
    """Scales of one (out, in) weight under ``fmt`` (0 when not quantised); see the module docstring."""
    if fmt.dtype == "int8":
        return out_features
    if fmt.dtype == "int4":
        return out_features * ceil_div(in_features, fmt.group_size)
    if fmt.dtype == "fp8":
        return ceil_div(out_features, fmt.group_size) * ceil_div(in_features, fmt.group_size)
    return 0


def quantised_weight_bytes(out_features: int, in_features: int, fmt: WeightFormat) -> tuple[int, int]:
    """(data bytes, scale bytes) of one (out, in) linear weight stored in the quantised format ``fmt``.
    Data: ⌈out·in·bits / 8⌉; scales: ``scale_count`` × scale bytes, plus packed 4-bit zero points for int4 with
    ``zero_point`` (⌈groups·4 / 8⌉)."""
    data = tensor_bytes(out_features * in_features, DTYPE_BITS[fmt.dtype])
    n_scales = scale_count(out_features, in_features, fmt)
    scales = tensor_bytes(n_scales, fmt.scale_bits)
    if fmt.dtype == "int4" and fmt.zero_point:
        scales += tensor_bytes(n_scales, 4)
    return data, scales
