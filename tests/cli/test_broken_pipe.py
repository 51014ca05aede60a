"""A reader of ``zerotopo``'s standard output that goes away (``zerotopo plan ... | head -1``) ends the
command as SIGPIPE ends a Unix tool: quietly, status 0 (everything was written before the reader left) or
141, with nothing on standard error; a BrokenPipeError of the command's own is still reported as a bug."""

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


def _zerotopo(argv: list[str], stdout) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "zerotopo", *argv],
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


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
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails with EPIPE
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
