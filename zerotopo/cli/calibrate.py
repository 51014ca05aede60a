"""``zerotopo calibrate``: measure bandwidth and latency per tier and write the cost model's table.

For every tier, all-gathers over groups that cross exactly that tier, every group at once (as in
training): latency per ring step from one element per rank, bandwidth from large messages. The YAML it
writes (and prints) is read by :func:`zerotopo.cost.calibration.load_calibration` in place of the
topology file's figures. Outside a distributed job it spawns local gloo ranks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from zerotopo.cli.bench import _csv, add_collective_arguments, emulation

EPILOG = """examples:
  zerotopo calibrate --topology emulated -o calibration.yaml
  zerotopo calibrate --topology emulated-frontier --emulate   # root: every tier a shaped link
  srun -N2 -n16 zerotopo calibrate --topology frontier --size 256M -o frontier-calibration.yaml
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    add_collective_arguments(parser)
    parser.add_argument("--size", default="4M", help="message size for the bandwidth, bytes (default 4M)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the table to FILE (YAML)")


def run(args: argparse.Namespace) -> int:
    from zerotopo.comm import bench

    spec = bench.BenchSpec(
        topology=args.topology,
        nodes=args.nodes,
        ops=("all_gather",),
        sizes=(bench.parse_size(args.size),),
        iters=args.iters,
        warmup=args.warmup,
        tiers=tuple(_csv(args.tiers)),
    )
    table = bench.run("calibrate", spec, ranks=args.ranks, emulate=emulation(args))
    if table is None:  # not rank 0 of a job
        return 0
    command = "zerotopo " + " ".join(sys.argv[1:]) if sys.argv[1:] else "zerotopo calibrate"
    # The layout of zerotopo.cost.calibration: header fields, then the tiers.
    table = {**{k: v for k, v in table.items() if k != "tiers"}, "command": command, "tiers": table["tiers"]}
    text = yaml.safe_dump(table, sort_keys=False)
    if args.output:
        Path(args.output).write_text(text)
    print(text, end="")
    if args.output:
        print(f"# written to {args.output}")
    return 0
