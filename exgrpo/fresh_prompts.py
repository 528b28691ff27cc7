"""Which retired questions leave the fresh prompt stream, and when (``exgrpo.retire_fresh_prompts``).

A retired question (solved K/K) is never replayed again. Whether it is still drawn as a *fresh* question:

* ``retire_fresh_prompts: true`` (OUR CHOICE, default): no, from the step after its retirement.
* ``retire_fresh_prompts: false`` (the released code): the release removes retired questions from its training
  data set at the next epoch boundary, and only while the data set still holds more than B + 20 questions
  (B = questions per step), so that an epoch keeps enough questions for a full batch. Until that boundary the
  question is drawn as usual; a data set at or below B + 20 questions keeps everything from then on.

:class:`FreshPromptFilter` is that decision as a small state machine the trainer asks once per epoch boundary
and once per drawn row. Its state (the questions removed so far) goes into the checkpoint. A question that the
"retired questions re-added" ablation un-retires is drawn again at once in both modes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

__all__ = ["RELEASED_REMOVAL_MARGIN", "FreshPromptFilter"]

#: The released code removes retired questions at an epoch boundary only while the data set has more than
#: B + RELEASED_REMOVAL_MARGIN questions.
RELEASED_REMOVAL_MARGIN = 20


class FreshPromptFilter:
    """Skips retired questions in the fresh prompt stream, at once (``immediate``) or from epoch boundaries."""

    def __init__(self, immediate: bool, margin: int = RELEASED_REMOVAL_MARGIN):
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.immediate = bool(immediate)
        self.margin = int(margin)
        self.removed: set[Any] = set()  # questions taken out of the stream at a boundary (released mode)

    def on_epoch_boundary(self, num_questions: int, batch_size: int, retired: Iterable[Any]) -> int:
        """A new epoch of the data loader begins; returns how many questions were removed now.

        ``num_questions`` is the size of the training data set, ``retired`` the questions retired so far. The
        data set as the release sees it holds ``num_questions`` minus those removed at earlier boundaries (and
        still retired); when that is more than ``batch_size + margin``, every retired question leaves it.
        """
        if self.immediate:
            return 0
        retired = set(retired)
        self.removed &= retired  # un-retired (re-added) questions are back in the data set
        if num_questions - len(self.removed) <= batch_size + self.margin:
            return 0
        before = len(self.removed)
        self.removed |= retired
        return len(self.removed) - before

    def skips(self, question_id: Any, retired: Collection[Any]) -> bool:
        """Whether a fresh row of ``question_id`` is skipped now (``retired``: the current retired set)."""
        if question_id not in retired:
            return False
        return self.immediate or question_id in self.removed

    def num_removed(self, retired: Collection[Any]) -> int:
        """Questions currently out of the stream in released mode (removed and still retired)."""
        return sum(1 for q in self.removed if q in retired)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"immediate": self.immediate, "margin": self.margin, "removed": sorted(self.removed, key=str)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the removed set (a checkpoint without this state, or one from the other mode, removes none)."""
        self.removed = set(state.get("removed", ())) if state else set()
