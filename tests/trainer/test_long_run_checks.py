"""The long-run checks as pure functions (no process group): the non-finite guard's verdict on logged rows,
the run identity at resume, the samples a resumed run's data must hold, and what a failed save says about
the previous checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from zerotopo.checkpoint.store import NonFiniteError, _kept, check_identity, previous_checkpoint
from zerotopo.config.neox import load_neox_config
from zerotopo.errors import ConfigError, ZerotopoError
from zerotopo.trainer.longrun import check_finite_rows, check_resume_position
from zerotopo.trainer.steps import train_samples_needed

ROOT = Path(__file__).resolve().parents[2]


def _row(step, loss=2.0, grad_norm=1.0, skipped=0):
    return {"step": step, "loss": loss, "grad_norm": grad_norm, "skipped": skipped}


@pytest.mark.parametrize("bad", [{"loss": math.nan}, {"loss": math.inf}, {"grad_norm": math.nan}])
def test_the_first_non_finite_step_stops_the_run(bad):
    rows = [_row(1), _row(2, **bad), _row(3, loss=math.nan)]
    with pytest.raises(NonFiniteError, match="step 2: the .* before saving anything from it; the last"):
        check_finite_rows(rows, "ckpt")


def test_steps_the_fp16_scaler_skipped_are_not_counted():
    check_finite_rows([_row(1, grad_norm=math.inf, skipped=1), _row(2)], None)


def _ckpt(tmp_path, **manifest):
    base = {"step": 2, "consumed_samples": 16, "seed": 1234, "plan": "zerotopo", "config_hash": "aaaa"}
    return SimpleNamespace(path=tmp_path / "step_2", step=2, manifest={**base, **manifest})


def test_identity_differences_are_an_error_only_when_the_run_continues_in_that_directory(tmp_path):
    ckpt = _ckpt(tmp_path)
    same = dict(seed=1234, plan="zerotopo", config_hash="aaaa")
    assert check_identity(ckpt, **same, continues=True) is None
    with pytest.raises(ZerotopoError, match=r"written by another run \(seed 1234 -> 7\)"):
        check_identity(ckpt, **{**same, "seed": 7}, continues=True)
    with pytest.raises(ZerotopoError, match="config aaaa -> bbbb"):
        check_identity(ckpt, **{**same, "config_hash": "bbbb"}, continues=True)
    # another plan reshards: a notice; so is any branch into another save directory
    assert "plan zerotopo -> zero3" in check_identity(ckpt, **{**same, "plan": "zero3"}, continues=True)
    assert "seed 1234 -> 7" in check_identity(ckpt, **{**same, "seed": 7}, continues=False)
    # checkpoints of an earlier zerotopo carry no hash: only what they recorded is compared
    assert check_identity(_ckpt(tmp_path, config_hash=None), **same, continues=True) is None


def test_a_resume_at_another_global_batch_is_accepted_and_an_impossible_count_refused(tmp_path):
    args = load_neox_config([ROOT / "configs" / "tiny.yml"], {"train_iters": 4})
    _, _, global_batch = args.batch.batch_sizes(8)
    # written by 8 ranks at step 2, resumed on 4: half the global batch, the same consumed samples
    check_resume_position(args, _ckpt(tmp_path, consumed_samples=2 * global_batch), 4)
    check_resume_position(args, _ckpt(tmp_path, consumed_samples=2 * global_batch), 8)
    with pytest.raises(ConfigError, match="has consumed 1 samples at step 2, fewer than one per step; the "):
        check_resume_position(args, _ckpt(tmp_path, consumed_samples=1), 8)


def test_the_training_data_holds_the_consumed_samples_and_the_remaining_steps_at_the_new_batch():
    ctx = SimpleNamespace(is_main=False)
    # 8 ranks consumed 128 samples in 2 steps of 64; 4 ranks run the 2 steps left at 32
    assert train_samples_needed(4, 2, 128, 32, ctx) == 128 + 2 * 32
    assert train_samples_needed(4, 2, 64, 32, ctx) == 4 * 32  # the same batch: train_iters x batch


def test_a_failed_save_names_the_kept_checkpoint_or_says_there_is_none(tmp_path):
    assert previous_checkpoint(tmp_path) is None
    assert _kept(tmp_path) == f"there is no earlier checkpoint in {tmp_path}"
    (tmp_path / "step_4").mkdir()
    (tmp_path / "step_4" / "checkpoint.json").write_text("{}")
    (tmp_path / "latest").write_text("step_4\n")
    assert _kept(tmp_path) == f"the previous checkpoint is kept ({tmp_path / 'step_4'})"


def test_load_naming_nothing_is_an_error_unless_a_fresh_start_is_asked_for(tmp_path):
    from zerotopo.trainer.job import TrainJob
    from zerotopo.trainer.longrun import check_fresh_start

    tiny = ROOT / "configs" / "tiny.yml"
    typo = str(tmp_path / "checkpints")
    job = TrainJob(configs=(str(tiny),))
    with pytest.raises(ConfigError, match="load: .*checkpints does not exist; .*fresh_start: true"):
        check_fresh_start(load_neox_config([tiny], {"load": typo}), job)
    (tmp_path / "checkpints").mkdir()
    with pytest.raises(ConfigError, match="checkpints holds no checkpoint"):
        check_fresh_start(load_neox_config([tiny], {"load": typo}), job)
    check_fresh_start(load_neox_config([tiny], {"load": typo, "fresh_start": True}), job)
    check_fresh_start(load_neox_config([tiny], {"load": typo, "save": typo}), job)  # NeoX's first run
