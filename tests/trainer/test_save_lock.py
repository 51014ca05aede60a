"""One writer per save directory: the lock a second job meets, naming its holder, and stale locks (their
process gone) taken over; held and released by real processes."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time

import pytest

from zerotopo.errors import ConfigError
from zerotopo.trainer.savelock import LOCK_FILE, SaveLock, check_unlocked, read_holder


def _lock_of(pid: int, host: str | None = None, job: str = "") -> str:
    return json.dumps({"host": host or socket.gethostname(), "pid": pid, "job": job, "started": time.time()})


def test_a_live_holder_is_named_and_a_second_lock_refused(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILE).write_text(_lock_of(holder.pid))
        with pytest.raises(ConfigError, match=f"is in use by another run .*process {holder.pid}"):
            check_unlocked(tmp_path)
        with pytest.raises(ConfigError, match=f"process {holder.pid}"):
            SaveLock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert read_holder(tmp_path).pid == holder.pid  # refused: the other job's lock is untouched


def test_a_lock_whose_process_is_gone_is_taken_over_and_released(tmp_path, caplog, monkeypatch):
    # An earlier test in this process may have set up the console, which stops the zerotopo logger's
    # records from reaching the root logger that caplog listens on.
    monkeypatch.setattr(logging.getLogger("zerotopo"), "propagate", True)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / LOCK_FILE).write_text(_lock_of(int(gone.stdout)))
    check_unlocked(tmp_path)  # stale: no error
    lock = SaveLock(tmp_path)
    assert read_holder(tmp_path).pid == lock.me.pid
    assert f"process {int(gone.stdout)} is gone" in caplog.text
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_requeued_slurm_job_takes_its_own_lock_back(tmp_path, monkeypatch):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_FILE).write_text(_lock_of(holder.pid, host="other-node", job="4242"))
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
        check_unlocked(tmp_path)
        monkeypatch.setenv("SLURM_JOB_ID", "4243")
        with pytest.raises(ConfigError, match="host other-node, process .*Slurm job 4242"):
            check_unlocked(tmp_path)
    finally:
        holder.kill()
        holder.wait()


def test_a_damaged_lock_does_not_block_forever(tmp_path):
    (tmp_path / LOCK_FILE).write_bytes(b"\x00garbage")
    SaveLock(tmp_path).release()
