"""``zerotopo calibrate``: measure the cost model's inputs on this machine and write them as a table.

For every group span training uses (the shard groups of each tier's size, and the groups crossing
exactly one tier), every group at once: the bus bandwidth of each collective at several message sizes
(the ``bandwidth:`` curves), per-tier latency and bandwidth (``tiers:``), the overlap parameters
(``overlap:``), and this machine's compute and quantizer rates (``device:``,
:mod:`zerotopo.cost.rates`). ``zerotopo plan --calibration FILE`` reads it in place of the topology's
shipped table (:mod:`zerotopo.bench.curves`, :mod:`zerotopo.cost.calibration`). Outside a distributed job it spawns
local gloo ranks.
"""

from __future__ import annotations

import argparse
import sys

import yaml

from zerotopo.cli.bench import _csv, add_collective_arguments, emulation
from zerotopo.errors import ConfigError

EPILOG = """examples:
  zerotopo calibrate --topology emulated -o calibration.yaml
  zerotopo calibrate --topology emulated-frontier --emulate   # root: every tier a shaped link
  srun -N2 -n16 zerotopo calibrate --topology frontier --sizes 1M,16M,128M,1G -o frontier-calibration.yaml
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    add_collective_arguments(parser)
    parser.add_argument(
        "--sizes",
        default="64K,1M,16M",
        help="message sizes in bytes (whole message), K/M/G suffixes (default 64K,1M,16M)",
    )
    parser.add_argument("--size", default=None, help="a single message size (same as --sizes SIZE)")
    parser.add_argument(
        "--ops",
        default="all_gather,reduce_scatter,all_reduce,all_to_all",
        help="collectives to measure (default all_gather,reduce_scatter,all_reduce,all_to_all)",
    )
    parser.add_argument("--no-overlap", action="store_true", help="skip the overlap measurements")
    parser.add_argument(
        "--no-device",
        action="store_true",
        help="skip the device rates (device.compute_tflops: matmul rate; device.quant_gbps: quantizer rate; "
        "device.quantizer: its rates by input dtype, code and pass)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="write the table to FILE (YAML)")


def run(args: argparse.Namespace) -> int:
    from zerotopo.bench import collectives as bench
    from zerotopo.bench import curves as measure
    from zerotopo.cli.bench import check_collective_flags

    check_collective_flags(args)
    sizes = tuple(sorted({bench.parse_size(s) for s in _csv(args.size or args.sizes)}))
    if not sizes:
        raise ConfigError("give at least one message size", source="--sizes")
    ops = tuple(_csv(args.ops))
    bad = [op for op in ops if op not in measure.MEASURED]
    if bad or not ops:
        raise ConfigError(
            f"unknown op {bad[0] if bad else ''!r}; calibrate measures {', '.join(measure.MEASURED)}",
            source="--ops",
        )
    spec = measure.MeasureSpec(
        topology=args.topology,
        nodes=args.nodes,
        ops=ops,
        sizes=sizes,
        iters=args.iters,
        warmup=args.warmup,
        tiers=tuple(_csv(args.tiers)),
        overlap=not args.no_overlap,
    )
    table = measure.run(spec, ranks=args.ranks, emulate=emulation(args))
    if table is None:  # not rank 0 of a job
        return 0
    if not args.no_device:
        from zerotopo.cost.rates import measure_device

        table["device"] = measure_device()  # after the ranks are done: this process alone on the machine
    command = "zerotopo " + " ".join(sys.argv[1:]) if sys.argv[1:] else "zerotopo calibrate"
    # The layout of zerotopo.cost.calibration: header fields, then the measurements.
    head = {k: v for k, v in table.items() if k not in ("tiers", "bandwidth", "overlap", "device")}
    body = {k: table[k] for k in ("tiers", "overlap", "device", "bandwidth") if k in table}
    text = yaml.safe_dump({**head, "command": command, **body}, sort_keys=False, default_flow_style=None)
    if args.output:
        from zerotopo.fsutil import write_text_atomic

        write_text_atomic(args.output, text)
    print(text, end="")
    if args.output:
        print(f"# written to {args.output}")
    return 0
