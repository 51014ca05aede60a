"""Learning-rate schedules as GPT-NeoX runs them: linear warmup, then constant, linear or cosine decay.

Warmup lasts ``warmup`` (a fraction) of the decay iterations and rises linearly from 0 to the peak; the
decay then runs over the remaining iterations down to ``min_lr`` and stays there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


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
