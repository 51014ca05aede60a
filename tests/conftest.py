"""Shared pytest setup: the repository root on ``sys.path`` so tests import helpers by module path, ranks
started in the test process as forks (``pytest_configure``), and the ``gpu`` lane: tests marked ``gpu`` are skipped, with the reason, when torch sees no accelerator."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    """The ranks the tests start in this process are forks of a fork server that imported torch once
    (``forkserver``: 0.25 s for 8 ranks where new interpreters take about 12 s here). The commands the
    tests run in a subprocess (``zerotopo train``, the launchers) keep the shipped default, new
    interpreters, and tests/test_spawn_start.py checks both."""
    from zerotopo.launch import spawn

    spawn.DEFAULT_START_METHOD = "forkserver"


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest hook signature
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    reason = (
        f"gpu lane: torch {torch.__version__} sees no CUDA/ROCm device (torch.cuda.is_available() is False); "
        "run `pytest -m gpu` on a machine with one"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
