"""``zerotopo train`` end to end on the emulated cluster, and the errors a user meets before any rank starts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from zerotopo.cli.main import main
from zerotopo.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def run_cli(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_default_config_trains_on_8_ranks_and_writes_the_run_directory(tmp_path, capsys):
    run = tmp_path / "run"
    code, out, err = run_cli(
        [
            "train",
            "--set",
            "train_iters=6",
            "--set",
            "log_interval=3",
            "--set",
            "eval_interval=3",
            "--set",
            "eval_iters=1",
            "--run-dir",
            str(run),
            "--no-progress",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    summary = json.loads(out[out.index("{") :])
    assert summary["world_size"] == 8 and summary["plan"] == "zerotopo"
    rows = read_metrics(run / "metrics.csv")
    train = [r for r in rows if r["kind"] == "train"]
    valid = [r for r in rows if r["kind"] == "valid"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in valid] == [3, 6]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5  # the loss falls visibly within a few steps
    # zerotopo's plan crosses every tier of the emulated machine
    assert all(train[-1][f"bytes_{t}"] > 0 for t in ("package", "node", "network"))
    assert (run / "loss.png").stat().st_size > 1000 and (run / "bytes_per_tier.png").exists()
    saved = yaml.safe_load((run / "config.yml").read_text())
    assert saved["plan"]["name"] == "zerotopo" and saved["topology"] == "emulated"


def test_missing_data_file_is_one_clear_error(tmp_path, capsys):
    code, _, err = run_cli(["train", "--set", f"data_path={tmp_path}/nothing", "--no-progress"], capsys)
    assert code == 2
    assert "nothing.bin" in err and "zerotopo data preprocess" in err and "Traceback" not in err


def test_plan_that_does_not_fit_names_a_plan_that_does(tmp_path, capsys):
    topo = yaml.safe_load((ROOT / "topologies" / "emulated.yaml").read_text())
    topo["device"]["memory_gib"] = 0.02  # 21 MB: ddp holds 16 B per parameter of a 0.9M model + activations
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(topo))
    code, _, err = run_cli(["train", "--topology", str(path), "--plan", "ddp", "--no-progress"], capsys)
    assert code == 2
    assert "plan 'ddp' needs" in err and "GiB per device" in err
    suggested = re.search(r"--plan (\S+) fits", err)
    assert suggested and suggested.group(1) != "ddp", err


def test_bad_plan_degree_and_bad_set(capsys):
    code, _, err = run_cli(["train", "--plan", "nonsense", "--no-progress"], capsys)
    assert code == 2 and "unknown plan preset 'nonsense'" in err
    code, _, err = run_cli(["train", "--set", "train_iters", "--no-progress"], capsys)
    assert code == 2 and "KEY=VALUE" in err


def test_vocabulary_larger_than_the_model_is_refused(tmp_path, capsys):
    from zerotopo.data.indexed import IndexedDatasetBuilder

    prefix = str(tmp_path / "big")
    b = IndexedDatasetBuilder(prefix, "int32")
    b.add_document([1, 2, 70000])
    b.finalize()
    code, _, err = run_cli(["train", "--set", f"data_path={prefix}", "--no-progress"], capsys)
    assert code == 2 and "token id 70000" in err
