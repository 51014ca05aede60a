"""A resumed run: its summary covers the whole run, and GPT-NeoX's ``override_lr_scheduler`` decides
whether a changed learning-rate schedule may continue it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from zerotopo.cli.main import main
from zerotopo.trainer.loop import whole_run
from zerotopo.trainer.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


def test_whole_run_reads_the_earlier_attempts(tmp_path):
    (tmp_path / "metrics.csv").write_text(
        "step,kind,loss\n1,train,5.5\n2,train,5.0\n2,valid,5.2\n3,train,4.0\n4,train,3.5\n4,valid,3.9\n"
    )
    (tmp_path / "summary.json").write_text(json.dumps({"wall_s": 10.0, "steps": 2}))
    run = whole_run(tmp_path, 2, 4.0)
    assert run == {"first_loss": 5.5, "final_valid_loss": 3.9, "wall_s_total": 14.0}
    assert whole_run(tmp_path, 0, 4.0) == {"wall_s_total": 4.0}  # a fresh run is its own whole


@pytest.mark.slow
def test_resume_summary_covers_the_whole_run_and_a_changed_schedule_needs_override(tmp_path, capfd):
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yml").read_text())
    cfg.update(
        num_layers=1, hidden_size=32, num_attention_heads=2, seq_length=16, max_position_embeddings=16,
        train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, eval_interval=100, eval_iters=0,
        log_interval=1, save=str(tmp_path / "save"), save_interval=2, train_iters=2,
    )  # fmt: skip
    (tmp_path / "c.yml").write_text(yaml.safe_dump(cfg))
    run = tmp_path / "run"

    def train(*sets: str) -> tuple[int, str]:
        argv = ["train", str(tmp_path / "c.yml"), "--run-dir", str(run), "--no-progress"]
        code = main(argv + [a for s in sets for a in ("--set", s)])
        out, err = capfd.readouterr()
        return code, out + err

    code, out = train()
    assert code == 0, out[-3000:]
    first = json.loads((run / "summary.json").read_text())
    # the schedule is the checkpoint's (train_iters and lr_decay_iters fixed): the resume continues it
    code, out = train("train_iters=4", "lr_decay_iters=2", "load=" + str(tmp_path / "save"))
    assert code == 0, out[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["steps"], summary["resumed_from_step"], summary["steps_this_attempt"]) == (4, 2, 2)
    assert summary["first_loss"] == first["first_loss"]  # step 1's, from the first attempt
    assert summary["wall_s_total"] == pytest.approx(first["wall_s"] + summary["wall_s"])
    assert [r["step"] for r in read_metrics(run / "metrics.csv") if r["kind"] == "train"] == [1, 2, 3, 4]
    assert "4 steps (2 after resuming at step 2)" in out
    # another peak rate: refused before any rank starts under NeoX's override_lr_scheduler: false ...
    load = "load=" + str(tmp_path / "save")
    code, out = train(
        "train_iters=6", "lr_decay_iters=2", "optimizer.params.lr=0.01", load, "override_lr_scheduler=false"
    )
    assert code == 2 and "lr 0.001 -> 0.01" in out and "override_lr_scheduler: true" in out
    # ... and followed, with a notice, when the config says so
    code, out = train(
        "train_iters=6", "lr_decay_iters=2", "optimizer.params.lr=0.01", load, "override_lr_scheduler=true"
    )
    assert code == 0 and "override_lr_scheduler: the schedule follows this config" in out
