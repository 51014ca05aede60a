"""Entry point of the ``zerotopo`` command.

Each subcommand lives in ``zerotopo/cli/<name>.py`` and defines ``add_arguments(parser)`` and
``run(args) -> int``. Modules are imported only for the subcommand that runs, so ``zerotopo topo``
never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
import threading

from zerotopo import __version__
from zerotopo.errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    ZerotopoError,
)
from zerotopo.logs import setup_console, to_null

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
        "write a checkpoint as a Hugging Face directory (sharded safetensors): GPTNeoXForCausalLM, "
        "LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM, after the model's family",
    ),
    "env": ("zerotopo.cli.env", "show what rank discovery found and warn about bad settings"),
    "export": (
        "zerotopo.cli.export_state",
        "write a checkpoint as one safetensors state dict or a standard torch DCP directory",
    ),
    "config": ("zerotopo.cli.config", "list the GPT-NeoX config keys: honoured, without effect, refused"),
    "ckpt": ("zerotopo.cli.ckpt", "check a checkpoint's stored bytes (ckpt verify DIR) without training"),
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
    """Run the ``zerotopo`` command line ``argv`` (default ``sys.argv[1:]``); returns the exit status
    (docs/errors.md). A reader of standard output that goes away (``| head``) ends the command quietly
    with :data:`~zerotopo.errors.EXIT_BROKEN_PIPE`, as SIGPIPE ends a Unix tool."""
    try:
        try:
            return _main(argv)
        finally:  # also after argparse's exit (--help): what is still buffered fails here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:
        to_null(sys.stdout)  # later writes (the interpreter's last flush among them) go nowhere
        return EXIT_BROKEN_PIPE


def _reader_closed() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll reports an error on the write
    end of such a pipe), so a :class:`BrokenPipeError` means the reader went away rather than a failure
    of one of the command's own pipes or sockets."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or no file descriptor behind sys.stdout
        return False


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in SUBCOMMANDS:
        command = None
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    prefix = f"zerotopo {args.command}" + _launched_rank(args.command)
    setup_console()
    old_term = _on_sigterm()
    try:
        module = importlib.import_module(SUBCOMMANDS[args.command][0])
        return int(module.run(args) or 0)
    except ZerotopoError as exc:
        print(f"{prefix}: error: {_bounded(str(exc))}", file=sys.stderr)
        return int(getattr(exc, "exit_code", EXIT_BAD_INPUT))
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted{_ranks_note(args.command)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _Terminated:
        print(f"{prefix}: stopped by SIGTERM{_ranks_note(args.command)}", file=sys.stderr)
        return EXIT_TERMINATED
    except RecursionError:
        print(f"{prefix}: error: an input is nested too deeply to read; flatten it", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - a bug: its traceback goes to a file, the user gets one line
        if isinstance(exc, BrokenPipeError) and _reader_closed():
            raise  # standard output's reader went away, not a bug: main() ends quietly
        log = _log_traceback(args.command)
        print(
            f"{prefix}: internal error: {type(exc).__name__}: {_bounded(str(exc), 300)}; "
            f"this is a bug in zerotopo, the traceback is in {log}",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


def _launched_rank(command: str) -> str:
    """`` (rank N)`` when this process is one rank of an srun/mpiexec/torchrun job, so each rank's message
    says which rank it is."""
    if command not in ("train", "bench", "calibrate"):
        return ""
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit() and len(value) <= 8:
            return f" (rank {int(value)})"
    return ""


def _ranks_note(command: str) -> str:
    return "; every rank was stopped" if command in ("train", "bench", "calibrate") else ""


class _Terminated(BaseException):
    """SIGTERM reached the command."""


def _on_sigterm():
    """Turn SIGTERM into an exception, so cleanups (ranks, network namespaces) run before exiting."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise _Terminated()

    return signal.signal(signal.SIGTERM, handler)


#: Longest error message printed (a message quoting a hostile value is cut, never unbounded).
MAX_MESSAGE_CHARS = 4000


def _bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _log_traceback(command: str) -> str:
    """Write the current exception's traceback to a new file; returns its path."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix=f"zerotopo-{command}-traceback-", suffix=".log")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(traceback.format_exc())
    return path


if __name__ == "__main__":
    sys.exit(main())
