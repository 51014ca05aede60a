"""Shared pytest setup: the repository root on ``sys.path`` so tests import helpers by module path; SIGINT
at Python's default in the test process (see :func:`pytest_configure`); and the ``gpu`` lane: tests
marked ``gpu`` are skipped, with the reason, when torch sees no accelerator; and, on pytest-xdist's
workers, the longest files first."""

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


#: The files that take longest (seconds on a quiet 2-core machine, one worker), started first when the
#: suite runs on several workers with ``--dist loadfile``: each file runs on one worker, so a long file
#: started last would keep one worker busy while the others wait.
LONGEST_FIRST = (
    "tests/trainer/test_long_run.py",  # 150 s
    "tests/launch/test_launchers.py",  # 85 s, more with Slurm
    "tests/trainer/test_checkpoint_resume.py",  # 70 s
    "tests/trainer/test_background_save.py",  # 65 s in the CI lane
    "tests/lab/bench/test_compare.py",  # 55 s
    "tests/comm/test_quant_fused.py",  # 50 s
    "tests/engine/test_deepspeed_parity.py",  # 45 s
    "tests/engine/test_planner_candidates.py",  # 45 s
    "tests/engine/test_features.py",  # 45 s
    "tests/lab/bench/test_ringbytes.py",  # 40 s
    "tests/trainer/test_neox_import.py",  # 35 s
    "tests/engine/test_parity.py",  # 35 s
    "tests/trainer/test_run_outputs.py",  # 30 s
)


def _longest_first(items) -> None:
    """Sort ``items`` so the files of LONGEST_FIRST come first, in its order; the sort is stable, so every
    other file keeps its place and each file's tests stay together and in order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_collection_modifyitems(config, items):
    import pytest
    import torch

    if hasattr(config, "workerinput"):  # a pytest-xdist worker: every worker sorts the same way
        _longest_first(items)

    if torch.cuda.is_available():
        return
    reason = (
        f"gpu lane: torch {torch.__version__} sees no CUDA/ROCm device (torch.cuda.is_available() is False); "
        "run `pytest -m gpu` on a machine with one"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
