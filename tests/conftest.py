"""Shared pytest setup: the repository root on ``sys.path`` so tests import helpers by module path, and
the ``gpu`` lane: tests marked ``gpu`` are skipped, with the reason, when torch sees no accelerator."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


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
