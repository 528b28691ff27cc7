"""``python -m recipe.exgrpo.cpu_demo``: the CPU demo, whose code lives in ``recipe.exgrpo.harness.demo``.

A command name kept stable for the people and scripts that type it; nothing imports this module.
"""

import sys

from recipe.exgrpo.harness.demo import main

if __name__ == "__main__":
    sys.exit(main())
