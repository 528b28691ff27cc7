"""``python -m exgrpo.pool``: see :mod:`exgrpo.pool.cli`."""

import sys

from exgrpo.pool.cli import main

if __name__ == "__main__":
    sys.exit(main())
