"""Run every case of the bad-input corpus (tests/badinput/corpus.py) as a ``zerotopo`` subprocess with a
timeout and print one line per case that did not end in a clean error, then the summary::

    N cases: N clean errors, 0 tracebacks, 0 hangs, 0 accepted, 0 executed

Usage: ``python benchmarks/badinput_corpus.py [--timeout S] [--jobs J] [--only SUBSTRING] [--verbose]``.
Exits 0 when every case was a clean error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "badinput"))

from corpus import CASES, summary_line  # noqa: E402
from runner import run_subprocess  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before a case counts as a hang")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--verbose", action="store_true", help="print every case's outcome")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only in c.name]
    start = time.monotonic()
    counts: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for case, (outcome, output) in zip(cases, pool.map(lambda c: run_subprocess(c, args.timeout), cases)):
            counts[outcome] += 1
            if outcome != "clean" or args.verbose:
                last = output.strip().splitlines()[-1:] or [""]
                print(f"{outcome:9s} {case.name}: {last[0][:200]}", flush=True)
    print(
        f"# {time.monotonic() - start:.0f}s, categories: "
        + ", ".join(f"{k} {v}" for k, v in sorted(Counter(c.category.split(":")[0] for c in cases).items()))
    )
    print(summary_line(counts))
    return 0 if counts["clean"] == len(cases) else 1


if __name__ == "__main__":
    sys.exit(main())
