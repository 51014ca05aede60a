"""Small pieces of the training step that the loop reads top to bottom: the language-model loss (with
NeoX's ``eod_mask_loss``), how many training samples a (resumed) run needs, whether the validation split
can be evaluated, the per-step memory figure and the elapsed/ETA text of the log line."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zerotopo.logs import get_logger
from zerotopo.trainer.peak import PeakMemory, _status_bytes

log = get_logger("train")


def lm_loss(
    logits: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor, eod: int | None = None
) -> torch.Tensor:
    """Mean next-token cross entropy. With ``eod`` (NeoX's ``eod_mask_loss``) the positions whose input
    token is the end-of-document token carry no loss, as NeoX's ``get_ltor_masks_and_position_ids`` masks
    them (the token after a document's end belongs to an unrelated document)."""
    flat = logits.float().reshape(-1, logits.shape[-1])
    if eod is None:
        return F.cross_entropy(flat, labels.reshape(-1))
    losses = F.cross_entropy(flat, labels.reshape(-1), reduction="none")
    mask = (inputs.reshape(-1) != eod).to(losses.dtype)
    # NeoX divides by mask.sum(); a micro-batch of end tokens only would divide by zero there.
    return (losses * mask).sum() / mask.sum().clamp(min=1.0)


def train_samples_needed(iters: int, start_step: int, consumed: int, global_batch: int, ctx) -> int:
    """Training samples the dataset must hold: ``iters`` steps of ``global_batch``, or, when a checkpoint
    was written under another global batch, the samples it consumed plus the remaining steps' (the run
    continues from the consumed sample count, as NeoX's ``consumed_train_samples``)."""
    needed = iters * global_batch
    if consumed != start_step * global_batch and start_step < iters:
        needed = max(needed, consumed + (iters - start_step) * global_batch)
        if ctx.is_main:
            log.info(
                f"the checkpoint of step {start_step} consumed {consumed} samples, not {start_step} x "
                f"{global_batch} (it was trained with another global batch): training continues from "
                f"sample {consumed} with {global_batch} samples per step"
            )
    return needed


def usable_valid_split(dataset, micro: int, ctx, args):
    """The validation split, or None (evaluation skipped with a notice, as NeoX skips it) when the split
    has no documents or fewer samples than one global micro-batch."""
    if not args.evaluation.iters:
        return dataset
    size = 0 if dataset is None else len(dataset)
    if size >= micro * ctx.world:
        return dataset
    if ctx.is_main:
        log.warning(_no_evaluation(args, size, micro, ctx.world))
    return None


def _no_evaluation(args, size: int, micro: int, world: int) -> str:
    """Why evaluation is skipped, naming the key that fixes it."""
    batch = f"one global micro-batch ({micro} x {world} ranks)"
    if args.data.train_data_paths and not args.data.valid_data_paths:
        return (
            "train_data_paths is set without valid_data_paths, so there is no validation data: evaluation is "
            "skipped; set valid_data_paths to evaluate (split is not used with train_data_paths)"
        )
    if args.data.valid_data_paths:
        return (
            f"valid_data_paths hold {size} samples, fewer than {batch}: evaluation is skipped; give "
            "valid_data_paths more documents, or a smaller micro-batch"
        )
    return (
        f"the validation split (split {','.join(f'{x:g}' for x in args.data.split)}) holds {size} samples, fewer "
        f"than {batch}: evaluation is skipped; give the second split weight more documents to evaluate"
    )


def allocated_peak(probe: PeakMemory) -> int:
    """This rank's peak memory so far, in bytes, without waiting on the device: the caching allocator's
    high-water mark on a GPU (a host-side counter), the resident set's (VmHWM) on CPU."""
    if probe.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(probe.device))
    return int(_status_bytes("VmHWM") or 0)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def elapsed_eta(elapsed_s: float, steps_done: int, steps_left: int) -> str:
    """``elapsed 0:01:05 ETA 0:10:00`` from the mean step time of this run so far."""
    eta = elapsed_s / max(steps_done, 1) * steps_left
    return f"elapsed {_clock(elapsed_s)} ETA {_clock(eta)}"
