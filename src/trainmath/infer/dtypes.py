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
- ``mxfp4``: OCP Microscaling FP4 (E2M1 elements, OCP MX spec v1.0 §5): one shared 8-bit power-of-two scale
  (E8M0) per block of 32 consecutive input features of each output row; gpt-oss ships its experts so
  (``gate_up_proj_blocks`` (E, 2f, d/32, 16) uint8 holding two FP4 values per byte, ``gate_up_proj_scales``
  (E, 2f, d/32) uint8). The block size is fixed by the format (``group_size`` is ignored).
- ``nvfp4``: NVIDIA's NVFP4 (E2M1 elements, two per byte): one FP8 E4M3 scale per block of 16 consecutive input
  features of each output row, plus one fp32 scale per tensor (Intel Neural Compressor, "NVFP4 Quantization",
  https://intel.github.io/neural-compressor/latest/docs/source/3x/PT_NVFP4Quant.html, format table: E2M1, 4 bits,
  block 16, UE4M3 8-bit scale, FP32 32-bit global tensor-wise scale; the ModelOpt checkpoint layout, NVIDIA NeMo
  AutoModel docs ``nemo_automodel.components.quantization.nvfp4``: ``weight_scale`` float8_e4m3fn per 16 columns,
  ``weight_scale_2`` float32 per tensor). So 4.5 bits per value + 4 bytes per tensor; the block is fixed.

Only ``linear`` weights of the decoder layers are quantised. Embeddings, the LM head, MoE routers, norms, biases,
convolution weights and per-head parameters stay at ``keep_dtype`` (default bf16) — the convention of GPTQ/AWQ
checkpoints and of DeepSeek-V3's fp8 release, which keep these tensors in 16-bit.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmath.arith import ceil_div
from trainmath.errors import TrainmathError

# Bits per element of each storage format.
DTYPE_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4, "mxfp4": 4, "nvfp4": 4, "e8m0": 8}
WEIGHT_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "nvfp4")
MX_BLOCK = 32
"""Elements sharing one E8M0 scale in the OCP MX formats (MX spec v1.0, Table 1: k = 32)."""
NV_BLOCK = 16
"""Elements sharing one E4M3 scale in NVFP4 (module docstring)."""
NV_TENSOR_SCALE_BYTES = 4
"""NVFP4's per-tensor fp32 scale (ModelOpt ``weight_scale_2``)."""
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float": "fp32",
           "float8": "fp8", "fp8_e4m3": "fp8", "e4m3": "fp8", "mx_fp4": "mxfp4", "fp4": "mxfp4", "nv_fp4": "nvfp4"}
QUANTISED = ("fp8", "int8", "int4", "mxfp4", "nvfp4")
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")


def dtype_name(name: str, allowed: tuple[str, ...] = WEIGHT_DTYPES, what: str = "dtype") -> str:
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
    """Format of the quantised (decoder ``linear``) weights: fp32, bf16, fp16, fp8, int8, int4, mxfp4 or nvfp4."""
    keep_dtype: str = "bf16"
    """Format of every tensor that is not quantised (embeddings, lm_head, routers, norms, biases, conv, params).
    Ignored (set equal to ``dtype``) when ``dtype`` is itself a 16/32-bit float."""
    group_size: int = 128
    """int4: input features per scale group; fp8: side of the square scale block. Unused for int8 (per row)."""
    scale_dtype: str | None = None
    """Format of the scales; None for the default of the dtype (int8 fp32, int4 fp16, fp8 fp32)."""
    zero_point: bool = False
    """int4 only: asymmetric quantisation with a packed 4-bit zero point per group."""
    skip_modules: tuple[str, ...] = ()
    """Module name patterns (checkpoint names, ``*`` a wildcard, a module's own tensors included) left at
    ``keep_dtype``: a quantization_config's ``modules_to_not_convert`` (gpt-oss keeps attention and routers)."""
    source: str = "given"
    """Where the format comes from, for the output: ``given`` (flags) or the config's ``quantization_config``."""

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
        defaults = {"int8": "fp32", "int4": "fp16", "fp8": "fp32", "mxfp4": "e8m0", "nvfp4": "fp8"}
        return self.scale_dtype or defaults[self.dtype]

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
            "mxfp4": f"one {scale} scale per block of {MX_BLOCK} input features per output row (OCP MX)",
            "nvfp4": f"one {scale} (e4m3) scale per block of {NV_BLOCK} input features per output row and one fp32 "
                     "scale per tensor (NVFP4)",
        }[self.dtype]
        skipped = f"; also kept: {', '.join(self.skip_modules)}" if self.skip_modules else ""
        origin = "" if self.source == "given" else f" ({self.source})"
        return (f"weights{origin}: decoder linear weights at {self.dtype} with {how}; embeddings, lm_head, routers, "
                f"norms, biases, conv and per-head params at {self.keep_dtype}{skipped}")


def scale_count(out_features: int, in_features: int, fmt: WeightFormat) -> int:
    """Scales of one (out, in) weight under ``fmt`` (0 when not quantised); see the module docstring."""
    if fmt.dtype == "int8":
        return out_features
    if fmt.dtype == "int4":
        return out_features * ceil_div(in_features, fmt.group_size)
    if fmt.dtype == "fp8":
        return ceil_div(out_features, fmt.group_size) * ceil_div(in_features, fmt.group_size)
    if fmt.dtype == "mxfp4":
        return out_features * ceil_div(in_features, MX_BLOCK)
    if fmt.dtype == "nvfp4":
        return out_features * ceil_div(in_features, NV_BLOCK)
    return 0


def quantised_weight_bytes(out_features: int, in_features: int, fmt: WeightFormat) -> tuple[int, int]:
    """(data bytes, scale bytes) of one (out, in) linear weight stored in the quantised format ``fmt``.
    Data: ⌈out·in·bits / 8⌉; scales: ``scale_count`` × scale bytes, plus packed 4-bit zero points for int4 with
    ``zero_point`` (⌈groups·4 / 8⌉), and NVFP4's per-tensor fp32 scale."""
    data = tensor_bytes(out_features * in_features, DTYPE_BITS[fmt.dtype])
    n_scales = scale_count(out_features, in_features, fmt)
    scales = tensor_bytes(n_scales, fmt.scale_bits)
    if fmt.dtype == "int4" and fmt.zero_point:
        scales += tensor_bytes(n_scales, 4)
    if fmt.dtype == "nvfp4":
        scales += NV_TENSOR_SCALE_BYTES
    return data, scales


def shipped_format(quantization_config: object, *, source: str = "config") -> WeightFormat:
    """The format a checkpoint ships in, from its config's ``quantization_config`` (bf16 when it has none):
    ``fp8`` with ``weight_block_size`` [b, b] (DeepSeek-V3, Kimi K2: e4m3, fp32 ``weight_scale_inv`` per block),
    ``mxfp4`` (gpt-oss) with its ``modules_to_not_convert``, GPTQ/AWQ ``bits`` 4 or 8 with their ``group_size``,
    bitsandbytes ``load_in_8bit``. Any other method is one error asking for ``--dtype``."""
    q = quantization_config
    if q is None:
        return WeightFormat()
    if not isinstance(q, dict):
        raise TrainmathError(f"{source}: quantization_config must be an object, got {type(q).__name__}")
    method = str(q.get("quant_method", "")).lower()
    skip = q.get("modules_to_not_convert") or ()
    if not isinstance(skip, (list, tuple)) or not all(isinstance(m, str) for m in skip):
        raise TrainmathError(f"{source}: quantization_config.modules_to_not_convert must be a list of names")
    origin = f"quantization_config: {method}"
    if method == "fp8":
        block = q.get("weight_block_size") or [128, 128]
        if (not isinstance(block, (list, tuple)) or len(block) != 2 or block[0] != block[1]
                or not isinstance(block[0], int) or isinstance(block[0], bool) or block[0] <= 0):
            raise TrainmathError(f"{source}: quantization_config.weight_block_size must be a square [b, b] of "
                                 f"positive integers, got {block!r}")
        return WeightFormat(dtype="fp8", group_size=block[0], skip_modules=tuple(skip), source=origin)
    if method == "mxfp4":
        return WeightFormat(dtype="mxfp4", skip_modules=tuple(skip), source=origin)
    if method in ("gptq", "awq") and q.get("bits") in (4, 8):
        group = q.get("group_size", 128)
        if not isinstance(group, int) or isinstance(group, bool) or not (group == -1 or 1 <= group <= 2**40):
            raise TrainmathError(f"{source}: quantization_config.group_size must be a positive integer or -1 (one "
                                 f"group per row), got {group!r}")
        if q["bits"] == 8:
            return WeightFormat(dtype="int8", skip_modules=tuple(skip), source=origin)
        # group_size -1 means one group per row (GPTQ): a group as wide as any layer's input
        return WeightFormat(dtype="int4", group_size=group if group > 0 else 1 << 40,
                            zero_point=method == "awq" or not q.get("sym", True), skip_modules=tuple(skip),
                            source=origin)
    if method == "bitsandbytes" and q.get("load_in_8bit"):
        return WeightFormat(dtype="int8", skip_modules=tuple(skip), source=origin)
    raise TrainmathError(f"{source}: quantization_config quant_method {method or '(none)'!r} is not modelled; "
                         f"pass --dtype (one of {', '.join(WEIGHT_DTYPES)})")
