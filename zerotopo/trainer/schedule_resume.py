"""The learning-rate schedule a checkpoint was trained with, and GPT-NeoX's ``override_lr_scheduler``.

zerotopo's schedule is a function of the config's keys and the step, so a resume continues the
checkpoint's schedule exactly when those keys are the checkpoint's. Each checkpoint records them
(``lr_schedule`` in its manifest). On a resume, ``override_lr_scheduler: true`` follows the config's keys
(a notice names what changed); ``false``, GPT-NeoX's default, refuses a run whose keys differ from the
checkpoint's, naming each, as GPT-NeoX's ``AnnealingLR`` does when it loads a checkpoint. Not set, the
schedule follows the config with the same notice (zerotopo's default, see config/neox_defaults.py).
"""

from __future__ import annotations

from typing import Any

from zerotopo.config.tree import TrainConfig
from zerotopo.errors import ConfigError


def schedule_record(args: TrainConfig, iters: int) -> dict[str, Any]:
    """The settings that fix the learning rate of every step, as a checkpoint records them (GPT-NeoX's
    scheduler checks the same: peak and floor, warmup, decay length and style; ``train_iters`` may grow,
    ``lr_decay_iters`` then follows it unless set)."""
    return {
        "lr": args.optim.lr,
        "min_lr": args.optim.min_lr,
        "warmup": args.optim.warmup,
        "lr_decay_iters": args.decay_iters or iters,
        "lr_decay_style": args.optim.lr_decay_style,
        "scheduler": args.optim.scheduler,
    }


def check_resumed_schedule(args: TrainConfig, iters: int, manifest: dict[str, Any], where: str) -> str | None:
    """Compare this run's schedule with the one recorded in a checkpoint's ``manifest``.

    Returns a notice for rank 0 (None: nothing to say). Raises :class:`ConfigError` when the schedule
    differs and ``override_lr_scheduler`` is set to false."""
    saved = manifest.get("lr_schedule")
    if not isinstance(saved, dict):
        return (
            f"{where} records no learning-rate schedule (written by an older zerotopo); the schedule follows "
            "this config's keys"
        )
    mine = schedule_record(args, iters)
    diffs = [f"{k} {saved.get(k)!r} -> {v!r}" for k, v in mine.items() if _differs(saved.get(k), v)]
    if not diffs:
        return None
    if args.optim.override_lr_scheduler is None:
        return (
            f"the learning-rate schedule follows this config, not {where}: {', '.join(diffs)} (set "
            "override_lr_scheduler: false to refuse such a resume, as GPT-NeoX does)"
        )
    if args.optim.override_lr_scheduler:
        return f"override_lr_scheduler: the schedule follows this config, not {where}: {', '.join(diffs)}"
    raise ConfigError(
        f"the learning-rate schedule differs from the one {where} was trained with ({', '.join(diffs)}); "
        "set override_lr_scheduler: true to follow this config's schedule from the resumed step, or give "
        "the checkpoint's values",
        source=args.optim.where("override_lr_scheduler")["source"],
        key="override_lr_scheduler",
    )


def _differs(saved: Any, mine: Any) -> bool:
    if isinstance(saved, (int, float)) and isinstance(mine, (int, float)) and not isinstance(saved, bool):
        return abs(float(saved) - float(mine)) > 1e-12 * max(abs(float(saved)), abs(float(mine)), 1.0)
    return saved != mine
