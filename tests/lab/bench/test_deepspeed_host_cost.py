"""benchmarks/deepspeed_host_cost.py: one row per module count, stage 3's added host work positive; a bad
``--modules`` is a clear usage error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
SCRIPT = ROOT / "benchmarks" / "deepspeed_host_cost.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    # the checkout's package, installed or not (the script runs from benchmarks/, outside the package)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": path}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip


def test_bad_module_counts_are_a_usage_error():
    r = _run("--modules", "4,x")
    assert r.returncode == 2 and "--modules must be positive integers" in r.stderr


@pytest.mark.slow
def test_prints_stage3_host_cost_per_module():
    pytest.importorskip("deepspeed")
    r = _run("--modules", "2,6", "--repeats", "1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["2"], ["6"])]
    assert [row[0] for row in rows] == ["2", "6"]
    for _, s0, s3, _added in rows:
        assert float(s3) > float(s0) > 0  # stage 3 fetches and releases what stage 0 keeps
