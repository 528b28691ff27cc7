"""The replay step of ExGRPO, trainer-neutral: what one training step adds to GRPO, over rows of plain tensors.

- ``step.py``: :class:`ReplayStep` (the stages a trainer adapter calls) and :class:`StepState` (one step's value,
  carried from stage to stage), :class:`ReplayBackend` (the two calls it asks of a trainer);
- ``rows.py``: :class:`Rows`, a step's rows as tensors, columns and meta (each adapter converts its own batch);
- ``batch.py``: the mixed batch (candidate rows, the selected replayed members, collection groups);
- ``scoring.py``: the replayed members' rewards; ``metrics.py``: the step's figures;
- ``fresh.py``: the fresh prompts (leftovers, the data loader, retired questions skipped);
- ``fields.py``: the names of the per-row fields the step adds and the actor loss reads.

Nothing here imports verl, Ray or a trainer (tests/unit/test_import_graph.py).
"""

from recipe.exgrpo.replay_step.rows import Rows
from recipe.exgrpo.replay_step.step import (
    POOL_DIRNAME,
    TRACE_FILE,
    ReplayBackend,
    ReplayStep,
    StepState,
    prune_pools,
    simple_timer,
)

__all__ = [
    "POOL_DIRNAME",
    "TRACE_FILE",
    "ReplayBackend",
    "ReplayStep",
    "Rows",
    "StepState",
    "prune_pools",
    "simple_timer",
]
