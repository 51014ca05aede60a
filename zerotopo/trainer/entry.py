"""``zerotopo train``'s entry point: one rank of a launched job, or the whole local emulated cluster.

[Note: launch modes] With ``--launcher auto`` a process that finds a launcher's environment (``srun``,
``mpiexec``, ``torchrun``) trains as that rank. A process that finds none spawns the topology's ranks on
this machine (gloo, ``ranks_per_node`` = devices per node, so the mesh sees emulated nodes) and waits
for them; ``--launcher local`` forces that. Either way each rank runs
:func:`zerotopo.trainer.loop.train_rank` with the same :class:`TrainJob`, so a local run and an
``srun`` run of the same config train identically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from dataclasses import replace
from typing import Any

from zerotopo.errors import ConfigError
from zerotopo.launch.devices import check_device_list
from zerotopo.launch.discovery import detect_launcher
from zerotopo.placement import numbers
from zerotopo.trainer.job import TrainJob


def launched_externally(job: TrainJob) -> bool:
    if job.launcher == "local":
        return False
    if job.launcher != "auto":
        return True
    return detect_launcher(os.environ) != "local"


def preflight(job: TrainJob):
    """Every check that needs no process group, run once before spawning ranks, so a bad config is one
    clear error instead of eight: config, topology, plan, data files, vocabulary and memory fit."""
    from zerotopo.data.tokenizers import build_tokenizer
    from zerotopo.trainer.loop import DTYPES
    from zerotopo.trainer.lr_schedule import schedule_for
    from zerotopo.trainer.preflight import (
        check_checkpoint_source,
        check_memory,
        data_files,
        data_prefix,
        model_config,
    )

    env_number("ZEROTOPO_THREADS_PER_RANK", 1, 1, 1024, integer=True)
    env_number("ZEROTOPO_LOCAL_TIMEOUT_S", 24 * 3600, 1, 30 * 24 * 3600)
    args = job.load_args()
    topology = job.load_topology(args)
    check_device_list(os.environ, topology)
    plan = job.load_plan(args)
    plan.degrees(topology)
    args.batch.batch_sizes(topology.world_size)  # config errors before missing files
    if data_files(args):
        data_prefix(args)  # every data file the config names exists
    schedule_for(args, args.train_iters or 100)
    tokenizer = build_tokenizer(
        args.data.tokenizer_type, args.data.vocab_file, args.data.merge_file, args.data.eod_token
    )
    cfg = model_config(args, job, tokenizer)
    check_checkpoint_source(args, job, cfg, world=topology.world_size)
    micro, _, _ = args.batch.batch_sizes(topology.world_size)
    shape = cfg.shape(args.model.seq_length)
    check_memory(
        args, shape, shape.unit_params(), topology, plan,
        param_bytes=DTYPES[args.precision.resolved].itemsize, micro=micro,
    )  # fmt: skip
    return args, topology


def env_number(name: str, default: float, lo: float, hi: float, *, integer: bool = False) -> float:
    """A numeric ``ZEROTOPO_*`` environment variable, or ``default``; ConfigError naming it when it is
    not a number in ``[lo, hi]``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    kind = "an integer" if integer else "a number"
    wording = f"expected {kind} from {lo:g} to {hi:g}, found {{found}}; fix or unset it"
    return numbers.number(
        text,
        name,
        integer=integer,
        strings=True,
        minimum=lo,
        maximum=hi,
        messages=wording,
        error=lambda message: ConfigError(message, source=name),
    )


def check_writable_dir(path: str, source: str) -> None:
    """Create ``path`` if needed and prove a file can be made in it; ConfigError naming it otherwise."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ConfigError(
            f"directory {path!r} is not writable ({exc.strerror}); pick a directory you can write to",
            source=source,
        ) from None


def run_training(job: TrainJob) -> dict[str, Any] | None:
    """Train; returns rank 0's summary (None on other ranks of an external launch)."""
    from zerotopo.trainer.loop import train_rank

    if launched_externally(job):
        import torch.distributed as dist

        from zerotopo.launch.discovery import discover

        info = discover(prefer=None if job.launcher == "auto" else job.launcher)
        try:
            return train_rank(info.rank, info.world_size, job)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    args, topology = preflight(job)
    # One run directory for every rank, fixed before they start; it must be writable, like save:.
    job = replace(job, run_dir=str(job.resolve_run_dir(job.load_plan(args).name)))
    created = not os.path.exists(job.run_dir)
    check_writable_dir(job.run_dir, "--run-dir")
    try:
        return _locked_launch(job, args, topology)
    except BaseException:
        if created:  # a run that stopped before writing anything leaves no empty run directory behind
            _remove_if_empty(job.run_dir)
        raise


def _locked_launch(job: TrainJob, args, topology) -> dict[str, Any] | None:
    """The save directory's lock, taken before any rank starts, then the local ranks."""
    with _sigterm_raises():
        lock = None
        if args.checkpoint.save:
            check_writable_dir(args.checkpoint.save, args.checkpoint.where("save")["source"] or "save")
            from zerotopo.trainer.savelock import SaveLock

            # Taken here, before any rank starts, and held by this process for the whole run: a second
            # run on the directory is refused at once, and a rank that dies cannot leave it behind.
            lock = SaveLock(args.checkpoint.save, args.checkpoint.where("save")["source"] or "save")
            job = dataclasses.replace(job, save_locked=True)
        try:
            return _launch_local(job, args, topology)
        finally:
            if lock is not None:
                lock.release()


def _remove_if_empty(path: str) -> None:
    # not empty (a log, a rank's traceback) or already gone: kept
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _launch_local(job: TrainJob, args, topology) -> dict[str, Any] | None:
    """Spawn the topology's ranks on this machine (the lock, if any, is held) and wait for them."""
    from zerotopo.launch.spawn import spawn
    from zerotopo.logs import get_logger
    from zerotopo.trainer.loop import train_rank
    from zerotopo.trainer.preflight import data_files

    job = dataclasses.replace(job, config_warnings_shown=True)
    if not data_files(args):
        # Build the bundled corpus once here, before the ranks all ask for it.
        from zerotopo.data.corpus import default_corpus_prefix

        default_corpus_prefix(args.data.tokenizer_type)
    get_logger("train").info(
        f"zerotopo train: starting {topology.world_size} ranks on this machine ({topology.name}, "
        f"{topology.nodes} nodes x {topology.devices_per_node}); {_how_ranks_start()}"
    )

    def launch(network=None) -> list:
        return spawn(
            train_rank,
            topology.world_size,
            args=(job,),
            ranks_per_node=topology.devices_per_node,
            timeout_s=env_number("ZEROTOPO_LOCAL_TIMEOUT_S", 24 * 3600, 1, 30 * 24 * 3600),
            network=network,
            log_dir=job.run_dir,
            preempt_on_sigterm=True,
        )

    if job.network_mbit:
        from zerotopo.launch.netem import emulated_network

        with emulated_network(topology.nodes, rate_mbit=job.network_mbit) as net:
            return launch(net)[0]
    return launch()[0]


@contextlib.contextmanager
def _sigterm_raises():
    """SIGTERM before the ranks have started (or after they finished) ends this process through its
    ``finally`` blocks, so the save directory's lock is released; while they run the launcher handles it
    (see :mod:`zerotopo.launch.spawn`)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        from zerotopo.errors import EXIT_TERMINATED
        from zerotopo.launch.spawn import SpawnError

        raise SpawnError(
            "stopped by SIGTERM before training started; nothing to save", exit_code=EXIT_TERMINATED
        )

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _how_ranks_start() -> str:
    """The start line's account of how the ranks come up (``ZEROTOPO_START_METHOD``)."""
    from zerotopo.launch.spawn import start_method

    if start_method() == "spawn":
        return "each imports torch and joins the job"
    return "forked from one process that imports torch once, then each joins the job"
