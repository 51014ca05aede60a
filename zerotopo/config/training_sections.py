"""The ``batch``, ``optim`` and ``precision`` sections of the config tree: how each step is batched,
optimized and computed."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

from zerotopo.config import checks as c
from zerotopo.config.optimizers import spec_for
from zerotopo.config.section import DTYPE_ALIASES, Section, block, setting
from zerotopo.errors import ConfigError

# --- batch ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchConfig(Section):
    """Samples per micro-batch, per step and over the job."""

    NAME: ClassVar[str] = "batch"

    micro_batch_size: int | None = setting(c.optional(c.integer(1, 1 << 20)))
    """Samples per rank per micro-batch."""
    gradient_accumulation_steps: int | None = setting(c.optional(c.integer(1, 1 << 20)))
    """Micro-batches per optimizer step."""
    global_batch_size: int | None = setting(c.optional(c.integer(1, 1 << 30)))
    """Samples per optimizer step over all ranks: micro × accumulation × data-parallel ranks."""
    pipe_parallel_size: int = setting(c.integer(0), 0)
    """NeoX's pipeline stages (0 and 1: no pipeline); zerotopo is data-parallel only (see :meth:`batch_sizes`)."""
    model_parallel_size: int = setting(c.integer(0), 1)
    """NeoX's tensor-parallel degree; zerotopo is data-parallel only (see :meth:`batch_sizes`)."""

    def batch_sizes(self, dp_world: int) -> tuple[int, int, int]:
        """``(micro, accumulation, global)`` for ``dp_world`` data-parallel ranks, deriving the one not given
        as NeoX does (``global = micro × accumulation × dp_world``).

        With NeoX's ``pipe_parallel_size`` × ``model_parallel_size`` above 1, NeoX's data-parallel world
        is ``world / (pipe × model)``, so micro × accumulation would give a different global batch here,
        where every rank is a data-parallel rank: that is refused unless the global batch is fixed."""
        mp = max(self.pipe_parallel_size, 1) * max(self.model_parallel_size, 1)
        if mp > 1:
            if self.global_batch_size is None:
                micro, accum = self.micro_batch_size, self.gradient_accumulation_steps or 1
                neox = f"{micro} x {accum} x {dp_world // mp}" if micro and dp_world % mp == 0 else "fewer"
                where = self.where("pipe_parallel_size")
                source = where["source"] or self.where("model_parallel_size")["source"]
                raise ConfigError(
                    f"pipe_parallel_size {self.pipe_parallel_size} x model_parallel_size "
                    f"{self.model_parallel_size}: GPT-NeoX would split {dp_world} ranks into {dp_world // mp or 1} "
                    f"data-parallel replicas ({neox} samples per step), but zerotopo shards over data-parallel "
                    "ranks only and every rank takes a micro-batch; set both to 1, and train_batch_size to "
                    "the global batch you want",
                    source=source,
                    key=where["key"],
                )
            warnings.warn(
                f"pipe_parallel_size {self.pipe_parallel_size} x model_parallel_size {self.model_parallel_size} "
                "ignored: zerotopo shards over data-parallel ranks only (the global batch is train_batch_size "
                f"= {self.global_batch_size}, as asked)",
                stacklevel=2,
            )
        source = self.where("global_batch_size")["source"] or self.where("micro_batch_size")["source"]
        return derive_batch_sizes(
            self.micro_batch_size,
            self.gradient_accumulation_steps,
            self.global_batch_size,
            dp_world,
            source=source,
        )


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


# --- optimizer and learning-rate schedule ---------------------------------------------------------------


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer: its type and hyperparameters; the types and what each takes are the table in
    :mod:`zerotopo.config.optimizers`."""

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
class OptimConfig(Section):
    """The optimizer, weight decay, gradient clipping and the learning-rate schedule."""

    NAME: ClassVar[str] = "optim"

    optimizer: OptimizerConfig = block(OptimizerConfig)
    """The optimizer's type and hyperparameters."""
    weight_decay: float = setting(c.number(0.0, 10.0), 0.1)
    """Weight decay, decoupled for AdamW and Adam (the optimizer block's ``weight_decay`` wins when given)."""
    gradient_clipping: float = setting(c.number(0.0), 1.0)
    """Clip the global gradient norm to this; 0 disables clipping."""
    lr_decay_style: str = setting(c.choice("constant", "linear", "cosine"), "linear")
    """Learning-rate decay after warmup."""
    lr_decay_iters: int | None = setting(c.optional(c.integer(1, 10**9)))
    """Steps over which the learning rate decays to ``min_lr``; ``train_iters`` when not set."""
    warmup: float = setting(c.number(0.0, 1.0), 0.01)
    """Fraction of ``lr_decay_iters`` spent warming up linearly from 0."""
    min_lr: float = setting(c.number(0.0), 0.0)
    """Learning rate at the end of decay."""
    override_lr_scheduler: bool | None = setting(c.optional(c.boolean))
    """GPT-NeoX's switch between the config's schedule and the checkpoint's on a resume. zerotopo's schedule
    always follows the config's keys (what ``true`` asks for). ``false`` (NeoX's default) on a resume checks
    that the schedule keys (``lr``, ``min_lr``, ``warmup``, ``lr_decay_iters`` (``train_iters`` when not
    set), ``lr_decay_style``, ``scheduler``) are those the checkpoint was trained with, and refuses the run, naming
    each that differs, where they are not, as NeoX does. Not set: the schedule follows the config, and a
    resume whose schedule keys differ from the checkpoint's says which (zerotopo's behaviour before it read
    this key, kept so that a run resumed with more ``train_iters`` continues)."""
    scheduler: dict[str, Any] | None = setting(c.optional(c.mapping))
    """DeepSpeed's ``scheduler`` block (``WarmupLR`` or ``WarmupDecayLR`` with their ``params``); when
    given it sets the learning rate instead of ``lr_decay_style``/``warmup``/``min_lr``, as in DeepSpeed."""

    @property
    def lr(self) -> float:
        """The peak learning rate."""
        return self.optimizer.lr

    @property
    def effective_weight_decay(self) -> float:
        """The optimizer's own weight decay when it has one, else this section's."""
        wd = self.optimizer.weight_decay
        return self.weight_decay if wd is None else wd

    def check(self) -> None:
        """The schedule ends at or below its peak."""
        if self.min_lr > self.lr:
            raise ConfigError(
                f"{self.min_lr} is above the peak learning rate {self.lr}; expected min_lr <= optimizer.params.lr",
                **self.where("min_lr"),
            )


# --- precision ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FP16Config:
    """fp16 training with dynamic loss scaling (DeepSpeed's)."""

    enabled: bool = setting(c.boolean, False)
    """Train in fp16 with an fp32 master copy."""
    loss_scale: float = setting(c.number(0.0), 0.0)
    """0 for dynamic loss scaling, else a fixed scale."""
    initial_scale_power: int = setting(c.integer(0, 63), 16)
    """Dynamic scaling starts at ``2**initial_scale_power``."""
    loss_scale_window: int = setting(c.integer(1), 1000)
    """Steps without overflow before the scale doubles."""
    hysteresis: int = setting(c.integer(1), 2)
    """Overflows tolerated before the scale halves."""
    min_loss_scale: float = setting(c.number(0.0, lo_open=True), 1.0)
    """The scale never drops below this."""

    def scaler_options(self) -> dict[str, float | int]:
        """The block as :class:`zerotopo.engine.optim.LossScaler` keywords (dynamic scaling)."""
        return {
            "init_scale": 2.0**self.initial_scale_power,
            "growth_interval": self.loss_scale_window,
            "hysteresis": self.hysteresis,
            "min_scale": self.min_loss_scale,
        }


@dataclass(frozen=True)
class PrecisionConfig(Section):
    """The parameters' and gradients' dtypes."""

    NAME: ClassVar[str] = "precision"

    dtype: str | None = setting(c.optional(c.choice("fp32", "fp16", "bf16", aliases=DTYPE_ALIASES)))
    """fp32 | fp16 | bf16; when not set, taken from ``fp16`` / ``bf16`` (fp32 if neither)."""
    fp16: FP16Config = block(FP16Config)
    """fp16 training and its loss scaling."""
    bf16: bool = setting(c.boolean, False)
    """Train in bf16 (when ``dtype`` is not set)."""
    grad_accum_dtype: str | None = setting(
        c.optional(c.choice("fp32", "fp16", "bf16", aliases=DTYPE_ALIASES))
    )
    """The gradients' dtype (reduction and accumulated shard), as DeepSpeed's ``data_types:
    {grad_accum_dtype: ...}``. DeepSpeed's default is the model dtype, and so is zerotopo's (plan
    ``grad_dtype: param``); ``fp32`` keeps fp32 gradients (plan ``grad_dtype: fp32``). A plan's own
    ``grad_dtype`` wins."""

    @property
    def resolved(self) -> str:
        """fp32, fp16 or bf16 after combining ``dtype`` with ``fp16`` / ``bf16``."""
        if self.dtype:
            return self.dtype
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16 else "fp32"

    @property
    def grad_dtype(self) -> str:
        """The plan ``grad_dtype`` a DeepSpeed user of this config gets: ``param`` unless
        ``grad_accum_dtype`` asks for fp32 under fp16/bf16 training."""
        if self.grad_accum_dtype == "fp32" and self.resolved != "fp32":
            return "fp32"
        return "param"

    def check(self) -> None:
        """One precision, and gradients in the parameters' dtype or fp32."""
        acc, prec = self.grad_accum_dtype, self.resolved
        if acc is not None and acc not in ("fp32", prec):
            raise ConfigError(
                f"{acc} gradients with {prec} parameters: gradients are kept in the parameter dtype or in fp32 "
                f"(DeepSpeed rejects this mix too); set grad_accum_dtype to {prec} or fp32",
                **self.where("grad_accum_dtype"),
            )
        blocks = {p for p, on in (("fp16", self.fp16.enabled), ("bf16", self.bf16)) if on}
        if len(blocks) > 1 or (self.dtype and blocks and blocks != {self.dtype}):
            source = next(
                (self.where(n)["source"] for n in ("dtype", "fp16", "bf16") if self.is_given(n)), None
            )
            raise ConfigError(
                f"precision {self.dtype!r} conflicts with enabled blocks {sorted(blocks)}; enable one of "
                "fp16/bf16 or set precision alone",
                source=source,
                key=self.where("dtype")["key"],
            )
