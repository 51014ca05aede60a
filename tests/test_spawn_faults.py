"""Faults in spawned ranks: one message naming the rank, the others stopped, no orphans, no hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.proc import alive
from zerotopo.errors import ZerotopoError
from zerotopo.launch.spawn import SpawnError, spawn

pytestmark = pytest.mark.slow  # each test spawns ranks and signals them

ROOT = Path(__file__).resolve().parents[1]


def _user_error(rank, world):
    if rank == 1:
        raise ZerotopoError("data_path: no such dataset; give a prefix")
    import torch.distributed as dist

    dist.barrier()


def _bug(rank, world):
    if rank == 0:
        raise ValueError("an internal bug")
    import torch.distributed as dist

    dist.barrier()


def _killed(rank, world):
    import torch.distributed as dist

    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_user_error_in_a_rank_is_one_message():
    with pytest.raises(SpawnError) as info:
        spawn(_user_error, 2, timeout_s=120)
    msg = str(info.value)
    assert msg.startswith("rank 1: data_path: no such dataset; give a prefix")
    assert "Traceback" not in msg and info.value.exit_code == 2


def test_bug_in_a_rank_goes_to_a_log_file(tmp_path):
    with pytest.raises(SpawnError) as info:
        spawn(_bug, 2, timeout_s=120, log_dir=tmp_path)
    msg = str(info.value)
    log = tmp_path / "rank-errors.log"
    assert msg.startswith("rank 0 failed: ValueError: an internal bug") and str(log) in msg
    assert "Traceback" not in msg and info.value.exit_code == 1
    assert "Traceback" in log.read_text() and "=== rank 0 ===" in log.read_text()


def test_killed_rank_is_named_and_the_others_stop():
    start = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(_killed, 2, timeout_s=300)
    assert time.monotonic() - start < 60
    assert str(info.value).startswith("rank 1 of 2 exited with signal 9 (SIGKILL)")
    assert info.value.exit_code == 1


LAUNCHER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from zerotopo.cli.main import main
    import zerotopo.cli.bench  # noqa: F401
    from test_spawn_faults import _sleeper
    from zerotopo.launch.spawn import spawn
    from zerotopo.errors import ZerotopoError

    def run(args):
        spawn(_sleeper, 2, args=({pids!r},), timeout_s=600)
        return 0

    if __name__ == "__main__":
        sys.modules["zerotopo.cli.bench"].run = run
        sys.exit(main(["bench", "collectives"]))
    """
)


def _sleeper(rank, world, pid_dir):
    with open(os.path.join(pid_dir, f"{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_to_the_launcher_stops_every_rank(tmp_path, sig, code):
    script = tmp_path / "launch.py"
    script.write_text(LAUNCHER.format(root=str(ROOT), tests=str(ROOT / "tests"), pids=str(tmp_path)))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2, proc.stderr.read() if proc.poll() is not None else "ranks did not start"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in out + err and "every rank was stopped" in err
    time.sleep(0.5)
    assert not any(alive(pid) for pid in pids)
