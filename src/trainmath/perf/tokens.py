"""Token budgets as people write them: ``1T``, ``15.6T``, ``300B``, ``2e12`` (decimal: K 1e3, M 1e6, B/G 1e9,
T 1e12, P 1e15 — a model's '15T tokens' is 15e12)."""

from __future__ import annotations

from trainmath.errors import TrainmathError

_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}


def parse_tokens(text: str) -> int:
    """``"1T"`` → 1_000_000_000_000 tokens; a positive whole number of tokens, with an optional decimal suffix."""
    s = str(text).strip().upper().replace(",", "").replace("_", "")
    suffix = s[-1] if s and s[-1] in _SCALE and s[-1] != "" and not s[-1].isdigit() else ""
    number = s[: len(s) - len(suffix)]
    try:
        value = float(number) * _SCALE[suffix]
    except ValueError:
        value = -1
    if not number or value < 1 or value != value or value == float("inf"):
        raise TrainmathError(f"bad token count {text!r}: expected a positive number with an optional K, M, B, T "
                             f"or P suffix, e.g. 1T or 300B")
    return int(round(value))
