"""The NeoX training recipe as components, built in one stated order by :func:`build`.

Each component owns its state; those whose state a checkpoint keeps are registered with one
:class:`~zerotopo.checkpoint.components.Checkpointer`, which saves and loads exactly that set (see [Note:
checkpoint components]). The components, in the order :func:`build` makes them:

1. the rank joined to the job: topology, plan, mesh (:func:`join_job`);
2. model + engine (:class:`ModelEngine`): the sharded model; checkpointed as ``model`` and ``loss_scaler``;
3. optimizer + LR scheduler (:class:`OptimizerLR`): checkpointed as ``optimizer`` (the schedule follows the
   optimizer's step; its settings are recorded for the resume's check);
4. data (:class:`~zerotopo.trainer.train_data.TrainData`): checkpointed as ``data``, its position;
5. the checkpointer, registering the above with the RNG, the run's identity (``run``: seed and config hash)
   and the tokenizer;
6. the resume: the checkpointer loads the registered set (or weights come from Hugging Face / GPT-NeoX);
7. metrics (:class:`Metrics`): the run directory, whose ``metrics.csv`` is their state across attempts;
8. preemption and the save lock (:class:`~zerotopo.trainer.longrun.LongRun`, made before the build), and
   the background writer of ``async_save``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zerotopo.checkpoint.components import Checkpointer, Record, TokenizerFiles
from zerotopo.checkpoint.state import model_components
from zerotopo.comm.ledger import Ledger
from zerotopo.comm.mesh import build_mesh
from zerotopo.config.neox import to_neox_dict
from zerotopo.config.tree import TrainConfig
from zerotopo.data.tokenizers import build_tokenizer
from zerotopo.dtypes import PRECISIONS
from zerotopo.engine import MixedPrecision, ShardedOptimizer, debug
from zerotopo.engine.optim import make_scaler
from zerotopo.errors import ConfigError
from zerotopo.fsutil import write_text_atomic
from zerotopo.launch.advice import topology_mismatch_advice
from zerotopo.launch.devices import check_device_list
from zerotopo.launch.discovery import check_against_topology, discover, init_distributed, topological_index
from zerotopo.logs import attach_run_log, get_logger
from zerotopo.models.neox import GPTNeoX, NeoXConfig
from zerotopo.placement.plan import Plan
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.topology import Topology
from zerotopo.trainer.job import TrainJob
from zerotopo.trainer.longrun import LongRun, check_fresh_start, check_run_identity, config_hash
from zerotopo.trainer.lr_schedule import ScheduleLR, held_schedule, schedule_for
from zerotopo.trainer.metrics import MetricsWriter, open_wandb
from zerotopo.trainer.peak import PeakMemory, unmap_large_frees
from zerotopo.trainer.preflight import check_memory, hf_source, model_config, recognise_topology
from zerotopo.trainer.schedule_resume import check_resumed_schedule, schedule_record
from zerotopo.trainer.train_data import TrainData

if TYPE_CHECKING:
    from zerotopo.checkpoint.background import BackgroundSaver

log = get_logger("train")

#: What a ``finetune: true`` resume loads: the weights (with the loss scaler and RNG), never the
#: optimizer's state or the data position.
WEIGHTS_ONLY = ("model", "loss_scaler", "rng")


@dataclass
class RankContext:
    """What every part of the loop needs to know about this rank."""

    rank: int
    world: int
    device: torch.device
    is_main: bool


@dataclass
class ModelEngine:
    """Model + engine: the model sharded by the engine, the unit description its memory and FLOPs are
    counted from, and the engine's ledger of collectives."""

    cfg: NeoXConfig
    model: torch.nn.Module
    ledger: Ledger
    shape: ModelShape
    unit_numels: list[int]
    param_dtype: torch.dtype
    loss_scale: Any
    """The config's loss scale (``"dynamic"`` or a number) with fp16, else None."""
    probe: PeakMemory


@dataclass
class OptimizerLR:
    """The sharded optimizer and the LR scheduler that sets its rate (made by :meth:`start` once the start
    step is known)."""

    optimizer: ShardedOptimizer
    lr_at: Callable[[int], Any]
    """``step -> learning rate`` of the config's schedule (held at skipped fp16 steps)."""
    schedule: dict[str, Any]
    """The schedule's settings, as a checkpoint records them."""
    scheduler: ScheduleLR | None = None

    def start(self, step: int) -> None:
        self.scheduler = ScheduleLR(self.optimizer, self.lr_at, start_step=step)


@dataclass
class Metrics:
    """Rank 0's metrics writer and progress bar, and the figures kept between log intervals."""

    writer: MetricsWriter | None = None
    bar: Any = None
    pending: list[tuple[int, torch.Tensor, dict[str, Any]]] = field(default_factory=list)
    first_loss: float | None = None
    last_loss: float | None = None
    valid_losses: list[float] = field(default_factory=list)
    skipped_total: int = 0


@dataclass
class Trainer:
    """One rank's run once :func:`build` made its components."""

    args: TrainConfig
    job: TrainJob
    run: LongRun
    ctx: RankContext
    topology: Topology
    plan: Plan
    tokenizer: Any
    batch: tuple[int, int, int]
    """``(micro, accumulation steps, global batch)`` in samples."""
    iters: int
    run_dir: Path
    engine: ModelEngine
    optim: OptimizerLR
    data: TrainData
    checkpointer: Checkpointer
    metrics: Metrics = field(default_factory=Metrics)
    start_step: int = 0
    saver: BackgroundSaver | None = None
    """The background checkpoint writer (``async_save``), else None."""
    t_run: float = 0.0

    @property
    def flops_per_step(self) -> float:
        return self.engine.shape.step_flops(
            self.batch[2], checkpoint_activations=self.args.model.checkpoint_activations
        )

    @property
    def tokens_per_step(self) -> int:
        return self.batch[2] * self.args.model.seq_length


def build(args: TrainConfig, job: TrainJob, run: LongRun) -> Trainer:
    """This rank's components, in the order of the module's list."""
    job, ctx, topology, plan, mesh, probe = join_job(args, job, run)
    tokenizer = build_tokenizer(
        args.data.tokenizer_type, args.data.vocab_file, args.data.merge_file, args.data.eod_token
    )
    engine = build_engine(args, job, ctx, topology, plan, mesh, tokenizer, probe)
    iters = args.train_iters or 100
    optim = build_optimizer(args, engine, iters)
    batch = args.batch.batch_sizes(ctx.world)
    data = TrainData(
        args, ctx, batch=batch, iters=iters, eod=tokenizer.eod if args.data.eod_mask_loss else None
    )
    checkpointer = build_checkpointer(args, engine, optim, data, plan, topology, tokenizer)
    tr = Trainer(
        args=args, job=job, run=run, ctx=ctx, topology=topology, plan=plan, tokenizer=tokenizer, batch=batch,
        iters=iters, run_dir=job.resolve_run_dir(plan.name), engine=engine, optim=optim, data=data,
        checkpointer=checkpointer,
    )  # fmt: skip
    tr.start_step = resume(tr)
    optim.start(tr.start_step)
    if ctx.is_main:
        log.info("zerotopo train: opening the data")
    data.open(tr.start_step)
    if ctx.is_main:
        tr.metrics.writer = open_run_dir(tr)
    if args.checkpoint.async_save and args.checkpoint.save:
        from zerotopo.checkpoint.background import BackgroundSaver, check_host_memory

        check_host_memory(optim.optimizer, is_main=ctx.is_main, say=log.info)
        tr.saver = BackgroundSaver()
    return tr


def join_job(args: TrainConfig, job: TrainJob, run: LongRun):
    """This rank joined to the job: ``(job, ctx, topology, plan, mesh, memory probe)``, the save lock taken."""
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
    return job, ctx, topology, plan, mesh, probe


def build_engine(
    args: TrainConfig, job: TrainJob, ctx: RankContext, topology, plan, mesh, tokenizer, probe
) -> ModelEngine:
    """The model built on the meta device, checked against the device's memory, then sharded by the engine."""
    cfg = model_config(args, job, tokenizer)
    param_dtype = PRECISIONS[args.precision.resolved]
    micro = args.batch.batch_sizes(ctx.world)[0]
    torch.manual_seed(args.seed)
    with torch.device("meta"):
        # no storage: parallelize materializes each unit in turn and keeps this rank's shards only,
        # drawing the init in the order an eager build with this seed would (engine/api.py)
        model = GPTNeoX(cfg)
    unit_numels = [
        sum(p.numel() for p in m.parameters()) for m in [model.embed_in, *model.layers, model.head]
    ]
    shape = cfg.shape(args.model.seq_length)
    check_memory(args, shape, unit_numels, topology, plan, param_bytes=param_dtype.itemsize, micro=micro)
    ledger = Ledger()
    loss_scale: Any = None
    if args.precision.resolved == "fp16":
        loss_scale = args.precision.fp16.loss_scale if args.precision.fp16.loss_scale else "dynamic"
    model = debug.parallelize(
        model, mesh=mesh, mp_policy=MixedPrecision(param_dtype), options=debug.DebugOptions(ledger=ledger)
    )
    return ModelEngine(cfg, model, ledger, shape, unit_numels, param_dtype, loss_scale, probe)


def build_optimizer(args: TrainConfig, engine: ModelEngine, iters: int) -> OptimizerLR:
    """The sharded optimizer over the engine's model and the config's learning-rate schedule."""
    fp16 = args.precision.fp16
    optimizer = ShardedOptimizer(
        engine.model,
        args.optim.optimizer.type,
        lr=args.optim.lr,
        weight_decay=args.optim.effective_weight_decay,
        max_grad_norm=args.optim.gradient_clipping or None,
        loss_scale=make_scaler(engine.loss_scale, engine.param_dtype, **fp16.scaler_options()),
        **args.optim.optimizer.hyperparameters(),
    )
    lr_at = held_schedule(schedule_for(args, iters), iters, optimizer)
    return OptimizerLR(optimizer, lr_at, schedule_record(args, iters))


def build_checkpointer(
    args: TrainConfig, engine: ModelEngine, optim: OptimizerLR, data: TrainData, plan, topology, tokenizer
) -> Checkpointer:
    """The checkpointer of every component whose state a checkpoint keeps, in the order they load."""
    info = tokenizer_info(args, tokenizer)
    return Checkpointer(
        [
            *model_components(
                engine.model, optim.optimizer, engine.cfg, plan_name=plan.name, plan_label=plan.label(topology),
                seed=args.seed, lr_schedule=optim.schedule, eod=info["eod"],
            ),
            data,
            Record("run", {"seed": args.seed, "config_hash": config_hash(args, engine.cfg)}),
            TokenizerFiles(info),
        ]
    )  # fmt: skip


def tokenizer_info(args: TrainConfig, tokenizer) -> dict[str, Any]:
    """What a checkpoint records of the run's tokenizer (its files are copied beside the shards)."""
    files = [args.data.vocab_file, args.data.merge_file]
    return {"type": args.data.tokenizer_type, "eod": tokenizer.eod, "files": [f for f in files if f]}


def resume(tr: Trainer) -> int:
    """The step to start from, with the components loaded: a zerotopo checkpoint (any plan, any world
    size; ``finetune``: its weights only), a GPT-NeoX or Hugging Face model's weights (step 0), or nothing."""
    from zerotopo.checkpoint.neox import load_neox_weights, neox_step_dir
    from zerotopo.checkpoint.store import (
        check_compatible,
        check_optimizer,
        find_checkpoint,
        is_hf_directory,
        open_checkpoint,
        settle_optimizer,
    )

    args, job, ctx, cfg = tr.args, tr.job, tr.ctx, tr.engine.cfg
    model, optimizer = tr.engine.model, tr.optim.optimizer
    hf_dir = hf_source(args, job)
    neox_dir = neox_step_dir(args.checkpoint.load) if args.checkpoint.load else None
    if neox_dir is not None:
        load_neox_weights(neox_dir, model, optimizer, cfg)
        if ctx.is_main:
            log.info(f"weights from the GPT-NeoX checkpoint {neox_dir} (finetune: fresh optimizer, step 0)")
        return 0
    step_dir = (
        find_checkpoint(args.checkpoint.load)
        if args.checkpoint.load and not is_hf_directory(Path(args.checkpoint.load))
        else None
    )
    if step_dir is not None:
        ckpt = open_checkpoint(step_dir)
        notice = check_run_identity(args, job, cfg, ckpt)
        if notice and ctx.is_main:
            log.warning(notice)
        if not args.checkpoint.finetune:
            notice = check_resumed_schedule(args, tr.iters, ckpt.manifest, str(step_dir))
            if notice and ctx.is_main:
                log.warning(notice)
        check_compatible(ckpt, cfg)
        if args.checkpoint.finetune:
            tr.checkpointer.load(step_dir, only=WEIGHTS_ONLY)
            settle_optimizer(model, optimizer, step=0, zero_moments=True)
            if ctx.is_main:
                log.info(f"finetune: weights of step {ckpt.step} from {step_dir}; fresh optimizer, step 0")
            return 0
        check_optimizer(ckpt, optimizer.spec.name, list(optimizer.states))
        tr.checkpointer.load(step_dir)
        if ctx.is_main:
            log.info(f"resumed from the checkpoint of step {ckpt.step} in {step_dir}")
        return ckpt.step
    check_fresh_start(args, job)
    if args.checkpoint.load and ctx.is_main:
        log.warning(
            f"load: {args.checkpoint.load} holds no checkpoint yet; training starts from step 0 "
            f"(as GPT-NeoX does){' and saves there' if args.checkpoint.save == args.checkpoint.load else ''}"
        )
    if hf_dir:
        from zerotopo.checkpoint.hf import load_hf_shards

        load_hf_shards(hf_dir, model, optimizer, cfg)
        if ctx.is_main:
            log.info(f"weights from the Hugging Face model {hf_dir}")
    return 0


def open_run_dir(tr: Trainer) -> MetricsWriter:
    """Rank 0: the run directory's log, resolved config and metrics writer, and the run's opening line."""
    args, run_dir = tr.args, tr.run_dir
    log_copies = (Path(args.logging.log_dir) / f"{run_dir.name}.log",) if args.logging.log_dir else ()
    attach_run_log(run_dir, copies=log_copies)
    saved_config = run_config(args, tr.plan, tr.job, tr.topology)
    write_text_atomic(run_dir / "config.yml", _yaml_dump(saved_config))
    writer = MetricsWriter(
        run_dir,
        tr.topology.tier_names,
        tensorboard_dir=args.logging.tensorboard_dir,
        resume_step=tr.start_step if args.checkpoint.load else None,
        wandb_run=open_wandb(
            project=args.logging.wandb_project,
            group=args.logging.wandb_group,
            team=args.logging.wandb_team,
            host=args.logging.wandb_host,
            name=run_dir.name,
            run_dir=run_dir,
            config=saved_config,
        )
        if args.logging.use_wandb
        else None,
    )
    cfg, topology, plan, (micro, accum, global_batch) = tr.engine.cfg, tr.topology, tr.plan, tr.batch
    log.info(
        f"zerotopo train: {cfg.num_layers} layers x {cfg.hidden_size} wide, "
        f"{sum(tr.engine.unit_numels) / 1e6:.2f}M parameters, {args.precision.resolved}; plan {plan.name} "
        f"({plan.label(topology)}) on {topology.name} x{topology.nodes} nodes = {tr.ctx.world} ranks; batch "
        f"{micro} x {accum} micro x {tr.ctx.world} ranks = {global_batch} samples of {args.model.seq_length} tokens; "
        f"run dir {run_dir}"
    )
    if hasattr(tr.optim.optimizer, "describe"):  # Muon: which parameters each optimizer runs on
        log.info(tr.optim.optimizer.describe())
    return writer


def run_config(args: TrainConfig, plan, job: TrainJob, topology) -> dict[str, Any]:
    """The run as one NeoX-style config (every key resolved, the plan written out, the topology and
    node count), which ``zerotopo train`` takes back as is."""
    out = to_neox_dict(args)
    out["plan"] = plan.to_dict()
    out["zero_optimization"] = None  # the plan above is what ran
    out["topology"] = job.topology or args.sharding.topology or topology.name
    out["num_nodes"] = topology.nodes
    return out


def _yaml_dump(obj: Any) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False)
