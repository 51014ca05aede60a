"""GPT-NeoX-style training configs read into a :class:`~zerotopo.config.tree.TrainConfig`: the one module
that knows GPT-NeoX's and DeepSpeed's key names.

:data:`KEYS` maps every key zerotopo honours to its place in the tree (even where the name is the same);
the keys accepted without effect and those refused unless they hold NeoX's default are the tables of
:mod:`zerotopo.config.neox_keys`; :data:`UNSUPPORTED_KEYS` says what happens to the keys zerotopo cannot
honour. Rules (as GPT-NeoX's ``megatron/neox_arguments``): files are merged, a key given in two files is an
error naming both, ``-`` and ``_`` are the same in keys, unknown keys are one error naming them, and an
invalid value is a :class:`~zerotopo.errors.ConfigError` naming the file, key, value and what is allowed
(:func:`zerotopo.config.validate.validate` checks the values). ``overrides`` (``zerotopo train --set
key=value``, by NeoX name) win over the files. :func:`to_neox_dict` writes a config back as NeoX keys.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from zerotopo.config import checks as c
from zerotopo.config.neox_keys import (  # noqa: F401 - NO_EFFECT_KEYS and REFUSED_UNLESS_DEFAULT are re-exported
    NO_EFFECT_KEYS,
    REFUSED_UNLESS_DEFAULT,
    refused_value,
)
from zerotopo.config.optimizers import spec_for
from zerotopo.config.tree import SECTIONS, FP16Config, ModelConfig, OptimizerConfig, TrainConfig
from zerotopo.config.validate import validate
from zerotopo.errors import ConfigError, short
from zerotopo.placement.yamlio import apply_overrides, merge_files

#: Every key zerotopo honours -> its field in the tree, in the order ``zerotopo config keys``, the reference
#: and a run's ``config.yml`` list them. ``optimizer`` and ``fp16`` are blocks (see :func:`build_config`);
#: a dotted key is a key of a DeepSpeed block.
KEYS: dict[str, str] = {
    "num_layers": "model.num_layers",
    "hidden_size": "model.hidden_size",
    "num_attention_heads": "model.num_attention_heads",
    "intermediate_size": "model.intermediate_size",
    "mlp_multiple_of": "model.mlp_multiple_of",
    "mlp_type": "model.mlp_type",
    "num_kv_heads": "model.num_kv_heads",
    "seq_length": "model.seq_length",
    "max_position_embeddings": "model.max_position_embeddings",
    "pos_emb": "model.pos_emb",
    "rotary_pct": "model.rotary_pct",
    "rotary_emb_base": "model.rotary_emb_base",
    "gpt_j_residual": "model.gpt_j_residual",
    "norm": "model.norm",
    "layernorm_epsilon": "model.layernorm_epsilon",
    "rms_norm_epsilon": "model.rms_norm_epsilon",
    "use_bias_in_norms": "model.use_bias_in_norms",
    "bias_gelu_fusion": "model.bias_gelu_fusion",
    "activation": "model.activation",
    "use_bias_in_attn_linear": "model.use_bias_in_attn_linear",
    "use_bias_in_mlp": "model.use_bias_in_mlp",
    "qk_norm": "model.qk_norm",
    "post_norm": "model.post_norm",
    "make_vocab_size_divisible_by": "model.vocab_multiple_of",
    "no_weight_tying": "model.no_weight_tying",
    "init_method": "model.init_method",
    "output_layer_init_method": "model.output_layer_init_method",
    "init_method_std": "model.init_method_std",
    "hidden_dropout": "model.hidden_dropout",
    "attention_dropout": "model.attention_dropout",
    "checkpoint_activations": "model.checkpoint_activations",
    "train_micro_batch_size_per_gpu": "batch.micro_batch_size",
    "gradient_accumulation_steps": "batch.gradient_accumulation_steps",
    "train_batch_size": "batch.global_batch_size",
    "train_iters": "train_iters",
    "lr_decay_style": "optim.lr_decay_style",
    "lr_decay_iters": "optim.lr_decay_iters",
    "warmup": "optim.warmup",
    "min_lr": "optim.min_lr",
    "override_lr_scheduler": "optim.override_lr_scheduler",
    "scheduler": "optim.scheduler",
    "optimizer": "optim.optimizer",
    "weight_decay": "optim.weight_decay",
    "gradient_clipping": "optim.gradient_clipping",
    "precision": "precision.dtype",
    "fp16": "precision.fp16",
    "bf16.enabled": "precision.bf16",
    "data_types.grad_accum_dtype": "precision.grad_accum_dtype",
    "data_path": "data.data_path",
    "split": "data.split",
    "train_data_paths": "data.train_data_paths",
    "train_data_weights": "data.train_data_weights",
    "valid_data_paths": "data.valid_data_paths",
    "valid_data_weights": "data.valid_data_weights",
    "test_data_paths": "data.test_data_paths",
    "test_data_weights": "data.test_data_weights",
    "eod_mask_loss": "data.eod_mask_loss",
    "tokenizer_type": "data.tokenizer_type",
    "vocab_file": "data.vocab_file",
    "merge_file": "data.merge_file",
    "eod_token": "data.eod_token",
    "seed": "seed",
    "eval_interval": "evaluation.interval",
    "eval_iters": "evaluation.iters",
    "log_interval": "logging.log_interval",
    "save": "checkpoint.save",
    "finetune": "checkpoint.finetune",
    "load": "checkpoint.load",
    "save_interval": "checkpoint.save_interval",
    "checkpoint_factor": "checkpoint.checkpoint_factor",
    "checkpoint_scale": "checkpoint.checkpoint_scale",
    "extra_save_iters": "checkpoint.extra_save_iters",
    "keep_last_n_checkpoints": "checkpoint.keep_last_n_checkpoints",
    "strict_saves": "checkpoint.strict_saves",
    "async_save": "checkpoint.async_save",
    "fresh_start": "checkpoint.fresh_start",
    "log_dir": "logging.log_dir",
    "tensorboard_dir": "logging.tensorboard_dir",
    "use_wandb": "logging.use_wandb",
    "wandb_project": "logging.wandb_project",
    "wandb_group": "logging.wandb_group",
    "wandb_team": "logging.wandb_team",
    "wandb_host": "logging.wandb_host",
    "pipe_parallel_size": "batch.pipe_parallel_size",
    "model_parallel_size": "batch.model_parallel_size",
    "zero_optimization": "sharding.zero_optimization",
    "topology": "sharding.topology",
    "plan": "sharding.plan",
    "num_nodes": "sharding.num_nodes",
}

#: Top-level spellings of two block keys that are accepted too: ``bf16_enabled: true``,
#: ``grad_accum_dtype: fp32``.
FLAT_SPELLINGS = {"bf16_enabled": "bf16.enabled", "grad_accum_dtype": "data_types.grad_accum_dtype"}

#: The blocks whose keys are read one by one (the ``bf16`` and ``data_types`` keys are in :data:`KEYS`).
_BLOCKS = ("optimizer", "fp16", "bf16", "data_types")

# Accepted without effect, with the reason: zerotopo/config/neox_keys.py (docs/configs.md reads it).
IGNORED_KEYS = frozenset(NO_EFFECT_KEYS)
# The keys of DeepSpeed's zero_optimization block. Those the plan reads pick the plan; the bucket and
# overlap knobs tune DeepSpeed's own scheduling and have no counterpart (zerotopo's schedule is per
# unit); offloading is reported (see _zero_optimization). Anything else is a typo and is reported.
ZERO_PLAN_KEYS = frozenset(
    {
        "stage",
        "zero_hpz_partition_size",
        "mics_shard_size",
        "zero_quantized_weights",
        "zero_quantized_gradients",
    }
)
ZERO_TUNING_KEYS = frozenset(
    {
        "allgather_partitions",
        "allgather_bucket_size",
        "overlap_comm",
        "reduce_scatter",
        "reduce_bucket_size",
        "contiguous_gradients",
        "sub_group_size",
        "elastic_checkpoint",
        "load_from_fp32_weights",
        "ignore_unused_parameters",
        "round_robin_gradients",
        "legacy_stage1",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "zero_quantized_nontrainable_weights",
        "mics_hierarchical_params_gather",
        "memory_efficient_linear",
        "use_multi_rank_bucket_allreduce",
        "log_trace_cache_warnings",
    }
)
ZERO_OFFLOAD_KEYS = frozenset(
    {"offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_params", "cpu_offload_use_pin_memory"}
)

# NeoX keys zerotopo cannot honour. Each is refused when it would change what is trained and reported
# in a warning when it would not; the handler is in build_args (_unsupported).
UNSUPPORTED_KEYS: dict[str, str] = {
    "attention_config": "dense (global) attention is accepted, flash is the same math (a warning), any "
    "sparse or local attention type is refused",
    "sparsity_config": "refused with sparse attention (which is refused); without it, no effect (a warning)",
    "zero_optimization.offload_*": "offloading moves states to the host without changing the result (a "
    "warning); the memory check counts device memory",
    "pipe_parallel_size": "zerotopo is data-parallel only; a value above 1 is refused unless "
    "train_batch_size fixes the global batch (then a warning)",
    "model_parallel_size": "as pipe_parallel_size",
    "sliding_window_width": "sliding-window attention is not implemented: refused when shorter than seq_length; "
    "at least seq_length, it is the same full causal attention (a warning)",
    "deepspeed_extra_args": "accepted when it holds only comms_logger, flops_profiler, wall_clock_breakdown, "
    "steps_per_print (logging); refused otherwise",
    "fp16.type": "fp16 only; bfloat16 in an enabled fp16 block (Pythia's configs) is refused as ambiguous: "
    "older GPT-NeoX trained bf16 from it, today's trains fp16",
}

# Fields whose every accepted value trains the same model (validated, so anything else is refused).
EQUIVALENT_VALUES: dict[str, str] = {
    "fp32_allreduce": "true reduces gradients in fp32: the same as data_types: {grad_accum_dtype: fp32}",
    "optimizer.type": "Adam and AdamW both train with decoupled weight decay: NeoX's Adam is DeepSpeed's "
    "FusedAdam, which runs in AdamW mode by default",
}

# Dense attention types: global is what zerotopo computes; flash is a kernel for the same attention.
_DENSE_ATTENTION = {"global": None, "flash": "a flash-attention kernel computes the same dense attention"}


def _fp16_type(value: Any) -> str:
    """The fp16 block's ``type``: fp16 only. Pythia's configs write ``type: bfloat16`` in an enabled fp16
    block, which older GPT-NeoX read as bf16 and today's reads as fp16, so it is refused as ambiguous."""
    if isinstance(value, str) and value.lower() in ("fp16", "float16"):
        return "fp16"
    if isinstance(value, str) and value.lower() in ("bf16", "bfloat16"):
        raise ValueError(
            "an fp16 block of type bfloat16 trains bf16 in older GPT-NeoX and fp16 in today's; say which: "
            "bf16: {enabled: true} (and fp16: {enabled: false}), or drop type for fp16"
        )
    raise ValueError("expected fp16")


# The fp16 block's keys that are no field of the tree (NeoX's and DeepSpeed's own), with their checks.
_FP16_NEOX_ONLY = {
    "fp16": c.boolean,  # NeoX configs repeat ``fp16: true`` inside the block
    "type": _fp16_type,
    "auto_cast": c.boolean,  # DeepSpeed casts the inputs to fp16; the model computes in fp16 here anyway
}
_FP16_FIELDS = tuple(f.name for f in dataclasses.fields(FP16Config))


def load_neox_config(
    paths: Sequence[str | os.PathLike], overrides: Mapping[str, Any] | None = None
) -> TrainConfig:
    """Merge NeoX-style YAML files (and ``--set`` overrides by NeoX key) into a validated config."""
    values, sources = merge_files(paths)
    apply_overrides(values, sources, overrides)
    config, unknown = build_config(values, sources)
    if unknown:
        raise ConfigError(
            "config keys not implemented by zerotopo and not GPT-NeoX keys it accepts: "
            + ", ".join(unknown)
            + "; fix the spelling or drop them (`zerotopo config keys` lists every accepted key)",
            source=next((sources[k] for k in unknown if k in sources), None),
            key=unknown[0].split(" ")[0],
        )
    return config


def build_config(values: Mapping[str, Any], sources: Mapping[str, str]) -> tuple[TrainConfig, list[str]]:
    """Merged NeoX values placed in the tree by :data:`KEYS` and validated; returns the config and the
    unknown keys (sorted)."""
    unknown: list[str] = []
    placed: dict[str, Any] = {}
    origin: dict[str, tuple[str, str | None]] = {path: (key, None) for key, path in KEYS.items()}

    def place(key: str, value: Any, top: str, written: str | None = None) -> None:
        path = KEYS[FLAT_SPELLINGS.get(key, key)]
        placed[path] = value
        origin[path] = (written or key, sources.get(top))

    fp32_allreduce = False
    for key, value in values.items():
        if (key in KEYS or key in FLAT_SPELLINGS) and key not in _BLOCKS:
            place(key, value, key)
        elif key == "optimizer":
            place(key, _optimizer(value, sources, unknown), key)
        elif key == "fp16":
            place(key, _fp16(value, sources, unknown), key)
        elif key == "bf16":
            block = _block("bf16", value, {"enabled": None, "bf16": c.boolean}, sources, unknown)
            inner = "enabled" if "enabled" in block else "bf16"
            place("bf16.enabled", block.get(inner, True), key, f"bf16.{inner}")
        elif key == "data_types":
            block = _block("data_types", value, {"grad_accum_dtype": None}, sources, unknown)
            if "grad_accum_dtype" in block:
                place("data_types.grad_accum_dtype", block["grad_accum_dtype"], key)
        elif key in ("attention_config", "sparsity_config"):
            _unsupported(key, value, values, sources)
        elif key == "fp32_allreduce":
            fp32_allreduce = _checked(c.boolean, value, key, sources, key)
        elif key in ("sliding_window_width", "deepspeed_extra_args"):
            _checked_extra(key, value, values, sources)
        elif key in REFUSED_UNLESS_DEFAULT:
            why = refused_value(key, value)
            if why:
                raise ConfigError(why, source=sources.get(key), key=key)
        elif key not in NO_EFFECT_KEYS:
            unknown.append(_with_suggestion(str(key)))
    accum = KEYS["data_types.grad_accum_dtype"]
    from_data_types = accum in placed
    if fp32_allreduce and not from_data_types:
        placed[accum] = "fp32"
        origin[accum] = ("data_types.grad_accum_dtype", sources.get("fp32_allreduce"))
    config = validate(_tree(placed, origin))
    if config.sharding.zero_optimization is not None:
        unknown += _zero_optimization(config.sharding.zero_optimization, sources)
    if fp32_allreduce and from_data_types and config.precision.grad_accum_dtype != "fp32":
        raise ConfigError(
            f"fp32_allreduce: true asks for fp32 gradient reduction but data_types.grad_accum_dtype is "
            f"{config.precision.grad_accum_dtype}; drop one of them",
            source=sources.get("fp32_allreduce"),
            key="fp32_allreduce",
        )
    return config, sorted(unknown)


def _tree(placed: Mapping[str, Any], origin: Mapping[str, tuple[str, str | None]]) -> TrainConfig:
    """A :class:`TrainConfig` of the placed values (``{tree path: value}``) and their origins."""
    parts: dict[str, dict[str, Any]] = {name: {} for name in ("", *SECTIONS)}
    origins: dict[str, dict[str, tuple[str, str | None]]] = {name: {} for name in parts}
    for path, where in origin.items():
        section, _, name = path.rpartition(".")
        origins[section][name] = where
        if path in placed:
            parts[section][name] = placed[path]
    sections = {name: cls(**parts[name], origin=origins[name]) for name, cls in SECTIONS.items()}
    return TrainConfig(**sections, **parts[""], origin=origins[""])


def field_of(config: TrainConfig, key: str) -> Any:
    """The value of NeoX key ``key`` (a key of :data:`KEYS`) in ``config``."""
    return functools.reduce(getattr, KEYS[key].split("."), config)


def to_neox_dict(config: TrainConfig) -> dict[str, Any]:
    """Plain values (YAML/JSON-ready) of every honoured key, nested the way NeoX files write them, so the
    dict loads back as the same config (a run's ``config.yml``, logs)."""
    late = ("optimizer", "bf16.enabled", "data_types.grad_accum_dtype")
    out: dict[str, Any] = {}
    for key in KEYS:
        if key not in late:
            value = field_of(config, key)
            out[key] = _plain(dataclasses.asdict(value) if key == "fp16" else value)
    out["split"] = ",".join(f"{x:g}" for x in config.data.split)
    opt: OptimizerConfig = config.optim.optimizer
    takes = spec_for(opt.type).params
    named = {"lr": opt.lr, "betas": opt.betas, "eps": opt.eps, "weight_decay": opt.weight_decay}
    params = {k: v for k, v in named.items() if v is not None and (k not in ("betas", "eps") or k in takes)}
    out["optimizer"] = {"type": opt.type, "params": _plain({**params, **opt.options})}
    out["bf16"] = {"enabled": config.precision.bf16}
    out["data_types"] = {"grad_accum_dtype": config.precision.grad_accum_dtype}
    return out


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively, so ``yaml.safe_dump`` and ``json.dumps`` take the result."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _checked(check: c.Check, value: Any, key: str, sources: Mapping[str, str], top: str) -> Any:
    """A NeoX-only key's value checked (a value of the tree is checked by :func:`validate`)."""
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigError(f"{short(value)}: {exc}", source=sources.get(top), key=key) from None


def _block(
    name: str,
    value: Any,
    keys: Mapping[str, c.Check | None],
    sources: Mapping[str, str],
    unknown: list[str],
) -> dict[str, Any]:
    """The keys of a nested block: those with a check are NeoX-only and checked here, those without are
    fields of the tree, passed on as written; unknown ones are collected as ``block.key``."""
    top = name.split(".")[0]
    block = _checked(c.mapping, value, name, sources, top)
    out = {}
    for key, raw in block.items():
        if key not in keys:
            unknown.append(f"{name}.{key}")
        else:
            check = keys[key]
            out[key] = raw if check is None else _checked(check, raw, f"{name}.{key}", sources, top)
    return out


def _fp16(value: Any, sources: Mapping[str, str], unknown: list[str]) -> FP16Config:
    """The ``fp16`` block: its fields as written, ``enabled`` true unless the block says otherwise."""
    keys: dict[str, c.Check | None] = {**dict.fromkeys(_FP16_FIELDS), **_FP16_NEOX_ONLY}
    block = _block("fp16", value, keys, sources, unknown)
    block.pop("type", None)
    block.pop("auto_cast", None)
    enabled = block.pop("fp16", None)
    block.setdefault("enabled", enabled if enabled is not None else True)
    return FP16Config(**block)


def _optimizer(value: Any, sources: Mapping[str, str], unknown: list[str]) -> OptimizerConfig:
    """The ``optimizer`` block, ``{type: <name>, params: {...}}``: the type and every parameter as written
    (in ``options``; :func:`validate` checks them against the type and moves ``lr``, ``betas``, ``eps``
    and ``weight_decay`` to their fields)."""
    block = _block("optimizer", value, {"type": None, "params": c.mapping}, sources, unknown)
    return OptimizerConfig(type=block.get("type", "AdamW"), options=dict(block.get("params", {})))


def _with_suggestion(key: str) -> str:
    """``key`` with the accepted key it most likely misspells, if any."""
    import difflib

    top = {k for k in (*KEYS, *FLAT_SPELLINGS) if "." not in k}
    known = sorted(top | set(NO_EFFECT_KEYS) | set(REFUSED_UNLESS_DEFAULT) | {"optimizer", "fp16", "bf16"})
    close = difflib.get_close_matches(key, known, n=1)
    return key + (f" (did you mean {close[0]}?)" if close else "")


def _attention_types(value: Any, source: str | None) -> list[str]:
    """The attention types of NeoX's ``attention_config: [[["global"], 12], ...]``."""
    try:
        return [str(t).lower() for kinds, _count in value for t in kinds]
    except (TypeError, ValueError):
        raise ConfigError(
            f'{value!r}: expected NeoX\'s form [[[type, ...], layers], ...], e.g. [[["global"], 12]]',
            source=source,
            key="attention_config",
        ) from None


def _unsupported(key: str, value: Any, values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """The keys of :data:`UNSUPPORTED_KEYS` that are not fields: refuse what changes the result, warn
    about what does not."""
    types = _attention_types(values.get("attention_config") or [], sources.get("attention_config"))
    sparse = sorted({t for t in types if t not in _DENSE_ATTENTION})
    if key == "attention_config":
        if sparse:
            raise ConfigError(
                f"attention types {', '.join(sparse)} are not implemented: zerotopo's NeoX model computes dense "
                'causal attention; use [[["global"], num_layers]]',
                source=sources.get(key),
                key=key,
            )
        for t in sorted(set(types)):
            if _DENSE_ATTENTION.get(t):
                warnings.warn(f"attention_config type {t!r}: {_DENSE_ATTENTION[t]}", stacklevel=3)
    elif key == "sparsity_config" and value and not sparse:
        warnings.warn(
            "sparsity_config has no effect: attention_config asks for dense attention only", stacklevel=3
        )


# The deepspeed_extra_args entries that only log or profile (anything else could change the training).
_EXTRA_ARGS_NO_EFFECT = frozenset(
    {"comms_logger", "flops_profiler", "wall_clock_breakdown", "steps_per_print"}
)


def _checked_extra(key: str, value: Any, values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """``sliding_window_width`` (accepted, with a notice, when it covers the whole sequence: the same
    attention) and ``deepspeed_extra_args`` (accepted when it only logs or profiles)."""
    if value is None:
        return
    if key == "sliding_window_width":
        width = _checked(c.integer(1), value, key, sources, key)
        seq = values.get("seq_length", ModelConfig.seq_length)
        if not isinstance(seq, int) or width < seq:
            raise ConfigError(
                f"{width} is shorter than seq_length {seq}: sliding-window attention is not implemented (each "
                "position attends to every earlier one); train with seq_length at most the window, or drop "
                "the key for full causal attention",
                source=sources.get(key),
                key=key,
            )
        warnings.warn(
            f"sliding_window_width {width} covers the whole sequence (seq_length {seq}): full causal "
            "attention computes the same",
            stacklevel=3,
        )
        return
    block = _checked(c.mapping, value, key, sources, key)
    other = sorted(str(k) for k in block if k not in _EXTRA_ARGS_NO_EFFECT)
    if other:
        raise ConfigError(
            f"{', '.join(other)}: DeepSpeed settings zerotopo does not read; it accepts "
            f"{', '.join(sorted(_EXTRA_ARGS_NO_EFFECT))} here (logging and profiling only); give the others "
            "as their zerotopo keys or drop them",
            source=sources.get(key),
            key=key,
        )


def _zero_optimization(zero: Mapping[str, Any], sources: Mapping[str, str]) -> list[str]:
    """Offload settings are reported; keys DeepSpeed does not have are returned as unknown (with the
    known key they most likely misspell)."""
    import difflib

    known = ZERO_PLAN_KEYS | ZERO_TUNING_KEYS | ZERO_OFFLOAD_KEYS
    unknown = []
    for raw_key, value in zero.items():
        k = str(raw_key).replace("-", "_")
        if k in ZERO_OFFLOAD_KEYS:
            on = (
                value
                if isinstance(value, bool)
                else bool(value)
                and (not isinstance(value, Mapping) or str(value.get("device", "cpu")).lower() != "none")
            )
            if on:
                warnings.warn(
                    f"zero_optimization.{k}: zerotopo keeps every state on the device (offloading changes where "
                    "states live, not the result); the memory check counts device memory, so pick a plan "
                    "that fits with `zerotopo plan`",
                    stacklevel=3,
                )
        elif k not in known:
            close = difflib.get_close_matches(k, sorted(known), n=1)
            unknown.append(f"zero_optimization.{raw_key}" + (f" (did you mean {close[0]}?)" if close else ""))
    return unknown
