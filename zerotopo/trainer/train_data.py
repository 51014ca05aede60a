"""The recipe's data component: the training batches, the validation split, and the position in the
training data, which it owns and checkpoints (``consumed_samples``, GPT-NeoX's ``consumed_train_samples``).

The position is counted as batches are taken, not derived from the step: a run that resumes a checkpoint
written under another global batch continues from the samples that run consumed."""

from __future__ import annotations

from typing import Any

import torch

from zerotopo.data.dataset import DistributedBatches
from zerotopo.trainer.preflight import build_datasets
from zerotopo.trainer.steps import train_samples_needed, usable_valid_split


class TrainData:
    """The data of one rank. A checkpoint component (``data``, see
    :mod:`zerotopo.checkpoint.components`): ``state_dict()`` is ``{"consumed_samples": n}``, the samples
    of the whole job taken so far; :meth:`open` starts the batches there.

    ``batch``: ``(micro, accumulation steps, global batch)``; ``eod``: the end-of-document token whose
    positions carry no loss (None: every position counts)."""

    name = "data"

    def __init__(self, args, ctx, *, batch: tuple[int, int, int], iters: int, eod: int | None) -> None:
        self.args, self.ctx, self.batch, self.iters, self.eod = args, ctx, batch, iters, eod
        self.consumed = 0
        self.valid: Any = None
        self._batches: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed = int(state.get("consumed_samples", 0))

    def open(self, start_step: int) -> None:
        """The training batches from the current position (a run resumed at ``start_step``) and the
        validation split (None when it cannot be evaluated)."""
        args, ctx = self.args, self.ctx
        micro, _, global_batch = self.batch
        eval_runs = self.iters // args.evaluation.interval + 1
        num_samples = (
            train_samples_needed(self.iters, start_step, self.consumed, global_batch, ctx),
            max(eval_runs * args.evaluation.iters * micro * ctx.world, 1),
            1,
        )
        train_ds, valid_ds, _ = build_datasets(args, num_samples)
        self.valid = usable_valid_split(valid_ds, micro, ctx, args)
        self._batches = iter(
            DistributedBatches(train_ds, micro, ctx.rank, ctx.world, start_sample=self.consumed)
        )

    def next_micro_batch(self) -> torch.Tensor:
        """This rank's next micro-batch (host tensor); the job's position moves by one micro-batch per rank."""
        batch = next(self._batches)
        self.consumed += self.batch[0] * self.ctx.world
        return batch
