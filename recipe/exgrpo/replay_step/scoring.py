"""Scoring the rows of a step: the replayed members' rewards, the prompt a reward function reads, and the reward
mode's figures of a step. The replay step (``step.py``) calls these; the reward mode (``exgrpo.modes``) does the
bucketing and says which figures it logs.

Rewards come from the trainer's reward loop (verl's, through the adapter's backend, ``ReplayBackend.score``) either
way:

* a discriminative reward model (``reward.reward_model.enable=true``, ``model_path``, its own vLLM/SGLang rollout,
  with ``reward.custom_reward_function.path`` left null so that verl's loop sends every response to the model).
  In its own resource pool (``reward.reward_model.enable_resource_pool=true``) verl scores each response inside
  the agent loop as it is generated; colocated with the actor it cannot (the rollout holds the GPUs), and the replay
  step has the backend score the generated rows after the rollout went to sleep, as verl's own trainer does;
* a reward function (``reward.custom_reward_function``) returning real values, e.g. partial credit.

The replayed member's reward (``exgrpo.replay_reward``): ``rescore`` sends it through the same path as every other
member (``ReplayStep``: the backend's ``score``, verl's ``compute_rm_score``, which reaches the reward model or the
function); ``stored`` puts the reward recorded with the trajectory at collection into its row
(:func:`set_stored_replay_rewards`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from recipe.exgrpo.replay_step.fields import IS_REPLAY_KEY
from recipe.exgrpo.replay_step.rows import Rows

__all__ = [
    "PROMPT_FIELDS_KEY",
    "mode_reward_metrics",
    "set_stored_replay_rewards",
    "with_prompt_for_reward_functions",
]

#: The per-row fields verl's reward manager merges into the ``extra_info`` it hands a reward function
#: (``NaiveRewardManager.run_single``): the agent loop's extra fields for a generated response, ``raw_prompt`` (the
#: conversation) among them.
PROMPT_FIELDS_KEY = "tool_extra_fields"


def with_prompt_for_reward_functions(data: Rows) -> Rows:
    """``data`` (rows the trainer scores through verl's reward loop itself) with the prompt's conversation where a
    reward function finds it for a generated response: ``raw_prompt`` in the fields verl merges into ``extra_info``.

    verl passes a reward function ``extra_info`` but not the prompt; for a response scored while it is generated, its
    manager merges the agent loop's extra fields (``raw_prompt`` among them) into ``extra_info``. Rows the trainer
    scores (the replayed members, and every row with a colocated reward model) carry ``raw_prompt`` but not those
    fields, so a reward function that needs the prompt (``recipe/exgrpo/reward_model_client.py``) would not see it.
    A shallow copy: the batch's own columns (and ``extra_info`` dicts, which verl's manager updates) are untouched.
    """
    prompts = data.columns.get("raw_prompt")
    if prompts is None or PROMPT_FIELDS_KEY in data.columns:
        return data
    fields = np.empty(len(data), dtype=object)
    fields[:] = [{"raw_prompt": p} for p in prompts]
    non_tensor = {**data.columns, PROMPT_FIELDS_KEY: fields}
    if "extra_info" in non_tensor:
        copies = np.empty(len(data), dtype=object)
        copies[:] = [dict(e) if isinstance(e, dict) else e for e in non_tensor["extra_info"]]
        non_tensor["extra_info"] = copies
    return Rows(data.tensors, non_tensor, dict(data.meta))


def set_stored_replay_rewards(batch: Rows, rewards: Sequence[float]) -> None:
    """``exgrpo.replay_reward=stored``: the replayed rows (in batch order, one per selected trajectory) get the
    reward stored with their trajectory, at the last response token as verl places a score.

    The reward's extra keys of those rows (copied from a generated sibling when the row was built) would describe
    another response: numeric ones become NaN, others None.
    """
    rows = torch.nonzero(batch.tensors[IS_REPLAY_KEY]).flatten()
    if len(rows) != len(rewards):
        raise ValueError(f"{len(rewards)} stored rewards for {len(rows)} replayed rows")
    if not len(rows):
        return
    prompt_len = batch.tensors["prompts"].shape[1]
    scores = batch.tensors["rm_scores"]
    last = batch.tensors["attention_mask"][rows, prompt_len:].sum(-1) - 1
    scores[rows] = 0
    scores[rows, last] = torch.as_tensor(list(rewards), dtype=scores.dtype)
    for key in batch.meta.get("reward_extra_keys", []):
        column = batch.columns.get(key)
        if column is None:
            continue
        idx = rows.numpy()
        if np.issubdtype(column.dtype, np.number):
            column = column.astype(np.float64)
            column[idx] = np.nan
        else:
            column = column.astype(object)
            column[idx] = None
        batch.columns[key] = column


def mode_reward_metrics(
    mode: Any, scores: np.ndarray, batch: Rows, reward_extra_infos: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """The reward mode's figures of one step (``RewardMode.reward_metrics``: the continuous mode's
    ``exgrpo/reward/...``; none in the binary mode), from the batch's replayed rows and groups."""
    replayed = batch.tensors[IS_REPLAY_KEY].bool().numpy()
    return mode.reward_metrics(scores, replayed, batch.columns["uid"], reward_extra_infos)
