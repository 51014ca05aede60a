"""The exit codes of docs/errors.md: 2 bad input, 1 a failure while running (a bug: traceback in a file)."""

from __future__ import annotations

import re
import sys

import pytest

from zerotopo.cli import main as cli
from zerotopo.errors import ConfigError
from zerotopo.launch.spawn import SpawnError


def _with_run(monkeypatch, run):
    import zerotopo.cli.topo as topo

    monkeypatch.setattr(topo, "run", run)


def test_bad_input_is_2(capsys):
    assert cli.main(["topo", "show", "emulated", "--nodes", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerotopo topo: error: --nodes: ") and "Traceback" not in err


def test_a_bug_is_1_with_its_traceback_in_a_file(monkeypatch, capsys):
    def run(args):
        raise TypeError("unsupported operand")

    _with_run(monkeypatch, run)
    assert cli.main(["topo", "list"]) == 1
    err = capsys.readouterr().err
    assert "internal error: TypeError: unsupported operand" in err and "Traceback" not in err
    log = re.search(r"traceback is in (\S+)", err).group(1)
    with open(log) as f:
        assert "Traceback" in f.read()


@pytest.mark.parametrize("code", [1, 2, 143])
def test_rank_failures_keep_their_code(monkeypatch, capsys, code):
    def run(args):
        raise SpawnError("rank 3 of 8 exited with signal 9 (SIGKILL)", exit_code=code)

    _with_run(monkeypatch, run)
    assert cli.main(["topo", "list"]) == code


def test_long_messages_are_cut(monkeypatch, capsys):
    def run(args):
        raise ConfigError("x" * 100_000, source="f.yaml")

    _with_run(monkeypatch, run)
    assert cli.main(["topo", "list"]) == 2
    assert len(capsys.readouterr().err) < cli.MAX_MESSAGE_CHARS + 100


def test_keyboard_interrupt_is_130(monkeypatch, capsys):
    def run(args):
        raise KeyboardInterrupt

    _with_run(monkeypatch, run)
    assert cli.main(["topo", "list"]) == 130
    assert "Traceback" not in capsys.readouterr().err
    assert sys.exc_info() == (None, None, None)
