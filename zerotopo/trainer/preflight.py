"""Every check of a training run that needs no process group, run once before any rank starts (by
:func:`zerotopo.trainer.entry.preflight`) and again inside each rank: the data files the config names, the
vocabulary against the data, the model (from the config or a Hugging Face directory), what ``load:``
names, and whether the plan fits the device's memory."""

from __future__ import annotations

import os
from pathlib import Path

from zerotopo.config.tree import TrainConfig
from zerotopo.data.dataset import build_train_valid_test
from zerotopo.errors import ConfigError, PlanError
from zerotopo.logs import get_logger
from zerotopo.models.neox import NeoXConfig
from zerotopo.placement.plan import PRESETS
from zerotopo.trainer.job import TrainJob
from zerotopo.trainer.longrun import check_fresh_start, check_resume_position, check_run_identity

log = get_logger("train")

DATA_KEYS = ("data_path", "train_data_paths", "valid_data_paths", "test_data_paths")


def data_files(args: TrainConfig) -> list[tuple[str, str]]:
    """``(key, prefix)`` of every dataset the config names (``data_path`` or NeoX's
    ``train/valid/test_data_paths``)."""
    return [(key, prefix) for key in DATA_KEYS for prefix in getattr(args.data, key) or ()]


def check_data_file(args: TrainConfig, key: str, prefix: str) -> None:
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
        f" --tokenizer-type {args.data.tokenizer_type}"
        + "".join(
            f" --{flag} {value}"
            for flag, value in (("vocab-file", args.data.vocab_file), ("merge-file", args.data.merge_file))
            if value
        )
        + " --append-eod`"
        + ("" if named else f" (it writes PREFIX_text_document; set {key} to that)"),
        **args.data.where(key),
    )


def data_prefix(args: TrainConfig) -> str | list[str]:
    """The dataset prefixes: the config's ``data_path`` (several are blended by size), else the bundled
    corpus. Every file the config names (NeoX's ``*_data_paths`` too) is checked to exist first."""
    files = data_files(args)
    for key, prefix in files:
        check_data_file(args, key, prefix)
    if args.data.data_path:
        return list(args.data.data_path)
    if files:
        return [prefix for _, prefix in files]
    from zerotopo.data.corpus import default_corpus_prefix

    return default_corpus_prefix(args.data.tokenizer_type)


def build_datasets(args: TrainConfig, num_samples: tuple[int, int, int]):
    """Train, valid and test datasets as NeoX builds them: weighted ``*_data_paths`` blends, else
    ``data_path`` (or the bundled corpus) split by ``split``."""
    prefix = data_prefix(args)
    if args.data.train_data_paths:
        from zerotopo.data.dataset import build_weighted_splits

        return build_weighted_splits(
            [args.data.train_data_paths, args.data.valid_data_paths, args.data.test_data_paths],
            [args.data.train_data_weights, args.data.valid_data_weights, args.data.test_data_weights],
            args.model.seq_length,
            num_samples,
            args.seed,
        )
    return build_train_valid_test(prefix, args.data.split, args.model.seq_length, num_samples, args.seed)


def check_memory(
    args: TrainConfig, shape, model_units: list[int], topology, plan, param_bytes: int, micro: int
) -> None:
    """Refuse a plan whose states, buffers and activations exceed the device, naming a plan that fits.

    ``model_units`` are the units' parameter counts (the built model's when there is one), ``shape`` the
    model's :class:`~zerotopo.placement.shape.ModelShape` for activations and the planner's suggestion."""
    from zerotopo.cost.memory import memory_per_device
    from zerotopo.cost.planner import plan_candidates

    ckpt = args.model.checkpoint_activations
    mem = memory_per_device(
        model_units,
        topology,
        plan,
        param_bytes=param_bytes,
        padded=True,
        micro_batch=micro,
        shape=shape,
        checkpoint_activations=ckpt,
        optim_bytes_per_param=args.optim.optimizer.bytes_per_param(),
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
            grad_accum=args.batch.gradient_accumulation_steps or 1,
            plans="auto",
            param_bytes=param_bytes,
            checkpoint_activations=ckpt,
            grad_dtype=args.precision.grad_dtype,
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


def check_vocab(args: TrainConfig, tokenizer) -> NeoXConfig:
    """The model config for ``tokenizer``; the data's largest token id must fit its embedding."""
    cfg = args.model.model_config(tokenizer.vocab_size)
    if data_files(args):
        from zerotopo.data.indexed import MMapIndexedDataset

        for key, prefix in data_files(args):
            check_data_file(args, key, prefix)  # missing files are named before any vocabulary check
            top = MMapIndexedDataset(prefix).max_token_id()
            if top >= cfg.vocab_size:
                raise ConfigError(
                    f"{prefix} holds token id {top}, but the model's vocabulary has {cfg.vocab_size} entries "
                    f"(tokenizer {args.data.tokenizer_type}); preprocess the data with the tokenizer the config names",
                    **args.data.where(key),
                )
    return cfg


def recognise_topology(job: TrainJob, args: TrainConfig, info) -> TrainJob:
    """``job`` with the machine's built-in topology when none was given and the launcher and devices
    name it unmistakably (a Frontier node), with a notice; otherwise ``job`` as it is."""
    from dataclasses import replace

    from zerotopo.launch.advice import recognised_topology

    name = None if job.topology or args.sharding.topology else recognised_topology(info, os.environ)
    if name is None:
        return job
    if info.rank == 0:
        log.info(
            f"no topology given: ranks on ROCm devices of a Slingshot system, 8 per node; using --topology {name}"
        )
    return replace(job, topology=name)


def hf_source(args: TrainConfig, job: TrainJob) -> str | None:
    """The Hugging Face directory the run starts from: ``--from-hf``, or ``load:`` naming one."""
    from zerotopo.checkpoint.store import is_hf_directory

    if args.checkpoint.load and is_hf_directory(Path(args.checkpoint.load)):
        return args.checkpoint.load
    return getattr(job, "from_hf", None)


def model_config(args: TrainConfig, job: TrainJob, tokenizer) -> NeoXConfig:
    """The run's model: the config's, or a Hugging Face directory's architecture (see ``hf_source``)."""
    cfg = check_vocab(args, tokenizer)
    hf = hf_source(args, job)
    if hf:
        from zerotopo.checkpoint.hf import merge_hf_config

        cfg = merge_hf_config(hf, args.model, cfg)
        if tokenizer.vocab_size > cfg.vocab_size:
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocab_size} tokens but the model in {hf} only "
                f"{cfg.vocab_size} embedding rows; use the tokenizer the model was trained with",
                key="tokenizer_type",
            )
    return cfg


def check_checkpoint_source(
    args: TrainConfig, job: TrainJob, cfg: NeoXConfig, world: int | None = None
) -> None:
    """Pre-flight of what the run loads (no process group): a zerotopo checkpoint in ``load:`` is read
    and checked against the model (manifest, metadata, every shard file present and long enough), a
    Hugging Face directory has every tensor with its shape."""
    from zerotopo.checkpoint.neox import check_neox_checkpoint, neox_step_dir
    from zerotopo.checkpoint.store import find_checkpoint, preflight_load
    from zerotopo.trainer.schedule_resume import check_resumed_schedule

    neox_dir = neox_step_dir(args.checkpoint.load) if args.checkpoint.load else None
    if neox_dir is not None:
        check_neox_checkpoint(neox_dir, cfg)
        return
    if args.checkpoint.load and find_checkpoint(args.checkpoint.load) is not None:
        # finetune loads the weights alone (a fresh optimizer of any type); a resume needs the writer's
        run_optimizer = (
            None
            if args.checkpoint.finetune
            else (args.optim.optimizer.type, args.optim.optimizer.state_names())
        )
        ckpt = preflight_load(args.checkpoint.load, cfg, run_optimizer)
        check_run_identity(args, job, cfg, ckpt)
        if not args.checkpoint.finetune:  # a schedule that differs is refused here, before any rank starts
            check_resumed_schedule(args, args.train_iters or 100, ckpt.manifest, str(ckpt.path))
        if world is not None:
            check_resume_position(args, ckpt, world)
        return
    check_fresh_start(args, job)
    hf = hf_source(args, job)
    if hf:
        from zerotopo.checkpoint.hf import check_hf_directory

        check_hf_directory(hf, cfg)
