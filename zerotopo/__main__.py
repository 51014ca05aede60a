"""``python -m zerotopo`` is the ``zerotopo`` command."""

import sys

from zerotopo.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
