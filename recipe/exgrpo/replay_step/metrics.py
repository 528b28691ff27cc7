"""The replay step's figures of a step's rows (docs/trainer.md, "Metrics"): replay groups, the rollout/actor log-prob
agreement (the weight sync's health), the pass rate of the generated rows, the reward's health, the tool turns."""

from __future__ import annotations

import numpy as np
import torch

from recipe.exgrpo.replay_step.fields import IS_REPLAY_KEY
from recipe.exgrpo.replay_step.rows import Rows

__all__ = [
    "replay_group_metrics",
    "reward_health",
    "rollout_actor_agreement",
    "rows_with_tool_turn",
    "sampled_pass_rate",
    "tool_turn_metrics",
]


def replay_group_metrics(batch: Rows) -> dict[str, float]:
    """Members per replay group (K: the stored trajectory plus K−1 fresh rollouts) and replayed rows."""
    uids = batch.columns["uid"]
    is_replay = batch.tensors[IS_REPLAY_KEY].numpy().astype(bool)
    replay_uids = set(uids[is_replay].tolist())
    sizes = [int((uids == u).sum()) for u in replay_uids]
    return {
        "exgrpo/replayed_rows": float(is_replay.sum()),
        "exgrpo/replay_group_size_min": float(min(sizes)) if sizes else 0.0,
        "exgrpo/replay_group_size_max": float(max(sizes)) if sizes else 0.0,
    }


def rollout_actor_agreement(batch: Rows, first_diff_mean: float | None = None) -> dict[str, float]:
    """How closely the rollout's sampling log-probs match the actor's recomputed old log-probs, on generated rows.

    Both come from the same weights when the weight sync works, so the gap is numerical noise: |Δ| ~1e-6 in
    float32 on CPU, but ~1e-2 on average with maxima above 1 for a bf16 vLLM rollout against a bf16 FSDP actor, more
    than one update at lr 1e-6 moves a log-prob. So beside the gap itself (``diff_mean``, ``diff_max``):

    - ``log_prob_pearson``: Pearson correlation of the two log-prob vectors. Noise keeps it at the top of its range
      (the log-probs of a step span several nats, the noise ~1e-2); weights that are not the actor's (a broken or
      partial load) pull it down at once.
    - ``diff_mean_vs_first``: this step's mean gap over the first measured step's (``first_diff_mean``). At that
      step rollout and actor hold the same weights (both loaded before any update), so its gap is the noise floor
      of this run's hardware and numerics. Noise keeps the ratio near 1; a rollout left on stale weights drifts
      further from the actor with every update, so the ratio climbs step after step.

    Replayed rows are left out: their "rollout" log-probs are the stored behaviour log-probs of a past policy.
    """
    if "rollout_log_probs" not in batch.tensors.keys() or "old_log_probs" not in batch.tensors.keys():
        return {}
    mask = batch.tensors["response_mask"].bool()
    if IS_REPLAY_KEY in batch.tensors.keys():
        mask = mask & ~batch.tensors[IS_REPLAY_KEY].bool().unsqueeze(-1)
    if not bool(mask.any()):
        return {}
    rollout = batch.tensors["rollout_log_probs"].double()[mask]
    actor = batch.tensors["old_log_probs"].double()[mask]
    diff = (rollout - actor).abs()
    out = {
        "exgrpo/rollout_actor_log_prob_diff_mean": float(diff.mean()),
        "exgrpo/rollout_actor_log_prob_diff_max": float(diff.max()),
    }
    if rollout.numel() > 1 and float(rollout.std()) > 0 and float(actor.std()) > 0:
        out["exgrpo/rollout_actor_log_prob_pearson"] = float(torch.corrcoef(torch.stack([rollout, actor]))[0, 1])
    if first_diff_mean is not None and first_diff_mean > 0:
        out["exgrpo/rollout_actor_log_prob_diff_mean_vs_first"] = float(diff.mean()) / first_diff_mean
    return out


def sampled_pass_rate(scores: np.ndarray, batch: Rows) -> float:
    """Pass rate of the responses generated this step: replayed members (stored correct answers) left out."""
    generated = ~batch.tensors[IS_REPLAY_KEY].bool().numpy()
    return float((scores[generated] >= 1.0).mean()) if generated.any() else float("nan")


def reward_health(reward_extra_infos: dict) -> dict[str, float]:
    """How the reward behaved this step, from the extra keys of the recipe's reward (recipe/exgrpo/reward.py):
    the share of responses whose grading errored or timed out, and the seconds a grading call waited for a free
    grader process (mean, max). Keys a custom reward does not return are left out."""
    out: dict[str, float] = {}
    for key, name in (("reward_error", "error_rate"), ("reward_timeout", "timeout_rate")):
        if key in reward_extra_infos and len(reward_extra_infos[key]):
            # NaN on replayed rows whose stored reward was reused (exgrpo.replay_reward=stored): not graded
            out[f"exgrpo/reward/{name}"] = float(np.nanmean(np.asarray(reward_extra_infos[key], dtype=float)))
    if "reward_queue_s" in reward_extra_infos and len(reward_extra_infos["reward_queue_s"]):
        queue = np.asarray(reward_extra_infos["reward_queue_s"], dtype=float)
        out["exgrpo/reward/queue_s_mean"] = float(queue.mean())
        out["exgrpo/reward/queue_s_max"] = float(queue.max())
    return out


def rows_with_tool_turn(masks: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row of a ``(rows, width)`` response mask and its responses' ``lengths`` (attended tokens: the model's turns
    and the tool's answers; the padding after them is not): whether the response holds a tool's answer, i.e. a
    context token (mask 0) within its length besides its model tokens (mask 1). An exchange cut inside the tool's
    answer (no model token after it) has one; the padding alone never makes one, and neither does a row without a
    model token. The mask alone cannot tell a cut tool answer from padding: both are zeros after the last 1."""
    m = np.asarray(masks, dtype=bool)
    if m.ndim != 2:
        raise ValueError(f"masks must be (rows, width), got shape {m.shape}")
    lengths = np.asarray(lengths).reshape(-1)
    if lengths.shape[0] != m.shape[0]:
        raise ValueError(f"{lengths.shape[0]} lengths for {m.shape[0]} rows")
    within = np.arange(m.shape[1])[None, :] < lengths[:, None]
    return m.any(axis=1) & (~m & within).any(axis=1)


def tool_turn_metrics(
    scores: np.ndarray, masks: np.ndarray, generated: np.ndarray, lengths: np.ndarray
) -> dict[str, float]:
    """How this step's responses used tools: of those generated, the share that got a tool's answer
    (``exgrpo/multi_turn/tool_turn_share``) and the mean reward of those with one and of those without
    (``reward_with_tool_turn``, ``reward_without_tool_turn``; in the binary mode their pass rates), so a run shows
    whether calling pays and whether the policy calls more; of the replayed members, the share that hold a tool turn
    (``replayed_tool_turn_share``). ``masks``: the rows' response masks (model tokens 1); ``lengths``: their
    responses' lengths (``batch.response_lengths``), which tell a tool answer at the end from the padding."""
    generated = np.asarray(generated, dtype=bool)
    holds = rows_with_tool_turn(masks, lengths)
    out = {}
    if (~generated).any():
        out["exgrpo/multi_turn/replayed_tool_turn_share"] = float(holds[~generated].mean())
    scores = np.asarray(scores, dtype=np.float64)[generated]
    with_tool = holds[generated]
    if not len(with_tool):
        return out
    out["exgrpo/multi_turn/tool_turn_share"] = float(with_tool.mean())
    if with_tool.any():
        out["exgrpo/multi_turn/reward_with_tool_turn"] = float(scores[with_tool].mean())
    if (~with_tool).any():
        out["exgrpo/multi_turn/reward_without_tool_turn"] = float(scores[~with_tool].mean())
    return out
