"""One rank of a training run: build the mesh, the model and the data, then train, evaluate and log.

[Note: host synchronization] Following DESIGN.md rule 3, per-step losses stay on the device and are
summed across ranks only at each ``log_interval`` (one all-reduce of a short vector), and so are the
engine's per-step figures (gradient norm, fp16 overflow flag and loss scale: 0-d device tensors) and the
ledger's event times; the host never waits on the device inside a logging window.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from zerotopo.checkpoint.retention import prune_checkpoints
from zerotopo.checkpoint.store import NonFiniteError, load_checkpoint, save_checkpoint
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import build_mesh
from zerotopo.config.neox import NeoXArgs
from zerotopo.data.dataset import DistributedBatches, build_train_valid_test
from zerotopo.data.tokenizers import build_tokenizer
from zerotopo.engine import parallelize
from zerotopo.errors import ConfigError, PlanError, ZerotopoError
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
from zerotopo.models.config import check_trainable
from zerotopo.models.neox import GPTNeoX, NeoXConfig
from zerotopo.placement.plan import PRESETS
from zerotopo.trainer.job import TrainJob
from zerotopo.trainer.longrun import (
    LongRun,
    check_finite_rows,
    check_fresh_start,
    check_resume_position,
    check_run_identity,
    config_hash,
    per_step_means,
)
from zerotopo.trainer.lr_schedule import held_schedule, schedule_for
from zerotopo.trainer.metrics import MetricsWriter, open_wandb, plot_run, write_summary
from zerotopo.trainer.peak import PeakMemory, unmap_large_frees
from zerotopo.trainer.preempt import EXIT_PREEMPTED, Preempted, Preemption, preemption_signals, signal_name
from zerotopo.trainer.steps import (
    allocated_peak,
    elapsed_eta,
    lm_loss,
    train_samples_needed,
    usable_valid_split,
)

log = get_logger("train")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class RankContext:
    """What every part of the loop needs to know about this rank."""

    rank: int
    world: int
    device: torch.device
    is_main: bool


DATA_KEYS = ("data_path", "train_data_paths", "valid_data_paths", "test_data_paths")


def data_files(args: NeoXArgs) -> list[tuple[str, str]]:
    """``(key, prefix)`` of every dataset the config names (``data_path`` or NeoX's
    ``train/valid/test_data_paths``)."""
    return [(key, prefix) for key in DATA_KEYS for prefix in getattr(args, key) or ()]


def check_data_file(args: NeoXArgs, key: str, prefix: str) -> None:
    """A ConfigError naming ``prefix``'s missing ``.bin``/``.idx`` file and the key that names it, with
    the command that writes it."""
    missing = [p for p in (prefix + ".bin", prefix + ".idx") if not os.path.exists(p)]
    if not missing:
        return
    stem, _, jkey = prefix.rpartition("_")[0].rpartition("_")
    named = prefix.endswith("_document") and stem
    raise ConfigError(
        f"data file {missing[0]!r} does not exist; preprocess your jsonl with "
        f"`zerotopo data preprocess --input FILE.jsonl --output-prefix {stem if named else 'PREFIX'}"
        f"{f' --jsonl-keys {jkey}' if named and jkey != 'text' else ''}"
        f" --tokenizer-type {args.tokenizer_type}"
        + "".join(
            f" --{flag} {value}"
            for flag, value in (("vocab-file", args.vocab_file), ("merge-file", args.merge_file))
            if value
        )
        + " --append-eod`"
        + ("" if named else f" (it writes PREFIX_text_document; set {key} to that)"),
        source=args.sources.get(key),
        key=key,
    )


def data_prefix(args: NeoXArgs) -> str | list[str]:
    """The dataset prefixes: the config's ``data_path`` (several are blended by size), else the bundled
    corpus. Every file the config names (NeoX's ``*_data_paths`` too) is checked to exist first."""
    files = data_files(args)
    for key, prefix in files:
        check_data_file(args, key, prefix)
    if args.data_path:
        return list(args.data_path)
    if files:
        return [prefix for _, prefix in files]
    from zerotopo.data.corpus import default_corpus_prefix

    return default_corpus_prefix(args.tokenizer_type)


def build_datasets(args: NeoXArgs, num_samples: tuple[int, int, int]):
    """Train, valid and test datasets as NeoX builds them: weighted ``*_data_paths`` blends, else
    ``data_path`` (or the bundled corpus) split by ``split``."""
    prefix = data_prefix(args)
    if args.train_data_paths:
        from zerotopo.data.dataset import build_weighted_splits

        return build_weighted_splits(
            [args.train_data_paths, args.valid_data_paths, args.test_data_paths],
            [args.train_data_weights, args.valid_data_weights, args.test_data_weights],
            args.seq_length,
            num_samples,
            args.seed,
        )
    return build_train_valid_test(prefix, args.split, args.seq_length, num_samples, args.seed)


def check_memory(
    args: NeoXArgs, shape, model_units: list[int], topology, plan, param_bytes: int, micro: int
) -> None:
    """Refuse a plan whose states, buffers and activations exceed the device, naming a plan that fits.

    ``model_units`` are the units' parameter counts (the built model's when there is one), ``shape`` the
    model's :class:`~zerotopo.placement.shape.ModelShape` for activations and the planner's suggestion."""
    from zerotopo.cost.memory import memory_per_device
    from zerotopo.cost.planner import plan_candidates

    ckpt = args.checkpoint_activations
    mem = memory_per_device(
        model_units,
        topology,
        plan,
        param_bytes=param_bytes,
        padded=True,
        micro_batch=micro,
        shape=shape,
        checkpoint_activations=ckpt,
    )
    limit = topology.device.memory_gib * 2**30
    if mem.total <= limit:
        return
    fitting = [
        c
        for c in plan_candidates(
            shape,
            topology,
            micro_batch=micro,
            grad_accum=args.gradient_accumulation_steps or 1,
            plans="auto",
            param_bytes=param_bytes,
            checkpoint_activations=ckpt,
            grad_dtype=args.grad_dtype,
        )
        if c.fits
    ]
    presets = [c for c in fitting if c.plan.name in PRESETS]
    if presets:
        hint = f"; --plan {presets[0].plan.name} fits (run `zerotopo plan` to compare all plans)"
    elif fitting:
        hint = (
            f"; a plan with degrees {fitting[0].plan.label(topology)} fits: write it as a plan YAML "
            "(docs/plans.md) or run `zerotopo plan` to compare"
        )
    else:
        hint = "; no plan fits: use more nodes, a smaller micro-batch or checkpoint_activations: true"
    raise PlanError(
        f"plan {plan.name!r} needs {mem.total / 2**30:.3f} GiB per device (parameters "
        f"{mem.params / 2**30:.3f}, secondary {mem.secondary / 2**30:.3f}, gradients {mem.grads / 2**30:.3f}, "
        f"optimizer {mem.optim / 2**30:.3f}, buffers {mem.buffers / 2**30:.3f}, activations "
        f"{mem.activations / 2**30:.3f}), more than the {topology.device.memory_gib:g} GiB of a "
        f"{topology.device.name}{hint}"
    )


def check_vocab(args: NeoXArgs, tokenizer) -> NeoXConfig:
    """The model config for ``tokenizer``; the data's largest token id must fit its embedding."""
    cfg = args.model_config(tokenizer.vocab_size)
    if data_files(args):
        from zerotopo.data.indexed import MMapIndexedDataset

        for key, prefix in data_files(args):
            check_data_file(args, key, prefix)  # missing files are named before any vocabulary check
            top = MMapIndexedDataset(prefix).max_token_id()
            if top >= cfg.vocab_size:
                raise ConfigError(
                    f"{prefix} holds token id {top}, but the model's vocabulary has {cfg.vocab_size} entries "
                    f"(tokenizer {args.tokenizer_type}); preprocess the data with the tokenizer the config names",
                    source=args.sources.get(key),
                    key=key,
                )
    return cfg


def recognise_topology(job: TrainJob, args: NeoXArgs, info) -> TrainJob:
    """``job`` with the machine's built-in topology when none was given and the launcher and devices
    name it unmistakably (a Frontier node), with a notice; otherwise ``job`` as it is."""
    from dataclasses import replace

    from zerotopo.launch.advice import recognised_topology

    name = None if job.topology or args.topology else recognised_topology(info, os.environ)
    if name is None:
        return job
    if info.rank == 0:
        log.info(
            f"no topology given: ranks on ROCm devices of a Slingshot system, 8 per node; using --topology {name}"
        )
    return replace(job, topology=name)


def hf_source(args: NeoXArgs, job: TrainJob) -> str | None:
    """The Hugging Face directory the run starts from: ``--from-hf``, or ``load:`` naming one."""
    from zerotopo.checkpoint.store import is_hf_directory

    if args.load and is_hf_directory(Path(args.load)):
        return args.load
    return getattr(job, "from_hf", None)


def model_config(args: NeoXArgs, job: TrainJob, tokenizer) -> NeoXConfig:
    """The run's model: the config's, or a Hugging Face directory's architecture (see ``hf_source``)."""
    cfg = check_vocab(args, tokenizer)
    hf = hf_source(args, job)
    if hf:
        from zerotopo.checkpoint.hf import merge_hf_config

        cfg = merge_hf_config(hf, args, cfg)
        if tokenizer.vocab_size > cfg.vocab_size:
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but the model in {hf} only "
                f"{cfg.vocab_size} embedding rows; use the tokenizer the model was trained with",
                key="tokenizer_type",
            )
    check_trainable(
        cfg, "tie_word_embeddings" if hf else "no_weight_tying", hf or args.sources.get("no_weight_tying")
    )
    return cfg


def check_checkpoint_source(args: NeoXArgs, job: TrainJob, cfg: NeoXConfig, world: int | None = None) -> None:
    """Pre-flight of what the run loads (no process group): a zerotopo checkpoint in ``load:`` is read
    and checked against the model (manifest, metadata, every shard file present and long enough), a
    Hugging Face directory has every tensor with its shape."""
    from zerotopo.checkpoint.neox import check_neox_checkpoint, neox_step_dir
    from zerotopo.checkpoint.store import find_checkpoint, preflight_load

    neox_dir = neox_step_dir(args.load) if args.load else None
    if neox_dir is not None:
        check_neox_checkpoint(neox_dir, cfg)
        return
    if args.load and find_checkpoint(args.load) is not None:
        ckpt = preflight_load(args.load, cfg)
        check_run_identity(args, job, cfg, ckpt)
        if world is not None:
            check_resume_position(args, ckpt, world)
        return
    check_fresh_start(args, job)
    hf = hf_source(args, job)
    if hf:
        from zerotopo.checkpoint.hf import check_hf_directory

        check_hf_directory(hf, cfg)


def train_rank(rank: int, world: int, job: TrainJob) -> dict[str, Any] | None:
    """Run the job as one rank; returns the run summary on rank 0 (None elsewhere). A run stopped by a
    preemption signal saves first, then raises :class:`~zerotopo.trainer.preempt.Preempted`."""
    from zerotopo.trainer.entry import launched_externally

    external = launched_externally(job)
    run = LongRun(Preemption(preemption_signals(external)))
    try:
        summary = _train_rank(rank, world, job, run)
    finally:
        run.close()
    # Under a launcher every rank exits with the status; the local launcher stops the other ranks as soon
    # as one fails, so there rank 0 alone (the last to finish) reports it.
    if run.preemption.stopped_by and (external or rank == 0):
        at = run.preemption.saved_at
        raise Preempted(
            f"stopped by {signal_name(run.preemption.stopped_by)}"
            + (f" after saving the checkpoint of step {at}" if at is not None else " (no save: directory)")
            + f"; run the same command again to continue (exit status {EXIT_PREEMPTED})"
        )
    return summary


def _train_rank(rank: int, world: int, job: TrainJob, run: LongRun) -> dict[str, Any] | None:
    setup_console(verbose=rank == 0)
    with console_muted() if job.config_warnings_shown else contextlib.nullcontext():
        args = job.load_args(quiet=rank != 0)
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
    check_device_list(os.environ, topology)
    device = init_distributed(info)
    torch.set_num_threads(max(1, int(os.environ.get("ZEROTOPO_THREADS_PER_RANK", "1"))))
    plan = job.load_plan(args)
    degrees = plan.degrees(topology)
    ctx = RankContext(rank=info.rank, world=info.world_size, device=device, is_main=info.rank == 0)
    run.take_lock(args, ctx.is_main)
    mesh = build_mesh(topology, plan, topo_index=topological_index(info, topology), device=device)
    if device.type == "cpu":
        unmap_large_frees()  # freed units go back to the OS (zerotopo.trainer.peak, [Note: CPU ranks and glibc])
    probe = PeakMemory(device)  # the baseline: interpreter, torch, process groups; no model state yet

    tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file, args.eod_token)
    cfg = model_config(args, job, tokenizer)
    precision = args.resolved_precision
    param_dtype = DTYPES[precision]
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
    if precision == "fp16":
        loss_scale = fp16.loss_scale if fp16.loss_scale else "dynamic"
    model, optimizer = parallelize(
        model,
        mesh=mesh,
        param_dtype=param_dtype,
        lr=args.lr,
        betas=tuple(args.optimizer.betas),
        eps=args.optimizer.eps,
        weight_decay=args.effective_weight_decay,
        max_grad_norm=args.gradient_clipping or None,
        loss_scale=loss_scale,
        loss_scale_options=fp16.scaler_options(),
        ledger=ledger,
    )
    iters = args.train_iters or 100
    schedule = schedule_for(args, iters)
    lr_at = held_schedule(schedule, iters, optimizer)

    run_dir = job.resolve_run_dir(plan.name)
    start_step, consumed = resume(args, job, model, optimizer, cfg, ctx)
    eval_runs = iters // args.eval_interval + 1
    num_samples = (
        train_samples_needed(iters, start_step, consumed, global_batch, ctx),
        max(eval_runs * args.eval_iters * micro * ctx.world, 1),
        1,
    )
    train_ds, valid_ds, _ = build_datasets(args, num_samples)
    valid_ds = usable_valid_split(valid_ds, micro, ctx, args)
    eod = tokenizer.eod if args.eod_mask_loss else None
    train_batches = iter(DistributedBatches(train_ds, micro, ctx.rank, ctx.world, start_sample=consumed))
    writer = None
    if ctx.is_main:
        log_copies = (Path(args.log_dir) / f"{run_dir.name}.log",) if args.log_dir else ()
        attach_run_log(run_dir, copies=log_copies)
        saved_config = run_config(args, plan, job, topology)
        write_text_atomic(run_dir / "config.yml", _yaml_dump(saved_config))
        writer = MetricsWriter(
            run_dir,
            topology.tier_names,
            tensorboard_dir=args.tensorboard_dir,
            resume_step=start_step if args.load else None,
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
        log.info(
            f"zerotopo train: {cfg.num_layers} layers x {cfg.hidden_size} wide, "
            f"{sum(unit_numels) / 1e6:.2f}M parameters, {precision}; plan {plan.name} ({plan.label(topology)}) "
            f"on {topology.name} x{topology.nodes} nodes = {ctx.world} ranks; batch {micro} x {accum} micro x "
            f"{ctx.world} ranks = {global_batch} samples of {args.seq_length} tokens; run dir {run_dir}"
        )
    flops_per_step = shape.step_flops(global_batch, checkpoint_activations=args.checkpoint_activations)
    tokens_per_step = global_batch * args.seq_length
    peak = topology.device.peak_tflops

    def save(at_step: int, *, last: bool = False) -> bool:
        """Save ``at_step``; a failed save warns and training goes on, unless ``strict_saves`` or ``last``."""
        if writer is not None:
            writer.sync()  # every logged row on disk before the checkpoint that follows it
        try:
            _save(at_step)
        except NonFiniteError:
            raise
        except ZerotopoError as exc:
            if args.strict_saves or last:
                raise
            if ctx.is_main:
                log.warning(f"{exc}; training goes on (strict_saves: true stops the run instead)")
            return False
        return True

    def _save(at_step: int) -> None:
        save_checkpoint(
            Path(args.save),
            model,
            optimizer,
            step=at_step,
            consumed_samples=consumed + (at_step - start_step) * global_batch,
            cfg=cfg,
            plan_name=plan.name,
            plan_label=plan.label(topology),
            seed=args.seed,
            tokenizer=tokenizer_info(args, tokenizer),
            config_hash=config_hash(args, cfg),
        )

    bar = None
    if ctx.is_main and job.progress and on_terminal():
        # A bar only on a terminal: in a scheduler's log file the log_interval lines are the progress.
        from tqdm import tqdm

        # Follow the terminal's width when it has one; an unsized pseudo-terminal gets 80 columns.
        sized = terminal_columns() is not None
        bar = tqdm(
            total=iters,
            initial=start_step,
            desc="train",
            unit="step",
            dynamic_ncols=sized,
            ncols=None if sized else 80,
        )
    save_steps = set(args.save_iters(iters))
    pending: list[tuple[int, torch.Tensor, dict[str, Any]]] = []
    first_loss = last_loss = None
    valid_losses: list[float] = []
    t_run = time.perf_counter()
    skipped_total = 0
    for step in range(start_step, iters):
        lr = lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device, dtype=torch.float32)
        for mb in range(accum):
            batch = next(train_batches).to(device, non_blocking=True)  # no stream sync on the step path
            inputs, labels = batch[:, :-1], batch[:, 1:]
            logits = model(inputs)
            loss = lm_loss(logits, inputs, labels, eod)
            model.set_is_last_backward(mb == accum - 1)  # step-end reductions start in this backward
            model.scale_loss(loss / accum).backward()
            loss_sum += loss.detach()
        stats = optimizer.step()
        optimizer.zero_grad()
        dt = time.perf_counter() - t0
        comm = ledger.mark_step()
        row = {
            "kind": "train",
            "step": step + 1,
            "lr": lr,
            "grad_norm": stats.get("grad_norm"),
            "skipped": stats.get("skipped", False),  # a device tensor with fp16: read at the log interval
            "loss_scale": stats.get("loss_scale"),
            "step_time_s": dt,
            "tokens_per_s": tokens_per_step / dt,
            "tflops_per_device": flops_per_step / dt / ctx.world / 1e12,
            "peak_memory_bytes": allocated_peak(probe),
        }
        if peak:
            row["mfu"] = row["tflops_per_device"] / peak
        for tier, nbytes in comm.get("bytes_by_tier", {}).items():
            row[f"bytes_{tier}"] = nbytes
        pending.append((step + 1, loss_sum / accum, row))
        if bar is not None:
            bar.update(1)
        last_step = step + 1 == iters
        saving = bool(args.save) and step + 1 in save_steps and not last_step
        stop = run.preemption.agreed()  # every rank sees the same answer at the same step
        console = (step + 1) % args.log_interval == 0 or last_step
        if console or saving or stop:  # a save or a stop writes out the rows it follows
            losses = per_step_means(torch.stack([p[1] for p in pending]))
            for (_, _, r), value in zip(pending, losses):
                r["loss"] = value
                r.update({k: float(v) for k, v in r.items() if isinstance(v, torch.Tensor)})
                r["skipped"] = int(bool(r["skipped"]))
                skipped_total += r["skipped"]
                r["perplexity"] = math.exp(min(value, 50.0))
                if writer:
                    writer.write(r)
            check_finite_rows([r for _, _, r in pending], args.save)
            first_loss = losses[0] if first_loss is None else first_loss
            last_loss = losses[-1]
            if ctx.is_main and console:
                r = pending[-1][2]
                tiers = " ".join(
                    f"{k.removeprefix('bytes_')}={v / 2**20:.1f}MiB"
                    for k, v in r.items()
                    if k.startswith("bytes_")
                )
                msg = (
                    f"step {r['step']:>5}/{iters} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | "
                    f"{r['tokens_per_s']:.0f} tok/s | {r['tflops_per_device'] * 1e3:.2f} GFLOPS/dev"
                    + (f" | MFU {r['mfu'] * 100:.1f}%" if "mfu" in r else "")
                    + (f" | loss scale {r['loss_scale']:g}" if loss_scale is not None else "")
                    + f" | skipped {skipped_total}"
                    + f" | {elapsed_eta(time.perf_counter() - t_run, step + 1 - start_step, iters - step - 1)}"
                    + f" | {tiers}"
                )
                _say(bar, msg)
                if bar is not None:
                    bar.set_postfix(loss=f"{r['loss']:.3f}")
            pending.clear()
            ledger.poll()  # resolve the completed collective timings (never waits)
        if valid_ds is not None and args.eval_iters and ((step + 1) % args.eval_interval == 0 or last_step):
            vloss = evaluate(model, valid_ds, micro, ctx, args.eval_iters, eod)
            valid_losses.append(vloss)
            if writer:
                writer.write(
                    {
                        "kind": "valid",
                        "step": step + 1,
                        "loss": vloss,
                        "perplexity": math.exp(min(vloss, 50.0)),
                    }
                )
            if ctx.is_main:
                _say(
                    bar,
                    f"step {step + 1:>5}/{iters} | validation loss {vloss:.4f} | perplexity {math.exp(vloss):.2f}",
                )
        if stop:
            run.preemption.stopped_by = stop
            if args.save:
                save(step + 1, last=True)
                run.preemption.saved_at = step + 1
            if ctx.is_main:
                log.warning(f"{signal_name(stop)} received: stopping after step {step + 1}")
            break
        if saving and save(step + 1):
            _retain(args, ctx)
        ledger.reset()
    if bar is not None:
        bar.close()
    if args.save and start_step < iters and not run.preemption.stopped_by:
        save(iters, last=True)
        _retain(args, ctx)
    wall = time.perf_counter() - t_run
    memory = model.memory_report()
    peak = peak_report(probe, ctx, args, shape, unit_numels, topology, plan, param_dtype.itemsize, micro)
    # Land in-flight parameter gathers and stop the engine's worker threads before the process group
    # goes: a thread still alive when the interpreter finalizes can abort the process from C++.
    model.close()
    if writer is None:
        return None
    writer.close()
    summary = {
        "run_dir": str(run_dir),
        "plan": plan.name,
        "degrees": plan.label(topology),
        "topology": topology.name,
        "nodes": topology.nodes,
        "world_size": ctx.world,
        "parameters": sum(unit_numels),
        "steps": iters - start_step,
        "first_loss": first_loss,
        "final_loss": last_loss,
        "final_valid_loss": valid_losses[-1] if valid_losses else None,
        "wall_s": wall,
        "tokens_per_s": (iters - start_step) * tokens_per_step / wall,
        "memory_bytes_rank0": memory,
        "memory_peak": peak,
        "degrees_resolved": vars(degrees),
    }
    write_summary(run_dir, summary)
    summary["plots"] = [str(p) for p in plot_run(run_dir)]
    # The command prints its own closing lines; the log file gets the same facts.
    log.debug(
        f"done: {summary['steps']} steps in {wall:.1f}s; loss {first_loss} -> {last_loss}; "
        f"files {', '.join(sorted(p.name for p in run_dir.iterdir()))}"
    )
    close_run_log()
    return summary


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
        notice = check_run_identity(args, job, cfg, open_checkpoint(step_dir))
        if notice and ctx.is_main:
            log.warning(notice)
        state = load_checkpoint(args.load, model, optimizer, cfg=cfg, seed=args.seed)
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
