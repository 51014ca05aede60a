"""``bench compare --json`` prints the JSON report alone on stdout: what the ranks (and the libraries
they load) print goes to the log file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zerotopo_lab.bench.quiet import stdout_to

MINI = str(Path(__file__).with_name("mini-frontier.yaml"))


def test_output_of_this_process_and_its_children_goes_to_the_log(tmp_path, capfd):
    log = tmp_path / "ranks.log"
    with stdout_to(str(log)):
        print("parent line", flush=True)
        subprocess.run([sys.executable, "-c", "print('DeepSpeed op built successfully')"], check=True)
    print("after")
    out, _ = capfd.readouterr()
    assert out == "after\n"
    assert log.read_text().splitlines() == ["parent line", "DeepSpeed op built successfully"]


def test_stdout_is_restored_after_an_error(tmp_path, capfd):
    with pytest.raises(RuntimeError), stdout_to(str(tmp_path / "x.log")):
        raise RuntimeError("a rank failed")
    print("visible")
    assert capfd.readouterr().out == "visible\n"


@pytest.mark.slow
def test_compare_json_is_the_only_stdout(tmp_path):
    log = tmp_path / "ranks.log"
    rows = ["no-comm", "zero3"]
    try:
        import deepspeed  # noqa: F401

        rows.append("deepspeed-zero3")
    except ImportError:
        pass
    cmd = [sys.executable, "-m", "zerotopo", "bench", "compare", "--json", "--regime", "comm-bound", "--no-emulate", "--topology",
           MINI, "--model", "tiny", "--rows", ",".join(rows), "--steps", "1", "--warmup", "0",
           "--batch", "1", "--micro-batches", "1", "--seq", "16", "--repeat", "1", "--log", str(log)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)  # nothing but the JSON
    assert [row["name"] for row in report["rows"]] == rows
    assert str(log) in r.stderr and log.exists()
    # DeepSpeed calls torch's deprecated collective names: the ranks keep those warnings off the terminal
    assert "is deprecated" not in r.stderr, r.stderr[-3000:]
