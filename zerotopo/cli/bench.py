"""``zerotopo bench``: measure collectives (``bench collectives``), training steps (``bench step``), or
compare zerotopo with DeepSpeed and FSDP2 on an emulated cluster (``bench compare``).

``bench collectives`` runs every op on the shard groups of every tier of the topology at once, as in
training, and prints op, degree, tier crossed, message size, time and algorithm bandwidth (bytes this
rank sent / time). Outside a distributed job it spawns the ranks locally (gloo, emulated topology);
under ``srun``/``torchrun``/``mpiexec`` it runs as one rank of the job and rank 0 prints.
``bench compare``, ``bench scale`` and ``bench step`` come with the lab (``zerotopo_lab``, found through
:mod:`zerotopo.cli.lab`; see docs/bench.md); without it they say how to install it.
"""

from __future__ import annotations

import argparse
import json

from zerotopo.errors import ConfigError

#: The targets the lab adds (:mod:`zerotopo.cli.lab`).
LAB_TARGETS = ("compare", "scale", "step")

EPILOG = """examples:
  zerotopo bench collectives                              # 8 local gloo ranks, emulated topology
  zerotopo bench collectives --sizes 64K,1M --ops all_gather,reduce_scatter_int4 --json
  srun -N2 -n16 zerotopo bench collectives --topology frontier --sizes 16M,256M
  zerotopo bench compare --plot compare.png    # root: zerotopo vs DeepSpeed vs FSDP2, emulated Frontier
  zerotopo bench compare --model tiny --steps 2 --rows zerotopo,zero3,fsdp2-hsdp --json
  zerotopo bench scale --nodes 2,4,8,16 --json -o scale.json --plot scale.png   # root: on the device clock
"""


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def check_collective_flags(args: argparse.Namespace) -> None:
    """Counts out of range are bad input before any rank starts."""
    from zerotopo.placement.topology import MAX_NODES

    bounds = {"nodes": (1, MAX_NODES), "ranks": (1, 4096), "iters": (1, 10**6), "warmup": (0, 10**6)}
    for name, (lo, hi) in bounds.items():
        value = getattr(args, name, None)
        if value is not None and not lo <= value <= hi:
            raise ConfigError(f"expected {lo} to {hi}, found {value}", source=f"--{name}")


def add_collective_arguments(p: argparse.ArgumentParser) -> None:
    """Options shared by ``bench collectives`` and ``calibrate``."""
    p.add_argument("--topology", default="emulated", help="topology name or YAML file (default: emulated)")
    p.add_argument("--nodes", type=int, help="nodes (default: the job's, or ranks / devices per node)")
    p.add_argument("--ranks", type=int, help="local ranks to spawn outside a job (default: the topology's)")
    p.add_argument("--iters", type=int, default=5, help="timed calls per measurement (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first (default 2)")
    p.add_argument("--tiers", default="", help="comma-separated tiers to measure (default: all)")
    add_emulation_arguments(p)


def add_emulation_arguments(p: argparse.ArgumentParser) -> None:
    """``--emulate``, ``--network-mbit``, ``--shape``: local ranks on an emulated, shaped cluster."""
    p.add_argument(
        "--emulate",
        action="store_true",
        help="root: each local rank in its own network namespace, every tier a shaped link "
        "(zerotopo.launch.netem.emulated_cluster)",
    )
    p.add_argument(
        "--network-mbit",
        type=float,
        default=50.0,
        help="with --emulate: network tier rate per rank, Mbit/s; inner tiers at Frontier's ratios "
        "above it (default 50: package 800, node 200)",
    )
    p.add_argument(
        "--shape",
        default="",
        help="with --emulate: per-tier rates overriding those, e.g. package=1000,node=250",
    )


def emulation(args: argparse.Namespace) -> dict | None:
    """Keywords of :func:`zerotopo.launch.netem.emulated_cluster` from the emulation flags (None: no emulation)."""
    if not getattr(args, "emulate", False):
        return None
    from zerotopo.launch.netem import parse_rates

    return {"network_mbit": args.network_mbit, "rates": parse_rates(args.shape)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    sub = parser.add_subparsers(dest="bench_target", metavar="TARGET")
    p = sub.add_parser("collectives", help="time collectives per op, size and tier")
    add_collective_arguments(p)
    p.add_argument(
        "--sizes", default="64K,1M,4M", help="message sizes in bytes, K/M/G suffixes (default 64K,1M,4M)"
    )
    p.add_argument("--ops", default=None, help="comma-separated ops (default: the plain and quantized ones)")
    p.add_argument(
        "--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="element type (default fp32)"
    )
    p.add_argument("--block", type=int, default=256, help="quantization block (default 256)")
    p.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    from zerotopo.cli import lab

    hooks = lab.load()
    if hooks is not None:
        hooks.add_bench_targets(sub)
        return
    for name in LAB_TARGETS:  # without the lab: each says how to get it
        # every flag is taken as a plain word (no prefix characters), so run() can name the install
        p = sub.add_parser(
            name, help=f"(comes with the lab: {lab.INSTALL})", add_help=False, prefix_chars="\0"
        )
        p.add_argument("rest", nargs="*")


def run(args: argparse.Namespace) -> int:
    if args.bench_target in LAB_TARGETS:
        from zerotopo.cli import lab

        return lab.require(f"zerotopo bench {args.bench_target}").run_bench(args)
    if args.bench_target != "collectives":
        raise ConfigError("choose what to benchmark: zerotopo bench collectives | step | compare | scale")
    check_collective_flags(args)
    if not 1 <= args.block <= 1 << 20:
        raise ConfigError(f"expected 1 to {1 << 20}, found {args.block}", source="--block")
    from zerotopo.bench import collectives as bench

    ops = tuple(_csv(args.ops)) if args.ops else bench.DEFAULT_OPS
    unknown = [o for o in ops if o not in bench.OPS]
    if unknown:
        raise ConfigError(f"unknown op {unknown[0]!r}; ops are {', '.join(bench.OPS)}", key="--ops")
    spec = bench.BenchSpec(
        topology=args.topology,
        nodes=args.nodes,
        ops=ops,
        sizes=tuple(bench.parse_size(s) for s in _csv(args.sizes)),
        dtype=args.dtype,
        block=args.block,
        iters=args.iters,
        warmup=args.warmup,
        tiers=tuple(_csv(args.tiers)),
    )
    rows = bench.run(spec, ranks=args.ranks, emulate=emulation(args))
    if rows is None:  # not rank 0 of a job
        return 0
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        backend = rows[0]["backend"] if rows else "?"
        print(f"collectives on {backend}, topology {args.topology}, {args.dtype}, slowest rank per row")
        print(bench.format_table(rows))
    return 0
