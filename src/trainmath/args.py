"""Validated argparse types shared by every command, and the parser that reports a bad argument in one line.

Each type turns the text of one argument into a value inside stated bounds, or raises
``argparse.ArgumentTypeError`` with what is allowed and the value given (argparse prefixes the flag:
``argument --timeout: must be a finite number of seconds in (0, 86400], got 'nan'``). The bounds are those of
real jobs, wide enough for any, narrow enough that no command can be made to run for minutes or allocate
gigabytes (a 4,300-digit integer, ``1e400``, NaN and infinity never reach the calculator).
"""

from __future__ import annotations

import argparse
import math
import sys

# The largest count any command accepts (batch, sequence, context, degrees): 2**40 ≈ 1.1e12.
MAX_COUNT = 2**40
# More characters than any accepted number can have: longer text is refused before it is parsed, so a
# 100,000-digit argument costs nothing (Python's int() refuses 4,300 digits, Decimal would try).
_MAX_DIGITS = 40


def _show(text: str) -> str:
    """The value as quoted in a message, cut to 40 characters (a 5,000-digit number stays one short line)."""
    return repr(text) if len(text) <= 40 else repr(text[:20]) + f"... ({len(text):,} characters)"


def count(minimum: int = 1, maximum: int = MAX_COUNT, *, what: str = "an integer"):
    """An argparse type: an integer in [minimum, maximum] written in decimal (``4096``, ``4_096``)."""

    def parse(text: str) -> int:
        s = text.strip().replace("_", "")
        if len(s) > _MAX_DIGITS or not (s.isdigit() or (s[:1] == "-" and s[1:].isdigit())):
            raise argparse.ArgumentTypeError(f"must be {what} in {minimum:,}..{maximum:,}, got {_show(text)}")
        value = int(s)
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be {what} in {minimum:,}..{maximum:,}, got {_show(text)}")
        return value

    parse.__name__ = "count"
    return parse


def integer(text: str) -> int:
    """An integer of at most 2**40 in magnitude, range left to the command's own checks (which name the value)."""
    return count(-MAX_COUNT, MAX_COUNT)(text)


def number(minimum: float = 0.0, maximum: float = 1e9, *, exclusive_minimum: bool = False, unit: str = ""):
    """An argparse type: a finite decimal number in [minimum, maximum] (``(minimum, maximum]`` when exclusive);
    NaN, infinity and out-of-range values are refused."""
    low = "(" if exclusive_minimum else "["
    unit_text = f" {unit}" if unit else ""

    def parse(text: str) -> float:
        allowed = f"a finite number{unit_text} in {low}{minimum:g}, {maximum:g}]"
        try:
            value = float(text) if len(text) <= _MAX_DIGITS else math.nan
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value > maximum or value < minimum or (exclusive_minimum and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {_show(text)}")
        return value

    parse.__name__ = "number"
    return parse


MAX_TOKENS = 10**18
"""The largest token budget (``--tokens``): a million times the 15T tokens of today's largest runs."""


def tokens(text: str) -> int:
    """A token budget as people write it (``1T``, ``300B``, ``2e12``: decimal suffixes), 1..10**18."""
    from trainmath.errors import TrainmathError
    from trainmath.perf.tokens import parse_tokens

    allowed = f"a token count in 1..{MAX_TOKENS:.0e} with an optional K, M, B, T or P suffix (e.g. 1T, 300B)"
    if len(text) > _MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {_show(text)}")
    try:
        digits = text.strip().replace("_", "").replace(",", "")
        value = int(digits) if digits.isdigit() else parse_tokens(text)  # digits: exact, not through a float
    except (TrainmathError, OverflowError):
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {_show(text)}") from None
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {_show(text)}")
    return value


def port(text: str) -> int:
    """A TCP port, 0..65535 (0: pick a free one)."""
    return count(0, 65535, what="a TCP port")(text)


def host(text: str) -> str:
    """A host name or address: not empty, no spaces (an empty --master-addr used to wait 45 s)."""
    if not text.strip() or any(c.isspace() for c in text) or len(text) > 253:
        raise argparse.ArgumentTypeError(f"must be a host name or IP address (e.g. 127.0.0.1), got {_show(text)}")
    return text


_BYTE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
               "gb": 10**9, "tb": 10**12}
MAX_BYTES = 2**60  # 1 EiB: more than any machine holds


def byte_size(text: str) -> int:
    """'4096', '2GiB', '1.5GB' → exact integer bytes (GiB = 2**30, GB = 1e9), rounded down, in 0..2**60."""
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    from decimal import Decimal, InvalidOperation  # here: ~2 ms of start-up for the one type that needs it

    allowed = "a byte size in 0..1 EiB (e.g. 4096, 2GiB, 1.5GB)"
    if len(num) > _MAX_DIGITS or unit not in _BYTE_UNITS or "e" in num:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {_show(text)}")
    try:
        value = Decimal(num) * _BYTE_UNITS[unit]
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {_show(text)}") from None
    if not value.is_finite() or not 0 <= value <= MAX_BYTES:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {_show(text)}")
    return int(value)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: ``trainmath: error: memory: argument --seq: ... (see
    `trainmath memory --help`)``, exit 2 — the same shape as every other error of the CLI."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{command}: " if command else ""
        help_hint = f" (see `{self.prog} --help`)"
        print(f"trainmath: error: {where}{message}{help_hint}", file=sys.stderr)
        sys.exit(2)


STRICT_HELP = ("refuse a config that lacks keys (instead of taking transformers' defaults) or holds a key one "
               "edit away from a known one (a likely typo): exit 2")


def add_strict(p: argparse.ArgumentParser) -> None:
    """``--strict``, for every command that reads a config."""
    p.add_argument("--strict", action="store_true", help=STRICT_HELP)


def config_lines(spec) -> list[str]:
    """The lines saying how ``spec``'s config was read (defaults taken, likely typos), for text output."""
    report = getattr(spec, "config_report", None)
    return report.lines() if report is not None else []


def config_json(spec) -> dict:
    """The same for ``--json``: ``{"defaults_used": {...}, "unknown_keys": {...}}``."""
    report = getattr(spec, "config_report", None)
    return report.to_dict() if report is not None else {"defaults_used": {}, "unknown_keys": {}}


def positions_warning(spec, tokens: int, flag: str) -> str | None:
    """Tokens per sequence against the model's positions: an error for learned position embeddings (GPT-2's
    ``wpe`` has no row beyond them: the model cannot run), a warning for rotary models (they run; beyond their
    trained length quality is not promised, and RoPE scaling may extend it). None when within."""
    from trainmath.errors import TrainmathError

    limit = spec.max_position_embeddings
    if tokens <= limit:
        return None
    if any(t.component == "pos_embed" for t in spec.pre):
        raise TrainmathError(f"{flag} {tokens} is longer than {spec.name}'s {limit} learned positions "
                             f"(n_positions / max_position_embeddings); use {flag} {limit} or less")
    return (f"{flag} {tokens} is beyond max_position_embeddings {limit} of {spec.name} (counted as asked; the model "
            f"was not trained on longer sequences)")


def add_mem_util(p: argparse.ArgumentParser) -> None:
    """``--mem-util``: the one fit rule's usable share (``trainmath.usable``), the same flag and default in every
    command that gives a fit verdict."""
    from trainmath.usable import CUDA_CONTEXT_BYTES, MEM_UTIL_PERCENT

    p.add_argument("--mem-util", type=count(1, 100, what="a percentage"), default=MEM_UTIL_PERCENT,
                   metavar="PERCENT",
                   help=f"fit rule: peak_bytes + the {CUDA_CONTEXT_BYTES // 2**20} MiB CUDA context must stay under "
                        f"this %% of the GPU's memory (default {MEM_UTIL_PERCENT}; vLLM's gpu_memory_utilization "
                        f"means the same: 90 matches its default)")
