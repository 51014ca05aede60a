"""GPT-NeoX-style training configs: several YAML files merged into one validated :class:`NeoXArgs`.

Rules (as GPT-NeoX's ``megatron/neox_arguments``): files are merged, a key given in two files is an error
naming both, ``-`` and ``_`` are the same in keys, unknown keys are one error naming them, and an
invalid value is a :class:`~zerotopo.errors.ConfigError` naming the file, key, value and what is allowed.
``overrides`` (``zerotopo train --set key=value``) win over the files.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zerotopo.config import checks as c
from zerotopo.config.neox_keys import (  # noqa: F401 - NO_EFFECT_KEYS and REFUSED_UNLESS_DEFAULT are re-exported
    NO_EFFECT_KEYS,
    REFUSED_UNLESS_DEFAULT,
    refused_value,
)
from zerotopo.config.optimizers import (
    HyperparameterError,
    canonical,
    check_hyperparameters,
    spec_for,
    supported,
)
from zerotopo.data.tokenizers import TOKENIZER_TYPES
from zerotopo.errors import ConfigError, short
from zerotopo.models.config import INIT_METHODS, NeoXConfig, mlp_width
from zerotopo.placement.shape import ModelShape
from zerotopo.placement.yamlio import apply_overrides, merge_files

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


def _key(check: c.Check, default: Any = None, *, neox: str | None = None) -> Any:
    """A config field with its value check (and NeoX's name when it differs)."""
    return field(default=default, metadata={"check": check, "neox": neox})


@dataclass(frozen=True)
class OptimizerArgs:
    """The ``optimizer`` block: ``{type: <name>, params: {lr, weight_decay, <the type's others>}}``; the
    types and what each takes are the table in :mod:`zerotopo.config.optimizers`."""

    type: str = "AdamW"
    """torch's elementwise optimizer to run on the sharded fp32 master weights (any case): AdamW, Adam,
    SGD, Adagrad, Adadelta, RMSprop, Adamax, NAdam or RAdam. NeoX's ``Adam`` is DeepSpeed's FusedAdam,
    whose default is decoupled weight decay (AdamW), so the two names train alike. LBFGS, SparseAdam and
    Adafactor are refused: their state is not per element."""
    lr: float = 1e-3
    """Peak learning rate, reached at the end of warmup (NeoX's default without it: 0.001)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Moment decay rates (AdamW, Adam, Adamax, NAdam, RAdam); NeoX's Adam takes torch's (0.9, 0.999)."""
    eps: float = 1e-8
    """Denominator epsilon (every type but SGD; this default for all of them)."""
    weight_decay: float | None = None
    """Weight decay from the block; when absent the top-level ``weight_decay`` key applies."""
    options: dict[str, Any] = field(default_factory=dict)
    """The type's other hyperparameters as the block gives them, checked against the type: ``amsgrad``
    (AdamW, Adam), ``momentum``, ``dampening``, ``nesterov`` (SGD), ``lr_decay``,
    ``initial_accumulator_value`` (Adagrad), ``rho`` (Adadelta), ``alpha``, ``momentum``, ``centered``
    (RMSprop), ``momentum_decay`` (NAdam), ``decoupled_weight_decay`` (NAdam, RAdam); torch's defaults
    for those not given. A hyperparameter the type does not take is an error naming it."""

    def hyperparameters(self) -> dict[str, Any]:
        """What the engine's optimizer takes besides ``lr`` and ``weight_decay``: ``betas`` and ``eps``
        where the type takes them, and the ``options``."""
        takes = spec_for(self.type).params
        out = {k: v for k, v in (("betas", self.betas), ("eps", self.eps)) if k in takes}
        return {**out, **self.options}

    def state_names(self) -> tuple[str, ...]:
        """The per-element states the type keeps with these hyperparameters (its checkpoint keys)."""
        return spec_for(self.type).state_names(self.hyperparameters())

    def bytes_per_param(self) -> int:
        """Optimizer-shard bytes per parameter: the fp32 master and each fp32 per-element state (AdamW 12)."""
        return 4 * (1 + len(self.state_names()))


@dataclass(frozen=True)
class FP16Args:
    """The ``fp16`` block (DeepSpeed's dynamic loss scaling)."""

    enabled: bool = False
    """Train in fp16 with an fp32 master copy."""
    loss_scale: float = 0.0
    """0 for dynamic loss scaling, else a fixed scale."""
    initial_scale_power: int = 16
    """Dynamic scaling starts at ``2**initial_scale_power``."""
    loss_scale_window: int = 1000
    """Steps without overflow before the scale doubles."""
    hysteresis: int = 2
    """Overflows tolerated before the scale halves."""
    min_loss_scale: float = 1.0
    """The scale never drops below this."""

    def scaler_options(self) -> dict[str, float | int]:
        """The block as :class:`zerotopo.engine.optim.LossScaler` keywords (dynamic scaling)."""
        return {
            "init_scale": 2.0**self.initial_scale_power,
            "growth_interval": self.loss_scale_window,
            "hysteresis": self.hysteresis,
            "min_scale": self.min_loss_scale,
        }


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


_FP16_CHECKS = {
    "enabled": c.boolean,
    "fp16": c.boolean,  # NeoX configs repeat ``fp16: true`` inside the block
    "type": _fp16_type,
    "auto_cast": c.boolean,  # DeepSpeed casts the inputs to fp16; the model computes in fp16 here anyway
    "loss_scale": c.number(0.0),
    "initial_scale_power": c.integer(0, 63),
    "loss_scale_window": c.integer(1),
    "hysteresis": c.integer(1),
    "min_loss_scale": c.number(0.0, lo_open=True),
}


_DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class NeoXArgs:
    """Everything a NeoX-style config file can set that zerotopo uses, validated."""

    # --- model shape -------------------------------------------------------------------------------------
    num_layers: int = _key(c.integer(1, 10_000), 4)
    """Transformer layers."""
    hidden_size: int = _key(c.integer(1, 1 << 20), 128)
    """Model width; a multiple of ``num_attention_heads``."""
    num_attention_heads: int = _key(c.integer(1, 1 << 16), 4)
    """Attention heads."""
    intermediate_size: int | None = _key(c.optional(c.integer(1, 1 << 22)))
    """MLP width; ``4·hidden_size`` when not set. With ``mlp_type: llama`` the gate/up width (``8h/3``
    rounded up to ``mlp_multiple_of`` when not set); with ``activation: swiglu`` the ungated width that NeoX
    scales by 2/3 and splits between gate and up (see :func:`zerotopo.models.config.mlp_width`)."""
    mlp_multiple_of: int | None = _key(c.optional(c.integer(1, 1 << 20)))
    """The MLP width is rounded up to a multiple of this (NeoX: 256 for ``mlp_type: llama``, else 1)."""
    mlp_type: str = _key(c.choice("regular", "llama"), "regular")
    """``regular`` (two matrices) or ``llama``: NeoX's gated ``LLaMAParallelMLP``, ``w2(act(w1·x) * w3·x)``,
    without biases unless ``use_bias_in_mlp: true`` is given."""
    num_kv_heads: int | None = _key(c.optional(c.integer(1, 1 << 16)))
    """Key/value heads: grouped-query attention (1: multi-query); ``num_attention_heads`` when not set."""
    seq_length: int = _key(c.integer(1, 1 << 24), 128)
    """Tokens per training sample."""
    max_position_embeddings: int | None = _key(c.optional(c.integer(1, 1 << 24)))
    """Longest supported sequence; ``seq_length`` when not set, and never below it."""
    pos_emb: str = _key(c.const("rotary", "zerotopo's NeoX model uses rotary position embeddings"), "rotary")
    """Position embedding; only ``rotary``."""
    rotary_pct: float = _key(c.number(0.0, 1.0), 1.0)
    """Fraction of each head's dimensions that get rotary embeddings (NeoX's default 1.0: all; Pythia and
    NeoX-20B set 0.25)."""
    rotary_emb_base: int = _key(c.integer(1), 10000)
    """Base of the rotary frequencies."""
    gpt_j_residual: bool = _key(c.boolean, False)
    """Parallel attention+MLP residual (NeoX-20B, Pythia); NeoX's default is sequential."""
    norm: str = _key(c.choice("layernorm", "rmsnorm"), "layernorm")
    """Normalization: ``layernorm`` or ``rmsnorm`` (Llama's)."""
    layernorm_epsilon: float = _key(c.number(0.0, 1.0, lo_open=True), 1e-5)
    """LayerNorm epsilon."""
    rms_norm_epsilon: float = _key(c.number(0.0, 1.0, lo_open=True), 1e-8)
    """RMSNorm epsilon (NeoX's default 1e-8; Llama 1e-6)."""
    use_bias_in_norms: bool = _key(c.boolean, True)
    """Biases (offsets) in the norms."""
    bias_gelu_fusion: bool = _key(c.boolean, False)
    """NeoX's fused bias+GELU kernel, which computes the tanh approximation; here it selects that GELU."""
    activation: str = _key(c.choice("gelu", "silu", "swiglu"), "gelu")
    """MLP activation: ``gelu``, ``silu`` (gated with ``mlp_type: llama``: SwiGLU) or ``swiglu`` (NeoX's
    gated SiLU on the regular MLP)."""
    use_bias_in_attn_linear: bool = _key(c.boolean, True)
    """Biases on the QKV and attention output projections."""
    use_bias_in_mlp: bool = _key(c.boolean, True)
    """Biases on the MLP projections."""
    qk_norm: bool = _key(c.boolean, False)
    """OLMo-2's QK-norm: ``norm`` over the whole query and key projections before rotary (not NeoX's
    per-head ``use_qk_layernorm``)."""
    post_norm: bool = _key(c.boolean, False)
    """OLMo-2's norm placement: each layer's norms on the outputs of attention and MLP instead of their
    inputs."""
    make_vocab_size_divisible_by: int = _key(c.integer(1, 1 << 20), 128)
    """The tokenizer's vocabulary is padded up to a multiple of this (fast matmuls)."""
    no_weight_tying: bool = _key(c.boolean, True)
    """Untied input and output embeddings. NeoX's own default is False (tied), but every released
    NeoX/Pythia config sets it true, so zerotopo defaults to untied. False (tied) trains: the shared matrix
    is sharded once, in the embedding's unit, and the head gathers it from there."""
    init_method: str = _key(c.choice(*INIT_METHODS), "normal")
    """Init of embeddings, QKV and the first MLP projection: normal | scaled_normal | small_init | wang_init."""
    output_layer_init_method: str = _key(c.choice(*INIT_METHODS), "scaled_normal")
    """Init of the attention output and second MLP projections."""
    init_method_std: float = _key(c.number(0.0, 1.0, lo_open=True), 0.02)
    """Standard deviation of the ``normal`` / ``scaled_normal`` inits."""
    hidden_dropout: float = _key(c.const(0, "dropout is not implemented (NeoX's large configs set 0)"), 0)
    """Dropout after attention and MLP; only 0."""
    attention_dropout: float = _key(c.const(0, "dropout is not implemented (NeoX's large configs set 0)"), 0)
    """Dropout on attention probabilities; only 0."""
    checkpoint_activations: bool = _key(c.boolean, False)
    """Recompute each layer's activations in the backward pass (one layer per checkpoint)."""
    # --- batch -------------------------------------------------------------------------------------------
    train_micro_batch_size_per_gpu: int | None = _key(c.optional(c.integer(1, 1 << 20)))
    """Samples per rank per micro-batch."""
    gradient_accumulation_steps: int | None = _key(c.optional(c.integer(1, 1 << 20)))
    """Micro-batches per optimizer step."""
    train_batch_size: int | None = _key(c.optional(c.integer(1, 1 << 30)))
    """Samples per optimizer step over all ranks: micro × accumulation × data-parallel ranks."""
    # --- schedule and optimizer ---------------------------------------------------------------------------
    train_iters: int | None = _key(c.optional(c.integer(1, 10**9)))
    """Optimizer steps to train."""
    lr_decay_style: str = _key(c.choice("constant", "linear", "cosine"), "linear")
    """Learning-rate decay after warmup."""
    lr_decay_iters: int | None = _key(c.optional(c.integer(1, 10**9)))
    """Steps over which the learning rate decays to ``min_lr``; ``train_iters`` when not set."""
    warmup: float = _key(c.number(0.0, 1.0), 0.01)
    """Fraction of ``lr_decay_iters`` spent warming up linearly from 0."""
    min_lr: float = _key(c.number(0.0), 0.0)
    """Learning rate at the end of decay."""
    override_lr_scheduler: bool | None = _key(c.optional(c.boolean))
    """GPT-NeoX's switch between the config's schedule and the checkpoint's on a resume. zerotopo's schedule
    always follows the config's keys (what ``true`` asks for). ``false`` (NeoX's default) on a resume checks
    that the schedule keys (``lr``, ``min_lr``, ``warmup``, ``lr_decay_iters`` (``train_iters`` when not
    set), ``lr_decay_style``, ``scheduler``) are those the checkpoint was trained with, and refuses the run, naming
    each that differs, where they are not, as NeoX does. Not set: the schedule follows the config, and a
    resume whose schedule keys differ from the checkpoint's says which (zerotopo's behaviour before it read
    this key, kept so that a run resumed with more ``train_iters`` continues)."""
    scheduler: dict[str, Any] | None = _key(c.optional(c.mapping))
    """DeepSpeed's ``scheduler`` block (``WarmupLR`` or ``WarmupDecayLR`` with their ``params``); when
    given it sets the learning rate instead of ``lr_decay_style``/``warmup``/``min_lr``, as in DeepSpeed."""
    optimizer: OptimizerArgs = field(default_factory=OptimizerArgs)
    """The ``optimizer`` block."""
    weight_decay: float = _key(c.number(0.0, 10.0), 0.1)
    """Weight decay, decoupled for AdamW and Adam (the optimizer block's ``weight_decay`` wins when given)."""
    gradient_clipping: float = _key(c.number(0.0), 1.0)
    """Clip the global gradient norm to this; 0 disables clipping."""
    # --- precision ---------------------------------------------------------------------------------------
    precision: str | None = _key(
        c.optional(
            c.choice(
                "fp32", "fp16", "bf16", aliases={"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
            )
        )
    )
    """fp32 | fp16 | bf16; when not set, taken from the ``fp16`` / ``bf16`` blocks (fp32 if neither)."""
    fp16: FP16Args = field(default_factory=FP16Args)
    """The ``fp16`` block."""
    bf16_enabled: bool = _key(c.boolean, False, neox="bf16.enabled")
    """The ``bf16: {enabled: true}`` block."""
    grad_accum_dtype: str | None = _key(
        c.optional(c.choice("fp32", "fp16", "bf16", aliases=_DTYPE_ALIASES)),
        None,
        neox="data_types.grad_accum_dtype",
    )
    """DeepSpeed's ``data_types: {grad_accum_dtype: ...}``: the gradients' dtype (reduction and accumulated
    shard). DeepSpeed's default is the model dtype, and so is zerotopo's (plan ``grad_dtype: param``);
    ``fp32`` keeps fp32 gradients (plan ``grad_dtype: fp32``). A plan's own ``grad_dtype`` wins."""
    # --- data --------------------------------------------------------------------------------------------
    data_path: tuple[str, ...] | None = _key(c.optional(c.str_or_list))
    """Prefix (or list of prefixes) of mmap indexed datasets, without ``.bin``/``.idx``; the bundled
    corpus when not set."""
    split: tuple[float, float, float] = _key(c.split, (969 / 1000, 30 / 1000, 1 / 1000))
    """Train/valid/test weights over documents, e.g. ``"969,30,1"`` (NeoX's default)."""
    train_data_paths: tuple[str, ...] | None = _key(c.optional(c.str_or_list))
    """Training dataset prefixes, each read whole and blended by ``train_data_weights`` as NeoX's
    BlendableDataset does (instead of ``data_path`` and ``split``)."""
    train_data_weights: tuple[float, ...] | None = _key(c.optional(c.weights))
    """Blend weights of ``train_data_paths`` (normalized; equal when not set)."""
    valid_data_paths: tuple[str, ...] | None = _key(c.optional(c.str_or_list))
    """Validation dataset prefixes (with ``train_data_paths``); no evaluation when not set."""
    valid_data_weights: tuple[float, ...] | None = _key(c.optional(c.weights))
    """Blend weights of ``valid_data_paths``."""
    test_data_paths: tuple[str, ...] | None = _key(c.optional(c.str_or_list))
    """Test dataset prefixes (with ``train_data_paths``); checked to exist, as NeoX builds them."""
    test_data_weights: tuple[float, ...] | None = _key(c.optional(c.weights))
    """Blend weights of ``test_data_paths``."""
    eod_mask_loss: bool = _key(c.boolean, False)
    """No loss on the positions whose input is the end-of-document token (NeoX's loss mask)."""
    tokenizer_type: str = _key(
        c.choice(*TOKENIZER_TYPES, aliases={"ByteLevel": "ByteTokenizer"}),
        "GPT2BPETokenizer",
    )
    """GPT2BPETokenizer (NeoX's default: ``vocab_file`` vocab.json + ``merge_file`` merges.txt),
    HFTokenizer (a tokenizers JSON file in ``vocab_file``), SPMTokenizer (a SentencePiece ``tokenizer.model``
    in ``vocab_file``), TiktokenTokenizer (a tiktoken encoding name in ``vocab_file``, when tiktoken has it
    offline), CharLevelTokenizer (NeoX's: Unicode code points) or ByteTokenizer (UTF-8 bytes; needs no
    file, what the bundled corpus uses)."""
    vocab_file: str | None = _key(c.optional(c.text))
    """The tokenizer JSON file (HFTokenizer) or GPT-2 ``vocab.json`` (GPT2BPETokenizer)."""
    merge_file: str | None = _key(c.optional(c.text))
    """GPT-2 ``merges.txt`` (GPT2BPETokenizer)."""
    eod_token: str | None = _key(c.optional(c.text))
    """zerotopo: the end-of-document token's name for HFTokenizer, SPMTokenizer or TiktokenTokenizer (e.g.
    Llama 3's ``<|end_of_text|>``); when not set, the first of ``<|endoftext|>``, ``<|end_of_text|>``,
    ``</s>``, ``<eos>``, ``[SEP]`` the vocabulary has (SPMTokenizer: else the model's end-of-sentence piece)."""
    seed: int = _key(c.integer(0, 2**32 - 1), 1234)
    """Seed of the model init and of the data shuffle."""
    # --- evaluation, logging, checkpoints ----------------------------------------------------------------
    eval_interval: int = _key(c.integer(1, 10**9), 1000)
    """Steps between evaluations on the validation split."""
    eval_iters: int = _key(c.integer(0, 10**9), 100)
    """Validation micro-batches per evaluation."""
    log_interval: int = _key(c.integer(1, 10**9), 100)
    """Steps between log lines."""
    save: str | None = _key(c.optional(c.text))
    """Directory to save checkpoints to."""
    finetune: bool = _key(c.boolean, False)
    """Start from the weights in ``load`` only: a fresh optimizer, step counter and data position (a
    zerotopo checkpoint, or a GPT-NeoX ``global_stepN`` directory, which always loads this way)."""
    load: str | None = _key(c.optional(c.text))
    """Directory to resume from (a ``save:`` directory or one ``step_<N>`` in it, any plan or world size), or
    a Hugging Face GPT-NeoX directory to start from. One that does not exist or holds no checkpoint is an
    error unless ``fresh_start`` is set or it equals ``save`` (NeoX's first run: a notice, step 0)."""
    save_interval: int | None = _key(c.optional(c.integer(1, 10**9)))
    """Steps between checkpoints (the older name of ``checkpoint_factor``)."""
    checkpoint_factor: float | None = _key(c.optional(c.number(1.0)))
    """NeoX's save interval: a checkpoint every ``checkpoint_factor`` steps (``checkpoint_scale:
    linear``) or at its powers (``log``); the last step is always saved."""
    checkpoint_scale: str = _key(c.choice("linear", "log"), "linear")
    """How ``checkpoint_factor`` spaces the checkpoints."""
    extra_save_iters: tuple[int, ...] | None = _key(c.optional(c.int_list))
    """Further steps to save a checkpoint at."""
    keep_last_n_checkpoints: int | None = _key(c.optional(c.integer(1, 10**6)))
    """Delete older checkpoints of ``save`` after each save, keeping this many."""
    strict_saves: bool = _key(c.boolean, False)
    """A checkpoint save that fails (disk full, no permission) stops the run. By default it warns, keeps
    the previous checkpoint and training goes on; a failed last save always stops with an error."""
    async_save: bool = _key(c.boolean, False)
    """Write checkpoints in the background: the step copies its shards (to host memory) and training goes
    on while a writer thread persists them; at most one save is in flight. The host memory a save holds
    is printed and checked before the first save."""
    fresh_start: bool = _key(c.boolean, False)
    """Start from step 0 when ``load:`` does not exist or holds no checkpoint. Without it that is an
    error, except NeoX's first run, where ``load`` equals ``save`` (a notice)."""
    # --- logging backends ---------------------------------------------------------------------------------
    log_dir: str | None = _key(c.optional(c.text))
    """A directory for a copy of the run's text log (``<run name>.log``); the run directory always has
    ``train.log``."""
    tensorboard_dir: str | None = _key(c.optional(c.text))
    """TensorBoard event files go here (needs the ``tensorboard`` package; else one warning)."""
    use_wandb: bool | None = _key(c.optional(c.boolean))
    """Log metrics to Weights & Biases (needs the ``wandb`` package; else one warning)."""
    wandb_project: str = _key(c.text, "neox")
    """W&B project."""
    wandb_group: str | None = _key(c.optional(c.text))
    """W&B group of runs."""
    wandb_team: str | None = _key(c.optional(c.text))
    """W&B team (entity)."""
    wandb_host: str | None = _key(c.optional(c.text))
    """W&B server URL (the default is wandb's own)."""
    # --- sharding ----------------------------------------------------------------------------------------
    pipe_parallel_size: int = _key(c.integer(0), 0)
    """NeoX's pipeline stages (0 and 1: no pipeline); zerotopo is data-parallel only (see :meth:`batch_sizes`)."""
    model_parallel_size: int = _key(c.integer(0), 1)
    """NeoX's tensor-parallel degree; zerotopo is data-parallel only (see :meth:`batch_sizes`)."""
    zero_optimization: dict[str, Any] | None = _key(c.optional(c.mapping))
    """DeepSpeed's ``zero_optimization`` block, kept as written; the plan module maps it to a plan."""
    topology: str | None = _key(c.optional(c.text))
    """zerotopo: topology name or YAML file (``frontier``, ``emulated``, ...)."""
    plan: str | dict[str, Any] | None = _key(c.optional(c.plan))
    """zerotopo: plan preset name (``zerotopo``, ``zero3``, ...) or a mapping of degrees."""
    num_nodes: int | None = _key(c.optional(c.integer(-1)))
    """Nodes of the job (``--nodes`` and the launcher's count win); -1 or unset: the topology file's."""
    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Which file set each key (``--set`` for overrides); for error messages."""

    # -------------------------------------------------------------------------------------------------------
    @property
    def lr(self) -> float:
        return self.optimizer.lr

    @property
    def effective_weight_decay(self) -> float:
        wd = self.optimizer.weight_decay
        return self.weight_decay if wd is None else wd

    @property
    def decay_iters(self) -> int | None:
        return self.lr_decay_iters or self.train_iters

    @property
    def resolved_precision(self) -> str:
        """fp32, fp16 or bf16 after combining ``precision`` with the ``fp16`` / ``bf16`` blocks."""
        if self.precision:
            return self.precision
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16_enabled else "fp32"

    @property
    def grad_dtype(self) -> str:
        """The plan ``grad_dtype`` a DeepSpeed user of this config gets: ``param`` unless
        ``data_types.grad_accum_dtype`` asks for fp32 under fp16/bf16 training."""
        if self.grad_accum_dtype == "fp32" and self.resolved_precision != "fp32":
            return "fp32"
        return "param"

    def padded_vocab(self, vocab_size: int) -> int:
        """The tokenizer's vocabulary rounded up to a multiple of ``make_vocab_size_divisible_by``."""
        m = self.make_vocab_size_divisible_by
        return -(-vocab_size // m) * m

    def mlp_style(self) -> str:
        """``regular``, ``llama`` (``mlp_type: llama``) or ``gated`` (``activation: swiglu``)."""
        return "llama" if self.mlp_type == "llama" else "gated" if self.activation == "swiglu" else "regular"

    def model_config(self, vocab_size: int) -> NeoXConfig:
        """The model for a tokenizer of ``vocab_size`` tokens (padded here)."""
        style = self.mlp_style()
        width = self.intermediate_size
        if style != "regular" or self.mlp_multiple_of:
            width = mlp_width(self.hidden_size, self.intermediate_size, self.mlp_multiple_of, style)
        # NeoX's LLaMAParallelMLP has no biases; an explicit use_bias_in_mlp still wins
        mlp_bias = self.use_bias_in_mlp if style != "llama" or "use_bias_in_mlp" in self.sources else False
        return NeoXConfig(
            vocab_size=self.padded_vocab(vocab_size),
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=width,
            norm=self.norm,
            rms_norm_epsilon=self.rms_norm_epsilon,
            use_bias_in_norms=self.use_bias_in_norms,
            activation="silu" if self.activation == "swiglu" else self.activation,
            gated_mlp=style != "regular",
            num_kv_heads=self.num_kv_heads,
            max_position_embeddings=self.max_position_embeddings or self.seq_length,
            rotary_pct=self.rotary_pct,
            rotary_emb_base=self.rotary_emb_base,
            gpt_j_residual=self.gpt_j_residual,
            layernorm_epsilon=self.layernorm_epsilon,
            use_bias_in_attn_linear=self.use_bias_in_attn_linear,
            use_bias_in_mlp=mlp_bias,
            qk_norm=self.qk_norm,
            post_norm=self.post_norm,
            gelu_approximate=self.bias_gelu_fusion,
            tie_embeddings=not self.no_weight_tying,
            init_method=self.init_method,
            output_layer_init_method=self.output_layer_init_method,
            init_std=self.init_method_std,
            checkpoint_activations=self.checkpoint_activations,
        )

    def model_shape(self, vocab_size: int, name: str = "neox") -> ModelShape:
        """The :class:`ModelShape` for the cost model, without building the model."""
        return self.model_config(vocab_size).shape(self.seq_length, name=name)

    def save_iters(self, train_iters: int) -> list[int]:
        """Steps (before the last) after which a checkpoint is saved, as NeoX derives them from
        ``checkpoint_factor`` / ``checkpoint_scale`` and ``extra_save_iters``; the last step is always
        saved when ``save`` is set."""
        factor = self.checkpoint_factor or self.save_interval
        steps = {s for s in self.extra_save_iters or () if 0 < s < train_iters}
        if factor:
            step = factor
            while step < train_iters:
                steps.add(int(step))
                step = step * factor if self.checkpoint_scale == "log" else step + factor
        return sorted(steps)

    def batch_sizes(self, dp_world: int) -> tuple[int, int, int]:
        """``(micro, accumulation, global)`` for ``dp_world`` data-parallel ranks, deriving the one not given
        as NeoX does (``global = micro × accumulation × dp_world``).

        With NeoX's ``pipe_parallel_size`` × ``model_parallel_size`` above 1, NeoX's data-parallel world
        is ``world / (pipe × model)``, so micro × accumulation would give a different global batch here,
        where every rank is a data-parallel rank: that is refused unless ``train_batch_size`` fixes the
        global batch."""
        mp = max(self.pipe_parallel_size, 1) * max(self.model_parallel_size, 1)
        if mp > 1:
            src = self.sources.get("pipe_parallel_size") or self.sources.get("model_parallel_size")
            if self.train_batch_size is None:
                micro, accum = self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps or 1
                neox = f"{micro} x {accum} x {dp_world // mp}" if micro and dp_world % mp == 0 else "fewer"
                raise ConfigError(
                    f"pipe_parallel_size {self.pipe_parallel_size} x model_parallel_size "
                    f"{self.model_parallel_size}: GPT-NeoX would split {dp_world} ranks into {dp_world // mp or 1} "
                    f"data-parallel replicas ({neox} samples per step), but zerotopo shards over data-parallel "
                    "ranks only and every rank takes a micro-batch; set both to 1, and train_batch_size to "
                    "the global batch you want",
                    source=src,
                    key="pipe_parallel_size",
                )
            warnings.warn(
                f"pipe_parallel_size {self.pipe_parallel_size} x model_parallel_size {self.model_parallel_size} "
                "ignored: zerotopo shards over data-parallel ranks only (the global batch is train_batch_size "
                f"= {self.train_batch_size}, as asked)",
                stacklevel=2,
            )
        return derive_batch_sizes(
            self.train_micro_batch_size_per_gpu,
            self.gradient_accumulation_steps,
            self.train_batch_size,
            dp_world,
            source=self.sources.get("train_batch_size") or self.sources.get("train_micro_batch_size_per_gpu"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (YAML/JSON-ready) of every key, for logs and the run directory."""
        out = _plain(dataclasses.asdict(self))
        out.pop("sources")
        # Nested the way the files write them, so the dict loads back as a config.
        optim = out.pop("optimizer")
        options = optim.pop("options")
        for key in ("betas", "eps"):  # written only for the types that take them
            if key not in spec_for(optim["type"]).params:
                optim.pop(key)
        out["optimizer"] = {
            "type": optim.pop("type"),
            "params": {**{k: v for k, v in optim.items() if v is not None}, **options},
        }
        out["bf16"] = {"enabled": out.pop("bf16_enabled")}
        out["data_types"] = {"grad_accum_dtype": out.pop("grad_accum_dtype")}
        out["split"] = ",".join(f"{x:g}" for x in self.split)
        return out


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively, so ``yaml.safe_dump`` and ``json.dumps`` take the result."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def derive_batch_sizes(
    micro: int | None, accum: int | None, global_: int | None, dp_world: int, *, source: str | None = None
) -> tuple[int, int, int]:
    """Fill in the missing one of (micro, accumulation, global) as NeoX does; check consistency."""
    if dp_world < 1:
        raise ConfigError(f"data-parallel world size {dp_world}; expected at least 1", source=source)
    given = f"micro={micro}, accumulation={accum}, global={global_}, data-parallel ranks={dp_world}"
    if global_ is not None:
        if micro is None and accum is None:
            accum = 1
        if micro is None:
            micro, rest = divmod(global_, accum * dp_world)
        elif accum is None:
            accum, rest = divmod(global_, micro * dp_world)
        else:
            rest = global_ - micro * accum * dp_world
        if rest or not micro or not accum:
            raise ConfigError(
                f"batch sizes do not fit: {given}; train_batch_size must equal "
                "train_micro_batch_size_per_gpu × gradient_accumulation_steps × data-parallel ranks "
                "(drop train_batch_size to derive it)",
                source=source,
                key="train_batch_size",
            )
    elif micro is not None:
        accum = accum or 1
    else:
        raise ConfigError(
            f"set train_micro_batch_size_per_gpu (and optionally gradient_accumulation_steps) or "
            f"train_batch_size; got {given}",
            source=source,
            key="train_micro_batch_size_per_gpu",
        )
    return micro, accum, micro * accum * dp_world


def load_neox_config(
    paths: Sequence[str | os.PathLike], overrides: Mapping[str, Any] | None = None
) -> NeoXArgs:
    """Merge NeoX-style YAML files (and ``--set`` overrides) into validated :class:`NeoXArgs`."""
    values, sources = merge_files(paths)
    apply_overrides(values, sources, overrides)
    args, unknown = build_args(values, sources)
    if unknown:
        raise ConfigError(
            "config keys not implemented by zerotopo and not GPT-NeoX keys it accepts: "
            + ", ".join(unknown)
            + "; fix the spelling or drop them (`zerotopo config keys` lists every accepted key)",
            source=next((sources[k] for k in unknown if k in sources), None),
            key=unknown[0].split(" ")[0],
        )
    return args


def _checked(check: c.Check, value: Any, key: str, sources: Mapping[str, str], top: str) -> Any:
    try:
        return check(value)
    except ValueError as exc:
        raise ConfigError(f"{short(value)}: {exc}", source=sources.get(top), key=key) from None


def _block(
    name: str, value: Any, checks: Mapping[str, c.Check], sources: Mapping[str, str], unknown: list[str]
) -> dict[str, Any]:
    """Check the keys of a nested block; unknown ones are collected as ``block.key``."""
    top = name.split(".")[0]
    block = _checked(c.mapping, value, name, sources, top)
    out = {}
    for key, raw in block.items():
        if key in checks:
            out[key] = _checked(checks[key], raw, f"{name}.{key}", sources, top)
        else:
            unknown.append(f"{name}.{key}")
    return out


def _optimizer(value: Any, sources: Mapping[str, str], unknown: list[str]) -> OptimizerArgs:
    """The ``optimizer`` block: the type from the table, each parameter checked against what it takes."""
    block = _block("optimizer", value, {"type": _optimizer_type, "params": c.mapping}, sources, unknown)
    kind = block.get("type", "AdamW")
    raw = _checked(c.mapping, block.get("params", {}), "optimizer.params", sources, "optimizer")
    try:
        params = check_hyperparameters(spec_for(kind), raw)
    except HyperparameterError as exc:
        where = f"optimizer.params.{exc.key}"
        shown = f"{short(raw[exc.key])}: " if exc.key in raw else ""
        raise ConfigError(f"{shown}{exc}", source=sources.get("optimizer"), key=where) from None
    fields = {f.name for f in dataclasses.fields(OptimizerArgs)} - {"type", "options"}
    options = {k: v for k, v in params.items() if k not in fields}
    return OptimizerArgs(type=kind, options=options, **{k: v for k, v in params.items() if k in fields})


def _optimizer_type(value: Any) -> str:
    """An optimizer type of the table, spelled as the table spells it (``Adam`` stays ``Adam``)."""
    if not isinstance(value, str):
        raise ValueError(f"expected one of {supported()}")
    return canonical(value)


def build_args(values: Mapping[str, Any], sources: Mapping[str, str]) -> tuple[NeoXArgs, list[str]]:
    """Validate merged config values; returns the args and the unknown keys (sorted)."""
    unknown: list[str] = []
    kwargs: dict[str, Any] = {"sources": dict(sources)}
    fields = {f.name: f for f in dataclasses.fields(NeoXArgs) if "check" in f.metadata}
    for key, value in values.items():
        if key in fields:
            kwargs[key] = _checked(fields[key].metadata["check"], value, key, sources, key)
        elif key == "optimizer":
            kwargs["optimizer"] = _optimizer(value, sources, unknown)
        elif key == "fp16":
            block = _block("fp16", value, _FP16_CHECKS, sources, unknown)
            block.pop("type", None)
            block.pop("auto_cast", None)
            enabled = block.pop("fp16", None)
            block.setdefault("enabled", enabled if enabled is not None else True)
            kwargs["fp16"] = FP16Args(**block)
        elif key == "bf16":
            block = _block("bf16", value, {"enabled": c.boolean, "bf16": c.boolean}, sources, unknown)
            kwargs["bf16_enabled"] = block.get("enabled", block.get("bf16", True))
        elif key == "data_types":
            check = fields["grad_accum_dtype"].metadata["check"]
            block = _block("data_types", value, {"grad_accum_dtype": check}, sources, unknown)
            if "grad_accum_dtype" in block:
                kwargs["grad_accum_dtype"] = block["grad_accum_dtype"]
        elif key in ("attention_config", "sparsity_config"):
            _unsupported(key, value, values, sources)
        elif key == "fp32_allreduce":
            if _checked(c.boolean, value, key, sources, key):
                kwargs["fp32_allreduce"] = True
        elif key in ("sliding_window_width", "deepspeed_extra_args"):
            _checked_extra(key, value, values, sources)
        elif key in REFUSED_UNLESS_DEFAULT:
            why = refused_value(key, value)
            if why:
                raise ConfigError(why, source=sources.get(key), key=key)
        elif key not in NO_EFFECT_KEYS:
            unknown.append(_with_suggestion(str(key), fields))
    if kwargs.get("zero_optimization") is not None:
        unknown += _zero_optimization(kwargs["zero_optimization"], sources)
    if kwargs.pop("fp32_allreduce", False) and kwargs.setdefault("grad_accum_dtype", "fp32") != "fp32":
        raise ConfigError(
            f"fp32_allreduce: true asks for fp32 gradient reduction but data_types.grad_accum_dtype is "
            f"{kwargs['grad_accum_dtype']}; drop one of them",
            source=sources.get("fp32_allreduce"),
            key="fp32_allreduce",
        )
    args = NeoXArgs(**kwargs)
    _cross_check(args)
    return args, sorted(unknown)


def _with_suggestion(key: str, fields) -> str:
    """``key`` with the accepted key it most likely misspells, if any."""
    import difflib

    known = sorted(
        set(fields) | set(NO_EFFECT_KEYS) | set(REFUSED_UNLESS_DEFAULT) | {"optimizer", "fp16", "bf16"}
    )
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
        seq = values.get("seq_length", NeoXArgs.seq_length)
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


def _cross_check(a: NeoXArgs) -> None:
    """Checks that involve several keys; the error names the file of the first key."""
    src = a.sources.get
    if a.hidden_size % a.num_attention_heads:
        raise ConfigError(
            f"hidden_size {a.hidden_size} is not a multiple of num_attention_heads {a.num_attention_heads}; "
            "pick a head count that divides the width",
            source=src("hidden_size") or src("num_attention_heads"),
            key="hidden_size",
        )
    _check_architecture(a)
    acc, prec = a.grad_accum_dtype, a.resolved_precision
    if acc is not None and acc not in ("fp32", prec):
        raise ConfigError(
            f"{acc} gradients with {prec} parameters: gradients are kept in the parameter dtype or in fp32 "
            f"(DeepSpeed rejects this mix too); set grad_accum_dtype to {prec} or fp32",
            source=src("grad_accum_dtype") or src("data_types"),
            key="data_types.grad_accum_dtype",
        )
    head_dim = a.hidden_size // a.num_attention_heads
    if int(head_dim * a.rotary_pct) % 2:
        raise ConfigError(
            f"{a.rotary_pct} rotates {int(head_dim * a.rotary_pct)} of {head_dim} head dims; rotary needs an "
            "even count, pick a rotary_pct that gives one",
            source=src("rotary_pct"),
            key="rotary_pct",
        )
    if a.max_position_embeddings is not None and a.max_position_embeddings < a.seq_length:
        raise ConfigError(
            f"{a.max_position_embeddings} is below seq_length {a.seq_length}; raise it to at least seq_length",
            source=src("max_position_embeddings"),
            key="max_position_embeddings",
        )
    blocks = {p for p, on in (("fp16", a.fp16.enabled), ("bf16", a.bf16_enabled)) if on}
    if len(blocks) > 1 or (a.precision and blocks and blocks != {a.precision}):
        raise ConfigError(
            f"precision {a.precision!r} conflicts with enabled blocks {sorted(blocks)}; enable one of fp16/bf16 "
            "or set precision alone",
            source=src("precision") or src("fp16") or src("bf16"),
            key="precision",
        )
    if a.save_interval and a.checkpoint_factor and a.save_interval != a.checkpoint_factor:
        raise ConfigError(
            f"save_interval {a.save_interval} and checkpoint_factor {a.checkpoint_factor} disagree; they are "
            "the same setting (NeoX renamed it), keep checkpoint_factor",
            source=src("save_interval"),
            key="save_interval",
        )
    if a.checkpoint_scale == "log" and a.checkpoint_factor is not None and a.checkpoint_factor <= 1:
        raise ConfigError(
            f"checkpoint_factor {a.checkpoint_factor} with checkpoint_scale log never grows; use a factor above 1",
            source=src("checkpoint_factor"),
            key="checkpoint_factor",
        )
    _check_data_keys(a)
    if a.min_lr > a.lr:
        raise ConfigError(
            f"{a.min_lr} is above the peak learning rate {a.lr}; expected min_lr <= optimizer.params.lr",
            source=src("min_lr"),
            key="min_lr",
        )


def _check_architecture(a: NeoXArgs) -> None:
    """Architecture keys whose combination zerotopo cannot honour, refused naming the key and its values."""
    src = a.sources.get
    if a.num_kv_heads is not None and a.num_attention_heads % a.num_kv_heads:
        raise ConfigError(
            f"{a.num_kv_heads} does not divide num_attention_heads {a.num_attention_heads}; num_kv_heads takes a "
            "divisor of the head count (1: multi-query attention, num_attention_heads: multi-head)",
            source=src("num_kv_heads"),
            key="num_kv_heads",
        )
    if a.mlp_type == "llama" and a.activation == "swiglu":
        raise ConfigError(
            "activation swiglu with mlp_type llama would gate twice; with mlp_type llama set activation to silu "
            "(SwiGLU) or gelu, or keep activation swiglu with mlp_type regular (NeoX's newer form)",
            source=src("activation") or src("mlp_type"),
            key="activation",
        )
    if a.bias_gelu_fusion and a.activation != "gelu":
        raise ConfigError(
            f"true selects the tanh-approximate GELU, but activation is {a.activation}; bias_gelu_fusion takes "
            "true only with activation gelu (false with silu or swiglu)",
            source=src("bias_gelu_fusion"),
            key="bias_gelu_fusion",
        )


def _check_data_keys(a: NeoXArgs) -> None:
    """NeoX's two ways to name data are exclusive, and each weights list matches its paths."""
    src = a.sources.get
    if a.data_path and a.train_data_paths:
        raise ConfigError(
            "data_path and train_data_paths are both set; NeoX reads one of them: keep data_path (split by "
            "split) or train/valid/test_data_paths (blended by their weights)",
            source=src("train_data_paths") or src("data_path"),
            key="train_data_paths",
        )
    for kind in ("train", "valid", "test"):
        paths, weights = getattr(a, f"{kind}_data_paths"), getattr(a, f"{kind}_data_weights")
        if weights is not None and (paths is None or len(weights) != len(paths)):
            raise ConfigError(
                f"{len(weights)} weights for {len(paths or ())} {kind}_data_paths; give one weight per path",
                source=src(f"{kind}_data_weights"),
                key=f"{kind}_data_weights",
            )
        if paths and kind != "train" and not a.train_data_paths:
            raise ConfigError(
                f"{kind}_data_paths without train_data_paths; set train_data_paths too (or use data_path "
                "with split)",
                source=src(f"{kind}_data_paths"),
                key="train_data_paths",
            )
