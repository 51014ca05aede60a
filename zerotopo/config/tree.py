"""The training config as a tree of frozen dataclasses: :class:`TrainConfig` and its sections (defined in
:mod:`~zerotopo.config.model_section`, :mod:`~zerotopo.config.training_sections` and
:mod:`~zerotopo.config.run_sections`).

Every field carries its docstring right under it (docs/configs.md is generated from them) and, in its
metadata, the check of its value (:mod:`zerotopo.config.checks`). A section's ``check()`` holds the rules
between its own fields; :func:`zerotopo.config.validate.validate` runs the field checks and each section's
``check()``, and is the one way a config is validated, whether it was read
from GPT-NeoX YAML files (:mod:`zerotopo.config.neox`, which knows the NeoX key names) or built in code.

Each section records in ``origin`` the key that names each field in the files read and the file (or
``--set``) that set it, so an error names the user's key and file; a config built in code has none, and its
errors name the field's path in the tree (``model.hidden_size``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from zerotopo.config import checks as c
from zerotopo.config.model_section import ModelConfig
from zerotopo.config.run_sections import (
    CheckpointConfig,
    DataConfig,
    EvalConfig,
    LoggingConfig,
    ShardingConfig,
)
from zerotopo.config.section import Section, block, setting
from zerotopo.config.training_sections import (
    BatchConfig,
    FP16Config,
    OptimConfig,
    OptimizerConfig,
    PrecisionConfig,
    derive_batch_sizes,
)

__all__ = [
    "SECTIONS",
    "BatchConfig",
    "CheckpointConfig",
    "DataConfig",
    "EvalConfig",
    "FP16Config",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "OptimizerConfig",
    "PrecisionConfig",
    "Section",
    "ShardingConfig",
    "TrainConfig",
    "derive_batch_sizes",
    "field_at",
]

# --- the root -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainConfig(Section):
    """Everything a training run is configured by: one section per concern, and the run's length and
    seed. Validate one built in code with :func:`zerotopo.config.validate.validate`."""

    NAME: ClassVar[str] = ""

    model: ModelConfig = block(ModelConfig)
    """The model's shape, architecture switches and initialization."""
    batch: BatchConfig = block(BatchConfig)
    """Samples per micro-batch, per step and over the job."""
    optim: OptimConfig = block(OptimConfig)
    """The optimizer, weight decay, gradient clipping and the learning-rate schedule."""
    precision: PrecisionConfig = block(PrecisionConfig)
    """The parameters' and gradients' dtypes."""
    data: DataConfig = block(DataConfig)
    """The training, validation and test data and the tokenizer."""
    evaluation: EvalConfig = block(EvalConfig)
    """Evaluation on the validation data during training."""
    checkpoint: CheckpointConfig = block(CheckpointConfig)
    """Where checkpoints are saved and loaded, and when."""
    logging: LoggingConfig = block(LoggingConfig)
    """Log lines and the metric backends."""
    sharding: ShardingConfig = block(ShardingConfig)
    """The machine and the sharding plan."""
    train_iters: int | None = setting(c.optional(c.integer(1, 10**9)))
    """Optimizer steps to train."""
    seed: int = setting(c.integer(0, 2**32 - 1), 1234)
    """Seed of the model init and of the data shuffle."""

    def where(self, name: str) -> dict[str, str | None]:
        """As :meth:`Section.where`, for the root's own fields (named by their bare name)."""
        key, source = self.origin.get(name, (None, None))
        return {"source": source, "key": key or name}

    @property
    def sources(self) -> dict[str, str]:
        """``{top-level key as written: file}`` of every key a file or ``--set`` gave (for messages)."""
        out: dict[str, str] = {}
        for part in (self, *(getattr(self, name) for name in SECTIONS)):
            for key, source in part.origin.values():
                if source is not None:
                    out.setdefault(key.split(".")[0], source)
        return out

    @property
    def decay_iters(self) -> int | None:
        """Steps of the learning-rate decay: ``optim.lr_decay_iters``, else ``train_iters``."""
        return self.optim.lr_decay_iters or self.train_iters


#: The root's sections by name, in the order they are validated and documented.
SECTIONS: dict[str, type[Section]] = {
    "model": ModelConfig,
    "batch": BatchConfig,
    "optim": OptimConfig,
    "precision": PrecisionConfig,
    "data": DataConfig,
    "evaluation": EvalConfig,
    "checkpoint": CheckpointConfig,
    "logging": LoggingConfig,
    "sharding": ShardingConfig,
}


def field_at(path: str) -> Any:
    """The :class:`dataclasses.Field` at ``path`` in the tree: ``model.num_layers``, ``seed`` (a root field)."""
    section, _, name = path.rpartition(".")
    cls = SECTIONS[section] if section else TrainConfig
    return next(f for f in dataclasses.fields(cls) if f.name == name)
