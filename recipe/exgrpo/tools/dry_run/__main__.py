"""``python -m recipe.exgrpo.tools.dry_run``: the dry run's command line (``driver.main``)."""

import sys

from recipe.exgrpo.tools.dry_run.driver import main

sys.exit(main())
