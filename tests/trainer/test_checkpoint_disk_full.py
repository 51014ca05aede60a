"""A disk that fills during a save: one clean error, the previous checkpoint intact, the partial one gone.

The save directory is a small tmpfs (root only) that holds one checkpoint of the run but not two, so the
second save really runs out of space (ENOSPC) part-way through the ranks' shard files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.trainer.test_checkpoint_resume import small_config
from zerotopo.checkpoint.store import find_checkpoint
from zerotopo.cli.main import main

pytestmark = pytest.mark.slow


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _train(tmp: Path, name: str, save: Path, capfd, iters: int = 4) -> tuple[int, str]:
    code = main(
        ["train", str(tmp / "small.yml"), "--run-dir", str(tmp / f"run-{name}"), "--no-progress",
         "--set", f"save={save}", "--set", "save_interval=2", "--set", f"train_iters={iters}"]
    )  # fmt: skip
    out, err = capfd.readouterr()
    return code, out + err


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tmpfs")
def test_disk_full_during_save_keeps_the_previous_checkpoint(tmp_path, capfd):
    small_config(tmp_path / "small.yml")
    # One checkpoint's size on this run, measured on the ordinary disk.
    probe = tmp_path / "probe"
    code, text = _train(tmp_path, "probe", probe, capfd, iters=2)
    assert code == 0, text
    size = _du(probe / "step_2")
    disk = tmp_path / "disk"
    disk.mkdir()
    limit = (size * 3 // 2 // 4096 + 1) * 4096  # room for step_2 and half of step_4
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(disk)], capture_output=True
    )
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        save = disk / "ckpt"
        code, text = _train(tmp_path, "full", save, capfd)
        assert code != 0
        assert "the disk is full" in text and "the previous checkpoint is kept" in text, text
        assert "Traceback" not in text
        assert (save / "latest").read_text().strip() == "step_2"
        assert find_checkpoint(save) == save / "step_2"
        assert not list(save.glob(".step_*")) and not (save / "step_4").exists()  # the partial save is gone
        manifest = json.loads((save / "step_2" / "checkpoint.json").read_text())
        assert manifest["step"] == 2  # the kept checkpoint is whole: its manifest and every rank's shard file
        shards = sorted(f.name for f in (save / "step_2").glob("*.distcp"))
        assert shards == sorted(f.name for f in (probe / "step_2").glob("*.distcp"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tmpfs")
def test_a_short_write_on_a_full_disk_is_named_whatever_the_writer_raised(tmp_path):
    """torch's zip writer turns ENOSPC into ``RuntimeError: ... unexpected pos``; a save that fails with
    the file system full is still reported as a full disk, and on a disk with room it is not."""
    from zerotopo.checkpoint.store import _run_dcp
    from zerotopo.errors import ZerotopoError

    def short_write():
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    disk = tmp_path / "disk"
    disk.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        with pytest.raises(OSError):
            (disk / "fill").write_bytes(b"x" * (1 << 20))
        with pytest.raises(ZerotopoError, match="the disk is full .*the previous checkpoint is kept"):
            _run_dcp(short_write, "saving checkpoint x", space=(disk, 4096))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
    with pytest.raises(ZerotopoError, match="RuntimeError: .*unexpected pos") as info:
        _run_dcp(short_write, "saving checkpoint x", space=(tmp_path, 4096))
    assert "disk is full" not in str(info.value)
