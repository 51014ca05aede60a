"""Run-directory outputs: metrics CSV (and TensorBoard when installed), summary and PNG plots.

Only rank 0 writes. ``metrics.csv`` has one row per optimizer step (``kind=train``) and one per
evaluation (``kind=valid``); columns are fixed when the file is opened, so a run's CSV is rectangular.
"""

from __future__ import annotations

import csv
import json
import math
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
)


class MetricsWriter:
    """Append-only metrics for one run: CSV always, TensorBoard if ``torch.utils.tensorboard`` imports."""

    def __init__(self, run_dir: Path, tier_names: Sequence[str], *, tensorboard: bool = True):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tier_columns = [f"bytes_{t}" for t in tier_names]
        self.columns = list(BASE_COLUMNS) + self.tier_columns
        self.path = self.run_dir / "metrics.csv"
        self._file = self.path.open("w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        self._csv.writeheader()
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                self._tb = None

    def write(self, row: Mapping[str, Any]) -> None:
        self._csv.writerow({k: _fmt(v) for k, v in row.items()})
        self._file.flush()
        if self._tb is not None:
            kind = row.get("kind", "train")
            for k, v in row.items():
                if k not in ("kind", "step") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{kind}/{k}", v, int(row["step"]))

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


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
