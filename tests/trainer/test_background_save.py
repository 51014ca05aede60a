"""Checkpoints written in the background (``async_save: true``) through ``zerotopo train`` on 2 ranks: the
same checkpoint as a synchronous save, and nothing lost when a rank or the whole job is killed with
SIGKILL at any phase of a background save: the rerun starts from the newest complete checkpoint and is
bit-identical to a run that was never interrupted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.proc import launcher_free_env
from tests.trainer.save_faults import FAULT_ENV, HOOKS, LAUNCHER_ENV
from tests.trainer.test_checkpoint_resume import small_config
from zerotopo.checkpoint.store import SAVE_PHASES, find_checkpoint, read_tensors
from zerotopo.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

STEPS = ("train_iters=6", "log_interval=1", "save_interval=2")


def _env(fault: str | None = None) -> dict[str, str]:
    env = launcher_free_env(FAULT_ENV, LAUNCHER_ENV)
    env["PYTHONPATH"] = str(ROOT)
    if fault:
        # the hook loads as the launcher and its fork server start; the forked ranks inherit it
        env[FAULT_ENV] = fault
        env["PYTHONPATH"] = os.pathsep.join((str(HOOKS), str(ROOT)))
    return env


def _train(tmp: Path, run: str, *sets: str, fault: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "zerotopo", "train", str(tmp / "small.yml"), "--nodes", "1",
            "--run-dir", str(tmp / run), "--no-progress"]  # fmt: skip
    for s in (*STEPS, *sets):
        argv += ["--set", s]
    return subprocess.run(argv, env=_env(fault), capture_output=True, text=True, timeout=900, cwd=tmp)


def _losses(run: Path) -> dict[int, float]:
    return {int(r["step"]): r["loss"] for r in read_metrics(run / "metrics.csv") if r["kind"] == "train"}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bg")
    small_config(d / "small.yml")
    return d


@pytest.fixture(scope="module")
def reference(tmp) -> tuple[Path, dict[int, float]]:
    """2 ranks, 6 steps, a synchronous checkpoint every 2 steps."""
    res = _train(tmp, "ref", f"save={tmp / 'ref-ckpt'}")
    assert res.returncode == 0, res.stderr
    return tmp / "ref-ckpt", _losses(tmp / "ref")


def _all_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    import json

    md = json.loads((step_dir / "dcp_metadata.json").read_text())
    return read_tensors(step_dir, {k: tuple(v["size"]) for k, v in md["tensors"].items()})


def test_a_background_save_writes_the_synchronous_checkpoint_and_training_is_unchanged(tmp, reference):
    sync_dir, ref = reference
    res = _train(tmp, "async", f"save={tmp / 'async-ckpt'}", "async_save=true")
    assert res.returncode == 0, res.stderr
    assert _losses(tmp / "async") == ref  # bit for bit
    log = (tmp / "async" / "train.log").read_text()
    assert "async_save: a save holds a copy of the shards in host memory:" in log and "GiB available" in log
    assert "copied for the background writer" in log
    for step in (2, 4, 6):
        got, want = _all_tensors(tmp / "async-ckpt" / f"step_{step}"), _all_tensors(sync_dir / f"step_{step}")
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), step
    assert (tmp / "async-ckpt" / "latest").read_text().strip() == "step_6"
    assert not list((tmp / "async-ckpt").glob(".step_*"))


def test_a_save_needing_more_host_memory_than_the_machine_has_is_refused_before_the_first_save(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    import torch.distributed as dist

    from zerotopo.checkpoint import background
    from zerotopo.errors import ConfigError

    opt = SimpleNamespace(master=[torch.zeros(1000)], states={"exp_avg": [torch.zeros(1000)]})
    assert background.save_copy_bytes(opt) == 8000
    said: list[str] = []
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'store'}")
    try:
        monkeypatch.setattr(background, "host_bytes_available", lambda: 1 << 30)
        assert background.check_host_memory(opt, is_main=True, say=said.append) == 8000
        assert "0.000 GiB per rank" in said[0] and "(1 ranks); 1.0 GiB available" in said[0], said
        monkeypatch.setattr(background, "host_bytes_available", lambda: 4000)
        with pytest.raises(ConfigError, match="more than the machine has; set async_save: false"):
            background.check_host_memory(opt, is_main=False, say=said.append)
    finally:
        dist.destroy_process_group()


# The phases every rank goes through: rank 1 alone killed (rank 0 waits on it) and the whole job. The
# phases only rank 0 runs: the whole job, which kills rank 0 in that phase as killing it alone would
# (a rank left waiting on a dead peer is the rank-1 cases').
EVERY_RANK = ("copy", "write", "checksum")
# The CI lane kills one rank alone while it writes, the whole job while it checksums, and the whole job
# once the save is complete but before ``latest`` moves; the other phases are the exhaustive lane's.
REPRESENTATIVE = {("write", "1"), ("checksum", "job"), ("latest", "job")}
CASES = [
    pytest.param(
        phase, who, id=f"{phase}-{who if who == 'job' else 'rank' + who}",
        marks=() if (phase, who) in REPRESENTATIVE else pytest.mark.exhaustive,
    )
    for phase in SAVE_PHASES
    for who in (("1", "job") if phase in EVERY_RANK else ("job",))
]  # fmt: skip


@pytest.mark.parametrize("phase,who", CASES)
def test_kill_9_at_any_phase_of_a_background_save_loses_nothing(tmp, reference, phase, who):
    _, ref = reference
    save = tmp / f"kill-{phase}-{who}"
    sets = (f"save={save}", f"load={save}", "async_save=true")
    killed = _train(tmp, f"kill-{phase}-{who}", *sets, fault=f"4:{phase}:{who}")
    assert killed.returncode != 0, killed.stderr
    complete = 4 if phase == "latest" else 2  # latest is the last thing a save does
    assert find_checkpoint(save) == save / f"step_{complete}", killed.stderr
    # a partial save is never loaded: its directory has a hidden name, or is complete but not in latest
    assert not (save / "step_6").exists()
    resumed = _train(tmp, f"resume-{phase}-{who}", *sets)
    assert resumed.returncode == 0, resumed.stderr
    log = (tmp / f"resume-{phase}-{who}" / "train.log").read_text()
    assert f"resumed from the checkpoint of step {complete} in {save / f'step_{complete}'}" in log
    got = _losses(tmp / f"resume-{phase}-{who}")
    assert sorted(got) == list(range(complete + 1, 7))
    assert all(got[s] == ref[s] for s in got), (got, ref)  # bit for bit
    assert (save / "latest").read_text().strip() == "step_6"
    assert not list(save.glob(".step_*"))  # the partial save was cleaned up by the next save
