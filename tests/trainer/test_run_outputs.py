"""What a run leaves behind, as a scheduler's log would see it (stdout not a terminal): one notice per
warning without Python source lines, no progress bar, ``train.log`` in the run directory, a ``load:``
directory with no checkpoint yet starting from step 0, and a resumed run that appends to ``metrics.csv``
from the run's own ``config.yml`` passed back as is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zerotopo.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _train(argv, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "zerotopo", "train", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("runs")
    # NeoX's local_setup.yml names the same directory for save and load; nothing is there yet.
    (work / "local_setup.yml").write_text(
        'save: checkpoints\nload: checkpoints\ncheckpoint_factor: 2\nattention_config: [[["flash"], 2]]\n'
    )
    sets = ["--set", "train_iters=4", "--set", "log_interval=2", "--set", "eval_interval=4"]
    first = _train(["tiny", "local_setup.yml", *sets, "--set", "eval_iters=1", "--run-dir", "run"], work)
    metrics_after_first = read_metrics(work / "run" / "metrics.csv")
    second = _train(["run/config.yml", "--set", "train_iters=6", "--run-dir", "run"], work)
    return work, first, metrics_after_first, second


def test_warnings_once_without_source_lines_and_no_progress_bar(runs):
    _, first, _, _ = runs
    err, out = first.stderr, first.stdout
    assert err.count("attention_config type 'flash'") == 1, err
    assert err.count("holds no checkpoint yet") == 1, err
    assert "zerotopo: warning: load: checkpoints holds no checkpoint yet; training starts from step 0" in err
    assert ".py:" not in err and "warnings.warn" not in err and "UserWarning" not in err
    assert "\r" not in out + err and "it/s" not in out + err  # no tqdm bar off a terminal
    assert "step     2/4 | loss" in out and "step     4/4 | loss" in out  # plain periodic lines


def test_log_file_in_the_run_directory(runs):
    work, _, _, _ = runs
    text = (work / "run" / "train.log").read_text()
    assert "WARNING attention_config type 'flash'" in text
    assert "step     2/4 | loss" in text and "step     6/6 | loss" in text  # the resumed run appends
    assert "resumed from the checkpoint of step 4" in text


def test_load_of_an_empty_directory_starts_at_step_0(runs):
    work, _, metrics, _ = runs
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1, 2, 3, 4]
    assert (work / "checkpoints" / "latest").exists()


def test_saved_config_trains_again_as_is_and_metrics_append(runs):
    work, _, first_metrics, second = runs
    saved = yaml.safe_load((work / "run" / "config.yml").read_text())
    assert saved["topology"] == "emulated" and saved["plan"]["name"] == "zerotopo"
    assert "unknown config keys" not in second.stderr  # the saved file is a clean config
    rows = read_metrics(work / "run" / "metrics.csv")
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if r["kind"] == "valid"] == [4, 6]
    # the rows of the first run are kept exactly
    assert rows[:5] == first_metrics
