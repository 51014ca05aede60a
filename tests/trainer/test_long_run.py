"""A long run's faults, provoked as they happen: a preemption signal to real processes (the local launcher
and a torchrun-style launch), a second run on the same save directory, a loss that goes NaN, a crash in
the middle of a save, and a disk that fills up."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.proc import launcher_free_env
from tests.trainer.save_faults import FAULT_ENV, HOOKS
from tests.trainer.test_checkpoint_integrity import _patch, _values_span
from tests.trainer.test_checkpoint_resume import small_config
from zerotopo.checkpoint.dcpio import METADATA_FILE, piece_checksum
from zerotopo.launch.spawn import free_port
from zerotopo.trainer.metrics import read_metrics
from zerotopo.trainer.preempt import EXIT_PREEMPTED
from zerotopo.trainer.savelock import LOCK_FILE

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    return {**launcher_free_env("ZEROTOPO_FAULT_IN_SAVE"), "PYTHONPATH": str(ROOT), **extra}


def _argv(tmp: Path, run: str, *sets: str) -> list[str]:
    argv = [sys.executable, "-m", "zerotopo", "train", str(tmp / "small.yml"), "--run-dir", str(tmp / run)]
    for s in sets:
        argv += ["--set", s]
    return argv + ["--no-progress"]


def _run(tmp: Path, run: str, *sets: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        _argv(tmp, run, *sets), env=env or _env(), capture_output=True, text=True, timeout=900, cwd=tmp
    )


def _train_rows(run: Path) -> list[dict]:
    path = run / "metrics.csv"
    return [r for r in read_metrics(path) if r["kind"] == "train"] if path.exists() else []


def _wait_rows(proc: subprocess.Popen, run: Path, n: int) -> None:
    deadline = time.monotonic() + 600
    while len(_train_rows(run)) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.5)


@pytest.fixture
def tmp(tmp_path) -> Path:
    small_config(tmp_path / "small.yml")
    return tmp_path


def test_sigusr1_saves_at_the_next_step_and_a_second_run_meets_the_lock(tmp):
    save = tmp / "ckpt"
    sets = (f"save={save}", "load=" + str(save), "save_interval=1000", "train_iters=400")
    a = subprocess.Popen(_argv(tmp, "a", *sets), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp)  # fmt: skip
    try:
        _wait_rows(a, tmp / "a", 2)
        holder = json.loads((save / LOCK_FILE).read_text())
        b = _run(tmp, "b", *sets)  # a second job on the same directory, while the first one trains
        assert b.returncode == 2, b.stderr
        assert f"is in use by another run (host {holder['host']}, process {holder['pid']}" in b.stderr, (
            b.stderr
        )
        assert "Traceback" not in b.stderr and not (tmp / "b" / "metrics.csv").exists()
        a.send_signal(signal.SIGUSR1)
        out, err = a.communicate(timeout=600)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == EXIT_PREEMPTED, err
    step = _train_rows(tmp / "a")[-1]["step"]
    assert 2 <= step < 400
    assert f"stopped by SIGUSR1 after saving the checkpoint of step {step}" in err, err
    assert (save / "latest").read_text().strip() == f"step_{step}"
    assert [r["step"] for r in _train_rows(tmp / "a")] == list(range(1, step + 1))  # every row on disk
    assert not (save / LOCK_FILE).exists()
    # What the requeued job does: the same command continues from the saved step.
    c = _run(tmp, "a", *sets[:-1], f"train_iters={step + 1}")
    assert c.returncode == 0, c.stderr
    assert f"resumed from the checkpoint of step {step}" in c.stdout + c.stderr
    assert [r["step"] for r in _train_rows(tmp / "a")] == list(range(1, step + 2))


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in _train_rows(run)}


def test_sigterm_to_a_local_run_saves_even_when_repeated_and_the_rerun_is_bit_identical(tmp):
    save = tmp / "ckpt"
    sets = ("lr_decay_style=constant", "train_iters=40", "log_interval=1")
    ref = _run(tmp, "ref", *sets)
    assert ref.returncode == 0, ref.stderr
    a = subprocess.Popen(_argv(tmp, "a", *sets, f"save={save}", f"load={save}", "save_interval=1000"),
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)  # fmt: skip
    try:
        _wait_rows(a, tmp / "a", 2)
        a.send_signal(signal.SIGTERM)  # what timeout, systemd, docker stop and Kubernetes send
        time.sleep(0.5)
        a.send_signal(signal.SIGTERM)  # a second one lets the save finish
        out, err = a.communicate(timeout=600)
    finally:
        if a.poll() is None:
            a.kill()
    assert a.returncode == EXIT_PREEMPTED, err
    step = _train_rows(tmp / "a")[-1]["step"]
    assert 2 <= step < 40, err
    assert "SIGTERM received again: the ranks finish their save" in err, err
    assert f"stopped by SIGTERM after saving the checkpoint of step {step} in {save / f'step_{step}'};" in err
    assert (save / "latest").read_text().strip() == f"step_{step}" and not (save / LOCK_FILE).exists()
    rerun = _run(tmp, "a", *sets, f"save={save}", f"load={save}", "save_interval=1000")
    assert rerun.returncode == 0, rerun.stderr
    got, want = _losses(tmp / "a"), _losses(tmp / "ref")
    assert sorted(got) == list(range(1, 41))
    assert all(got[s] == want[s] for s in got), [(s, got[s], want[s]) for s in got if got[s] != want[s]]


def test_a_second_run_is_refused_before_any_rank_starts(tmp):
    from zerotopo.trainer.savelock import SaveLock

    save = tmp / "ckpt"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        lock = SaveLock(save)
        # the lock as a live run on this host holds it: another process
        (save / LOCK_FILE).write_text(json.dumps({**vars(lock.me), "pid": holder.pid}))
        t0 = time.monotonic()
        b = _run(tmp, "b", f"save={save}", "train_iters=2")
        took = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait()
    assert b.returncode == 2 and f"process {holder.pid}" in b.stderr, b.stderr
    assert not (tmp / "b").exists() or not (tmp / "b" / "metrics.csv").exists()
    assert "rank" not in b.stderr.split("is in use")[0], b.stderr  # refused by the launcher, not by a rank
    assert took < 120, took


def test_sigterm_to_every_rank_of_a_torchrun_style_launch_saves_then_exits_for_requeue(tmp):
    save, port = tmp / "ckpt", free_port()
    procs = []
    for rank in range(2):  # emulated-4node on the one node torchrun reports: 2 ranks
        env = _env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        argv = _argv(tmp, "t", f"save={save}", "save_interval=1000", "train_iters=400", "log_interval=1")
        procs.append(subprocess.Popen(argv + ["--launcher", "torchrun"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=tmp))  # fmt: skip
    try:
        _wait_rows(procs[0], tmp / "t", 2)
        for p in procs:  # as Slurm does at a preemption: every task gets SIGTERM
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [EXIT_PREEMPTED] * 2, outs
    step = _train_rows(tmp / "t")[-1]["step"]
    assert (save / "latest").read_text().strip() == f"step_{step}"
    assert "stopped by SIGTERM after saving the checkpoint of step" in outs[1][1]


def _poison(step: Path, fqn: str, value: float) -> None:
    """Overwrite every stored piece of ``fqn`` with ``value`` (finite, so the checkpoint still loads) and
    give the metadata matching checksums: state a diverging run could have saved."""
    md = json.loads((step / METADATA_FILE).read_text())
    for e in md["storage"]:
        if e["fqn"] == fqn:
            path, at, t = _values_span(step, e)
            _patch(path, at, torch.full((t.numel(),), value).numpy().tobytes())
            raw = path.read_bytes()[e["byte_offset"] : e["byte_offset"] + e["length"]]
            e["crc32c"] = piece_checksum(fqn, e["offset"], raw)
    (step / METADATA_FILE).write_text(json.dumps(md))


def test_a_nan_loss_stops_before_saving_and_keep_last_n_keeps_the_good_checkpoint(tmp):
    save = tmp / "ckpt"
    first = _run(tmp, "r", f"save={save}", "save_interval=2", "train_iters=2")
    assert first.returncode == 0, first.stderr
    good = save / "step_2"
    # Embeddings at the edge of fp32's range: the first LayerNorm overflows and the loss goes NaN.
    _poison(good, "param/embed_in.weight", 3e38)
    bad = _run(tmp, "r", f"save={save}", f"load={save}", "save_interval=2", "train_iters=6",
               "keep_last_n_checkpoints=1")  # fmt: skip
    assert bad.returncode == 1, bad.stderr
    assert "step 3: the loss" in bad.stderr and "before saving anything from it" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr
    assert sorted(p.name for p in save.iterdir() if p.name.startswith("step_")) == ["step_2"]
    assert (save / "latest").read_text().strip() == "step_2"
    # Another run (another seed) resuming into the same directory is refused before any rank starts.
    other = _run(tmp, "o", f"save={save}", f"load={save}", "train_iters=6", "seed=7")
    assert other.returncode == 2, other.stderr
    assert "was written by another run (seed 1234 -> 7)" in other.stderr, other.stderr


def test_rows_logged_before_a_crash_in_a_save_are_kept_and_losses_do_not_depend_on_the_window(tmp):
    ref = _run(tmp, "ref", "train_iters=6", "log_interval=1")
    assert ref.returncode == 0, ref.stderr
    save = tmp / "ckpt"
    crash = _run(tmp, "crash", f"save={save}", "save_interval=2", "train_iters=6", "log_interval=100",
                 env=_env(**{FAULT_ENV: "4:write", "PYTHONPATH": os.pathsep.join((str(HOOKS), str(ROOT)))}))  # fmt: skip
    assert crash.returncode != 0
    rows = _train_rows(tmp / "crash")
    assert [r["step"] for r in rows] == [1, 2, 3, 4], crash.stderr  # written before the killed save
    # each step's loss is the same bits whether it was reduced alone or in a window of two
    assert [r["loss"] for r in rows] == [r["loss"] for r in _train_rows(tmp / "ref")][:4]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tmpfs")
def test_a_full_disk_warns_and_training_goes_on(tmp):
    probe = tmp / "probe"
    assert _run(tmp, "p", f"save={probe}", "save_interval=2", "train_iters=2").returncode == 0
    size = sum(f.stat().st_size for f in (probe / "step_2").rglob("*") if f.is_file())
    disk = tmp / "disk"
    disk.mkdir()
    limit = (size * 3 // 2 // 4096 + 1) * 4096  # room for one checkpoint and half of another
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(disk)], capture_output=True
    )
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        save = disk / "ckpt"
        run = _run(tmp, "full", f"save={save}", "save_interval=2", "train_iters=6")
        assert run.returncode == 2, run.stderr  # the last save failed too: nothing would save the run's end
        warned = [line for line in run.stderr.splitlines() if "training goes on" in line]
        assert warned and "step_4" in warned[0] and "the disk is full" in warned[0], run.stderr
        assert f"the previous checkpoint is kept ({save / 'step_2'})" in warned[0]
        assert [r["step"] for r in _train_rows(tmp / "full")] == [1, 2, 3, 4, 5, 6]  # trained on
        assert (save / "latest").read_text().strip() == "step_2" and not list(save.glob(".step_*"))
        strict = _run(tmp, "strict", f"save={disk / 'strict'}", "save_interval=2", "train_iters=6",
                      "strict_saves=true")  # fmt: skip
        assert strict.returncode == 2 and "there is no earlier checkpoint in" in strict.stderr, strict.stderr
        assert len(_train_rows(tmp / "strict")) < 6
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
