"""Seconds from starting ``zerotopo train`` to its first console line, and to the run's opening line
(``... layers x ... wide``, printed once the ranks joined and the model is built), median of N runs.

    python benchmarks/startup_first_line.py [REPO] [N]

Each run is ``zerotopo train --set train_iters=2`` (the tiny default config on the emulated 8-rank
cluster), stopped as soon as the opening line appears; REPO (default: this checkout) is put on
PYTHONPATH, so two checkouts compare on the same machine.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def once(repo: str, run_dir: str) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": repo, "PYTHONUNBUFFERED": "1"}
    cmd = [
        sys.executable,
        "-m",
        "zerotopo",
        "train",
        "--set",
        "train_iters=2",
        "--no-progress",
        "--run-dir",
        run_dir,
    ]
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    first, ready, first_line = None, float("nan"), ""
    assert p.stdout is not None
    for raw in p.stdout:
        t = time.perf_counter() - t0
        line = raw.decode(errors="replace").rstrip()
        if first is None:
            first, first_line = t, line
        if "layers x" in line:
            ready = t
            break
    os.killpg(p.pid, signal.SIGKILL)  # the run's own session: the launcher and its ranks
    p.wait()
    return (first if first is not None else float("nan")), ready, first_line


def main() -> int:
    repo = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    firsts, readies = [], []
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        for i in range(n):
            first, ready, line = once(repo, os.path.join(tmp, f"run-{i}"))
            firsts.append(first)
            readies.append(ready)
            print(f"first line {first:.2f} s ({line[:80]}); opening line {ready:.2f} s", flush=True)
    print(
        f"first line: median {statistics.median(firsts):.2f} s ({', '.join(f'{t:.1f}' for t in firsts)}); "
        f"opening line: median {statistics.median(readies):.2f} s ({', '.join(f'{t:.1f}' for t in readies)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
