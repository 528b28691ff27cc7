"""The fresh prompts of a step: leftovers first, then the training data's next batch, retired questions skipped.

A step with ``n`` replayed questions takes ``B - n`` fresh prompts, so it uses less than a data-loader batch; the rest
waits as leftovers (in the checkpoint, as row numbers) for the next step. Nothing is silently dropped: a question
replayed this step (or drawn twice) is deferred, a retired one is skipped and counted (docs/algorithm.md §3,
``exgrpo.retire_fresh_prompts``). The trainer says where batches come from (``epoch_batches``: the dataset rows of
each batch of one pass over the data, a new pass each time it is called); the rest is the same for every trainer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from exgrpo.fresh_prompts import FreshPromptFilter

__all__ = ["FreshPrompts"]


class FreshPrompts:
    """Leftover rows, the data loader's pass and epoch, and the retired-question filter of a run."""

    def __init__(
        self,
        question_ids: Sequence[str],
        questions_per_step: int,
        epoch_batches: Callable[[], Iterable[Sequence[int]]],
        retired: Callable[[], Collection[str]],
        immediate: bool,
    ) -> None:
        self.question_ids = question_ids
        self.questions_per_step = int(questions_per_step)
        self.epoch_batches = epoch_batches
        self.retired = retired
        self.filter = FreshPromptFilter(immediate=immediate)
        self.leftover_rows: deque[int] = deque()
        self.loader_epoch = 0
        self._batches: Iterator[Sequence[int]] | None = None

    def _next_loader_rows(self) -> list[int]:
        """Row numbers of the next data-loader batch; a new epoch starts when one is exhausted."""
        for _ in range(2):
            if self._batches is None:
                self._batches = iter(self.epoch_batches())
            try:
                return [int(r) for r in next(self._batches)]
            except StopIteration:
                self._batches = None
                self.loader_epoch += 1
                self.filter.on_epoch_boundary(len(self.question_ids), self.questions_per_step, self.retired())
        raise RuntimeError("the training data loader yields no batch: is data.train_files empty after filtering?")

    def take(self, n: int, exclude: Collection[str], metrics: dict) -> list[int]:
        """``n`` fresh prompt rows: leftovers first, then the data loader. Nothing is silently dropped: unused rows
        stay in ``leftover_rows`` (and in the checkpoint); retired questions are skipped and counted."""
        rows, deferred, skipped_retired = [], [], 0
        chosen: set[str] = set()
        qids = self.question_ids
        retired = self.retired()
        guard = 0
        while len(rows) < n:
            if not self.leftover_rows:
                self.leftover_rows.extend(self._next_loader_rows())
                guard += 1
                if guard > 4 * (len(qids) // max(1, self.questions_per_step) + 2):
                    raise RuntimeError(
                        "could not find enough fresh prompts that are neither retired nor replayed this step: "
                        f"{len(retired)} of {len(qids)} questions are retired"
                    )
            row = self.leftover_rows.popleft()
            qid = qids[row]
            if self.filter.skips(qid, retired):
                skipped_retired += 1
            elif qid in exclude or qid in chosen:
                deferred.append(row)  # replayed this step (or a duplicate draw): keep it for a later step
            else:
                rows.append(row)
                chosen.add(qid)
        self.leftover_rows.extendleft(reversed(deferred))
        metrics["exgrpo/fresh_skipped_retired"] = skipped_retired
        metrics["exgrpo/fresh_removed_retired"] = self.filter.num_removed(retired)
        metrics["exgrpo/leftover_prompts"] = len(self.leftover_rows)
        return rows

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (the data loader's own position is the trainer's)."""
        return {
            "leftover_rows": list(self.leftover_rows),
            "loader_epoch": self.loader_epoch,
            "fresh_filter": self.filter.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.leftover_rows = deque(int(r) for r in state.get("leftover_rows", []))
        self.loader_epoch = int(state.get("loader_epoch", 0))
        self.filter.load_state_dict(state.get("fresh_filter"))
