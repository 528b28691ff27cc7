"""``python -m exgrpo.eval``: see exgrpo.eval.cli."""

import sys

from exgrpo.eval.cli import main

if __name__ == "__main__":  # importing this module (the import-guard test does) must not run the command
    sys.exit(main())
