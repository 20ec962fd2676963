"""Reading a user's JSON file (``--hardware FILE``, ``plot timeline|comm|plan FILE``): bounded, strict, one error.

Only a regular file is opened (a FIFO would block the reader forever, ``/dev/zero`` never ends): the path is
checked with ``stat`` first, opened with ``O_NONBLOCK`` so that a file swapped for a FIFO in between cannot block
either, and checked again on the open descriptor. At most ``max_bytes`` are read. The text must be UTF-8; NaN and
±Infinity literals are refused (they are not JSON, and no figure of these files may be one); an integer of more
than 40 digits is refused before Python parses it; nesting too deep for the parser is one error. Each failure is
one ``TrainmathError`` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import os
import stat

from trainmath.errors import TrainmathError

MAX_JSON_BYTES = 4 << 20
"""Largest file read (4 MiB: gpus.json is ~20 KB, a plan --json --explain of a large search a few MB)."""
_MAX_INT_DIGITS = 40


class _Refused(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (at most {_MAX_INT_DIGITS})")
    return int(text)


def _parse_constant(name: str):
    raise _Refused(f"{name} (not a JSON number; every figure must be finite)")


def _parse_float(text: str) -> float:
    if len(text) > 400:
        raise _Refused(f"a number of {len(text):,} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"{text[:40]} (beyond the range of a float)")
    return value


def read_json_file(path: str, what: str = "", max_bytes: int = MAX_JSON_BYTES):
    """The JSON document in the regular file at ``path``; ``what`` names it in errors ("hardware file" gives
    ``hardware file 'x.json'``; none: the bare path)."""
    label = f"{what} {path!r}" if what else path
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise TrainmathError(f"{label} is not a regular file (a FIFO, device or directory is never read)")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise TrainmathError(f"cannot read {label}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TrainmathError(f"{label} is not a regular file (a FIFO, device or directory is never read)")
        try:
            raw = f.read(max_bytes + 1)
        except OSError as e:
            raise TrainmathError(f"cannot read {label}: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise TrainmathError(f"{label} is larger than {max_bytes:,} bytes; not read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TrainmathError(f"{label} is not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except _Refused as e:
        raise TrainmathError(f"{label} holds {e}") from None
    except json.JSONDecodeError as e:
        raise TrainmathError(f"{label} is not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise TrainmathError(f"{label} is nested too deeply (arrays or objects hundreds of levels deep)") from None
