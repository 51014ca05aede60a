"""``zerotopo ckpt verify DIR``: check a checkpoint's bytes without training.

Reads every stored piece once (one at a time, so memory stays at the largest piece) and checks its
checksum, dtype, element count and values against the metadata, after the manifest and the metadata
themselves; the first fault is an error naming the file (exit status 2)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    verify = sub.add_parser("verify", help="check every stored piece of a checkpoint", description=__doc__)
    verify.add_argument("checkpoint", help="a step directory, or a save: directory (its latest is checked)")


def run(args: argparse.Namespace) -> int:
    import torch

    from zerotopo.checkpoint.store import verify_checkpoint

    # One piece at a time, each a few MB: one thread checks it at memory speed, while several spin
    # against each other (and against a run that shares the node) between such short passes.
    torch.set_num_threads(1)
    report = verify_checkpoint(args.checkpoint)
    note = (
        f"; {report.unchecked} pieces carry no checksum (written by an earlier zerotopo): dtype and size checked"
        if report.unchecked
        else ""
    )
    print(
        f"{report.path}: OK, step {report.step}: {report.pieces} pieces in {report.files} files, "
        f"{report.bytes / 2**20:.1f} MiB checked in {report.read_s:.2f}s "
        f"({report.bytes / max(report.read_s, 1e-9) / 1e9:.2f} GB/s){note}"
    )
    return 0
