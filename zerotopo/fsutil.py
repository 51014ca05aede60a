"""Writing user-visible files safely: a fresh temporary file next to the target, then a rename.

:func:`atomic_write` creates the temporary file with :func:`tempfile.mkstemp` in the target's directory
(``O_CREAT | O_EXCL``, mode 0600, an unpredictable name), so a planted file or symlink cannot redirect the
write, and readers see either the old file or the whole new one, never half of it. On any error the
temporary file is removed and the target is untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike, mode: str = "wb", *, perms: int = 0o644, **open_kwargs: Any
) -> Iterator[IO]:
    """``with atomic_write(p, "w") as f: f.write(...)``: ``p`` appears complete, or not at all."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, perms & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str, *, perms: int = 0o644) -> None:
    """``text`` (UTF-8) in ``path`` by :func:`atomic_write`: readers see the old or the new file."""
    with atomic_write(path, "w", perms=perms, encoding="utf-8") as f:
        f.write(text)


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (``os.umask`` is process-wide)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_json_object(
    path: str | os.PathLike, missing: str, damaged: str = "the file is damaged"
) -> dict[str, Any]:
    """The JSON object in ``path``; a missing file, text that is not UTF-8 JSON, or another JSON value is
    one error naming the file (``missing`` says what its absence means, ``damaged`` what to do)."""
    from pathlib import Path

    from zerotopo.errors import ZerotopoError

    path = Path(path)
    if not path.is_file():
        raise ZerotopoError(f"{path} is missing: {missing}")
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ZerotopoError(f"{path}: not valid JSON ({str(exc)[:120]}); {damaged}") from None
    if not isinstance(raw, dict):
        raise ZerotopoError(f"{path}: expected a JSON object; {damaged}")
    return raw
