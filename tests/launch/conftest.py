"""Fixtures for the launcher tests: a local Slurm cluster and mpich's mpiexec."""

from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path

import pytest
from slurm_harness import LocalSlurm, unavailable_reason


@pytest.fixture(scope="session")
def local_slurm():
    """A running one-node Slurm (8 CPUs declared) for the whole session; skipped without root or packages."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"local Slurm unavailable: {reason}")
    with LocalSlurm(cpus=8) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def mpiexec() -> str:
    """Path of mpich's mpiexec (pip install mpi4py mpich puts it next to this Python)."""
    candidates = [Path(sysconfig.get_path("scripts")) / "mpiexec", Path(sys.executable).parent / "mpiexec"]
    found = next((str(p) for p in candidates if p.exists()), None) or shutil.which("mpiexec")
    if found is None:
        pytest.skip("mpiexec not found: pip install mpi4py mpich (see .ci/install-system.sh)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py not installed: pip install mpi4py mpich (see .ci/install-system.sh)")
    return found
