"""Run-directory outputs: metrics CSV (and TensorBoard when installed), summary and PNG plots.

Only rank 0 writes. ``metrics.csv`` has one row per optimizer step (``kind=train``) and one per
evaluation (``kind=valid``); columns are fixed when the file is opened, so a run's CSV is rectangular.
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zerotopo.fsutil import write_text_atomic

BASE_COLUMNS = (
    "kind",
    "step",
    "loss",
    "perplexity",
    "lr",
    "grad_norm",
    "skipped",
    "loss_scale",
    "step_time_s",
    "tokens_per_s",
    "tflops_per_device",
    "mfu",
    "peak_memory_bytes",
)


class MetricsWriter:
    """Append-only metrics for one run: CSV always, TensorBoard if ``torch.utils.tensorboard`` imports.

    ``resume_step``: the run continues from a checkpoint of that step, so an existing ``metrics.csv``
    is kept up to that step (rows after it belong to the interrupted attempt, which is being redone)
    and new rows are appended. Without it a new run starts a new file."""

    def __init__(
        self,
        run_dir: Path,
        tier_names: Sequence[str],
        *,
        tensorboard: bool = True,
        tensorboard_dir: Path | str | None = None,
        resume_step: int | None = None,
        wandb_run: Any = None,
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tier_columns = [f"bytes_{t}" for t in tier_names]
        self.columns = list(BASE_COLUMNS) + self.tier_columns
        self.path = self.run_dir / "metrics.csv"
        kept: list[dict[str, str]] = []
        if resume_step is not None and self.path.exists():
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                old_columns = list(reader.fieldnames or [])
                kept = [r for r in reader if _step(r) is not None and _step(r) <= resume_step]
            self.columns = old_columns + [c for c in self.columns if c not in old_columns]
        self._file = self.path.open("w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._csv.writeheader()
        self._csv.writerows(kept)
        self._file.flush()
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

                self._tb = SummaryWriter(log_dir=str(tensorboard_dir or self.run_dir / "tensorboard"))
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                self._tb = None
                if tensorboard_dir is not None:
                    warnings.warn(
                        f"tensorboard_dir {tensorboard_dir} is set but TensorBoard is not installed "
                        "(pip install tensorboard); metrics go to metrics.csv only",
                        stacklevel=2,
                    )

        self._wandb = wandb_run

    def write(self, row: Mapping[str, Any]) -> None:
        self._csv.writerow({k: _fmt(v) for k, v in row.items()})
        self._file.flush()
        if self._wandb is None and self._tb is None:
            return
        kind = row.get("kind", "train")
        numbers = {
            f"{kind}/{k}": v
            for k, v in row.items()
            if k not in ("kind", "step") and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self._wandb is not None:
            self._wandb.log(numbers, step=int(row["step"]))
        if self._tb is not None:
            for tag, v in numbers.items():
                self._tb.add_scalar(tag, v, int(row["step"]))

    def sync(self) -> None:
        """Every row written so far on disk (flushed and fsynced): called before each checkpoint, so a
        crash after it loses no row of the steps it holds."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def open_wandb(
    *,
    project: str,
    group: str | None,
    team: str | None,
    host: str | None,
    name: str,
    run_dir: Path,
    config: dict,
) -> Any:
    """A Weights & Biases run for NeoX's ``use_wandb`` keys, or None (one warning) without ``wandb``."""
    try:
        import wandb
    except ImportError:
        warnings.warn(
            "use_wandb is set but the wandb package is not installed (pip install wandb); metrics go to "
            "metrics.csv only",
            stacklevel=2,
        )
        return None
    if host:
        wandb.login(host=host)
    return wandb.init(
        project=project, group=group, entity=team, name=name, dir=str(run_dir), config=config, resume="allow"
    )


def _step(row: Mapping[str, str]) -> int | None:
    try:
        return int(row.get("step") or "")
    except ValueError:
        return None


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    return v


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """Rows of a ``metrics.csv`` with numbers parsed (empty cells dropped)."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if v in ("", None):
                    continue
                try:
                    row[k] = int(v) if v.lstrip("-").isdigit() else float(v)
                except ValueError:
                    row[k] = v
            rows.append(row)
    return rows


def write_summary(run_dir: Path, summary: Mapping[str, Any]) -> Path:
    path = Path(run_dir) / "summary.json"
    write_text_atomic(path, json.dumps(summary, indent=2, default=str) + "\n")
    return path


def plot_run(run_dir: Path | str) -> list[Path]:
    """Write ``loss.png`` (train and validation loss per step) and ``bytes_per_tier.png`` (bytes each
    rank sent per step, by tier) from the run's ``metrics.csv``. Returns the files written; none when
    matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        warnings.warn(
            "matplotlib is not installed, so no plots were drawn (pip install matplotlib); "
            "metrics.csv holds the numbers",
            stacklevel=2,
        )
        return []
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.csv")
    train = [r for r in rows if r.get("kind") == "train" and "loss" in r]
    valid = [r for r in rows if r.get("kind") == "valid" and "loss" in r]
    out = []
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1)
    if valid:
        ax.plot([r["step"] for r in valid], [r["loss"] for r in valid], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"{run_dir.name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(run_dir / "loss.png", dpi=110)
    plt.close(fig)
    out.append(run_dir / "loss.png")
    tiers = [k for k in (train[0] if train else {}) if k.startswith("bytes_")]
    if tiers:
        fig, ax = plt.subplots(figsize=(7, 4))
        steps = [r["step"] for r in train]
        for k in tiers:
            ax.plot(steps, [r.get(k, 0) / 2**20 for r in train], label=k.removeprefix("bytes_"))
        ax.set_xlabel("step")
        ax.set_ylabel("MiB sent per rank (rank 0)")
        ax.set_title(f"{run_dir.name}: bytes per tier per step")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(run_dir / "bytes_per_tier.png", dpi=110)
        plt.close(fig)
        out.append(run_dir / "bytes_per_tier.png")
    return out
