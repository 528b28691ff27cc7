import sys

from recipe.exgrpo.tool_eval.cli import main

sys.exit(main())
