"""Process helpers shared by the tests that start and stop processes."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs; a zombie (exited, not yet reaped) answers ``kill(0)`` but counts dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            # the state follows the command name, which may hold spaces: read after its ") "
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False
