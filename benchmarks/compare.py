"""zerotopo's plans vs DeepSpeed ZeRO-3 / hpZ vs PyTorch FSDP2 on the emulated Frontier (root).

python benchmarks/compare.py [--model small --steps 3 --plot compare.png ...]   # same as: zerotopo bench compare

See docs/bench.md for the rows, the emulated network and how bytes and peaks are measured.
"""

from __future__ import annotations

import argparse
import sys

from zerotopo_lab.bench.compare import add_arguments, run

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
