"""Building ExGRPO's mixed batches out of a step's :class:`~recipe.exgrpo.replay_step.rows.Rows` (docs/algorithm.md
§5–6).

Pure tensor plumbing, no trainer and no verl: the replay step calls these, and tests drive them with hand-made rows.

- ``generation_counts``: K rollouts per fresh question, K−1 per replayed one (nothing wasted on the stored
  trajectory, unlike the released code).
- ``build_replay_members``: replayed-member rows of replay groups, made from a generated member of the same
  group (same uid, prompt tokens and reward metadata) with the stored response ids, loss mask and behaviour
  log-probs (a multi-turn trajectory: the model's turns and the tool outputs, the mask 0 on the latter).
- ``append_candidates``: every candidate trajectory of every replayed question as such a row, appended to the
  generated rows, so that ONE old-log-prob pass gives both the old log-probs of the step and the per-token
  entropies that select the replayed trajectory (``candidate_token_stats``); ``keep_selected`` then drops the
  candidates that were not selected.
- ``mark_replay_groups``: flags the rows of every replay group (the experience term of paper Eq. 4) and
  records the step's ρ, for ``exgrpo.weight_terms_by_ratio``.
- ``collection_groups``: the step's groups as the core's collection takes them (docs/algorithm.md §3): each
  member's whole response after the prompt (tool outputs included), its loss mask and its behaviour log-probs.
- ``replayed_row_digests``: what each replayed row carries (tokens, mask), for the step's trace.

A response's length is its attention mask's count over the response columns, not its ``response_mask``'s: in a
multi-turn row the mask is 0 on the tool outputs between the model's turns (docs/algorithm.md, "Multi-turn").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch

from exgrpo.advantage import experience_group_rows
from exgrpo.experience import masks
from exgrpo.experience.experience_pool import Candidate, GroupMember
from exgrpo.experience.selection import CandidateTokenStats, SelectedTrajectory
from recipe.exgrpo.replay_step.fields import (
    BEHAVIOUR_LOG_PROBS_KEY,
    CANDIDATE_KEY,
    ENTROPY_KEY,
    EXPERIENCE_GROUP_KEY,
    IS_REPLAY_KEY,
    NUM_TURNS_KEY,
    QUESTION_ID_KEY,
    RATIO_KEY,
    TRAJECTORY_RECORD_KEYS,
)
from recipe.exgrpo.replay_step.rows import Rows


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of a left-padded row: the attended tokens count from 0, the padding before them is 0 (as verl's
    ``compute_position_id_with_mask``)."""
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0, max=None)


def generation_counts(num_fresh: int, num_replay: int, k: int) -> np.ndarray:
    """Samples to generate per prompt row: fresh prompts first (K each), then replayed ones (K−1 each)."""
    if k < 2:
        raise ValueError(f"actor_rollout_ref.rollout.n (K) must be >= 2 for group-relative advantages, got {k}")
    return np.asarray([k] * num_fresh + [k - 1] * num_replay, dtype=np.int64)


def mark_fresh(batch: Rows) -> None:
    """Add the ExGRPO per-row fields to fresh rows: not replayed, behaviour log-probs unused (zeros)."""
    n, resp_len = batch.tensors["responses"].shape
    batch.tensors[IS_REPLAY_KEY] = torch.zeros(n, dtype=torch.bool)
    batch.tensors[BEHAVIOUR_LOG_PROBS_KEY] = torch.zeros(n, resp_len, dtype=torch.float32)


def mark_replay_groups(batch: Rows, replay_ratio: float) -> None:
    """Add the per-row fields of the explicit Eq. 4 term weights (``exgrpo.weight_terms_by_ratio``).

    ``EXPERIENCE_GROUP_KEY``: True on every row whose group (same uid) holds a replayed member, i.e. the
    replayed trajectory *and* its K−1 fresh siblings; ``RATIO_KEY``: ρ of this step (the scheduled ratio, 0
    before mixed mode; validated with the config at start-up). Call it once the replayed members are appended;
    later row reordering (balance_batch) keeps the flags aligned because they are per-row tensors.
    """
    n = len(batch)
    is_replay = batch.tensors[IS_REPLAY_KEY].bool().cpu().numpy()
    rows = experience_group_rows(batch.columns["uid"], is_replay)
    batch.tensors[EXPERIENCE_GROUP_KEY] = torch.as_tensor(rows, dtype=torch.bool)
    batch.tensors[RATIO_KEY] = torch.full((n,), float(replay_ratio), dtype=torch.float32)


def response_lengths(batch: Rows) -> torch.Tensor:
    """Tokens of each row's response: its attention over the response columns (model turns and tool outputs)."""
    width = batch.tensors["responses"].shape[1]
    return batch.tensors["attention_mask"][:, -width:].sum(-1)


def turn_count(mask: np.ndarray) -> int:
    """verl's ``num_turns`` of an exchange from its loss mask: the model's turns (runs of 1) + the tool turns between
    them (runs of 0) + the prompt's one; a single-turn response is 2, as verl's single-turn agent loop says."""
    m = np.asarray(mask, dtype=bool)
    if m.size == 0:
        return 1
    return int(np.count_nonzero(m[1:] != m[:-1])) + 2


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
    template: Rows,
    response_ids: Sequence[np.ndarray],
    behaviour_log_probs: Sequence[np.ndarray],
    pad_token_id: int,
    loss_masks: Sequence[np.ndarray | None] | None = None,
) -> Rows:
    """The replayed members, one per row of ``template``.

    ``template`` holds one generated member of each replay group (after ``batch.union(gen_output)``): its
    prompt tokens, uid, data source, ground truth and every other per-row field are copied, then the response
    is replaced by the stored one: its tokens (all attended), its loss mask (``loss_masks[i]``, True per token the
    model generated; None = all of them) as ``response_mask``, its behaviour log-probs (0.0 where the mask is 0).
    Two per-row records of verl's agent loop describe the exchange, not the prompt, so they are the stored one's:
    ``__num_turns__`` (counted from the mask) and the tool loop's :data:`TRAJECTORY_RECORD_KEYS` (None: no record,
    the loop did not run for this row). The reward (``rm_scores``) is zeroed here: the caller re-scores the replayed
    members with the reward function like any other member (docs/algorithm.md §6).
    """
    n = len(template)
    loss_masks = [None] * n if loss_masks is None else list(loss_masks)
    if not (n == len(response_ids) == len(behaviour_log_probs) == len(loss_masks)):
        raise ValueError(
            f"replay members: {n} template rows, {len(response_ids)} responses, "
            f"{len(behaviour_log_probs)} behaviour log-prob rows, {len(loss_masks)} loss masks; they must match"
        )
    src = template.tensors
    prompts = src["prompts"]
    resp_len = src["responses"].shape[1]
    # verl's agent loop gives every row a multi_modal_inputs entry, an empty dict for a text-only row
    multi_modal = template.columns.get("multi_modal_inputs")
    if src["position_ids"].dim() != 2 or (multi_modal is not None and any(bool(m) for m in multi_modal)):
        raise ValueError(
            "ExGRPO replay supports text models only (position_ids must be [batch, seq_len], no multi_modal_inputs): "
            "a replayed row cannot rebuild the images or their positions of a stored trajectory"
        )
    model_masks = []
    for i, (ids, lp, mask) in enumerate(zip(response_ids, behaviour_log_probs, loss_masks)):
        if len(ids) != len(lp):
            raise ValueError(f"replay member {i}: {len(ids)} response tokens but {len(lp)} behaviour log-probs")
        mask = np.ones(len(ids), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        if mask.shape != (len(ids),):
            raise ValueError(f"replay member {i}: {len(ids)} response tokens but a loss mask of {mask.shape}")
        model_masks.append(mask)

    responses = _right_pad(response_ids, resp_len, pad_token_id, prompts.dtype)
    attended = _right_pad([np.ones(len(s), dtype=np.int64) for s in response_ids], resp_len, 0, torch.int64)
    response_mask = _right_pad([m.astype(np.int64) for m in model_masks], resp_len, 0, torch.int64)
    prompt_attention = src["attention_mask"][:, : prompts.shape[1]]
    attention_mask = torch.cat([prompt_attention, attended.to(prompt_attention.dtype)], dim=1)
    behaviour = _right_pad(
        [
            np.where(m, np.asarray(lp, dtype=np.float32), np.float32(0.0))
            for lp, m in zip(behaviour_log_probs, model_masks)
        ],
        resp_len,
        0.0,
        torch.float32,
    )

    out = Rows(src.clone(), {k: v.copy() for k, v in template.columns.items()}, dict(template.meta))
    b = out.tensors
    b["responses"] = responses
    b["response_mask"] = response_mask.to(src["response_mask"].dtype)
    b["input_ids"] = torch.cat([prompts, responses], dim=1)
    b["attention_mask"] = attention_mask
    b["position_ids"] = position_ids(attention_mask).to(src["position_ids"].dtype)
    if "rollout_log_probs" in b.keys():
        b["rollout_log_probs"] = behaviour.clone()
    if "rm_scores" in b.keys():
        b["rm_scores"] = torch.zeros_like(b["rm_scores"])
    b[IS_REPLAY_KEY] = torch.ones(n, dtype=torch.bool)
    b[BEHAVIOUR_LOG_PROBS_KEY] = behaviour
    nt = out.columns
    if NUM_TURNS_KEY in nt:
        nt[NUM_TURNS_KEY][:] = [turn_count(m) for m in model_masks]
    for key in TRAJECTORY_RECORD_KEYS:
        if key in nt:
            nt[key] = np.full(n, None, dtype=object)
    return out


def group_starts(counts: np.ndarray) -> np.ndarray:
    """Index of the first generated row of each prompt's group (rows are grouped: ``counts[i]`` rows each)."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def append_candidates(
    batch: Rows,
    counts: np.ndarray,
    num_fresh: int,
    candidates: Sequence[Sequence[Candidate]],
    pad_token_id: int,
) -> Rows:
    """The generated rows of the step followed by one row per candidate trajectory of each replayed question.

    ``batch``: the generated rows after ``union`` with the prompt batch, grouped by prompt (``counts[i]`` rows for
    prompt i: the ``num_fresh`` fresh prompts first, then the replayed ones, K−1 rows each). ``candidates[r]`` are
    the candidates of the r-th replayed question. Each candidate row copies the first generated row of its
    question's group (uid, prompt tokens, data source, ground truth) with the candidate's stored response and
    behaviour log-probs (:func:`build_replay_members`), so the old-log-prob pass scores exactly the sequence the
    actor will train on. ``CANDIDATE_KEY`` numbers the candidate rows 0..N-1 (-1 on generated rows).
    """
    if IS_REPLAY_KEY not in batch.tensors.keys():
        raise KeyError(f"append_candidates: the generated rows lack {IS_REPLAY_KEY!r}; call mark_fresh(batch) first")
    replay_starts = group_starts(counts)[num_fresh:]
    if len(replay_starts) != len(candidates):
        raise ValueError(f"{len(candidates)} candidate lists for {len(replay_starts)} replayed questions")
    n = len(batch)
    batch.tensors[CANDIDATE_KEY] = torch.full((n,), -1, dtype=torch.int64)
    flat = [c for group in candidates for c in group]
    if not flat:
        return batch
    template = batch.select([int(replay_starts[r]) for r, group in enumerate(candidates) for _ in group])
    rows = build_replay_members(
        template,
        [c.token_ids for c in flat],
        [c.behaviour_log_probs for c in flat],
        pad_token_id,
        [c.loss_mask for c in flat],
    )
    rows.tensors[CANDIDATE_KEY] = torch.arange(len(flat), dtype=torch.int64)
    return Rows.concat([batch, rows])


def candidate_rows(batch: Rows) -> torch.Tensor:
    """Row indices of the candidate rows of ``batch``, in candidate order (0..N-1), wherever they are."""
    cand = batch.tensors[CANDIDATE_KEY]
    rows = torch.nonzero(cand >= 0).flatten()
    return rows[torch.argsort(cand[rows])]


def candidate_token_stats(batch: Rows, entropy_key: str = ENTROPY_KEY) -> CandidateTokenStats:
    """Per-token entropies and old log-probs of the candidate rows (after the old-log-prob pass), in candidate
    order: the input of the core's selection (:meth:`ExperienceManager.select`)."""
    rows = candidate_rows(batch)
    b = batch.tensors
    return CandidateTokenStats(
        response_mask=b["response_mask"][rows],
        entropy=b[entropy_key][rows],
        log_prob=b["old_log_probs"][rows],
    )


def selected_candidate_indices(
    candidates: Sequence[Sequence[Candidate]], selected: Sequence[SelectedTrajectory]
) -> list[int]:
    """Flat candidate index of each selected trajectory (``selected[r]`` is one of ``candidates[r]``)."""
    if len(candidates) != len(selected):
        raise ValueError(f"{len(selected)} selections for {len(candidates)} replayed questions")
    out, offset = [], 0
    for group, sel in zip(candidates, selected):
        ids = [c.entry_id for c in group]
        if sel.entry_id not in ids:
            raise ValueError(f"selected entry {sel.entry_id} of question {sel.question_id!r} is not a candidate")
        out.append(offset + ids.index(sel.entry_id))
        offset += len(group)
    return out


def keep_selected(batch: Rows, selected: Sequence[int]) -> Rows:
    """Drop the candidate rows that were not selected (``selected``: flat candidate indices) and the candidate
    numbering; the generated rows and the kept candidates (now the replayed members) keep their order."""
    cand = batch.tensors[CANDIDATE_KEY]
    keep = (cand < 0) | torch.isin(cand, torch.as_tensor(list(selected), dtype=torch.int64))
    if int(keep.sum()) != int((cand < 0).sum()) + len(set(selected)):
        raise ValueError(f"selected candidate indices {list(selected)} are not all candidate rows of the batch")
    out = batch if bool(keep.all()) else batch.select(keep)
    out.tensors.pop(CANDIDATE_KEY)
    return out


#: ``ends_in_tool_call(response_ids, loss_mask) -> bool``: the exchange's last model turn holds a tool call that got
#: no answer (``recipe.exgrpo.tool_turns.ToolCallDetector``)
ToolCallCheck = Callable[[np.ndarray, np.ndarray], bool]


def member_defect(
    mask: np.ndarray, rollout_log_probs: np.ndarray | None, ends_in_tool_call: ToolCallCheck | None, ids: np.ndarray
) -> str | None:
    """What the trainer sees wrong with a generated trajectory before the pool checks its arrays (one of
    ``exgrpo.experience.masks.DEFECTS``), or None.

    ``inconsistent``: the rollout sampled a log-prob for a token its mask calls not the model's (verl's agent loop
    gives those 0.0, the mask and the log-probs disagree). ``truncated``: its last model turn holds a tool call that
    got no answer: the response length or a turn limit cut the exchange mid tool call (``ends_in_tool_call``).
    """
    if rollout_log_probs is not None and bool(np.any(rollout_log_probs[~mask] != 0.0)):
        return masks.INCONSISTENT
    if ends_in_tool_call is not None and ends_in_tool_call(ids, mask):
        return masks.TRUNCATED
    return None


def collection_groups(
    batch: Rows, ends_in_tool_call: ToolCallCheck | None = None, behaviour_from_rollout: bool = False
) -> dict[str, list[GroupMember]]:
    """The step's groups for ``ExperienceManager.collect`` (docs/algorithm.md §3), keyed by question id.

    Per row (after the rewards, ``token_level_scores``): the whole response after the prompt (its attended tokens:
    the model's turns and any tool outputs between them), its loss mask (``response_mask`` there; None when every
    token is the model's), the log-probs of the policy that sampled it — this step's old log-probs for a generated
    row, the stored behaviour log-probs for the replayed member — its reward, whether it is the replayed member, and
    for a generated row what :func:`member_defect` finds (``ends_in_tool_call``: the check of a run whose rollouts
    may call tools), as a function the pool calls for the members it would store only. One group per question and
    step: a question is never both replayed and fresh, nor drawn twice. ``behaviour_from_rollout``: a generated row
    stores its ``rollout_log_probs`` instead, token for token (asynchronous rollouts, docs/algorithm.md §15: the
    step's old log-probs are the trained policy's, not the one, or the several, that sampled it).
    """
    scores = batch.tensors["token_level_scores"].sum(-1).numpy()
    responses = batch.tensors["responses"].numpy()
    resp_mask = batch.tensors["response_mask"].bool().numpy()
    lengths = response_lengths(batch).numpy()
    old_lp = batch.tensors["old_log_probs"].float().numpy()
    is_replay = batch.tensors[IS_REPLAY_KEY].numpy()
    behaviour = batch.tensors[BEHAVIOUR_LOG_PROBS_KEY].float().numpy()
    rollout = (
        batch.tensors["rollout_log_probs"].float().numpy() if "rollout_log_probs" in batch.tensors.keys() else None
    )
    if behaviour_from_rollout and rollout is None:
        raise KeyError(
            "the rows carry no rollout_log_probs, the behaviour log-probs of an asynchronous rollout "
            "(actor_rollout_ref.rollout.calculate_log_probs=true)"
        )
    qids = batch.columns[QUESTION_ID_KEY]
    members_by_question: dict[str, list[GroupMember]] = {}
    for i in range(len(batch)):
        n = int(lengths[i])
        mask = resp_mask[i, :n]
        ids = responses[i, :n]
        replayed = bool(is_replay[i])
        if replayed:
            lp = behaviour[i, :n]
        elif behaviour_from_rollout:  # asynchronous rollouts: the old log-probs are the trained policy's, not its
            lp = rollout[i, :n]
        else:
            lp = old_lp[i, :n]
        defect = None
        if resp_mask[i, n:].any():  # a model token outside the response: the mask does not fit the row
            defect = masks.INCONSISTENT
        elif not replayed:  # checked only if the pool would store it (the tool-call check decodes a turn)
            defect = partial(member_defect, mask, None if rollout is None else rollout[i, :n], ends_in_tool_call, ids)
        members_by_question.setdefault(str(qids[i]), []).append(
            GroupMember(ids, lp, float(scores[i]), replayed, loss_mask=None if mask.all() else mask, defect=defect)
        )
    return members_by_question


def _sha(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def replayed_row_digests(batch: Rows) -> list[dict]:
    """Per replayed row, in row order (the order of the step's selected entries): its response length, model tokens,
    SHA-256 (16 hex digits) of its token ids (int32) and of its loss mask (uint8) over that length, and the model
    tokens its mask holds beyond it (0). The step's trace records them, so a test can hold them against the pool."""
    rows = torch.nonzero(batch.tensors[IS_REPLAY_KEY]).flatten().tolist()
    lengths = response_lengths(batch)
    out = []
    for r in rows:
        n = int(lengths[r])
        ids = batch.tensors["responses"][r, :n].numpy().astype(np.int32)
        mask = batch.tensors["response_mask"][r].numpy().astype(np.uint8)
        out.append(
            {
                "length": n,
                "model_tokens": int(mask[:n].sum()),
                "tokens_sha": _sha(ids),
                "mask_sha": _sha(mask[:n]),
                "mask_beyond": int(mask[n:].sum()),
            }
        )
    return out


def row_records(batch: Rows, scores: np.ndarray) -> list[dict]:
    """Per row of a step (after the advantages), what was trained on: its question, whether it is the replayed member,
    SHA-256 (16 hex digits) of its response tokens and of its loss mask over the response's length, its reward, its
    advantage and the sum of its old log-probs over the mask (``exgrpo.trace_rows``). Sorted by question, then
    replayed last, then digest: two adapters' rows compare record by record whatever their row order."""
    lengths = response_lengths(batch).tolist()
    b = batch.tensors
    mask = b["response_mask"].bool()
    old = b["old_log_probs"].double().masked_fill(~mask, 0.0).sum(-1).tolist()
    adv = b["advantages"].double()
    first = mask.float().argmax(dim=-1)
    advantages = adv[torch.arange(len(batch)), first].tolist()
    replayed = b[IS_REPLAY_KEY].bool().tolist()
    qids = batch.columns[QUESTION_ID_KEY]
    out = []
    for i, n in enumerate(lengths):
        out.append(
            {
                "question": str(qids[i]),
                "replayed": bool(replayed[i]),
                "tokens_sha": _sha(b["responses"][i, :n].numpy().astype(np.int32)),
                "mask_sha": _sha(b["response_mask"][i, :n].numpy().astype(np.uint8)),
                "reward": float(scores[i]),
                "advantage": float(advantages[i]),
                "old_log_prob_sum": float(old[i]),
            }
        )
    return sorted(out, key=lambda r: (r["question"], r["replayed"], r["tokens_sha"], r["mask_sha"]))
