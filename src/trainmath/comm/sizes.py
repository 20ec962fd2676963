"""Message sizes as the benchmark takes them: ``64M``, ``1K:64M`` (nccl-tests' -b/-e with factor -f 2).

Suffixes are binary, as in nccl-tests: K = 2**10, M = 2**20, G = 2**30 bytes.
"""

from __future__ import annotations

from trainmath.errors import TrainmathError

_SUFFIX = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
           "G": 2**30, "GB": 2**30, "GIB": 2**30}


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864 bytes. Binary suffixes K/M/G (nccl-tests convention); a bare number is bytes."""
    s = text.strip().upper()
    digits = s.rstrip("KMGIB")
    suffix = s[len(digits):]
    if not digits.isdigit() or suffix not in _SUFFIX:
        raise TrainmathError(f"bad size {text!r}: expected a whole number of bytes with optional K, M or G, e.g. 64M")
    return int(digits) * _SUFFIX[suffix]


def parse_size_range(text: str, factor: int = 2) -> list[int]:
    """``"1K:64M"`` -> [1024, 2048, ..., 67108864] (multiply by ``factor``); ``"1M,4M"`` -> a list; ``"8M"`` -> one."""
    if factor < 2:
        raise TrainmathError(f"size factor must be >= 2, got {factor}")
    if ":" in text:
        lo_text, _, hi_text = text.partition(":")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo < 1 or hi < lo:
            raise TrainmathError(f"bad size range {text!r}: need 1 <= start <= end")
        sizes = []
        while lo <= hi:
            sizes.append(lo)
            lo *= factor
        return sizes
    sizes = [parse_size(part) for part in text.split(",")]
    if any(s < 1 for s in sizes):
        raise TrainmathError(f"bad sizes {text!r}: every size must be at least 1 byte")
    return sizes


def format_size(size_bytes: int) -> str:
    """Shortest exact binary form: 1048576 -> ``1M``, 1536 -> ``1536``... for table columns."""
    for suffix, unit in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size_bytes >= unit and size_bytes % unit == 0:
            return f"{size_bytes // unit}{suffix}"
    return str(size_bytes)
