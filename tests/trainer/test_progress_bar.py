"""On a terminal, rank 0 of ``zerotopo train`` draws a progress bar, also on a pseudo-terminal that
nobody sized (0 columns, as ``script`` and some batch consoles give): the bar then takes 80 columns."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zerotopo.logs import terminal_columns

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run_on_a_pty(argv: list[str], cwd: Path, timeout_s: float = 900) -> tuple[int, str]:
    """Run ``argv`` with stdin, stdout and stderr on a fresh (unsized) pseudo-terminal; all it wrote."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other side closed: every writer has exited
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return rc, out.decode(errors="replace")


def test_an_unsized_terminal_reports_no_columns_and_a_file_none():
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "w", closefd=False) as stream:
            assert terminal_columns(stream) is None
        with open(os.devnull, "w") as stream:
            assert terminal_columns(stream) is None
    finally:
        os.close(master)
        os.close(slave)


def test_train_draws_a_progress_bar_on_an_unsized_terminal(tmp_path):
    rc, out = _run_on_a_pty(
        [
            sys.executable,
            "-m",
            "zerotopo",
            "train",
            "tiny",
            "--set",
            "train_iters=3",
            "--set",
            "eval_iters=1",
            "--set",
            "log_interval=1",
            "--run-dir",
            "run",
        ],  # fmt: skip
        tmp_path,
    )
    assert rc == 0, out[-3000:]
    assert "train:" in out and "3/3" in out, out[-3000:]  # tqdm's bar, drawn to its end
    assert "\r" in out  # redrawn in place, as a bar is
