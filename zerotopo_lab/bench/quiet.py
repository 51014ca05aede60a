"""Keep a command's standard output for its result: everything else written to file descriptor 1 while
the ranks run (their prints, DeepSpeed's "op built successfully" lines, any library's chatter) goes to
a log file instead, so ``zerotopo bench compare --json | jq`` reads JSON only."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator


def log_path(prefix: str = "zerotopo-bench-compare-") -> str:
    """A new log file in the temporary directory."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
    os.close(fd)
    return path


@contextlib.contextmanager
def stdout_to(path: str) -> Iterator[str]:
    """Point file descriptor 1 at ``path`` (appending) for this process and every process it starts
    inside the block; restore it after, whatever happened."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
        # Python's own sys.stdout too, where it is not file descriptor 1 (an embedding or a capture)
        with open(path, "a", buffering=1) as text, contextlib.redirect_stdout(text):
            yield path
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
