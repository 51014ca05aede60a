"""GPT-NeoX's override_lr_scheduler on a resume: true follows the config; false refuses a schedule that
differs from the one the checkpoint recorded."""

from __future__ import annotations

import pytest

from zerotopo.config.neox import load_neox_config
from zerotopo.errors import ConfigError
from zerotopo.trainer.schedule_resume import check_resumed_schedule, schedule_record


def _args(tmp_path, text: str):
    path = tmp_path / "c.yml"
    path.write_text("optimizer: {type: Adam, params: {lr: 2.0e-4}}\nmin_lr: 2.0e-5\ntrain_iters: 40\n" + text)
    return load_neox_config([path])


def test_same_schedule_resumes_under_either_setting(tmp_path):
    for flag in ("false", "true"):
        args = _args(tmp_path, f"override_lr_scheduler: {flag}\n")
        manifest = {"lr_schedule": schedule_record(args, 40)}
        assert check_resumed_schedule(args, 40, manifest, "ckpt/step_20") is None


def test_changed_schedule_is_refused_under_neox_false_naming_what_changed(tmp_path):
    saved = {"lr_schedule": schedule_record(_args(tmp_path, ""), 40)}
    changed = _args(tmp_path, "lr_decay_style: cosine\nwarmup: 0.1\noverride_lr_scheduler: false\n")
    with pytest.raises(ConfigError) as exc:
        check_resumed_schedule(changed, 40, saved, "ckpt/step_20")
    text = str(exc.value)
    assert "lr_decay_style 'linear' -> 'cosine'" in text and "warmup 0.01 -> 0.1" in text
    assert "override_lr_scheduler: true" in text and "ckpt/step_20" in text


def test_changed_schedule_follows_the_config_with_a_notice_when_the_key_is_not_set(tmp_path):
    saved = {"lr_schedule": schedule_record(_args(tmp_path, ""), 40)}
    args = load_neox_config([tmp_path / "c.yml"], {"train_iters": 80})
    assert args.optim.override_lr_scheduler is None
    notice = check_resumed_schedule(args, 80, saved, "ckpt/step_20")
    assert "follows this config" in notice and "lr_decay_iters 40 -> 80" in notice
    assert "override_lr_scheduler: false" in notice  # how to get NeoX's refusal


def test_override_true_follows_the_config_with_a_notice(tmp_path):
    saved = {"lr_schedule": schedule_record(_args(tmp_path, ""), 40)}
    overrides = {"override_lr_scheduler": True, "min_lr": 0.0, "train_iters": 80}
    args = load_neox_config([tmp_path / "c.yml"], overrides)
    notice = check_resumed_schedule(args, 80, saved, "ckpt/step_20")
    assert "follows this config" in notice and "min_lr 2e-05 -> 0.0" in notice
    assert "lr_decay_iters 40 -> 80" in notice  # train_iters grew and the decay follows it


def test_growing_train_iters_with_a_fixed_decay_resumes_under_the_default(tmp_path):
    saved = {"lr_schedule": schedule_record(_args(tmp_path, "lr_decay_iters: 40\n"), 40)}
    args = load_neox_config([tmp_path / "c.yml"], {"train_iters": 80})
    assert not args.optim.override_lr_scheduler
    assert check_resumed_schedule(args, 80, saved, "ckpt/step_20") is None


def test_a_checkpoint_without_a_record_follows_the_config_with_a_notice(tmp_path):
    notice = check_resumed_schedule(_args(tmp_path, ""), 40, {}, "old/step_5")
    assert "records no learning-rate schedule" in notice
