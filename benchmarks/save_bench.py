"""Training time blocked per checkpoint save, synchronous against ``async_save: true``, the save on SIGTERM,
and ``zerotopo ckpt verify``'s read rate, on the memory benchmark's model (40 x 512 NeoX, 127M parameters)
on 8 local CPU ranks::

    python benchmarks/save_bench.py                  # saves at steps 2, 4, 6 of 7 (median of the 3)
    python benchmarks/save_bench.py --layers 4 --hidden 128   # a quick look

Each run is ``zerotopo train`` in a subprocess (the emulated 2-node cluster, gloo, plan zero3); the
figures come from its ``train.log`` (``training blocked`` lines, written by rank 0). The SIGTERM run is sent
SIGTERM once two steps are logged; its save is the run's last one, and the time from the signal to the
exit is printed beside it. ``ckpt verify`` reports its own read time; the start-up is the rest of its wall
time. Figures are printed; nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from memory_bench import config  # noqa: E402

BLOCKED = re.compile(
    r"checkpoint of step (\d+) (copied for the background writer|saved): training blocked ([0-9.]+)s"
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _argv(cfg: Path, run: Path, *sets: str) -> list[str]:
    argv = [sys.executable, "-m", "zerotopo", "train", str(cfg), "--run-dir", str(run), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    return argv


def blocked(run: Path) -> dict[int, float]:
    """``{step: seconds training was blocked}`` from a run's log."""
    text = (run / "train.log").read_text()
    return {int(m.group(1)): float(m.group(3)) for m in BLOCKED.finditer(text)}


def train(cfg: Path, run: Path, *sets: str) -> dict[int, float]:
    proc = subprocess.run(_argv(cfg, run, *sets), env=_env(), capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{run.name}: zerotopo train failed ({proc.returncode})")
    return blocked(run)


def sigterm(cfg: Path, run: Path, *sets: str) -> tuple[dict[int, float], float, int]:
    """Blocked times, seconds from SIGTERM to exit, exit status."""
    proc = subprocess.Popen(_argv(cfg, run, *sets), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    metrics = run / "metrics.csv"
    while not metrics.exists() or metrics.read_text().count("\ntrain,") < 2:
        if proc.poll() is not None:
            raise SystemExit(f"{run.name} ended before it was signalled: {proc.stderr.read()[-2000:]}")
        time.sleep(0.5)
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.communicate()
    return blocked(run), time.perf_counter() - t0, proc.returncode


def verify(save: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "zerotopo", "ckpt", "verify", str(save)], env=_env(),
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    return wall, proc.stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zerotopo-savebench-", dir=a.dir) as tmp:
        work = Path(tmp)
        cfg = work / "model.yml"
        cfg.write_text(config(a.layers, a.hidden, a.heads, a.seq, 7, "zero3", "fp32"))
        rows = {}
        for mode in ("sync", "async"):
            got = train(cfg, work / mode, f"save={work / (mode + '-ckpt')}", "save_interval=2",
                        "keep_last_n_checkpoints=2",
                        f"async_save={'true' if mode == 'async' else 'false'}")  # fmt: skip
            rows[mode] = [got[s] for s in (2, 4, 6)]
            print(f"{mode:>5}: training blocked per save (steps 2, 4, 6): "
                  f"{', '.join(f'{t:.3f}' for t in rows[mode])} s; median {statistics.median(rows[mode]):.3f} s; "
                  f"last save (step 7, written before exit) {got[7]:.3f} s")  # fmt: skip
        got, to_exit, code = sigterm(cfg, work / "term", f"save={work / 'term-ckpt'}", "train_iters=1000")
        (step, t), *_ = sorted(got.items())
        print(
            f"SIGTERM: saved step {step}, training blocked {t:.3f} s; signal to exit {to_exit:.1f} s; exit {code}"
        )
        wall, line = verify(work / "sync-ckpt")
        print(f"ckpt verify: {line}; wall {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
