"""The ``data``, ``evaluation``, ``checkpoint``, ``logging`` and ``sharding`` sections of the config
tree: what a run reads, saves, logs and runs on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zerotopo.config import checks as c
from zerotopo.config.section import Section, setting
from zerotopo.data.tokenizers import TOKENIZER_TYPES
from zerotopo.errors import ConfigError

# --- data -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataConfig(Section):
    """The training, validation and test data and the tokenizer."""

    NAME: ClassVar[str] = "data"

    data_path: tuple[str, ...] | None = setting(c.optional(c.str_or_list))
    """Prefix (or list of prefixes) of mmap indexed datasets, without ``.bin``/``.idx``; the bundled
    corpus when not set."""
    split: tuple[float, float, float] = setting(c.split, (969 / 1000, 30 / 1000, 1 / 1000))
    """Train/valid/test weights over documents, e.g. ``"969,30,1"`` (NeoX's default)."""
    train_data_paths: tuple[str, ...] | None = setting(c.optional(c.str_or_list))
    """Training dataset prefixes, each read whole and blended by ``train_data_weights`` as NeoX's
    BlendableDataset does (instead of ``data_path`` and ``split``)."""
    train_data_weights: tuple[float, ...] | None = setting(c.optional(c.weights))
    """Blend weights of ``train_data_paths`` (normalized; equal when not set)."""
    valid_data_paths: tuple[str, ...] | None = setting(c.optional(c.str_or_list))
    """Validation dataset prefixes (with ``train_data_paths``); no evaluation when not set."""
    valid_data_weights: tuple[float, ...] | None = setting(c.optional(c.weights))
    """Blend weights of ``valid_data_paths``."""
    test_data_paths: tuple[str, ...] | None = setting(c.optional(c.str_or_list))
    """Test dataset prefixes (with ``train_data_paths``); checked to exist, as NeoX builds them."""
    test_data_weights: tuple[float, ...] | None = setting(c.optional(c.weights))
    """Blend weights of ``test_data_paths``."""
    eod_mask_loss: bool = setting(c.boolean, False)
    """No loss on the positions whose input is the end-of-document token (NeoX's loss mask)."""
    tokenizer_type: str = setting(
        c.choice(*TOKENIZER_TYPES, aliases={"ByteLevel": "ByteTokenizer"}),
        "GPT2BPETokenizer",
    )
    """GPT2BPETokenizer (NeoX's default: ``vocab_file`` vocab.json + ``merge_file`` merges.txt),
    HFTokenizer (a tokenizers JSON file in ``vocab_file``), SPMTokenizer (a SentencePiece ``tokenizer.model``
    in ``vocab_file``), TiktokenTokenizer (a tiktoken encoding name in ``vocab_file``, when tiktoken has it
    offline), CharLevelTokenizer (NeoX's: Unicode code points) or ByteTokenizer (UTF-8 bytes; needs no
    file, what the bundled corpus uses)."""
    vocab_file: str | None = setting(c.optional(c.text))
    """The tokenizer JSON file (HFTokenizer) or GPT-2 ``vocab.json`` (GPT2BPETokenizer)."""
    merge_file: str | None = setting(c.optional(c.text))
    """GPT-2 ``merges.txt`` (GPT2BPETokenizer)."""
    eod_token: str | None = setting(c.optional(c.text))
    """zerotopo: the end-of-document token's name for HFTokenizer, SPMTokenizer or TiktokenTokenizer (e.g.
    Llama 3's ``<|end_of_text|>``); when not set, the first of ``<|endoftext|>``, ``<|end_of_text|>``,
    ``</s>``, ``<eos>``, ``[SEP]`` the vocabulary has (SPMTokenizer: else the model's end-of-sentence piece)."""

    def check(self) -> None:
        """NeoX's two ways to name data are exclusive, and each weights list matches its paths."""
        if self.data_path and self.train_data_paths:
            source = self.where("train_data_paths")["source"] or self.where("data_path")["source"]
            raise ConfigError(
                "data_path and train_data_paths are both set; NeoX reads one of them: keep data_path (split by "
                "split) or train/valid/test_data_paths (blended by their weights)",
                source=source,
                key=self.where("train_data_paths")["key"],
            )
        for kind in ("train", "valid", "test"):
            paths, weights = getattr(self, f"{kind}_data_paths"), getattr(self, f"{kind}_data_weights")
            if weights is not None and (paths is None or len(weights) != len(paths)):
                raise ConfigError(
                    f"{len(weights)} weights for {len(paths or ())} {kind}_data_paths; give one weight per path",
                    **self.where(f"{kind}_data_weights"),
                )
            if paths and kind != "train" and not self.train_data_paths:
                raise ConfigError(
                    f"{kind}_data_paths without train_data_paths; set train_data_paths too (or use data_path "
                    "with split)",
                    source=self.where(f"{kind}_data_paths")["source"],
                    key=self.where("train_data_paths")["key"],
                )


# --- evaluation, checkpoints, logging -------------------------------------------------------------------


@dataclass(frozen=True)
class EvalConfig(Section):
    """Evaluation on the validation data during training."""

    NAME: ClassVar[str] = "evaluation"

    interval: int = setting(c.integer(1, 10**9), 1000)
    """Steps between evaluations on the validation split."""
    iters: int = setting(c.integer(0, 10**9), 100)
    """Validation micro-batches per evaluation."""


@dataclass(frozen=True)
class CheckpointConfig(Section):
    """Where checkpoints are saved and loaded, and when."""

    NAME: ClassVar[str] = "checkpoint"

    save: str | None = setting(c.optional(c.text))
    """Directory to save checkpoints to."""
    finetune: bool = setting(c.boolean, False)
    """Start from the weights in ``load`` only: a fresh optimizer, step counter and data position (a
    zerotopo checkpoint, or a GPT-NeoX ``global_stepN`` directory, which always loads this way)."""
    load: str | None = setting(c.optional(c.text))
    """Directory to resume from (a ``save:`` directory or one ``step_<N>`` in it, any plan or world size), or
    a Hugging Face GPT-NeoX directory to start from. One that does not exist or holds no checkpoint is an
    error unless ``fresh_start`` is set or it equals ``save`` (NeoX's first run: a notice, step 0)."""
    save_interval: int | None = setting(c.optional(c.integer(1, 10**9)))
    """Steps between checkpoints (the older name of ``checkpoint_factor``)."""
    checkpoint_factor: float | None = setting(c.optional(c.number(1.0)))
    """NeoX's save interval: a checkpoint every ``checkpoint_factor`` steps (``checkpoint_scale:
    linear``) or at its powers (``log``); the last step is always saved."""
    checkpoint_scale: str = setting(c.choice("linear", "log"), "linear")
    """How ``checkpoint_factor`` spaces the checkpoints."""
    extra_save_iters: tuple[int, ...] | None = setting(c.optional(c.int_list))
    """Further steps to save a checkpoint at."""
    keep_last_n_checkpoints: int | None = setting(c.optional(c.integer(1, 10**6)))
    """Delete older checkpoints of ``save`` after each save, keeping this many."""
    strict_saves: bool = setting(c.boolean, False)
    """A checkpoint save that fails (disk full, no permission) stops the run. By default it warns, keeps
    the previous checkpoint and training goes on; a failed last save always stops with an error."""
    async_save: bool = setting(c.boolean, False)
    """Write checkpoints in the background: the step copies its shards (to host memory) and training goes
    on while a writer thread persists them; at most one save is in flight. The host memory a save holds
    is printed and checked before the first save."""
    fresh_start: bool = setting(c.boolean, False)
    """Start from step 0 when ``load:`` does not exist or holds no checkpoint. Without it that is an
    error, except NeoX's first run, where ``load`` equals ``save`` (a notice)."""

    def check(self) -> None:
        """The two names of the save interval agree, and a log scale grows."""
        if self.save_interval and self.checkpoint_factor and self.save_interval != self.checkpoint_factor:
            raise ConfigError(
                f"save_interval {self.save_interval} and checkpoint_factor {self.checkpoint_factor} disagree; "
                "they are the same setting (NeoX renamed it), keep checkpoint_factor",
                **self.where("save_interval"),
            )
        if (
            self.checkpoint_scale == "log"
            and self.checkpoint_factor is not None
            and self.checkpoint_factor <= 1
        ):
            raise ConfigError(
                f"checkpoint_factor {self.checkpoint_factor} with checkpoint_scale log never grows; use a factor "
                "above 1",
                **self.where("checkpoint_factor"),
            )

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


@dataclass(frozen=True)
class LoggingConfig(Section):
    """Log lines and the metric backends."""

    NAME: ClassVar[str] = "logging"

    log_interval: int = setting(c.integer(1, 10**9), 100)
    """Steps between log lines."""
    log_dir: str | None = setting(c.optional(c.text))
    """A directory for a copy of the run's text log (``<run name>.log``); the run directory always has
    ``train.log``."""
    tensorboard_dir: str | None = setting(c.optional(c.text))
    """TensorBoard event files go here (needs the ``tensorboard`` package; else one warning)."""
    use_wandb: bool | None = setting(c.optional(c.boolean))
    """Log metrics to Weights & Biases (needs the ``wandb`` package; else one warning)."""
    wandb_project: str = setting(c.text, "neox")
    """W&B project."""
    wandb_group: str | None = setting(c.optional(c.text))
    """W&B group of runs."""
    wandb_team: str | None = setting(c.optional(c.text))
    """W&B team (entity)."""
    wandb_host: str | None = setting(c.optional(c.text))
    """W&B server URL (the default is wandb's own)."""


# --- sharding -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardingConfig(Section):
    """The machine and the sharding plan."""

    NAME: ClassVar[str] = "sharding"

    zero_optimization: dict[str, Any] | None = setting(c.optional(c.mapping))
    """DeepSpeed's ``zero_optimization`` block, kept as written; the plan module maps it to a plan."""
    topology: str | None = setting(c.optional(c.text))
    """zerotopo: topology name or YAML file (``frontier``, ``emulated``, ...)."""
    plan: str | dict[str, Any] | None = setting(c.optional(c.plan))
    """zerotopo: plan preset name (``zerotopo``, ``zero3``, ...) or a mapping of degrees."""
    num_nodes: int | None = setting(c.optional(c.integer(-1)))
    """Nodes of the job (``--nodes`` and the launcher's count win); -1 or unset: the topology file's."""
