"""Step time, tokens/s and bytes per tier of every preset on 8 local gloo ranks (see zerotopo_lab.bench.step).

python benchmarks/step_bench.py [--steps 4 --copy-delay-ms 20 ...]   # same as: zerotopo bench step
"""

from __future__ import annotations

import argparse
import sys

from zerotopo_lab.bench.step import add_arguments, run

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
