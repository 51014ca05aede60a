"""A reader of ``zerotopo``'s standard output that goes away (``zerotopo plan ... | head -1``) ends the
command as SIGPIPE ends a Unix tool: quietly, status 0 (everything was written before the reader left) or
141, with nothing on standard error; a training run's ranks log on without a traceback; a BrokenPipeError
of the command's own is still reported as a bug."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zerotopo.cli import main as cli
from zerotopo.errors import EXIT_BROKEN_PIPE

REPO = Path(__file__).resolve().parents[2]
PLAN = ["plan", "--model", "neox-20b", "--nodes", "48"]


def _zerotopo(argv: list[str], stdout, cwd: Path = REPO) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "zerotopo", *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _gone_pipe() -> int:
    """The write end of a pipe whose reader has already gone: every write to it fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    return write


def test_a_reader_that_closes_after_one_line_ends_the_command_quietly():
    proc = _zerotopo(PLAN, subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) in (0, EXIT_BROKEN_PIPE)
    assert first.startswith(b"neox-20b") and err == b"", err.decode()[-2000:]


@pytest.mark.parametrize(
    "argv", [PLAN, [*PLAN, "--json"], ["topo", "show", "frontier"]], ids=["plan", "json", "topo"]
)
def test_a_reader_gone_before_the_first_write_gives_141_and_no_traceback(argv):
    write = _gone_pipe()
    proc = _zerotopo(argv, write)
    os.close(write)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == EXIT_BROKEN_PIPE, err[-2000:]
    # --json times its search on standard error: that line is the only one there
    assert all(line.startswith("# planner:") for line in err.splitlines()), err[-2000:]


def test_a_broken_pipe_of_the_command_itself_is_still_a_bug(monkeypatch, capsys):
    import zerotopo.cli.topo as topo

    def run(args):
        raise BrokenPipeError(32, "Broken pipe")  # a rank's pipe, say: standard output is fine

    monkeypatch.setattr(topo, "run", run)
    assert cli.main(["topo", "list"]) == 1
    assert "internal error: BrokenPipeError" in capsys.readouterr().err


def test_the_console_log_of_a_gone_reader_is_dropped_without_a_logging_error():
    code = "from zerotopo.logs import get_logger, setup_console\nsetup_console()\n" + (
        "for i in range(3):\n    get_logger().info(f'step {i}')\n"
    )
    write = _gone_pipe()
    proc = subprocess.run(
        [sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, cwd=REPO, timeout=120
    )
    os.close(write)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode()[-2000:]


@pytest.mark.slow
def test_a_training_run_piped_into_head_ends_without_a_traceback(tmp_path):
    from tests.trainer.test_neox_import import MODEL, TOPOLOGY

    (tmp_path / "model.yml").write_text(MODEL)
    (tmp_path / "two.yaml").write_text(TOPOLOGY)
    argv = ["train", "model.yml", "--topology", "two.yaml", "--no-progress", "--set", "train_iters=6"]
    proc = _zerotopo(argv, subprocess.PIPE, cwd=tmp_path)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=900) in (0, EXIT_BROKEN_PIPE), err[-3000:]
    assert first.startswith(b"zerotopo train: ") and "Traceback" not in err and "Logging error" not in err, (
        err
    )
