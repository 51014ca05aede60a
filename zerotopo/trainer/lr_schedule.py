"""Learning-rate schedules as GPT-NeoX runs them: linear warmup, then constant, linear or cosine decay;
or DeepSpeed's ``scheduler`` block (``WarmupLR``, ``WarmupDecayLR``) when the config has one.

Warmup lasts ``warmup`` (a fraction) of the decay iterations and rises linearly from 0 to the peak; the
decay then runs over the remaining iterations down to ``min_lr`` and stays there.

[Note: DeepSpeed scheduler block] As in DeepSpeed, a ``scheduler`` block in the config wins over NeoX's
``lr_decay_style``/``warmup``/``min_lr``. DeepSpeed sets the block's learning rate once when the engine
starts (its iteration -1: ``warmup_min_lr``) and steps the scheduler after each optimizer step, so
optimizer step ``k`` (0-based) runs with the schedule's value at iteration ``k - 1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from zerotopo.errors import ConfigError
from zerotopo.placement import numbers

DEEPSPEED_SCHEDULERS = ("WarmupLR", "WarmupDecayLR")
_DS_PARAMS = {
    "WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"},
    "WarmupDecayLR": {
        "total_num_steps",
        "warmup_min_lr",
        "warmup_max_lr",
        "warmup_num_steps",
        "warmup_type",
        "last_batch_iteration",
    },
}


@dataclass(frozen=True)
class LRSchedule:
    """Peak ``lr``, floor ``min_lr``, ``warmup_iters`` of linear warmup and decay until ``decay_iters``."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_iters: int
    style: str = "cosine"

    @classmethod
    def from_args(
        cls, *, lr: float, min_lr: float, warmup: float, decay_iters: int, style: str
    ) -> LRSchedule:
        if style not in ("constant", "linear", "cosine"):
            raise ValueError(f"unknown lr_decay_style {style!r}; expected constant, linear or cosine")
        return cls(
            lr=lr,
            min_lr=min(min_lr, lr),
            warmup_iters=int(round(warmup * decay_iters)),
            decay_iters=max(decay_iters, 1),
            style=style,
        )

    def __call__(self, step: int) -> float:
        """Learning rate for optimizer step ``step`` (0-based)."""
        if self.warmup_iters > 0 and step < self.warmup_iters:
            return self.lr * (step + 1) / self.warmup_iters
        if self.style == "constant":
            return self.lr
        span = max(self.decay_iters - self.warmup_iters, 1)
        frac = min(max(step - self.warmup_iters, 0) / span, 1.0)
        if self.style == "linear":
            return self.lr - (self.lr - self.min_lr) * frac
        return self.min_lr + (self.lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * frac))


@dataclass(frozen=True)
class DeepSpeedWarmupSchedule:
    """DeepSpeed's ``WarmupLR`` (``total_num_steps`` None: constant after warmup) and ``WarmupDecayLR``
    (linear decay to ``warmup_min_lr`` at ``total_num_steps``), with DeepSpeed's stepping (see the note)."""

    min_lr: float
    max_lr: float
    warmup_num_steps: int
    warmup_type: str = "log"
    total_num_steps: int | None = None

    def at_iteration(self, it: int) -> float:
        """DeepSpeed's ``get_lr()`` after ``it`` scheduler steps (``it = -1``: before the first)."""
        if it < 0:
            return self.min_lr
        warm = max(2, self.warmup_num_steps)
        if it < warm:
            gamma = math.log(it + 1) / math.log(warm) if self.warmup_type == "log" else it / warm
        elif self.total_num_steps is None:
            gamma = 1.0
        else:
            gamma = max(0.0, (self.total_num_steps - it) / max(1.0, self.total_num_steps - warm))
        return self.min_lr + (self.max_lr - self.min_lr) * gamma

    def __call__(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based)."""
        return self.at_iteration(step - 1)


def deepspeed_schedule(
    block: Mapping[str, Any], *, lr: float, source: str | None = None
) -> DeepSpeedWarmupSchedule:
    """The schedule of a DeepSpeed ``scheduler: {type: ..., params: {...}}`` block; ``lr`` is the
    optimizer's (``WarmupLR``'s peak when ``warmup_max_lr`` is not given, as in DeepSpeed)."""
    kind = block.get("type")
    if kind not in DEEPSPEED_SCHEDULERS:
        raise ConfigError(
            f"{kind!r} is not supported; zerotopo runs DeepSpeed's {' and '.join(DEEPSPEED_SCHEDULERS)}, or drop "
            "the block to use NeoX's lr_decay_style / warmup / min_lr",
            source=source,
            key="scheduler.type",
        )
    unknown = sorted(set(block) - {"type", "params"})
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r}; expected type, params", source=source, key="scheduler"
        )
    params = dict(block.get("params") or {})
    bad = sorted(set(params) - _DS_PARAMS[kind])
    if bad:
        raise ConfigError(
            f"unknown parameter {bad[0]!r} of {kind}; expected {', '.join(sorted(_DS_PARAMS[kind]))}",
            source=source,
            key=f"scheduler.params.{bad[0]}",
        )
    if params.get("last_batch_iteration", -1) != -1:
        raise ConfigError(
            "last_batch_iteration other than -1 is not supported: a resumed run continues the schedule from "
            "its checkpoint's step",
            source=source,
            key="scheduler.params.last_batch_iteration",
        )

    def number(key: str, default: Any, kind_: type = float) -> Any:
        value = params.get(key, default)
        wording = f"{{found}}: expected a{'n integer' if kind_ is int else ' number'}"
        return numbers.number(
            value,
            integer=kind_ is int,
            strings=True,
            messages=wording,
            error=lambda message: ConfigError(message, source=source, key=f"scheduler.params.{key}"),
        )

    warmup_type = params.get("warmup_type", "log")
    if warmup_type not in ("log", "linear"):
        raise ConfigError(
            f"{warmup_type!r}: expected log or linear", source=source, key="scheduler.params.warmup_type"
        )
    steps = number("warmup_num_steps", 1000, int)
    if steps <= 0:
        raise ConfigError(
            f"{steps}: expected a positive integer", source=source, key="scheduler.params.warmup_num_steps"
        )
    total = None
    if kind == "WarmupDecayLR":
        if "total_num_steps" not in params:
            raise ConfigError(
                "WarmupDecayLR needs total_num_steps (usually train_iters)",
                source=source,
                key="scheduler.params.total_num_steps",
            )
        total = number("total_num_steps", None, int)
    return DeepSpeedWarmupSchedule(
        min_lr=number("warmup_min_lr", 0.0),
        # DeepSpeed: WarmupLR peaks at the optimizer's lr unless told; WarmupDecayLR defaults to 0.001.
        max_lr=number("warmup_max_lr", lr if kind == "WarmupLR" else 0.001),
        warmup_num_steps=steps,
        warmup_type=warmup_type,
        total_num_steps=total,
    )


def schedule_for(args, iters: int):
    """The learning-rate schedule a config asks for: its DeepSpeed ``scheduler`` block, else NeoX's keys."""
    if args.optim.scheduler is not None:
        return deepspeed_schedule(
            args.optim.scheduler, lr=args.optim.lr, source=args.optim.where("scheduler")["source"]
        )
    return LRSchedule.from_args(
        lr=args.optim.lr,
        min_lr=args.optim.min_lr,
        warmup=args.optim.warmup,
        decay_iters=args.decay_iters or iters,
        style=args.optim.lr_decay_style,
    )


def held_schedule(schedule, iters: int, optimizer):
    """``step -> learning rate`` as DeepSpeed steps its scheduler: only after an applied optimizer step.

    Without a loss scaler every step is applied and this is ``schedule(step)``. With fp16 dynamic loss
    scaling an overflow skips the step on the device, and DeepSpeed (so NeoX) does not advance the
    scheduler then: the rate is the schedule at the count of applied steps, looked up on the device in
    a table of the schedule, so the host never waits for the overflow flag (docs/engine.md,
    "Synchronization", rule 3)."""
    if getattr(optimizer, "scaler", None) is None:
        return schedule
    applied = optimizer._device_steps
    table = torch.tensor([schedule(k) for k in range(iters + 1)], dtype=torch.float64, device=applied.device)

    def lr_at(step: int) -> torch.Tensor:
        return table[applied.long().clamp(max=iters)]

    return lr_at


class ScheduleLR(LRScheduler):
    """A torch LR scheduler that sets every group's ``lr`` to ``lr_at(step)``, the rate of optimizer step
    ``step`` (0-based; a float, or a 0-d tensor as :func:`held_schedule` gives with loss scaling).

    Call :meth:`step` after each ``optimizer.step()``, as with torch's schedulers. ``start_step``: the
    optimizer step the next ``optimizer.step()`` is (a resumed run's first step), so the groups hold
    ``lr_at(start_step)`` after construction. Unlike ``LambdaLR``, which multiplies each group's initial
    rate by a factor, the rate is ``lr_at``'s value bit for bit."""

    def __init__(self, optimizer: torch.optim.Optimizer, lr_at: Any, *, start_step: int = 0) -> None:
        self.lr_at = lr_at
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        super().__init__(optimizer, last_epoch=start_step - 1)

    def get_lr(self) -> list[Any]:
        lr = self.lr_at(self.last_epoch)
        return [lr for _ in self.optimizer.param_groups]
