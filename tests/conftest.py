"""Shared pytest setup: the repository root on ``sys.path`` so tests import helpers by module path; SIGINT
at Python's default in the test process (see :func:`pytest_configure`); and the ``gpu`` lane: tests
marked ``gpu`` are skipped, with the reason, when torch sees no accelerator."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    """A suite started with SIGINT ignored (``pytest ... &`` in a non-interactive shell) would pass the
    ignore on to every launcher a test starts, and the tests that stop a launcher with SIGINT would wait
    for it in vain (the Note in zerotopo/launch/spawn.py). A handled SIGINT is reset to the default in a
    child at ``exec``, an ignored one is not: the test process handles it as Python does by default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
