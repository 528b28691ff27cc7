"""``python -m recipe.exgrpo.dry_run``: the launch dry run, whose code lives in
``recipe.exgrpo.launch_checks.dry_run.driver``.

A command name kept stable for the people and scripts that type it; nothing imports this module.
"""

import sys

from recipe.exgrpo.launch_checks.dry_run.driver import main

if __name__ == "__main__":
    sys.exit(main())
