"""NeoX's ``keep_last_n_checkpoints``: after a save, delete the oldest step directories of ``save``.

Only directories named ``step_<N>`` are candidates, the one ``latest`` names is never deleted, and a
directory whose name does not parse is left alone, so files a user put next to the checkpoints survive.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

STEP_DIR = re.compile(r"^step_(\d+)$")
"""The name of a checkpoint's step directory, ``step_<N>`` (the one pattern: the store writes and finds
them by it too)."""


def step_dir_name(step: int) -> str:
    """The step directory of optimizer step ``step``: ``step_<step>`` (matches :data:`STEP_DIR`)."""
    return f"step_{int(step)}"


def checkpoint_steps(root: Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of every ``step_<N>`` directory under ``root``, oldest first."""
    out = []
    for path in Path(root).iterdir() if Path(root).is_dir() else ():
        m = STEP_DIR.match(path.name)
        if m and path.is_dir():
            out.append((int(m.group(1)), path))
    return sorted(out)


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` step directories; returns what was deleted."""
    if keep < 1:
        raise ValueError(f"keep_last_n_checkpoints must be at least 1, found {keep}")
    latest_file = Path(root) / "latest"
    latest = latest_file.read_text().strip() if latest_file.exists() else None
    steps = checkpoint_steps(root)
    doomed = [p for _, p in steps[: max(len(steps) - keep, 0)] if p.name != latest]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
