"""``zerotopo config keys``: which GPT-NeoX config keys zerotopo honours, accepts without effect (and
why), or refuses unless they hold NeoX's default (and what to do instead)."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", choices=("keys",), help="keys: print the tables of NeoX keys")


def run(args: argparse.Namespace) -> int:
    from zerotopo.config.neox_keys import keys_table

    print(keys_table())
    return 0
