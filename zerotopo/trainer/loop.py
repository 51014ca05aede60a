"""One rank of a training run: its components built (:mod:`zerotopo.trainer.recipe`), then train, evaluate, log.

[Note: host synchronization] Following the rule that the host synchronizes only when logging
(docs/engine.md, "Synchronization", rule 3), per-step losses stay on the device and are
summed across ranks only at each ``log_interval`` (one all-reduce of a short vector), and so are the
engine's per-step figures (gradient norm, fp16 overflow flag and loss scale: 0-d device tensors) and the
ledger's event times; the host never waits on the device inside a logging window.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.checkpoint.retention import prune_checkpoints
from zerotopo.checkpoint.store import NonFiniteError, write_save
from zerotopo.config.tree import TrainConfig
from zerotopo.data.dataset import DistributedBatches
from zerotopo.dtypes import PRECISIONS
from zerotopo.errors import ZerotopoError
from zerotopo.logs import (
    close_run_log,
    console_muted,
    get_logger,
    on_terminal,
    setup_console,
    terminal_columns,
)
from zerotopo.trainer.job import TrainJob
from zerotopo.trainer.longrun import LongRun, check_finite_rows, per_step_means
from zerotopo.trainer.metrics import plot_run, write_summary
from zerotopo.trainer.peak import PeakMemory
from zerotopo.trainer.preempt import EXIT_PREEMPTED, Preempted, Preemption, preemption_signals, signal_name
from zerotopo.trainer.recipe import RankContext, Trainer, build
from zerotopo.trainer.steps import allocated_peak, elapsed_eta, lm_loss

log = get_logger("train")

DTYPES = PRECISIONS


def train_rank(rank: int, world: int, job: TrainJob) -> dict[str, Any] | None:
    """Run the job as one rank; returns the run summary on rank 0 (None elsewhere). A run stopped by a
    preemption signal saves first, then raises :class:`~zerotopo.trainer.preempt.Preempted`."""
    from zerotopo.trainer.entry import launched_externally

    external = launched_externally(job)
    run = LongRun(Preemption(preemption_signals(), counts=external))
    try:
        summary = _train_rank(rank, world, job, run)
    finally:
        run.close()
    # Under a launcher every rank exits with the status; the local launcher stops the other ranks as soon
    # as one fails, so there rank 0 alone (the last to finish) reports it.
    if run.preemption.stopped_by and (external or rank == 0):
        at, where = run.preemption.saved_at, run.preemption.saved_to
        raise Preempted(
            f"stopped by {signal_name(run.preemption.stopped_by)}"
            + (
                f" after saving the checkpoint of step {at} in {where}"
                if at is not None
                else " without saving: the run has no save: directory"
            )
            + f"; run the same command again to continue (exit status {EXIT_PREEMPTED})"
        )
    return summary


def _train_rank(rank: int, world: int, job: TrainJob, run: LongRun) -> dict[str, Any] | None:
    setup_console(verbose=rank == 0)
    with console_muted() if job.config_warnings_shown else contextlib.nullcontext():
        args = job.load_args(quiet=rank != 0)
    tr = build(args, job, run)
    tr.metrics.bar = progress_bar(tr)
    save_steps = set(args.checkpoint.save_iters(tr.iters))
    tr.t_run = time.perf_counter()
    for step in range(tr.start_step, tr.iters):
        tr.metrics.pending.append(train_step(tr, step))
        if tr.metrics.bar is not None:
            tr.metrics.bar.update(1)
        last_step = step + 1 == tr.iters
        saving = bool(args.checkpoint.save) and step + 1 in save_steps and not last_step
        stop = run.preemption.agreed()  # the same answer on every rank at the same step
        console = (step + 1) % args.logging.log_interval == 0 or last_step
        if console or saving or stop:  # a save or a stop writes out the rows it follows
            log_rows(tr, step, console)
        maybe_evaluate(tr, step, last_step)
        if stop:
            stop_for_preemption(tr, stop, step)
            break
        if saving and save(tr, step + 1) and tr.saver is None:
            _retain(args, tr.ctx)
        tr.engine.ledger.reset()
    run.preemption.settle()  # the last step's flag: every rank started its all-reduce
    if tr.metrics.bar is not None:
        tr.metrics.bar.close()
    if args.checkpoint.save and tr.start_step < tr.iters and not run.preemption.stopped_by:
        save(tr, tr.iters, last=True)
        _retain(args, tr.ctx)
    wait_for_save(tr, last=True)
    return finish(tr)


def progress_bar(tr: Trainer):
    """A bar only on rank 0's terminal: in a scheduler's log file the log_interval lines are the progress."""
    if not (tr.ctx.is_main and tr.job.progress and on_terminal()):
        return None
    from tqdm import tqdm

    # Follow the terminal's width when it has one; an unsized pseudo-terminal gets 80 columns.
    sized = terminal_columns() is not None
    return tqdm(
        total=tr.iters,
        initial=tr.start_step,
        desc="train",
        unit="step",
        dynamic_ncols=sized,
        ncols=None if sized else 80,
    )


def forward_backward_step(tr: Trainer) -> torch.Tensor:
    """The step's micro-batches forward and backward; the summed loss stays on the device."""
    accum = tr.batch[1]
    loss_sum = torch.zeros((), device=tr.ctx.device, dtype=torch.float32)
    for mb in range(accum):
        batch = tr.data.next_micro_batch().to(
            tr.ctx.device, non_blocking=True
        )  # no stream sync on the step path
        inputs, labels = batch[:, :-1], batch[:, 1:]
        logits = tr.engine.model(inputs)
        loss = lm_loss(logits, inputs, labels, tr.data.eod)
        tr.engine.model.set_is_last_backward(mb == accum - 1)  # step-end reductions start in this backward
        tr.engine.model.scale_loss(loss / accum).backward()
        loss_sum += loss.detach()
    return loss_sum


def train_step(tr: Trainer, step: int) -> tuple[int, torch.Tensor, dict[str, Any]]:
    """One optimizer step: ``(step number, mean loss on the device, the metrics row without its loss)``."""
    lr = tr.optim.optimizer.param_groups[0]["lr"]  # set by tr.optim.scheduler for this step
    if isinstance(lr, torch.Tensor):
        lr = lr.clone()  # the scheduler updates the group's tensor in place
    t0 = time.perf_counter()
    loss_sum = forward_backward_step(tr)
    stats = tr.optim.optimizer.step()
    tr.optim.scheduler.step()
    tr.optim.optimizer.zero_grad()
    dt = time.perf_counter() - t0
    comm = tr.engine.ledger.mark_step()
    row = {
        "kind": "train",
        "step": step + 1,
        "lr": lr,
        "grad_norm": stats.get("grad_norm"),
        "skipped": stats.get("skipped", False),  # a device tensor with fp16: read at the log interval
        "loss_scale": stats.get("loss_scale"),
        "step_time_s": dt,
        "tokens_per_s": tr.tokens_per_step / dt,
        "tflops_per_device": tr.flops_per_step / dt / tr.ctx.world / 1e12,
        "peak_memory_bytes": allocated_peak(tr.engine.probe),
    }
    peak = tr.topology.device.peak_tflops
    if peak:
        row["mfu"] = row["tflops_per_device"] / peak
    for tier, nbytes in comm.get("bytes_by_tier", {}).items():
        row[f"bytes_{tier}"] = nbytes
    return step + 1, loss_sum / tr.batch[1], row


def log_rows(tr: Trainer, step: int, console: bool) -> None:
    """The pending steps' rows, their losses summed across ranks (one all-reduce), written out and checked
    finite; with ``console`` the last one is the log line."""
    losses = per_step_means(torch.stack([p[1] for p in tr.metrics.pending]))
    for (_, _, r), value in zip(tr.metrics.pending, losses):
        r["loss"] = value
        r.update({k: float(v) for k, v in r.items() if isinstance(v, torch.Tensor)})
        r["skipped"] = int(bool(r["skipped"]))
        tr.metrics.skipped_total += r["skipped"]
        r["perplexity"] = math.exp(min(value, 50.0))
        if tr.metrics.writer:
            tr.metrics.writer.write(r)
    check_finite_rows([r for _, _, r in tr.metrics.pending], tr.args.checkpoint.save)
    tr.metrics.first_loss = losses[0] if tr.metrics.first_loss is None else tr.metrics.first_loss
    tr.metrics.last_loss = losses[-1]
    if tr.ctx.is_main and console:
        r = tr.metrics.pending[-1][2]
        _say(tr.metrics.bar, console_line(tr, r, step))
        if tr.metrics.bar is not None:
            tr.metrics.bar.set_postfix(loss=f"{r['loss']:.3f}")
    tr.metrics.pending.clear()
    tr.engine.ledger.poll()  # resolve the completed collective timings (never waits)


def console_line(tr: Trainer, r: dict[str, Any], step: int) -> str:
    """The log line of row ``r``: loss, rate, MFU, loss scale, skipped steps, time and bytes per tier."""
    iters = tr.iters
    tiers = " ".join(
        f"{k.removeprefix('bytes_')}={v / 2**20:.1f}MiB" for k, v in r.items() if k.startswith("bytes_")
    )
    return (
        f"step {r['step']:>5}/{iters} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | "
        f"{r['tokens_per_s']:.0f} tok/s | {r['tflops_per_device'] * 1e3:.2f} GFLOPS/dev"
        + (f" | MFU {r['mfu'] * 100:.1f}%" if "mfu" in r else "")
        + (f" | loss scale {r['loss_scale']:g}" if tr.engine.loss_scale is not None else "")
        + f" | skipped {tr.metrics.skipped_total}"
        + f" | {elapsed_eta(time.perf_counter() - tr.t_run, step + 1 - tr.start_step, iters - step - 1)}"
        + f" | {tiers}"
    )


def maybe_evaluate(tr: Trainer, step: int, last_step: bool) -> None:
    """The validation loss every ``eval_interval`` steps and after the last one."""
    args = tr.args
    if tr.data.valid is None or not args.evaluation.iters:
        return
    if (step + 1) % args.evaluation.interval != 0 and not last_step:
        return
    vloss = evaluate(tr.engine.model, tr.data.valid, tr.batch[0], tr.ctx, args.evaluation.iters, tr.data.eod)
    tr.metrics.valid_losses.append(vloss)
    if tr.metrics.writer:
        tr.metrics.writer.write(
            {"kind": "valid", "step": step + 1, "loss": vloss, "perplexity": math.exp(min(vloss, 50.0))}
        )
    if tr.ctx.is_main:
        _say(
            tr.metrics.bar,
            f"step {step + 1:>5}/{tr.iters} | validation loss {vloss:.4f} | perplexity {math.exp(vloss):.2f}",
        )


def stop_for_preemption(tr: Trainer, stop: int, step: int) -> None:
    """The ranks agreed on signal ``stop``: save ``step + 1`` (when the run saves) before the loop ends."""
    preemption = tr.run.preemption
    preemption.stopped_by = stop
    if tr.args.checkpoint.save:
        save(tr, step + 1, last=True)
        preemption.saved_at = step + 1
        preemption.saved_to = str(Path(tr.args.checkpoint.save) / f"step_{step + 1}")
    if tr.ctx.is_main:
        log.warning(f"{signal_name(stop)} received: stopping after step {step + 1}")


def save(tr: Trainer, at_step: int, *, last: bool = False) -> bool:
    """Save ``at_step``; a failed save warns and training goes on, unless ``strict_saves`` or ``last``.
    With ``async_save`` a save that is not the run's last is copied here and written in the background
    (see :mod:`zerotopo.checkpoint.background`); the last one waits for the one in flight and is written
    before this returns."""
    args = tr.args
    t0 = time.perf_counter()
    background = tr.saver is not None and not last
    wait_for_save(tr, before=at_step)  # at most one save in flight; a failed one warns (or strict_saves)
    if tr.metrics.writer is not None:
        tr.metrics.writer.sync()  # every logged row on disk before the checkpoint that follows it
    try:
        pending = tr.checkpointer.snapshot(args.checkpoint.save, step=at_step, copy=background)
        if background:
            tr.saver.start(pending, on_done=lambda _: _retain(args, tr.ctx))
        else:
            write_save(pending)
    except NonFiniteError:
        raise
    except ZerotopoError as exc:
        if args.checkpoint.strict_saves or last:
            raise
        if tr.ctx.is_main:
            log.warning(f"{exc}; training goes on (strict_saves: true stops the run instead)")
        return False
    if tr.ctx.is_main:
        blocked = time.perf_counter() - t0
        how = "copied for the background writer" if background else "saved"
        log.debug(f"checkpoint of step {at_step} {how}: training blocked {blocked:.3f}s")
    return True


def wait_for_save(tr: Trainer, *, last: bool = False, before: int | None = None) -> bool:
    """Wait for the background save in flight, if any (``before``: the step about to be saved, named in
    the log). False when it failed, which stops the run under ``strict_saves`` or at its ``last`` save
    and is a warning otherwise."""
    if tr.saver is None or tr.saver.in_flight is None:
        return True
    step = tr.saver.in_flight
    t0 = time.perf_counter()
    if tr.ctx.is_main and before is not None:
        log.info(f"waiting for the background save of step {step} before saving step {before}")
    error = tr.saver.wait()
    if tr.ctx.is_main:
        log.debug(
            f"background save of step {step}: written in {tr.saver.last_write_s or 0.0:.3f}s, "
            f"waited for {time.perf_counter() - t0:.3f}s"
        )
    if error is None:
        return True
    if isinstance(error, NonFiniteError) or not isinstance(error, ZerotopoError):
        raise error
    if tr.args.checkpoint.strict_saves or last:
        raise error
    if tr.ctx.is_main:
        log.warning(f"{error}; training goes on (strict_saves: true stops the run instead)")
    return False


def finish(tr: Trainer) -> dict[str, Any] | None:
    """Close the engine and, on rank 0, write the run's summary and plots; returns the summary there."""
    wall = time.perf_counter() - tr.t_run
    memory = tr.engine.model.memory_report()
    args, topology, plan = tr.args, tr.topology, tr.plan
    peak = peak_report(
        tr.engine.probe,
        tr.ctx,
        args,
        tr.engine.shape,
        tr.engine.unit_numels,
        topology,
        plan,
        tr.engine.param_dtype.itemsize,
        tr.batch[0],
    )
    # Land in-flight parameter gathers and stop the engine's worker threads before the process group
    # goes: a thread still alive when the interpreter finalizes can abort the process from C++.
    tr.engine.model.close()
    if tr.metrics.writer is None:
        return None
    tr.metrics.writer.close()
    steps = tr.iters - tr.start_step
    run = whole_run(tr.run_dir, tr.start_step, wall)
    summary = {
        "run_dir": str(tr.run_dir),
        "plan": plan.name,
        "degrees": plan.label(topology),
        "topology": topology.name,
        "nodes": topology.nodes,
        "world_size": tr.ctx.world,
        "parameters": sum(tr.engine.unit_numels),
        "steps": tr.iters,
        "resumed_from_step": tr.start_step,
        "steps_this_attempt": steps,
        "first_loss": run.get("first_loss", tr.metrics.first_loss),
        "final_loss": tr.metrics.last_loss,
        "final_valid_loss": tr.metrics.valid_losses[-1]
        if tr.metrics.valid_losses
        else run.get("final_valid_loss"),
        "wall_s": wall,
        "wall_s_total": run["wall_s_total"],
        "tokens_per_s": steps * tr.tokens_per_step / wall,
        "memory_bytes_rank0": memory,
        "memory_peak": peak,
        "degrees_resolved": vars(plan.degrees(topology)),
    }
    write_summary(tr.run_dir, summary)
    summary["plots"] = [str(p) for p in plot_run(tr.run_dir)]
    # The command prints its own closing lines; the log file gets the same facts.
    log.debug(
        f"done: {summary['steps']} steps in {wall:.1f}s; loss {tr.metrics.first_loss} -> {tr.metrics.last_loss}; "
        f"files {', '.join(sorted(p.name for p in tr.run_dir.iterdir()))}"
    )
    close_run_log()
    return summary


def whole_run(run_dir: Path, start_step: int, wall: float) -> dict[str, Any]:
    """What the summary says of the whole run when this attempt resumed it at ``start_step``: the first
    training loss and the last validation loss from ``metrics.csv`` (which keeps the earlier attempts'
    rows when the run directory is the same) and the wall time of every attempt that wrote a summary."""
    out: dict[str, Any] = {"wall_s_total": wall}
    if not start_step:
        return out
    from zerotopo.trainer.metrics import read_metrics

    try:
        rows = read_metrics(run_dir / "metrics.csv")
    except (OSError, ValueError):
        rows = []
    train = [r for r in rows if r.get("kind") == "train" and "loss" in r]
    valid = [r for r in rows if r.get("kind") == "valid" and "loss" in r]
    if train:
        out["first_loss"] = min(train, key=lambda r: r["step"])["loss"]
    if valid:
        out["final_valid_loss"] = max(valid, key=lambda r: r["step"])["loss"]
    try:
        before = json.loads((run_dir / "summary.json").read_text())
        out["wall_s_total"] += float(before.get("wall_s_total", before.get("wall_s", 0.0)))
    except (OSError, ValueError, TypeError):
        pass
    return out


def peak_report(
    probe: PeakMemory,
    ctx: RankContext,
    args: TrainConfig,
    shape,
    unit_numels,
    topology,
    plan,
    param_bytes,
    micro,
) -> dict[str, Any]:
    """Every rank's measured peak next to the cost model's per-device total (printed on rank 0)."""
    from zerotopo.cost.memory import memory_per_device

    mine = torch.tensor([probe.peak(), probe.baseline], dtype=torch.int64, device=ctx.device)
    every = [torch.zeros_like(mine) for _ in range(ctx.world)]
    dist.all_gather(every, mine)
    measured = [int(t[0]) for t in every]
    baseline = [int(t[1]) for t in every]
    pred = memory_per_device(
        unit_numels, topology, plan, param_bytes=param_bytes, padded=True, micro_batch=micro,
        shape=shape, checkpoint_activations=args.model.checkpoint_activations,
    )  # fmt: skip
    if ctx.is_main:
        g = 2**30
        log.info(
            f"peak memory per rank: measured {max(measured) / g:.3f} GiB (max over ranks; min "
            f"{min(measured) / g:.3f}) above a baseline of {max(baseline) / g:.3f} GiB; cost model "
            f"{pred.total / g:.3f} GiB per device (model states {pred.model_states / g:.3f}, buffers "
            f"{pred.buffers / g:.3f}, activations {pred.activations / g:.3f}); {probe.method}"
        )
    return {
        "method": probe.method,
        "measured_bytes_per_rank": measured,
        "baseline_bytes_per_rank": baseline,
        "predicted_bytes": pred.total,
        "predicted": pred.as_dict(),
    }


def _say(bar, msg: str) -> None:
    """A log line that does not tear the progress bar."""
    if bar is None:
        log.info(msg)
    else:
        with bar.external_write_mode():
            log.info(msg)


def _retain(args: TrainConfig, ctx: RankContext) -> None:
    """NeoX's keep_last_n_checkpoints, after every rank has finished the save."""
    if args.checkpoint.keep_last_n_checkpoints and ctx.is_main:
        for path in prune_checkpoints(Path(args.checkpoint.save), args.checkpoint.keep_last_n_checkpoints):
            log.debug(
                f"deleted checkpoint {path} (keep_last_n_checkpoints {args.checkpoint.keep_last_n_checkpoints})"
            )


def _mean_over_ranks(values: torch.Tensor) -> list[float]:
    values = values.detach().to(torch.float32).clone()
    dist.all_reduce(values)
    return (values / dist.get_world_size()).cpu().tolist()


@torch.no_grad()
def evaluate(model, dataset, micro: int, ctx: RankContext, eval_iters: int, eod: int | None = None) -> float:
    """Mean validation loss over ``eval_iters`` micro-batches per rank (the same samples every time;
    a split shorter than that is read round again, as NeoX's evaluation iterator does)."""
    total = torch.zeros((), device=ctx.device)
    batches = iter(DistributedBatches(dataset, micro, ctx.rank, ctx.world, start_sample=0, cycle=True))
    for _ in range(eval_iters):
        batch = next(batches).to(ctx.device)
        total += lm_loss(model(batch[:, :-1]), batch[:, :-1], batch[:, 1:], eod)
    return _mean_over_ranks((total / eval_iters).reshape(1))[0]
