"""verl dataset for ExGRPO: verl's ``RLHFDataset`` plus a stable question id and the dataset row.

The experience pool is keyed by a question id that must stay the same across epochs, restarts and
machines (docs/algorithm.md §2). The preprocessing commands write it to ``extra_info.question_id``; for a
parquet that lacks it, the id is the SHA-1 of the prompt messages, so it is still stable.
The dataset row lets the trainer fetch a replayed question's prompt and reward metadata again, and
lets leftover fresh prompts be checkpointed as row numbers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset

from recipe.exgrpo.replay_step.fields import QUESTION_ID_KEY, ROW_KEY

__all__ = ["QUESTION_ID_KEY", "ROW_KEY", "ExGRPODataset", "question_id_of"]


def question_id_of(extra_info: Any, prompt: Any) -> str:
    """The stable question id of one dataset row: ``extra_info.question_id`` or a hash of the prompt."""
    if isinstance(extra_info, dict):
        qid = extra_info.get("question_id")
        if qid is not None and str(qid) != "":
            return str(qid)
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    blob = json.dumps(prompt, sort_keys=True, ensure_ascii=False, default=str)
    return "sha1:" + hashlib.sha1(blob.encode("utf-8")).hexdigest()


class ExGRPODataset(RLHFDataset):
    """``RLHFDataset`` whose items also carry ``exgrpo_question_id`` and ``exgrpo_row``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._question_ids: list[str] | None = None

    @property
    def question_ids(self) -> list[str]:
        """Question id of every row, computed once (column reads, no chat templating)."""
        if self._question_ids is None:
            columns = self.dataframe.column_names
            extra = self.dataframe["extra_info"] if "extra_info" in columns else [None] * len(self.dataframe)
            prompts = self.dataframe[self.prompt_key]
            ids = [question_id_of(e, p) for e, p in zip(extra, prompts)]
            seen: dict[str, int] = {}
            dupes = []
            for row, qid in enumerate(ids):
                if qid in seen:
                    dupes.append((qid, seen[qid], row))
                seen[qid] = row
            if dupes:
                shown = ", ".join(f"{q!r} (rows {a} and {b})" for q, a, b in dupes[:5])
                raise ValueError(
                    f"the training data has {len(dupes)} duplicate question ids, e.g. {shown}; the experience pool "
                    "needs one row per question: deduplicate it (data_preprocess/openr1_math.py does)"
                )
            self._question_ids = ids
        return self._question_ids

    def row_of(self) -> dict[str, int]:
        return {qid: row for row, qid in enumerate(self.question_ids)}

    def __getitem__(self, item):
        row_dict = super().__getitem__(item)
        row_dict[QUESTION_ID_KEY] = self.question_ids[int(item)]
        row_dict[ROW_KEY] = int(item)
        return row_dict
