"""A GPT-NeoX user's path, end to end, with configs written in the keys and layout of NeoX's shipped
``125M.yml``, ``20B.yml`` and ``local_setup.yml``: preprocess with NeoX's arguments, plan, train with
``load:``/``save:`` on the same (empty) directory, checkpoints every ``checkpoint_factor`` steps with
``keep_last_n_checkpoints``, ``log-dir`` and ``tensorboard-dir`` honoured, and a resumed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.gpt2_files import write_gpt2_files
from zerotopo.cli.main import main
from zerotopo.config.neox import load_neox_config
from zerotopo.errors import ConfigError
from zerotopo.trainer.job import TrainJob
from zerotopo.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "neox"

# A 125M-shaped config scaled down to a CPU test (every other key as the file has it).
SMALL = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "seq_length": 32,
    "max_position_embeddings": 32,
    "attention_config": [[["global"], 2]],
    "train_iters": 4,
    "lr_decay_iters": 4,
    "checkpoint_factor": 2,
    "keep_last_n_checkpoints": 1,
    "eval_interval": 4,
    "eval_iters": 1,
    "log_interval": 2,
    "fp16.enabled": False,  # CPU ranks: fp32
}


def sets(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def test_shipped_style_configs_read_as_neox_would():
    small = load_neox_config([FIXTURES / "125M.yml"])
    assert small.data.tokenizer_type == "GPT2BPETokenizer"  # no tokenizer key: NeoX's default
    assert small.checkpoint.checkpoint_factor == 10000 and small.checkpoint.keep_last_n_checkpoints == 4
    assert small.precision.resolved == "fp16" and small.precision.fp16.loss_scale_window == 1000
    big = load_neox_config([FIXTURES / "20B.yml"])
    assert (
        big.checkpoint.save_iters(1500) == [500, 1000]
        and big.precision.fp16.scaler_options()["init_scale"] == 2.0**12
    )
    assert (big.batch.pipe_parallel_size, big.batch.model_parallel_size) == (4, 2)


@pytest.mark.slow
def test_20b_style_plans_and_the_pipeline_setting_is_refused_before_files(capsys):
    code = main(["plan", "--model", str(FIXTURES / "20B.yml"), "--topology", "frontier", "--nodes", "12"])
    assert code == 0 and "zero3" in capsys.readouterr().out
    from zerotopo.trainer.entry import preflight

    with pytest.raises(ConfigError, match="pipe_parallel_size 4 x model_parallel_size 2.*set both to 1"):
        preflight(TrainJob(configs=(str(FIXTURES / "20B.yml"),), topology="frontier", nodes=12))


def _train(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "zerotopo", "train", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_preprocess_then_train_then_resume_as_a_neox_user(tmp_path):
    vocab, merges = write_gpt2_files(tmp_path / "tok")
    (tmp_path / "tok" / "gpt2-vocab.json").write_bytes(Path(vocab).read_bytes())
    (tmp_path / "tok" / "gpt2-merges.txt").write_bytes(Path(merges).read_bytes())
    words = ["the", "hello", "world", "weather", "north", "going", "in", "a"]
    docs = [{"text": " ".join(words[(i + j) % len(words)] for j in range(40 + i % 7))} for i in range(300)]
    (tmp_path / "enwik8.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    data = tmp_path / "data"
    argv = f"data preprocess --input {tmp_path / 'enwik8.jsonl'} --output-prefix {data / 'enwik8'} "
    argv += f"--vocab-file {tmp_path / 'tok' / 'gpt2-vocab.json'} --merge-file {tmp_path / 'tok' / 'gpt2-merges.txt'} "
    argv += "--tokenizer-type GPT2BPETokenizer --append-eod --workers 2 --no-progress"
    assert main(argv.split()) == 0
    setup = (FIXTURES / "local_setup.yml").read_text()
    (tmp_path / "local_setup.yml").write_text(
        setup.replace("DATA", str(data)).replace("TOK", str(tmp_path / "tok"))
    )
    shutil_copy = (FIXTURES / "125M.yml").read_text()
    (tmp_path / "125M.yml").write_text(shutil_copy)

    first = _train(["125M.yml", "local_setup.yml", *sets(SMALL), "--run-dir", "run"], tmp_path)
    err = first.stderr
    assert err.count("holds no checkpoint yet") == 1
    assert err.count("TensorBoard is not installed") == 1  # tensorboard-dir asked for, not available
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["latest", "step_4"]  # step 2 saved (checkpoint_factor), then pruned (keep 1)
    assert "step     4/4 | loss" in (tmp_path / "logs" / "run.log").read_text()  # log-dir copy
    saved = (tmp_path / "run" / "config.yml").read_text()
    assert "tokenizer_type: GPT2BPETokenizer" in saved

    second = _train(
        ["run/config.yml", "--set", "train_iters=6", "--set", "lr_decay_iters=6", "--run-dir", "run"],
        tmp_path,
    )
    assert "resumed from the checkpoint of step 4" in second.stdout
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_6"]
