"""The verl 0.9.1 adapter of ExGRPO (docs/architecture.md)."""

from recipe.exgrpo.verl_compat import quiet_optional_engine_warnings

# before any of the recipe's commands imports verl (the dry run, main_exgrpo, --help): verl's warnings about the
# optional engines it cannot import, which the recipe does not use
quiet_optional_engine_warnings()
