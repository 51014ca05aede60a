"""Writes go through a fresh temporary file in the target's directory, then a rename."""

from __future__ import annotations

import os

import pytest

from zerotopo.fsutil import atomic_write, write_text_atomic


def test_planted_symlink_at_old_temp_names_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "summary.json"
    # The predictable names an older writer used: a planted link there must not be written through.
    for name in (f"{target}.tmp", f"{target}.tmp{os.getpid()}"):
        os.symlink(victim, name)
    write_text_atomic(target, "new")
    assert target.read_text() == "new" and victim.read_text() == "keep"
    assert not target.is_symlink()


def test_replaces_a_symlink_target_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "out.txt"
    os.symlink(victim, target)
    write_text_atomic(target, "new")
    assert victim.read_text() == "keep" and target.read_text() == "new"


def test_failure_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "metrics.csv"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target, "w") as f:
        f.write("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]
