"""``zerotopo train``: train a GPT-NeoX-style model under a sharding plan.

With no arguments: the tiny NeoX model of ``configs/tiny.yml`` with the ``zerotopo`` plan on the local
emulated cluster (8 gloo ranks as 2 nodes x 2 packages x 2 dies) on the corpus bundled with zerotopo.
Under ``srun``, ``mpiexec`` or ``torchrun`` the same command runs as one rank of the job.
"""

from __future__ import annotations

import argparse
import json
import os

from zerotopo.errors import ConfigError

EPILOG = """examples:
  zerotopo train                                   # tiny model, emulated 8-rank cluster, ~minutes on a CPU
  zerotopo train configs/tiny.yml --set train_iters=50 --plan zero3
  zerotopo train configs/neox-20b.yml --topology frontier --nodes 48 --plan zerotopo   # one rank under srun
  srun -N2 -n16 zerotopo train configs/tiny.yml --topology frontier --nodes 2
  srun -N1 -n8 zerotopo train --emulated-nodes 2   # 8 ranks on one host as the 2-node emulated topology

Config keys follow GPT-NeoX (see docs/configs.md); --set overrides any of them.
"""


def _parse_value(text: str):
    from zerotopo.placement.yamlio import parse_override_value

    return parse_override_value(text)


def parse_sets(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"expected KEY=VALUE, found {item!r}", source="--set")
        key, value = item.split("=", 1)
        key = key.strip().replace("-", "_")
        if not key:
            raise ConfigError(f"empty key in {item!r}", source="--set")
        out.pop(key, None)  # given twice: the last wins, and its place is the last one's
        out[key] = _parse_value(value)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    p.add_argument(
        "configs",
        nargs="*",
        metavar="CONFIG.yml",
        help="NeoX-style YAML files merged in order, or built-in config names (neox-125m); default: tiny",
    )
    p.add_argument(
        "--topology", help="topology name (frontier, dgx-a100, dgx-h100, dgx-h200, emulated) or YAML file"
    )
    p.add_argument("--nodes", type=int, help="number of nodes (default: the launcher's, else the topology's)")
    p.add_argument(
        "--emulated-nodes",
        type=int,
        metavar="N",
        help="under srun/mpiexec/torchrun: group the job's ranks into N nodes of consecutive ranks (all "
        "ranks on one host then act as N nodes of the topology); sets ZEROTOPO_EMULATED_NODES",
    )
    p.add_argument(
        "--plan",
        help="plan preset (zerotopo, zero3, zeropp, mics, ...), plan YAML file, or inline fields: 'zerotopo,sync=host' or 'params=package,grads=node,optim=world,secondary=node/int8'",
    )
    p.add_argument("--sync", choices=("event", "host"), help="stream ordering of the secondary partition")
    p.add_argument(
        "--grad-reduce", choices=("reduce_scatter", "allreduce"), help="cross-replica gradient reduction"
    )
    p.add_argument("--prefetch", type=int, help="units gathered ahead of the one computing")
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train_iters=50 (repeatable)",
    )
    p.add_argument(
        "--launcher",
        default="auto",
        choices=("auto", "local", "slurm", "mpi", "torchrun"),
        help="auto: join the srun/mpiexec/torchrun job if there is one, else spawn the "
        "topology's ranks locally (default)",
    )
    p.add_argument(
        "--network-mbit",
        type=float,
        metavar="MBIT",
        help="local runs (root): each emulated node in its own network namespace, nodes joined by "
        "links shaped to MBIT Mbit/s, so the inter-node tier is really slow",
    )
    p.add_argument(
        "--from-hf",
        metavar="DIR",
        help="start from a Hugging Face model directory (config.json + safetensors) of GPT-NeoX, Llama, "
        "Mistral or Qwen2 (model_type gpt_neox, llama, mistral, qwen2): its config.json sets the architecture, each rank reads "
        "only its slices of the weights",
    )
    p.add_argument("--run-dir", help="directory for metrics.csv, plots, summary (default runs/<time>-<plan>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")


#: Fastest emulated link, Mbit/s (10 Tbit/s: anything faster is not emulation).
MAX_NETWORK_MBIT = 1e7


def check_flags(args: argparse.Namespace) -> None:
    """Flag values out of range are bad input before anything starts."""
    import math

    from zerotopo.placement.topology import MAX_NODES

    if args.nodes is not None and not 1 <= args.nodes <= MAX_NODES:
        raise ConfigError(
            f"expected a node count from 1 to {MAX_NODES}, found {args.nodes}", source="--nodes"
        )
    if args.prefetch is not None and not 0 <= args.prefetch <= 64:
        raise ConfigError(f"expected 0 to 64 units, found {args.prefetch}", source="--prefetch")
    if args.network_mbit is not None and not (
        math.isfinite(args.network_mbit) and 0 < args.network_mbit <= MAX_NETWORK_MBIT
    ):
        raise ConfigError(
            f"expected a link rate in Mbit/s above 0 and at most {MAX_NETWORK_MBIT:g}, found {args.network_mbit}",
            source="--network-mbit",
        )
    if args.run_dir is not None and (not args.run_dir.strip() or "\x00" in args.run_dir):
        raise ConfigError("expected a directory path", source="--run-dir")


def _first_rank() -> bool:
    """Not a rank of an external launch, or its rank 0 (the only one that prints progress)."""
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(var, "0").strip() not in ("", "0"):
            return False
    return True


def run(args: argparse.Namespace) -> int:
    check_flags(args)
    if _first_rank():
        # before the imports and checks that take seconds, so the console never sits silent
        print("zerotopo train: checking the config, topology, plan, data and memory", flush=True)
    from zerotopo.trainer.entry import launched_externally, run_training
    from zerotopo.trainer.job import TrainJob

    plan_overrides = {
        k: v
        for k, v in (("sync", args.sync), ("grad_reduce", args.grad_reduce), ("prefetch", args.prefetch))
        if v is not None
    }
    job = TrainJob(
        configs=tuple(args.configs),
        overrides=parse_sets(args.sets),
        topology=args.topology,
        nodes=args.nodes,
        plan=args.plan,
        plan_overrides=plan_overrides,
        launcher=args.launcher,
        run_dir=args.run_dir,
        progress=not args.no_progress,
        network_mbit=args.network_mbit,
        from_hf=args.from_hf,
    )
    if args.emulated_nodes is not None:
        if args.emulated_nodes < 1:
            raise ConfigError(
                f"{args.emulated_nodes}: expected a positive node count", source="--emulated-nodes"
            )
        if not launched_externally(job):
            raise ConfigError(
                "local runs already emulate the topology's nodes; use --nodes N (--emulated-nodes regroups "
                "the ranks of srun, mpiexec or torchrun)",
                source="--emulated-nodes",
            )
        os.environ["ZEROTOPO_EMULATED_NODES"] = str(args.emulated_nodes)
    if args.network_mbit is not None and args.launcher not in ("auto", "local"):
        raise ConfigError(
            "--network-mbit emulates nodes on this machine; it needs --launcher local",
            source="--network-mbit",
        )
    summary = run_training(job)
    if summary is None:
        return 0
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        first, final = summary.get("first_loss"), summary.get("final_loss")
        resumed = summary.get("resumed_from_step") or 0
        steps = f"{summary['steps']} steps" + (
            f" ({summary['steps_this_attempt']} after resuming at step {resumed})" if resumed else ""
        )
        print(
            f"\ndone: {steps} in {summary['wall_s']:.1f}s "
            f"({summary['tokens_per_s']:.0f} tokens/s); loss {first:.4f} -> {final:.4f}"
            + (
                f"; validation loss {summary['final_valid_loss']:.4f}"
                if summary.get("final_valid_loss")
                else ""
            )
        )
        print(
            f"run directory: {summary['run_dir']} (metrics.csv, summary.json"
            + "".join(f", {p.rsplit('/', 1)[-1]}" for p in summary.get("plots", []))
            + ")"
        )
    return 0
