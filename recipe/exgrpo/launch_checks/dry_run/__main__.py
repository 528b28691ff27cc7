"""``python -m recipe.exgrpo.launch_checks.dry_run``: the dry run's command line (``driver.main``)."""

import sys

from recipe.exgrpo.launch_checks.dry_run.driver import main

sys.exit(main())
