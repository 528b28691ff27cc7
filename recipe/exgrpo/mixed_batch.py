"""Building ExGRPO's mixed batches out of verl ``DataProto`` objects (ALGORITHM.md §5–6).

Pure tensor plumbing, no Ray: the trainer calls these, and tests drive them with hand-made ``DataProto``s.

- ``generation_counts``: K rollouts per fresh question, K−1 per replayed one (nothing wasted on the stored
  trajectory, unlike the released code).
- ``build_replay_members``: the replayed member of each replay group, made from a fresh member of the same
  group (same uid, prompt tokens and reward metadata) with the stored response ids and behaviour log-probs.
- ``mark_replay_groups``: flags the rows of every replay group (the experience term of paper Eq. 4) and
  records the step's ρ, for ``exgrpo.weight_terms_by_ratio``.
- ``build_candidate_batch``: the rows of the entropy pass (batched by
  ``exgrpo.experience.selection.batch_by_token_budget``) that picks which stored
  trajectory a replayed question contributes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from exgrpo.advantage import experience_group_rows

IS_REPLAY_KEY = "exgrpo_is_replay"
BEHAVIOUR_LOG_PROBS_KEY = "exgrpo_behaviour_log_probs"
# per-row copies of step-wide values, so that every micro-batch of the actor update carries them
MIXED_KEY = "exgrpo_mixed"
RATIO_KEY = "exgrpo_replay_ratio"
# the row's group (uid) holds a replayed member: the experience term of paper Eq. 4 (weight_terms_by_ratio)
EXPERIENCE_GROUP_KEY = "exgrpo_experience_group"


def generation_counts(num_fresh: int, num_replay: int, k: int) -> np.ndarray:
    """Samples to generate per prompt row: fresh prompts first (K each), then replayed ones (K−1 each)."""
    if k < 2:
        raise ValueError(f"actor_rollout_ref.rollout.n (K) must be >= 2 for group-relative advantages, got {k}")
    return np.asarray([k] * num_fresh + [k - 1] * num_replay, dtype=np.int64)


def mark_fresh(batch: DataProto) -> None:
    """Add the ExGRPO per-row fields to fresh rows: not replayed, behaviour log-probs unused (zeros)."""
    n, resp_len = batch.batch["responses"].shape
    batch.batch[IS_REPLAY_KEY] = torch.zeros(n, dtype=torch.bool)
    batch.batch[BEHAVIOUR_LOG_PROBS_KEY] = torch.zeros(n, resp_len, dtype=torch.float32)


def mark_replay_groups(batch: DataProto, replay_ratio: float) -> None:
    """Add the per-row fields of the explicit Eq. 4 term weights (``exgrpo.weight_terms_by_ratio``).

    ``EXPERIENCE_GROUP_KEY``: True on every row whose group (same uid) holds a replayed member, i.e. the
    replayed trajectory *and* its K−1 fresh siblings; ``RATIO_KEY``: ρ of this step (the scheduled ratio, 0
    before mixed mode). Call it once the replayed members are appended; later row reordering (balance_batch)
    keeps the flags aligned because they are per-row tensors.
    """
    if not 0.0 <= replay_ratio <= 1.0:
        raise ValueError(f"replay_ratio must be in [0, 1], got {replay_ratio}")
    n = len(batch)
    is_replay = batch.batch[IS_REPLAY_KEY].bool().cpu().numpy()
    rows = experience_group_rows(batch.non_tensor_batch["uid"], is_replay)
    batch.batch[EXPERIENCE_GROUP_KEY] = torch.as_tensor(rows, dtype=torch.bool)
    batch.batch[RATIO_KEY] = torch.full((n,), float(replay_ratio), dtype=torch.float32)


def _right_pad(seqs: Sequence[np.ndarray], length: int, pad_value, dtype) -> torch.Tensor:
    out = torch.full((len(seqs), length), pad_value, dtype=dtype)
    for i, s in enumerate(seqs):
        if len(s) > length:
            raise ValueError(f"stored response of {len(s)} tokens exceeds the response length {length}")
        out[i, : len(s)] = torch.as_tensor(np.asarray(s), dtype=dtype)
    return out


def _left_pad(seqs: Sequence[np.ndarray], length: int, pad_value, dtype) -> torch.Tensor:
    out = torch.full((len(seqs), length), pad_value, dtype=dtype)
    for i, s in enumerate(seqs):
        if len(s):
            out[i, length - len(s) :] = torch.as_tensor(np.asarray(s), dtype=dtype)
    return out


def build_replay_members(
    template: DataProto,
    response_ids: Sequence[np.ndarray],
    behaviour_log_probs: Sequence[np.ndarray],
    pad_token_id: int,
) -> DataProto:
    """The replayed members, one per row of ``template``.

    ``template`` holds one generated member of each replay group (after ``batch.union(gen_output)``): its
    prompt tokens, uid, data source, ground truth and every other per-row field are copied, then the response
    is replaced by the stored one. The reward (``rm_scores``) is zeroed here: the caller re-scores the replayed
    members with the reward function like any other member (ALGORITHM.md §6).
    """
    n = len(template)
    if not (n == len(response_ids) == len(behaviour_log_probs)):
        raise ValueError(
            f"replay members: {n} template rows, {len(response_ids)} responses, "
            f"{len(behaviour_log_probs)} behaviour log-prob rows; they must match"
        )
    src = template.batch
    prompts = src["prompts"]
    resp_len = src["responses"].shape[1]
    if src["position_ids"].dim() != 2:
        raise ValueError("ExGRPO replay supports text models only (position_ids must be [batch, seq_len])")
    for i, (ids, lp) in enumerate(zip(response_ids, behaviour_log_probs)):
        if len(ids) != len(lp):
            raise ValueError(f"replay member {i}: {len(ids)} response tokens but {len(lp)} behaviour log-probs")

    responses = _right_pad(response_ids, resp_len, pad_token_id, prompts.dtype)
    response_mask = _right_pad([np.ones(len(s), dtype=np.int64) for s in response_ids], resp_len, 0, torch.int64)
    prompt_attention = src["attention_mask"][:, : prompts.shape[1]]
    attention_mask = torch.cat([prompt_attention, response_mask.to(prompt_attention.dtype)], dim=1)
    behaviour = _right_pad(behaviour_log_probs, resp_len, 0.0, torch.float32)

    out = DataProto(
        batch=src.clone(),
        non_tensor_batch={k: v.copy() for k, v in template.non_tensor_batch.items()},
        meta_info=dict(template.meta_info),
    )
    b = out.batch
    b["responses"] = responses
    b["response_mask"] = response_mask.to(src["response_mask"].dtype)
    b["input_ids"] = torch.cat([prompts, responses], dim=1)
    b["attention_mask"] = attention_mask
    b["position_ids"] = compute_position_id_with_mask(attention_mask).to(src["position_ids"].dtype)
    if "rollout_log_probs" in b.keys():
        b["rollout_log_probs"] = behaviour.clone()
    if "rm_scores" in b.keys():
        b["rm_scores"] = torch.zeros_like(b["rm_scores"])
    b[IS_REPLAY_KEY] = torch.ones(n, dtype=torch.bool)
    b[BEHAVIOUR_LOG_PROBS_KEY] = behaviour
    return out


def build_candidate_batch(
    prompt_ids: Sequence[np.ndarray], response_ids: Sequence[np.ndarray], pad_token_id: int
) -> DataProto:
    """Rows (left-padded prompt + right-padded response) whose per-token entropy the actor computes."""
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts for {len(response_ids)} candidate responses")
    p_len = max(1, max(len(p) for p in prompt_ids))
    r_len = max(1, max(len(r) for r in response_ids))
    prompts = _left_pad(prompt_ids, p_len, pad_token_id, torch.int64)
    prompt_mask = _left_pad([np.ones(len(p), dtype=np.int64) for p in prompt_ids], p_len, 0, torch.int64)
    responses = _right_pad(response_ids, r_len, pad_token_id, torch.int64)
    response_mask = _right_pad([np.ones(len(r), dtype=np.int64) for r in response_ids], r_len, 0, torch.int64)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_id_with_mask(attention_mask),
    }
    return DataProto.from_single_dict(batch)
