"""QLoRA's frozen base as bitsandbytes stores it: 4-bit NF4/FP4 with blockwise absmax, optionally double-quantized.

Source: bitsandbytes ``bitsandbytes/functional.py`` ``quantize_4bit``
(bitsandbytes-foundation/bitsandbytes@01327aa0119fa503ea16322dd72f69f202e4502e), for a weight of n elements:
- packed values: ``(n + 1) // (2 · itemsize(quant_storage))`` elements of quant_storage (uint8: 2 values a byte);
- absmax: one fp32 per block of ``blocksize`` (64 by default; ``ceil(n / blocksize)`` blocks);
- with ``compress_statistics`` (QLoRA's double quantization, ``bnb_4bit_use_double_quant``): the absmax minus
  their mean (an fp32 ``offset``) go through ``quantize_blockwise(absmax, blocksize=256)``: one uint8 code per
  absmax, an fp32 absmax per block of 256 of those, and that 8-bit quantizer's 256-entry fp32 code map;
- ``code``: the 16-entry fp32 NF4/FP4 table (``get_4bit_type``).
Checked against bitsandbytes' own tensors on the CPU in tests/params/test_qlora_storage.py.
"""

from __future__ import annotations


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def nf4_storage(numel: int, *, blocksize: int = 64, double_quant: bool = True, nested_blocksize: int = 256,
                storage_bytes: int = 1) -> dict[str, int]:
    """Bytes of one 4-bit quantized weight of ``numel`` elements, by part, and their ``total``."""
    blocks = _ceil_div(numel, blocksize)
    parts = {"packed": (numel + 1) // (2 * storage_bytes) * storage_bytes, "code": 16 * 4}
    if double_quant:
        parts |= {"absmax_uint8": blocks, "absmax_fp32": 4 * _ceil_div(blocks, nested_blocksize),
                  "offset": 4, "nested_code": 256 * 4}
    else:
        parts["absmax_fp32"] = 4 * blocks
    parts["total"] = sum(parts.values())
    return parts
