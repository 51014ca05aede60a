"""Muon against AdamW on the default ``zerotopo train`` run, each at learning rates swept over a few values::

    python benchmarks/muon_vs_adamw.py --out /tmp/muon-sweep            # AdamW 1e-3,3e-3,1e-2; Muon 0.02,0.05,0.1
    python benchmarks/muon_vs_adamw.py --out /tmp/muon-sweep --adamw 3e-4,1e-3 --muon 0.05
    python benchmarks/muon_vs_adamw.py --out /tmp/muon-sweep --report-only   # table and plot of finished runs

Every run is the default ``zerotopo train`` (the ``tiny`` config: 4 layers x 128 wide, bundled corpus, 200
steps, 8 gloo ranks of the ``emulated`` topology, plan ``zerotopo``) in a subprocess, one at a time, with
only the optimizer block and ``min_lr`` (a tenth of the peak, so every cosine schedule ends at the same
fraction of its peak) replaced. Muon runs with an AdamW aux (embedding, head, norms, biases) at the config's
lr, 1e-3, whatever Muon's own lr. A run whose ``summary.json`` exists is not run again, so an interrupted
sweep resumes. The script writes ``<out>/table.md`` (validation losses, final train loss, step time median
and quartiles over steps 11-200, wall time), ``<out>/sweep.json`` and, when matplotlib is installed,
``<out>/muon-vs-adamw.png`` (each optimizer's best run's loss curve and step times side by side). Figures
are written, nothing is asserted.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AUX_LR = 1.0e-3


@dataclass(frozen=True)
class Run:
    """One point of the sweep: ``kind`` is ``adamw`` or ``muon``, ``lr`` its peak learning rate."""

    kind: str
    lr: float

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.lr:g}"

    def overrides(self) -> list[str]:
        """The ``--set`` arguments that turn the default run into this one."""
        if self.kind == "adamw":
            opt = f"optimizer={{type: AdamW, params: {{lr: {self.lr:g}, betas: [0.9, 0.95], eps: 1.0e-8}}}}"
        else:
            opt = f"optimizer={{type: Muon, params: {{lr: {self.lr:g}, aux: {{lr: {AUX_LR:g}}}}}}}"
        return ["--set", opt, "--set", f"min_lr={self.lr / 10:g}"]


def _rates(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def run_one(run: Run, out: Path) -> None:
    """Train ``run`` into ``out/<name>`` unless it finished before; its output goes to ``<name>.log``."""
    run_dir = out / run.name
    if (run_dir / "summary.json").exists():
        return
    cmd = ["zerotopo", "train", "--no-progress", "--run-dir", str(run_dir), *run.overrides()]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    start = time.time()
    with open(out / f"{run.name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    print(f"{run.name}: rc {rc}, {time.time() - start:.0f} s", flush=True)
    if rc != 0:
        raise SystemExit(f"{run.name} failed (rc {rc}); see {out / (run.name + '.log')}")


def summarize(run: Run, out: Path) -> dict | None:
    """The figures of one finished run from its ``metrics.csv`` and ``summary.json``; None if unfinished."""
    run_dir = out / run.name
    if not (run_dir / "summary.json").exists():
        return None
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    train = [r for r in rows if r["kind"] == "train"]
    valid = [r for r in rows if r["kind"] == "valid"]
    times = [float(r["step_time_s"]) for r in train[10:]]
    q1, _, q3 = statistics.quantiles(times, n=4)
    return {
        "name": run.name,
        "kind": run.kind,
        "lr": run.lr,
        "valid": [(int(r["step"]), float(r["loss"])) for r in valid],
        "train_last10": statistics.fmean(float(r["loss"]) for r in train[-10:]),
        "step_median_s": statistics.median(times),
        "step_quartiles_s": (q1, q3),
        "wall_s": json.load(open(run_dir / "summary.json"))["wall_s"],
        "train_curve": [(int(r["step"]), float(r["loss"])) for r in train],
        "step_times": [(int(r["step"]), float(r["step_time_s"])) for r in train],
    }


def table(results: list[dict]) -> str:
    """A markdown table, one row per run, the best final validation loss of each optimizer in bold."""
    best = {}
    for r in results:
        if r["kind"] not in best or r["valid"][-1][1] < best[r["kind"]]["valid"][-1][1]:
            best[r["kind"]] = r
    steps = " / ".join(str(s) for s, _ in results[0]["valid"])
    lines = [
        f"| run | validation loss at {steps} | train loss (mean of the last 10 steps) "
        "| step time median (quartiles) | wall |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results:
        valid = " / ".join(f"{v:.3f}" for _, v in r["valid"])
        if best[r["kind"]] is r:
            valid = valid.rsplit(" / ", 1)
            valid = f"{valid[0]} / **{valid[1]}**" if len(valid) == 2 else f"**{valid[0]}**"
        q1, q3 = r["step_quartiles_s"]
        lines.append(
            f"| {r['name']} | {valid} | {r['train_last10']:.3f} | {r['step_median_s']:.2f} s "
            f"({q1:.2f}-{q3:.2f}) | {r['wall_s']:.0f} s |"
        )
    return "\n".join(lines) + "\n"


def _rolling_median(values: list[float], width: int = 11) -> list[float]:
    half = width // 2
    return [statistics.median(values[max(0, i - half) : i + half + 1]) for i in range(len(values))]


def plot(results: list[dict], path: Path) -> bool:
    """Every run's train loss (lines) and validation loss (dots), and its step time (rolling median over
    11 steps); AdamW in blues, Muon in reds, darker for higher rates. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (loss_ax, time_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    for kind, cmap in (("adamw", plt.cm.Blues), ("muon", plt.cm.Reds)):
        runs = sorted((r for r in results if r["kind"] == kind), key=lambda r: r["lr"])
        for k, r in enumerate(runs):
            color = cmap(0.45 + 0.5 * k / max(1, len(runs) - 1))
            steps, losses = zip(*r["train_curve"])
            loss_ax.plot(steps, losses, lw=1, color=color, label=r["name"])
            vs, vl = zip(*r["valid"])
            loss_ax.scatter(vs, vl, s=16, color=color, edgecolors="black", linewidths=0.5, zorder=3)
            ts, tt = zip(*r["step_times"])
            time_ax.plot(ts, _rolling_median(list(tt)), lw=1, color=color, label=r["name"])
    loss_ax.set(xlabel="step", ylabel="train loss (lines), validation loss (dots)", ylim=(1.4, 4.0))
    time_ax.set(xlabel="step", ylabel="step time s (rolling median of 11 steps)")
    time_ax.set_ylim(bottom=0)
    loss_ax.legend(fontsize=8)
    time_ax.legend(fontsize=8)
    fig.suptitle(
        "zerotopo train (tiny, bundled corpus, 200 steps, 8 gloo ranks on a shared 2-core CPU): "
        "Muon + AdamW aux (reds) vs AdamW (blues)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the runs, the table and the plot")
    p.add_argument("--adamw", default="1e-3,3e-3,1e-2", help="AdamW peak learning rates, comma-separated")
    p.add_argument("--muon", default="0.02,0.05,0.1", help="Muon peak learning rates, comma-separated")
    p.add_argument("--report-only", action="store_true", help="write the table and plot of finished runs")
    args = p.parse_args(argv)
    adamw = [Run("adamw", lr) for lr in _rates(args.adamw)]
    muon = [Run("muon", lr) for lr in _rates(args.muon)]
    # interleaved, so a sweep cut short still holds points of both
    runs = [r for pair in zip_longest(adamw, muon) for r in pair if r is not None]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for run in runs:
            run_one(run, args.out)
    results = [r for r in (summarize(run, args.out) for run in runs) if r is not None]
    if not results:
        print("no finished runs", file=sys.stderr)
        return 1
    text = table(results)
    (args.out / "table.md").write_text(text)
    slim = [{k: v for k, v in r.items() if k not in ("train_curve", "step_times")} for r in results]
    (args.out / "sweep.json").write_text(json.dumps(slim, indent=1) + "\n")
    plotted = plot(results, args.out / "muon-vs-adamw.png")
    print(text + (f"plot: {args.out / 'muon-vs-adamw.png'}" if plotted else "(matplotlib absent: no plot)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
