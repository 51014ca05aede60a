"""Make the ranks a test starts die at a chosen point of a save (see ``sitecustomize.py`` here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FAULT_ENV = "ZEROTOPO_FAULT_IN_SAVE"
#: The pid of the process whose ranks the hook stops (set by the hook in the first process that loads it).
LAUNCHER_ENV = "ZEROTOPO_FAULT_LAUNCHER_PID"
HOOKS = Path(__file__).resolve().parent


def inject_save_fault(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    """Ranks started after this call die at ``spec`` (``<step>:write`` or ``<step>:rename``). The hook
    loads when an interpreter starts, so the ranks start as new interpreters (``ZEROTOPO_START_METHOD``),
    not as forks of a fork server that started before the hook was on the path."""
    monkeypatch.setenv(FAULT_ENV, spec)
    monkeypatch.setenv("ZEROTOPO_START_METHOD", "spawn")
    path = os.environ.get("PYTHONPATH", "")
    root = str(HOOKS.parents[2])  # the ranks must still import this checkout's zerotopo
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HOOKS), root, path) if p))
