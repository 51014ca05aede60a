"""What keeps a days-long run safe, around the training loop of :mod:`zerotopo.trainer.loop`.

- One writer per save directory (:class:`LongRun` takes :mod:`zerotopo.trainer.savelock`'s lock on rank 0)
  and the preemption signals (:mod:`zerotopo.trainer.preempt`).
- The run identity checked at resume (seed, plan, :func:`config_hash`) and ``load:`` that names nothing
  (:func:`check_fresh_start`).
- The non-finite guard (:func:`check_finite_rows`) and per-step loss means that do not depend on the
  logging window (:func:`per_step_means`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.checkpoint.store import NonFiniteError
from zerotopo.config.tree import TrainConfig
from zerotopo.errors import ConfigError, ZerotopoError
from zerotopo.models.neox import NeoXConfig
from zerotopo.trainer.job import TrainJob
from zerotopo.trainer.preempt import Preemption
from zerotopo.trainer.savelock import SaveLock


@dataclass
class LongRun:
    """What keeps a long run safe across its steps: the save directory's lock (rank 0) and the
    preemption signals (see :mod:`zerotopo.trainer.preempt` and :mod:`zerotopo.trainer.savelock`)."""

    preemption: Preemption
    lock: SaveLock | None = None

    def take_lock(self, args: TrainConfig, is_main: bool, *, launcher_holds: bool = False) -> None:
        """Collective: rank 0 takes the lock of ``save:``; every rank raises the same error if it cannot.
        ``launcher_holds``: the launching process took it before the ranks started (nothing to do)."""
        if launcher_holds:
            return
        error = ""
        if is_main and args.checkpoint.save:
            try:
                self.lock = SaveLock(args.checkpoint.save, args.checkpoint.where("save")["source"])
                self.preemption.on_abort.append(self.lock.release)
            except ZerotopoError as exc:
                error = str(exc)
        box = [error]
        dist.broadcast_object_list(box, src=0)
        if box[0]:
            raise ConfigError(box[0])

    def close(self) -> None:
        self.preemption.restore()
        if self.lock is not None:
            self.lock.release()


def check_run_identity(args: TrainConfig, job: TrainJob, cfg: NeoXConfig, ckpt) -> str | None:
    """The checkpoint's run (seed, plan, config hash) against this one; an error when this run saves
    into the directory it resumes from and is another run, else a notice text (None: the same run)."""
    from zerotopo.checkpoint.store import check_identity

    # finetune starts a new run from the weights: nothing of the old run is continued
    continues = not args.checkpoint.finetune and (
        _same_dir(args.checkpoint.save, args.checkpoint.load)
        or _same_dir(args.checkpoint.save, ckpt.path.parent)
    )
    return check_identity(
        ckpt,
        seed=args.seed,
        plan=job.load_plan(args).name,
        config_hash=config_hash(args, cfg),
        continues=continues,
    )


def check_fresh_start(args: TrainConfig, job: TrainJob) -> None:
    """``load:`` that does not exist or holds no checkpoint: an error (a typo would otherwise start a new
    run whose saves take over ``latest``), unless ``fresh_start`` asks for step 0 or ``load`` equals
    ``save`` (NeoX's first run)."""
    if (
        not args.checkpoint.load
        or args.checkpoint.fresh_start
        or _hf_source(args, job)
        or _same_dir(args.checkpoint.load, args.checkpoint.save)
    ):
        return
    what = "does not exist" if not os.path.exists(args.checkpoint.load) else "holds no checkpoint"
    raise ConfigError(
        f"load: {args.checkpoint.load} {what}; point load: at a save: directory or a step_<N> in it, or set "
        "fresh_start: true to start from step 0",
        **args.checkpoint.where("load"),
    )


def _same_dir(a: str | os.PathLike | None, b: str | os.PathLike | None) -> bool:
    return bool(a) and bool(b) and os.path.realpath(a) == os.path.realpath(b)


def check_finite_rows(rows: list[dict[str, Any]], save: str | None) -> None:
    """Stop at the first step whose loss or gradient norm is NaN or Inf, before anything is saved from
    it. Steps the fp16 loss scaler skipped (an overflow it handles) are not counted."""
    for r in rows:
        if r.get("skipped"):
            continue
        bad = [k for k in ("loss", "grad_norm") if r.get(k) is not None and not math.isfinite(r[k])]
        if bad:
            where = f"; the last checkpoint in {save} predates it" if save else ""
            raise NonFiniteError(
                f"step {r['step']}: the {' and the '.join(k.replace('_', ' ') for k in bad)} "
                f"{'is' if len(bad) == 1 else 'are'} {r[bad[0]]}; the run stopped before saving anything "
                f"from it{where}. Resume with a lower lr, stronger gradient_clipping or bf16/fp32"
            )


def config_hash(args: TrainConfig, cfg: NeoXConfig) -> str:
    """What makes one run's checkpoints a continuation of another's, besides seed and plan: the model,
    the sequence length, the tokenizer and the data (file names, not directories, which may move)."""
    import hashlib
    import json

    from zerotopo.models.config import model_identity

    ident = {
        "model": model_identity(cfg),
        "seq_length": args.model.seq_length,
        "tokenizer": args.data.tokenizer_type,
        "data": [os.path.basename(p) for p in args.data.data_path or ()],
        "split": args.data.split,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def per_step_means(values: torch.Tensor) -> list[float]:
    """Each step's mean over the ranks, summed in rank order on the host: every step's figure is the same
    whatever the logging window it falls in (one all-reduce of the window's vector would sum each
    position in its own order and change the last bits with the window)."""
    values = values.detach().to(torch.float32).contiguous()
    every = [torch.empty_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(every, values)  # exact: no arithmetic in the collective
    rows = torch.stack(every).cpu()
    total = rows[0].clone()
    for row in rows[1:]:
        total += row
    return (total / dist.get_world_size()).tolist()


def check_resume_position(args: TrainConfig, ckpt, world: int) -> None:
    """The samples a checkpoint consumed are possible at its step, before any rank starts. A resume at
    another world size or global batch continues from the consumed count: the training data is built for
    the consumed samples plus the remaining steps at this run's global batch (see
    :func:`zerotopo.trainer.steps.train_samples_needed`), so no count a real run can reach is refused."""
    step, consumed = ckpt.step, int(ckpt.manifest["consumed_samples"])
    if consumed < step:
        raise ConfigError(
            f"{ckpt.path} has consumed {consumed} samples at step {step}, fewer than one per step; the "
            "manifest is damaged: load an earlier checkpoint",
            key="load",
        )


def _hf_source(args: TrainConfig, job: TrainJob) -> str | None:
    from zerotopo.trainer.preflight import hf_source

    return hf_source(args, job)
