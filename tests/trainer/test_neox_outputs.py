"""NeoX's checkpoint spacing and retention keys, and the logging backends (TensorBoard, W&B, log_dir)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from zerotopo.checkpoint.retention import checkpoint_steps, prune_checkpoints
from zerotopo.config.neox import load_neox_config
from zerotopo.errors import ConfigError
from zerotopo.logs import attach_run_log, close_run_log, get_logger, setup_console
from zerotopo.trainer.metrics import MetricsWriter, open_wandb, read_metrics


def args_of(tmp_path, text):
    path = tmp_path / "c.yml"
    path.write_text(text)
    return load_neox_config([path])


@pytest.mark.parametrize(
    "text, iters, want",
    [
        ("checkpoint_factor: 3\n", 10, [3, 6, 9]),
        ("save_interval: 5\n", 10, [5]),
        ("checkpoint_factor: 2\ncheckpoint_scale: log\n", 20, [2, 4, 8, 16]),
        ("checkpoint_factor: 4\nextra_save_iters: [1, 6, 40]\n", 10, [1, 4, 6, 8]),
        ("extra_save_iters: [3]\n", 10, [3]),
        ("seed: 1\n", 10, []),
    ],
)
def test_save_iters_as_neox_derives_them(tmp_path, text, iters, want):
    assert args_of(tmp_path, text).checkpoint.save_iters(iters) == want


def test_save_interval_and_checkpoint_factor_must_agree(tmp_path):
    with pytest.raises(ConfigError, match="same setting"):
        args_of(tmp_path, "save_interval: 5\ncheckpoint_factor: 10\n")
    assert args_of(tmp_path, "save_interval: 5\ncheckpoint_factor: 5\n").checkpoint.save_iters(11) == [5, 10]


def test_keep_last_n_checkpoints(tmp_path):
    for step in (2, 4, 6, 10):
        (tmp_path / f"step_{step}").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "latest").write_text("step_10\n")
    deleted = prune_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ["step_2", "step_4"]
    assert [s for s, _ in checkpoint_steps(tmp_path)] == [6, 10] and (tmp_path / "notes").exists()
    # the checkpoint latest names survives even when it is not among the newest by number
    (tmp_path / "latest").write_text("step_6\n")
    (tmp_path / "step_12").mkdir()
    prune_checkpoints(tmp_path, 1)
    assert [s for s, _ in checkpoint_steps(tmp_path)] == [6, 12]


def test_tensorboard_dir_without_tensorboard_warns(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.warns(UserWarning, match="tensorboard_dir .* TensorBoard is not installed"):
        MetricsWriter(tmp_path, ["node"], tensorboard_dir=tmp_path / "tb").close()


def test_wandb_logs_rows_when_installed(tmp_path, monkeypatch):
    calls = []

    class Run:
        def log(self, data, step):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)) or Run(), login=lambda **kw: calls.append(("login", kw))
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run = open_wandb(
        project="neox", group="g", team="t", host="https://w.example", name="r", run_dir=tmp_path, config={}
    )
    writer = MetricsWriter(tmp_path, ["node"], tensorboard=False, wandb_run=run)
    writer.write({"kind": "train", "step": 1, "loss": 2.5, "bytes_node": 10})
    writer.close()
    assert calls[0] == ("login", {"host": "https://w.example"})
    assert calls[1][0] == "init" and calls[1][1]["project"] == "neox" and calls[1][1]["entity"] == "t"
    assert calls[2] == ("log", {"train/loss": 2.5, "train/bytes_node": 10}, 1)
    assert calls[3] == ("finish",)


def test_use_wandb_without_wandb_warns(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.warns(UserWarning, match="wandb package is not installed"):
        assert (
            open_wandb(project="p", group=None, team=None, host=None, name="r", run_dir=tmp_path, config={})
            is None
        )


def test_resume_keeps_rows_up_to_the_checkpoint(tmp_path):
    w = MetricsWriter(tmp_path, ["node"], tensorboard=False)
    for step in (1, 2, 3):
        w.write({"kind": "train", "step": step, "loss": float(step)})
    w.close()
    w = MetricsWriter(tmp_path, ["node", "network"], tensorboard=False, resume_step=2)
    w.write({"kind": "train", "step": 3, "loss": 30.0, "bytes_network": 5})
    w.close()
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert rows[-1]["bytes_network"] == 5
    MetricsWriter(tmp_path, ["node"], tensorboard=False).close()  # a new run starts a new file
    assert read_metrics(tmp_path / "metrics.csv") == []


def test_log_file_and_log_dir_copy_get_buffered_records_and_warnings_once(tmp_path, capsys):
    import warnings

    setup_console()
    log = get_logger("test")
    warnings.warn("same thing twice", stacklevel=1)
    warnings.warn("same thing twice", stacklevel=1)
    path = attach_run_log(tmp_path / "run", copies=(tmp_path / "logs" / "run.log",))
    log.info("after the directory exists")
    close_run_log()
    err = capsys.readouterr().err
    assert err.count("zerotopo: warning: same thing twice") == 1 and ".py:" not in err
    for target in (path, tmp_path / "logs" / "run.log"):
        text = target.read_text()
        assert text.count("same thing twice") == 1 and "after the directory exists" in text
    logging.getLogger("zerotopo").handlers.clear()


def test_what_counts_as_a_checkpoint_to_load(tmp_path):
    from zerotopo.checkpoint.store import find_checkpoint

    assert find_checkpoint(tmp_path / "missing") is None
    assert find_checkpoint(tmp_path) is None  # empty: training starts at step 0
    (tmp_path / ".step_2.tmp-x1y2").mkdir()
    assert find_checkpoint(tmp_path) is None  # only an unfinished (hidden) save
