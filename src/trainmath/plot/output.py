"""Writing a chart or a page whole: a temporary file in the target's directory, then a rename.

On any failure the temporary file is removed and one ``TrainmathError`` names the path, so an interrupted or
refused write never leaves a half-written file or a ``.part`` file behind. No third-party imports.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from trainmath.errors import TrainmathError


def check_output(path: str | Path, suffixes: tuple[str, ...]) -> Path:
    """``path`` as a Path if it ends in one of ``suffixes`` and its directory exists; else one error line."""
    out = Path(path)
    if out.suffix.lower() not in suffixes:
        raise TrainmathError(f"--output must end in {', '.join(suffixes)}, got {out.name!r}")
    if out.is_dir():
        raise TrainmathError(f"--output {out} is a directory; give a file name ending in {', '.join(suffixes)}")
    if not out.parent.is_dir():
        raise TrainmathError(f"directory {out.parent} does not exist")
    return out


def write_atomic(path: Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a fresh file next to ``path``, then rename it onto ``path``."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    except OSError as e:
        raise TrainmathError(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes 0600; the result gets the modes any new file would
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise TrainmathError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        _remove(tmp)
        raise
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return write_atomic(path, write)


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass
