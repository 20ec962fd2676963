"""Exact integer arithmetic every calculator module shares: counts stay ints, rounding up is explicit."""

from __future__ import annotations

from math import prod


def ceil_div(a: int, b: int) -> int:
    """⌈a / b⌉ for integers (a shard of a items over b ranks, blocks of b bytes), without floats."""
    return -(-a // b)


def numel(shape: tuple[int, ...]) -> int:
    """Elements of a tensor of ``shape`` (1 for a scalar's empty shape)."""
    return prod(shape)
