"""The verl side of the continuous reward mode (docs/algorithm.md §13): reward-model scores, stored replay rewards,
the reward's metrics. ``RayExGRPOTrainer`` calls these from its stages; the core (``exgrpo.experience.continuous``)
does the bucketing.

Rewards come from verl 0.9.1's reward loop either way:

* a discriminative reward model (``reward.reward_model.enable=true``, ``model_path``, its own vLLM/SGLang rollout,
  with ``reward.custom_reward_function.path`` left null so that verl's loop sends every response to the model).
  In its own resource pool (``reward.reward_model.enable_resource_pool=true``) verl scores each response inside
  the agent loop as it is generated; colocated with the actor it cannot (the rollout holds the GPUs), and
  :func:`score_with_colocated_reward_model` scores the generated rows after the rollout went to sleep, as verl's
  own trainer does;
* a reward function (``reward.custom_reward_function``) returning real values, e.g. partial credit.

The replayed member's reward (``exgrpo.replay_reward``): ``rescore`` sends it through the same path as every other
member (``RayExGRPOTrainer._score_replayed_members``: the reward loop's ``compute_rm_score``, which reaches the
reward model or the function); ``stored`` puts the reward recorded with the trajectory at collection into its row
(:func:`set_stored_replay_rewards`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.utils.debug import marked_timer

from recipe.exgrpo.mixed_batch import IS_REPLAY_KEY

__all__ = [
    "continuous_reward_metrics",
    "reward_model_colocated",
    "score_with_colocated_reward_model",
    "set_stored_replay_rewards",
]


def reward_model_colocated(config: Any) -> bool:
    """A reward model is on and shares the actor's GPUs (so verl's agent loop does not score the responses)."""
    enable = OmegaConf.select(config, "reward.reward_model.enable", default=False)
    own_pool = OmegaConf.select(config, "reward.reward_model.enable_resource_pool", default=False)
    return bool(enable) and not bool(own_pool)


def score_with_colocated_reward_model(trainer: Any, batch: DataProto, timing_raw: dict) -> DataProto:
    """``batch`` with ``rm_scores`` (and the reward's extra keys) from a colocated reward model, when it has none.

    Called once the rollout replicas sleep (``generate_with_counts`` put them to sleep): the reward model's own
    replicas wake up, score every row and sleep again inside verl's ``RewardLoopManager.compute_rm_score``.
    Nothing happens without a colocated reward model, or when the rows already carry scores.
    """
    if not reward_model_colocated(trainer.config) or "rm_scores" in batch.batch.keys():
        return batch
    with marked_timer("reward_model", timing_raw, color="yellow"):
        scored = trainer.reward_loop_manager.compute_rm_score(batch)
    return batch.union(scored)


def set_stored_replay_rewards(batch: DataProto, rewards: Sequence[float]) -> None:
    """``exgrpo.replay_reward=stored``: the replayed rows (in batch order, one per selected trajectory) get the
    reward stored with their trajectory, at the last response token as verl places a score.

    The reward's extra keys of those rows (copied from a generated sibling when the row was built) would describe
    another response: numeric ones become NaN, others None.
    """
    rows = torch.nonzero(batch.batch[IS_REPLAY_KEY]).flatten()
    if len(rows) != len(rewards):
        raise ValueError(f"{len(rewards)} stored rewards for {len(rows)} replayed rows")
    if not len(rows):
        return
    prompt_len = batch.batch["prompts"].shape[1]
    scores = batch.batch["rm_scores"]
    last = batch.batch["attention_mask"][rows, prompt_len:].sum(-1) - 1
    scores[rows] = 0
    scores[rows, last] = torch.as_tensor(list(rewards), dtype=scores.dtype)
    for key in batch.meta_info.get("reward_extra_keys", []):
        column = batch.non_tensor_batch.get(key)
        if column is None:
            continue
        idx = rows.numpy()
        if np.issubdtype(column.dtype, np.number):
            column = column.astype(np.float64)
            column[idx] = np.nan
        else:
            column = column.astype(object)
            column[idx] = None
        batch.non_tensor_batch[key] = column


def _numeric(values: Any) -> np.ndarray | None:
    """A 1-D column of numbers (None counts as NaN) as float64; None for anything else (text, lists, bools)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        return None
    if arr.dtype.kind in "iuf":
        return arr.astype(np.float64)
    if arr.dtype == object and all(
        v is None or (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)) for v in arr
    ):
        return np.asarray([np.nan if v is None else float(v) for v in arr], dtype=np.float64)
    return None


def continuous_reward_metrics(
    scores: np.ndarray, batch: DataProto, reward_extra_infos: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """The reward's figures per step in continuous mode (``exgrpo/reward/...``), like ``reward_health``:

    the batch mean reward (all rows: the delayed start's signal), the generated responses' mean / std / min / max,
    the replayed members' mean, the mean and largest within-group standard deviation and the share of flat groups
    (std 0: no gradient), and the mean over generated rows of every numeric extra key the reward returned
    (``exgrpo/reward/extra/<key>``).
    """
    scores = np.asarray(scores, dtype=np.float64)
    replayed = batch.batch[IS_REPLAY_KEY].bool().numpy()
    generated = scores[~replayed]
    out = {"exgrpo/batch_mean_reward": float(scores.mean()) if scores.size else float("nan")}
    if generated.size:
        out.update(
            {
                "exgrpo/reward/mean": float(generated.mean()),
                "exgrpo/reward/std": float(generated.std()),
                "exgrpo/reward/min": float(generated.min()),
                "exgrpo/reward/max": float(generated.max()),
            }
        )
    if replayed.any():
        out["exgrpo/reward/replayed_mean"] = float(scores[replayed].mean())
    uids = batch.non_tensor_batch["uid"]
    stds = np.asarray([scores[uids == u].std() for u in dict.fromkeys(uids.tolist())], dtype=np.float64)
    if stds.size:
        out["exgrpo/reward/group_std_mean"] = float(stds.mean())
        out["exgrpo/reward/group_std_max"] = float(stds.max())
        out["exgrpo/reward/flat_group_share"] = float((stds == 0).mean())
    for key, values in (reward_extra_infos or {}).items():
        arr = _numeric(values)
        if arr is None or arr.shape[0] != scores.shape[0]:
            continue
        arr = arr[~replayed]
        if arr.size and np.isfinite(arr).any():
            out[f"exgrpo/reward/extra/{key}"] = float(np.nanmean(arr))
    return out
