"""Small behaviours of ``zerotopo train`` a user relies on: ``--set`` given twice, the help of the Hugging
Face commands, the notice when there is no validation data, and no empty run directory left behind."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from zerotopo.cli.main import main
from zerotopo.cli.train import parse_sets
from zerotopo.config.neox import load_neox_config
from zerotopo.logs import get_logger
from zerotopo.trainer.steps import usable_valid_split


def test_set_given_twice_the_last_wins():
    assert parse_sets(["train_iters=5", "seq-length=64", "train_iters=7"]) == {
        "seq_length": 64,
        "train_iters": 7,
    }
    assert parse_sets(["optimizer.params.lr=0.001", "optimizer.params.lr=0.002"]) == {
        "optimizer.params.lr": 0.002
    }


@pytest.mark.parametrize("argv, flag", [(["train", "--help"], "--from-hf"), (["--help"], "export-hf")])
def test_hugging_face_help_names_every_family_that_works(argv, flag, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    out = " ".join(capsys.readouterr().out.split())
    line = out[out.rindex(flag) :][:400]  # the option's own entry, not the usage line
    assert "GPT-NeoX" in line and "Llama" in line and "Mistral" in line, line


def _ctx():
    return SimpleNamespace(is_main=True, world=8)


class _Records(logging.Handler):
    """The zerotopo logger's records (it does not propagate once the CLI has set up the console)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        get_logger().addHandler(self)
        return self

    def __exit__(self, *exc):
        get_logger().removeHandler(self)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def test_train_data_paths_without_valid_data_paths_names_valid_data_paths(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text("train_data_paths: [data/a_text_document]\neval_iters: 2\n")
    args = load_neox_config([path])
    with _Records() as records:
        assert usable_valid_split(None, 4, _ctx(), args) is None
    text = records.text
    assert "set valid_data_paths to evaluate" in text
    assert "split" not in text.replace("split is not used", "") and "more documents" not in text


def test_a_short_split_still_points_at_the_split(tmp_path):
    path = tmp_path / "c.yml"
    path.write_text("eval_iters: 2\n")
    with _Records() as records:
        usable_valid_split([0, 1], 4, _ctx(), load_neox_config([path]))
    assert "the validation split (split 0.969,0.03,0.001) holds 2 samples" in records.text


def test_a_run_refused_after_its_run_directory_was_made_leaves_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ZEROTOPO_RUNS", str(tmp_path / "runs"))
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    code = main(["train", "--set", "train_iters=1", "--set", f"save={not_a_dir}", "--no-progress"])
    assert code == 2 and "not writable" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
