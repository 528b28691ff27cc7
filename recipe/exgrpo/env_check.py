"""``python -m recipe.exgrpo.env_check``: the environment check, whose code lives in
``recipe.exgrpo.launch_checks.env_check``.

A command name kept stable for the people and scripts that type it; nothing imports this module.
"""

import sys

from recipe.exgrpo.launch_checks.env_check import main

if __name__ == "__main__":
    sys.exit(main())
