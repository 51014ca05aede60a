"""One rank of a training run: build the mesh, the model and the data, then train, evaluate and log.

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
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.checkpoint.retention import prune_checkpoints
from zerotopo.checkpoint.store import NonFiniteError, load_checkpoint, snapshot_save, write_save
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import build_mesh
from zerotopo.config.neox import NeoXArgs
from zerotopo.data.dataset import DistributedBatches
from zerotopo.data.tokenizers import build_tokenizer
from zerotopo.dtypes import PRECISIONS
from zerotopo.engine import MixedPrecision, ShardedOptimizer, debug
from zerotopo.engine.optim import make_scaler
from zerotopo.errors import ConfigError, ZerotopoError
from zerotopo.fsutil import write_text_atomic
from zerotopo.launch.advice import topology_mismatch_advice
from zerotopo.launch.devices import check_device_list
from zerotopo.launch.discovery import check_against_topology, discover, init_distributed, topological_index
from zerotopo.logs import (
    attach_run_log,
    close_run_log,
    console_muted,
    get_logger,
    on_terminal,
    setup_console,
    terminal_columns,
)
from zerotopo.models.neox import GPTNeoX, NeoXConfig
from zerotopo.trainer.job import TrainJob
from zerotopo.trainer.longrun import (
    LongRun,
    check_finite_rows,
    check_fresh_start,
    check_run_identity,
    config_hash,
    per_step_means,
)
from zerotopo.trainer.lr_schedule import ScheduleLR, held_schedule, schedule_for
from zerotopo.trainer.metrics import MetricsWriter, open_wandb, plot_run, write_summary
from zerotopo.trainer.peak import PeakMemory, unmap_large_frees
from zerotopo.trainer.preempt import EXIT_PREEMPTED, Preempted, Preemption, preemption_signals, signal_name
from zerotopo.trainer.preflight import (
    build_datasets,
    check_memory,
    hf_source,
    model_config,
    recognise_topology,
)
from zerotopo.trainer.schedule_resume import check_resumed_schedule, schedule_record
from zerotopo.trainer.steps import (
    allocated_peak,
    elapsed_eta,
    lm_loss,
    train_samples_needed,
    usable_valid_split,
)

log = get_logger("train")

DTYPES = PRECISIONS


@dataclass
class RankContext:
    """What every part of the loop needs to know about this rank."""

    rank: int
    world: int
    device: torch.device
    is_main: bool


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


@dataclass
class Trainer:
    """One rank's run once it is built: what the step functions below read, and the figures they keep
    between log intervals. Built by :func:`setup`; the loop in :func:`_train_rank` reads top to bottom."""

    args: NeoXArgs
    job: TrainJob
    run: LongRun
    ctx: RankContext
    topology: Any
    plan: Any
    cfg: NeoXConfig
    tokenizer: Any
    probe: PeakMemory
    model: Any
    optimizer: Any
    ledger: Ledger
    loss_scale: Any
    shape: Any
    unit_numels: list[int]
    param_dtype: torch.dtype
    batch: tuple[int, int, int]
    """``(micro, accumulation steps, global batch)`` in samples."""
    iters: int
    lr_at: Any
    """``step -> learning rate`` of the config's schedule (held at skipped fp16 steps)."""
    run_dir: Path
    start_step: int = 0
    scheduler: Any = None
    """The torch LR scheduler that sets the optimizer's rate (built once the start step is known)."""
    consumed: int = 0
    train_batches: Any = None
    valid_ds: Any = None
    eod: int | None = None
    writer: MetricsWriter | None = None
    bar: Any = None
    pending: list[tuple[int, torch.Tensor, dict[str, Any]]] = field(default_factory=list)
    first_loss: float | None = None
    last_loss: float | None = None
    valid_losses: list[float] = field(default_factory=list)
    skipped_total: int = 0
    t_run: float = 0.0
    saver: Any = None
    """The background checkpoint writer (``async_save``), else None."""

    @property
    def flops_per_step(self) -> float:
        return self.shape.step_flops(self.batch[2], checkpoint_activations=self.args.checkpoint_activations)

    @property
    def tokens_per_step(self) -> int:
        return self.batch[2] * self.args.seq_length


def _train_rank(rank: int, world: int, job: TrainJob, run: LongRun) -> dict[str, Any] | None:
    setup_console(verbose=rank == 0)
    with console_muted() if job.config_warnings_shown else contextlib.nullcontext():
        args = job.load_args(quiet=rank != 0)
    tr = setup(args, job, run)
    tr.bar = progress_bar(tr)
    save_steps = set(args.save_iters(tr.iters))
    tr.t_run = time.perf_counter()
    for step in range(tr.start_step, tr.iters):
        tr.pending.append(train_step(tr, step))
        if tr.bar is not None:
            tr.bar.update(1)
        last_step = step + 1 == tr.iters
        saving = bool(args.save) and step + 1 in save_steps and not last_step
        stop = run.preemption.agreed()  # the same answer on every rank at the same step
        console = (step + 1) % args.log_interval == 0 or last_step
        if console or saving or stop:  # a save or a stop writes out the rows it follows
            log_rows(tr, step, console)
        maybe_evaluate(tr, step, last_step)
        if stop:
            stop_for_preemption(tr, stop, step)
            break
        if saving and save(tr, step + 1) and tr.saver is None:
            _retain(args, tr.ctx)
        tr.ledger.reset()
    run.preemption.settle()  # the last step's flag: every rank started its all-reduce
    if tr.bar is not None:
        tr.bar.close()
    if args.save and tr.start_step < tr.iters and not run.preemption.stopped_by:
        save(tr, tr.iters, last=True)
        _retain(args, tr.ctx)
    wait_for_save(tr, last=True)
    return finish(tr)


def setup(args: NeoXArgs, job: TrainJob, run: LongRun) -> Trainer:
    """This rank joined to the job, its model sharded and resumed, its data and run directory open."""
    info = discover(prefer=None if job.launcher in ("auto", "local") else job.launcher)
    job = recognise_topology(job, args, info)
    topology = job.load_topology(args, nodes=info.num_nodes if info.launcher != "local" else None)
    if info.world_size != topology.world_size:
        raise ConfigError(
            f"the job has {info.world_size} ranks but topology {topology.name!r} with {topology.nodes} nodes "
            f"x {topology.devices_per_node} devices needs {topology.world_size}; "
            + topology_mismatch_advice(info, topology),
            key="topology",
        )
    check_against_topology(info, topology)
    # A launched rank that sees no device stops here, naming the variable that hid it (not at the rendezvous).
    seen = torch.cuda.device_count() if info.launcher != "local" else None
    check_device_list(os.environ, topology, device_count=seen)
    device = init_distributed(info)
    torch.set_num_threads(max(1, int(os.environ.get("ZEROTOPO_THREADS_PER_RANK", "1"))))
    plan = job.load_plan(args)
    plan.degrees(topology)  # an unusable plan fails here, before the lock is taken
    ctx = RankContext(rank=info.rank, world=info.world_size, device=device, is_main=info.rank == 0)
    run.take_lock(args, ctx.is_main, launcher_holds=job.save_locked)
    mesh = build_mesh(topology, plan, topo_index=topological_index(info, topology), device=device)
    if device.type == "cpu":
        unmap_large_frees()  # freed units go back to the OS (zerotopo.trainer.peak, [Note: CPU ranks and glibc])
    probe = PeakMemory(device)  # the baseline: interpreter, torch, process groups; no model state yet
    if ctx.is_main:
        log.info(
            f"zerotopo train: {ctx.world} ranks joined; building the model and sharding it (plan {plan.name})"
        )
    tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file, args.eod_token)
    tr = build_model(args, job, run, ctx, topology, plan, mesh, tokenizer, probe)
    tr.start_step, tr.consumed = resume(args, job, tr.model, tr.optimizer, tr.cfg, ctx)
    tr.scheduler = ScheduleLR(tr.optimizer, tr.lr_at, start_step=tr.start_step)
    if ctx.is_main:
        log.info("zerotopo train: opening the data")
    open_data(tr)
    if ctx.is_main:
        tr.writer = open_run_dir(tr)
    if args.async_save and args.save:
        from zerotopo.checkpoint.background import BackgroundSaver, check_host_memory

        check_host_memory(tr.optimizer, is_main=ctx.is_main, say=log.info)
        tr.saver = BackgroundSaver()
    return tr


def build_model(
    args: NeoXArgs, job: TrainJob, run: LongRun, ctx: RankContext, topology, plan, mesh, tokenizer, probe
) -> Trainer:
    """The model built on the meta device, checked against the device's memory, then sharded by the
    engine with its optimizer; the learning-rate schedule and the run directory's name."""
    cfg = model_config(args, job, tokenizer)
    param_dtype = DTYPES[args.resolved_precision]
    micro, accum, global_batch = args.batch_sizes(ctx.world)
    torch.manual_seed(args.seed)
    with torch.device("meta"):
        # no storage: parallelize materializes each unit in turn and keeps this rank's shards only,
        # drawing the init in the order an eager build with this seed would (engine/api.py)
        model = GPTNeoX(cfg)
    unit_numels = [
        sum(p.numel() for p in m.parameters()) for m in [model.embed_in, *model.layers, model.head]
    ]
    shape = cfg.shape(args.seq_length)
    check_memory(args, shape, unit_numels, topology, plan, param_bytes=param_dtype.itemsize, micro=micro)

    ledger = Ledger()
    fp16 = args.fp16
    loss_scale: Any = None
    if args.resolved_precision == "fp16":
        loss_scale = fp16.loss_scale if fp16.loss_scale else "dynamic"
    model = debug.parallelize(
        model, mesh=mesh, mp_policy=MixedPrecision(param_dtype), options=debug.DebugOptions(ledger=ledger)
    )
    optimizer = ShardedOptimizer(
        model,
        args.optimizer.type,
        lr=args.lr,
        weight_decay=args.effective_weight_decay,
        max_grad_norm=args.gradient_clipping or None,
        loss_scale=make_scaler(loss_scale, param_dtype, **fp16.scaler_options()),
        **args.optimizer.hyperparameters(),
    )
    iters = args.train_iters or 100
    schedule = schedule_for(args, iters)
    return Trainer(
        args=args, job=job, run=run, ctx=ctx, topology=topology, plan=plan, cfg=cfg, tokenizer=tokenizer,
        probe=probe, model=model, optimizer=optimizer, ledger=ledger, loss_scale=loss_scale, shape=shape,
        unit_numels=unit_numels, param_dtype=param_dtype, batch=(micro, accum, global_batch), iters=iters,
        lr_at=held_schedule(schedule, iters, optimizer), run_dir=job.resolve_run_dir(plan.name),
    )  # fmt: skip


def open_data(tr: Trainer) -> None:
    """The training batches from the resumed position and the validation split (None: not evaluated)."""
    args, ctx = tr.args, tr.ctx
    micro, _, global_batch = tr.batch
    eval_runs = tr.iters // args.eval_interval + 1
    num_samples = (
        train_samples_needed(tr.iters, tr.start_step, tr.consumed, global_batch, ctx),
        max(eval_runs * args.eval_iters * micro * ctx.world, 1),
        1,
    )
    train_ds, valid_ds, _ = build_datasets(args, num_samples)
    tr.valid_ds = usable_valid_split(valid_ds, micro, ctx, args)
    tr.eod = tr.tokenizer.eod if args.eod_mask_loss else None
    tr.train_batches = iter(
        DistributedBatches(train_ds, micro, ctx.rank, ctx.world, start_sample=tr.consumed)
    )


def open_run_dir(tr: Trainer) -> MetricsWriter:
    """Rank 0: the run directory's log, resolved config and metrics writer, and the run's opening line."""
    args, run_dir = tr.args, tr.run_dir
    log_copies = (Path(args.log_dir) / f"{run_dir.name}.log",) if args.log_dir else ()
    attach_run_log(run_dir, copies=log_copies)
    saved_config = run_config(args, tr.plan, tr.job, tr.topology)
    write_text_atomic(run_dir / "config.yml", _yaml_dump(saved_config))
    writer = MetricsWriter(
        run_dir,
        tr.topology.tier_names,
        tensorboard_dir=args.tensorboard_dir,
        resume_step=tr.start_step if args.load else None,
        wandb_run=open_wandb(
            project=args.wandb_project,
            group=args.wandb_group,
            team=args.wandb_team,
            host=args.wandb_host,
            name=run_dir.name,
            run_dir=run_dir,
            config=saved_config,
        )
        if args.use_wandb
        else None,
    )
    cfg, topology, plan, (micro, accum, global_batch) = tr.cfg, tr.topology, tr.plan, tr.batch
    log.info(
        f"zerotopo train: {cfg.num_layers} layers x {cfg.hidden_size} wide, "
        f"{sum(tr.unit_numels) / 1e6:.2f}M parameters, {args.resolved_precision}; plan {plan.name} "
        f"({plan.label(topology)}) on {topology.name} x{topology.nodes} nodes = {tr.ctx.world} ranks; batch "
        f"{micro} x {accum} micro x {tr.ctx.world} ranks = {global_batch} samples of {args.seq_length} tokens; "
        f"run dir {run_dir}"
    )
    if hasattr(tr.optimizer, "describe"):  # Muon: which parameters each optimizer runs on
        log.info(tr.optimizer.describe())
    return writer


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
        batch = next(tr.train_batches).to(tr.ctx.device, non_blocking=True)  # no stream sync on the step path
        inputs, labels = batch[:, :-1], batch[:, 1:]
        logits = tr.model(inputs)
        loss = lm_loss(logits, inputs, labels, tr.eod)
        tr.model.set_is_last_backward(mb == accum - 1)  # step-end reductions start in this backward
        tr.model.scale_loss(loss / accum).backward()
        loss_sum += loss.detach()
    return loss_sum


def train_step(tr: Trainer, step: int) -> tuple[int, torch.Tensor, dict[str, Any]]:
    """One optimizer step: ``(step number, mean loss on the device, the metrics row without its loss)``."""
    lr = tr.optimizer.param_groups[0]["lr"]  # set by tr.scheduler for this step
    if isinstance(lr, torch.Tensor):
        lr = lr.clone()  # the scheduler updates the group's tensor in place
    t0 = time.perf_counter()
    loss_sum = forward_backward_step(tr)
    stats = tr.optimizer.step()
    tr.scheduler.step()
    tr.optimizer.zero_grad()
    dt = time.perf_counter() - t0
    comm = tr.ledger.mark_step()
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
        "peak_memory_bytes": allocated_peak(tr.probe),
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
    losses = per_step_means(torch.stack([p[1] for p in tr.pending]))
    for (_, _, r), value in zip(tr.pending, losses):
        r["loss"] = value
        r.update({k: float(v) for k, v in r.items() if isinstance(v, torch.Tensor)})
        r["skipped"] = int(bool(r["skipped"]))
        tr.skipped_total += r["skipped"]
        r["perplexity"] = math.exp(min(value, 50.0))
        if tr.writer:
            tr.writer.write(r)
    check_finite_rows([r for _, _, r in tr.pending], tr.args.save)
    tr.first_loss = losses[0] if tr.first_loss is None else tr.first_loss
    tr.last_loss = losses[-1]
    if tr.ctx.is_main and console:
        r = tr.pending[-1][2]
        _say(tr.bar, console_line(tr, r, step))
        if tr.bar is not None:
            tr.bar.set_postfix(loss=f"{r['loss']:.3f}")
    tr.pending.clear()
    tr.ledger.poll()  # resolve the completed collective timings (never waits)


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
        + (f" | loss scale {r['loss_scale']:g}" if tr.loss_scale is not None else "")
        + f" | skipped {tr.skipped_total}"
        + f" | {elapsed_eta(time.perf_counter() - tr.t_run, step + 1 - tr.start_step, iters - step - 1)}"
        + f" | {tiers}"
    )


def maybe_evaluate(tr: Trainer, step: int, last_step: bool) -> None:
    """The validation loss every ``eval_interval`` steps and after the last one."""
    args = tr.args
    if tr.valid_ds is None or not args.eval_iters:
        return
    if (step + 1) % args.eval_interval != 0 and not last_step:
        return
    vloss = evaluate(tr.model, tr.valid_ds, tr.batch[0], tr.ctx, args.eval_iters, tr.eod)
    tr.valid_losses.append(vloss)
    if tr.writer:
        tr.writer.write(
            {"kind": "valid", "step": step + 1, "loss": vloss, "perplexity": math.exp(min(vloss, 50.0))}
        )
    if tr.ctx.is_main:
        _say(
            tr.bar,
            f"step {step + 1:>5}/{tr.iters} | validation loss {vloss:.4f} | perplexity {math.exp(vloss):.2f}",
        )


def stop_for_preemption(tr: Trainer, stop: int, step: int) -> None:
    """The ranks agreed on signal ``stop``: save ``step + 1`` (when the run saves) before the loop ends."""
    preemption = tr.run.preemption
    preemption.stopped_by = stop
    if tr.args.save:
        save(tr, step + 1, last=True)
        preemption.saved_at = step + 1
        preemption.saved_to = str(Path(tr.args.save) / f"step_{step + 1}")
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
    if tr.writer is not None:
        tr.writer.sync()  # every logged row on disk before the checkpoint that follows it
    try:
        pending = snapshot_save(
            Path(args.save),
            tr.model,
            tr.optimizer,
            step=at_step,
            consumed_samples=tr.consumed + (at_step - tr.start_step) * tr.batch[2],
            cfg=tr.cfg,
            plan_name=tr.plan.name,
            plan_label=tr.plan.label(tr.topology),
            seed=args.seed,
            tokenizer=tokenizer_info(args, tr.tokenizer),
            config_hash=config_hash(args, tr.cfg),
            lr_schedule=schedule_record(args, tr.iters),
            copy=background,
        )
        if background:
            tr.saver.start(pending, on_done=lambda _: _retain(args, tr.ctx))
        else:
            write_save(pending)
    except NonFiniteError:
        raise
    except ZerotopoError as exc:
        if args.strict_saves or last:
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
    if tr.args.strict_saves or last:
        raise error
    if tr.ctx.is_main:
        log.warning(f"{error}; training goes on (strict_saves: true stops the run instead)")
    return False


def finish(tr: Trainer) -> dict[str, Any] | None:
    """Close the engine and, on rank 0, write the run's summary and plots; returns the summary there."""
    wall = time.perf_counter() - tr.t_run
    memory = tr.model.memory_report()
    args, topology, plan = tr.args, tr.topology, tr.plan
    peak = peak_report(
        tr.probe, tr.ctx, args, tr.shape, tr.unit_numels, topology, plan, tr.param_dtype.itemsize, tr.batch[0]
    )
    # Land in-flight parameter gathers and stop the engine's worker threads before the process group
    # goes: a thread still alive when the interpreter finalizes can abort the process from C++.
    tr.model.close()
    if tr.writer is None:
        return None
    tr.writer.close()
    steps = tr.iters - tr.start_step
    run = whole_run(tr.run_dir, tr.start_step, wall)
    summary = {
        "run_dir": str(tr.run_dir),
        "plan": plan.name,
        "degrees": plan.label(topology),
        "topology": topology.name,
        "nodes": topology.nodes,
        "world_size": tr.ctx.world,
        "parameters": sum(tr.unit_numels),
        "steps": tr.iters,
        "resumed_from_step": tr.start_step,
        "steps_this_attempt": steps,
        "first_loss": run.get("first_loss", tr.first_loss),
        "final_loss": tr.last_loss,
        "final_valid_loss": tr.valid_losses[-1] if tr.valid_losses else run.get("final_valid_loss"),
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
        f"done: {summary['steps']} steps in {wall:.1f}s; loss {tr.first_loss} -> {tr.last_loss}; "
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
    args: NeoXArgs,
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
        shape=shape, checkpoint_activations=args.checkpoint_activations,
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


def resume(
    args: NeoXArgs, job: TrainJob, model, optimizer, cfg: NeoXConfig, ctx: RankContext
) -> tuple[int, int]:
    """``(step, samples consumed)`` to start from: a zerotopo checkpoint (any plan, any world size), a
    Hugging Face GPT-NeoX directory (``load:`` or ``--from-hf``: weights only, step 0), or nothing."""
    from zerotopo.checkpoint.neox import load_neox_weights, neox_step_dir
    from zerotopo.checkpoint.store import (
        find_checkpoint,
        is_hf_directory,
        open_checkpoint,
        settle_optimizer,
    )

    hf_dir = hf_source(args, job)
    neox_dir = neox_step_dir(args.load) if args.load else None
    if neox_dir is not None:
        load_neox_weights(neox_dir, model, optimizer, cfg)
        if ctx.is_main:
            log.info(f"weights from the GPT-NeoX checkpoint {neox_dir} (finetune: fresh optimizer, step 0)")
        return 0, 0
    step_dir = find_checkpoint(args.load) if args.load and not is_hf_directory(Path(args.load)) else None
    if step_dir is not None:
        ckpt = open_checkpoint(step_dir)
        notice = check_run_identity(args, job, cfg, ckpt)
        if notice and ctx.is_main:
            log.warning(notice)
        if not args.finetune:
            notice = check_resumed_schedule(args, args.train_iters or 100, ckpt.manifest, str(step_dir))
            if notice and ctx.is_main:
                log.warning(notice)
        state = load_checkpoint(
            args.load, model, optimizer, cfg=cfg, seed=args.seed, weights_only=bool(args.finetune)
        )
        if args.finetune:
            settle_optimizer(model, optimizer, step=0, zero_moments=True)
            if ctx.is_main:
                log.info(
                    f"finetune: weights of step {state.step} from {state.source}; fresh optimizer, step 0"
                )
            return 0, 0
        if ctx.is_main:
            log.info(f"resumed from the checkpoint of step {state.step} in {state.source}")
        return state.step, state.consumed_samples
    check_fresh_start(args, job)
    if args.load and ctx.is_main:
        log.warning(
            f"load: {args.load} holds no checkpoint yet; training starts from step 0 "
            f"(as GPT-NeoX does){' and saves there' if args.save == args.load else ''}"
        )
    if hf_dir:
        from zerotopo.checkpoint.hf import load_hf_shards

        load_hf_shards(hf_dir, model, optimizer, cfg)
        if ctx.is_main:
            log.info(f"weights from the Hugging Face model {hf_dir}")
    return 0, 0


def tokenizer_info(args: NeoXArgs, tokenizer) -> dict[str, Any]:
    """What a checkpoint records of the run's tokenizer (its files are copied beside the shards)."""
    files = [getattr(args, k, None) for k in ("vocab_file", "merge_file")]
    return {"type": args.tokenizer_type, "eod": tokenizer.eod, "files": [f for f in files if f]}


def _say(bar, msg: str) -> None:
    """A log line that does not tear the progress bar."""
    if bar is None:
        log.info(msg)
    else:
        with bar.external_write_mode():
            log.info(msg)


def run_config(args: NeoXArgs, plan, job: TrainJob, topology) -> dict[str, Any]:
    """The run as one NeoX-style config (every key resolved, the plan written out, the topology and
    node count), which ``zerotopo train`` takes back as is."""
    out = args.to_dict()
    out["plan"] = plan.to_dict()
    out["zero_optimization"] = None  # the plan above is what ran
    out["topology"] = job.topology or args.topology or topology.name
    out["num_nodes"] = topology.nodes
    return out


def _retain(args: NeoXArgs, ctx: RankContext) -> None:
    """NeoX's keep_last_n_checkpoints, after every rank has finished the save."""
    if args.keep_last_n_checkpoints and ctx.is_main:
        for path in prune_checkpoints(Path(args.save), args.keep_last_n_checkpoints):
            log.debug(f"deleted checkpoint {path} (keep_last_n_checkpoints {args.keep_last_n_checkpoints})")


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


def _yaml_dump(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False)
