"""Entry point of the ``zerotopo`` command.

Each subcommand lives in ``zerotopo/cli/<name>.py`` and defines ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only for the subcommand that runs, so ``zerotopo topo``
never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from zerotopo import __version__
from zerotopo.errors import ZerotopoError

# name -> (module, one-line help, longer description)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "zerotopo.cli.train",
        "train a GPT-NeoX-style model (no arguments: tiny model, emulated 8-rank cluster)",
    ),
    "topo": ("zerotopo.cli.topo", "show or validate a topology descriptor"),
    "plan": ("zerotopo.cli.plan", "rank sharding plans by memory and predicted step time"),
    "data": ("zerotopo.cli.data", "preprocess jsonl text into NeoX mmap indexed datasets"),
    "bench": ("zerotopo.cli.bench", "benchmark collectives or training steps"),
    "calibrate": ("zerotopo.cli.calibrate", "measure per-tier bandwidth and latency for the cost model"),
    "export-hf": (
        "zerotopo.cli.export",
        "write a checkpoint as a Hugging Face GPT-NeoX directory (sharded safetensors)",
    ),
    "env": ("zerotopo.cli.env", "show what rank discovery found and warn about bad settings"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zerotopo",
        description="Topology-aware sharded training for GPT-NeoX-style models.",
    )
    parser.add_argument("--version", action="version", version=f"zerotopo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == only:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in SUBCOMMANDS:
        command = None
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except ZerotopoError as exc:
        print(f"zerotopo {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"zerotopo {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
