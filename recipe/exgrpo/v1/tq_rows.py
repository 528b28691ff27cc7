"""A v1 step's rows between TransferQueue and the replay step.

verl's v1 trainer keeps every trajectory in TransferQueue under the key ``{uid}_{session}_{index}``, unpadded: per row
its prompt ids, response ids (the model's turns and any tool outputs between them), ``response_mask``,
``rollout_log_probs`` and ``rm_scores`` as jagged tensors of their own length, and the prompt's fields (``raw_prompt``,
``reward_model``, ``extra_info``, the question id, ...) and the agent loop's record (``extra_fields``: the policy
versions the trajectory spans, the reward's extra info, the tool loop's per-turn records) as plain values.

The replay step works on padded rows, the legacy trainer's layout (:class:`~recipe.exgrpo.replay_step.Rows`): prompts
left-padded, responses right-padded to the step's response width, an attention mask over both. :func:`rows_from_tq`
builds them from what TransferQueue returns, :func:`jagged` and :func:`stored_records` go the other way: the per-row
response fields the step adds, and the stored trajectories of replayed questions as new TransferQueue rows that carry
every field and tag the agent loop writes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from recipe.exgrpo.replay_step import Rows
from recipe.exgrpo.replay_step.batch import position_ids, response_lengths, turn_count
from recipe.exgrpo.replay_step.fields import BEHAVIOUR_LOG_PROBS_KEY, CANDIDATE_KEY, ENTROPY_KEY

__all__ = [
    "REWARD_EXTRA_FIELD",
    "TQ_KEY",
    "jagged",
    "padded",
    "rows_from_tq",
    "stored_records",
    "tq_key",
]

#: per row of a step's :class:`Rows`: its TransferQueue key
TQ_KEY = "exgrpo_tq_key"
#: where the agent loop keeps the reward's extra keys of a trajectory (inside ``extra_fields``)
REWARD_EXTRA_FIELD = "reward_extra_info"
#: jagged per-response-token fields of TransferQueue -> their names in the replay step's rows
_RESPONSE_FIELDS = {
    "response_mask": "response_mask",
    "rollout_log_probs": "rollout_log_probs",
    "rm_scores": "rm_scores",
    "old_log_probs": "old_log_probs",
    "entropy": ENTROPY_KEY,
}


def tq_key(uid: str, session: int, index: int = 0) -> str:
    """A trajectory's TransferQueue key (v1 parses ``{uid}_{session}_{index}``: a uid holds no ``_``)."""
    return f"{uid}_{int(session)}_{int(index)}"


def split_key(key: str) -> tuple[str, int, int]:
    uid, session, index = key.rsplit("_", 2)
    return uid, int(session), int(index)


def _unbind(value: Any) -> list[torch.Tensor]:
    """The per-row tensors of a jagged (nested) or dense tensor field."""
    return list(value.unbind()) if getattr(value, "is_nested", False) else list(value)


def _values(value: Any) -> list:
    """The per-row values of a non-tensor field, as plain Python objects."""
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


def _object_column(values: Sequence) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def padded(rows: Sequence[torch.Tensor], width: int, value: float = 0, left: bool = False) -> torch.Tensor:
    """Per-row 1-D tensors padded to ``width`` (on the right, or on the left)."""
    dtype = rows[0].dtype if rows else torch.float32
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, r in enumerate(rows):
        n = len(r)
        if n > width:
            raise ValueError(f"a row of {n} tokens does not fit the step's width {width}")
        if n and left:
            out[i, width - n :] = r
        elif n:
            out[i, :n] = r
    return out


def rows_from_tq(data: Any, keys: Sequence[str], pad_token_id: int, response_width: int) -> Rows:
    """The replay step's rows of ``keys`` from their TransferQueue fields ``data`` (one row per key, in order).

    Prompts are left-padded to the longest prompt, responses right-padded to ``response_width`` (the step's width: the
    rollout's response length), with the attention mask, input ids and positions the legacy trainer's rows have; every
    jagged per-response-token field (``response_mask``, ``rollout_log_probs``, ``rm_scores``, ``old_log_probs``,
    ``entropy`` as ``entropys``) right-padded with zeros. Every non-tensor field becomes a column; the reward's extra
    keys of each trajectory (``extra_fields["reward_extra_info"]``) become one column each, named in meta
    ``reward_extra_keys`` as verl's legacy trainer names them; ``TQ_KEY`` holds the keys.
    """
    n = len(keys)
    prompts = [p.to(torch.int64) for p in _unbind(data.get("prompts"))]
    responses = [r.to(torch.int64) for r in _unbind(data.get("responses"))]
    if len(prompts) != n or len(responses) != n:
        raise ValueError(f"{n} keys but {len(prompts)} prompts and {len(responses)} responses from TransferQueue")
    longest = max((len(r) for r in responses), default=0)
    if longest > response_width:
        raise ValueError(
            f"a response of {longest} tokens is longer than the step's width {response_width} "
            "(actor_rollout_ref.rollout.response_length / data.max_response_length)"
        )
    p_len = max((len(p) for p in prompts), default=0)
    prompt_ids = padded(prompts, p_len, pad_token_id, left=True)
    response_ids = padded(responses, response_width, pad_token_id)
    prompt_attn = padded([torch.ones(len(p), dtype=torch.int64) for p in prompts], p_len, 0, left=True)
    response_attn = padded([torch.ones(len(r), dtype=torch.int64) for r in responses], response_width, 0)
    attention = torch.cat([prompt_attn, response_attn], dim=1)
    tensors: dict[str, torch.Tensor] = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": attention,
        "position_ids": position_ids(attention),
    }
    columns: dict[str, Any] = {}
    for name in data.keys():
        if name in ("prompts", "responses", "input_ids", "position_ids", "loss_mask"):
            continue
        value = data.get(name)
        if isinstance(value, torch.Tensor):
            if name in _RESPONSE_FIELDS:
                tensors[_RESPONSE_FIELDS[name]] = padded(_unbind(value), response_width)
            continue  # other tensor fields (verl's per-row extras) stay in TransferQueue only
        columns[name] = _object_column(_values(value))
    if "response_mask" not in tensors:
        raise KeyError("the TransferQueue rows carry no response_mask")
    extra_keys: list[str] = []
    records = columns.get("extra_fields")
    if records is not None:
        infos = [dict((r or {}).get(REWARD_EXTRA_FIELD) or {}) if isinstance(r, Mapping) else {} for r in records]
        extra_keys = sorted({k for info in infos for k in info})
        for key in extra_keys:
            columns.setdefault(key, _object_column([info.get(key) for info in infos]))
    columns[TQ_KEY] = _object_column(list(keys))
    rows = Rows.of(tensors, columns)
    rows.meta["reward_extra_keys"] = extra_keys
    return rows


def jagged(tensor: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """The first ``lengths[i]`` entries of row i of a padded response tensor, as one jagged tensor (TransferQueue's
    form of a per-response-token field)."""
    return torch.nested.as_nested_tensor([tensor[i, : int(n)] for i, n in enumerate(lengths)], layout=torch.jagged)


def stored_records(
    rows: Rows,
    templates: Sequence[Mapping[str, Any]],
    template_tags: Sequence[Mapping[str, Any]],
    collected_steps: Sequence[int],
    k: int,
) -> tuple[list[str], list[dict], list[dict]]:
    """New TransferQueue rows for the candidate rows of ``rows`` (the stored trajectories of the replayed questions,
    made by the replay step from a generated member of their group): keys, fields and tags.

    Each copies its group's generated row (``templates[i]``, every field the agent loop wrote: the prompt's fields,
    uid, ...; ``template_tags[i]``: its tags) and replaces what belongs to the response: the stored response ids, its
    loss mask (``response_mask``, ``loss_mask``), its behaviour log-probs (as ``rollout_log_probs``, 0.0 off the
    mask), zero ``rm_scores`` (the replay step scores it), input ids and positions, the turn count, and the agent
    loop's record (no tool records: the loop did not run for it; no reward extra info yet). The policy version it was
    sampled from (``min_global_steps`` / ``max_global_steps``: the weights of the step before the one it was collected
    in, ``collected_steps[j] - 1``). Its session is ``k - 1 + j`` for the j-th candidate of the step, beyond the
    group's K−1 generated sessions.
    """
    b = rows.tensors
    cand = b[CANDIDATE_KEY]
    lengths = response_lengths(rows)
    keys, fields, tags = [], [], []
    for i, row in enumerate(torch.nonzero(cand >= 0).flatten().tolist()):
        j = int(cand[row])
        template, tag = templates[i], template_tags[i]
        template = {name: template[name] for name in template.keys()}
        n = int(lengths[row])
        response = b["responses"][row, :n].clone()
        mask = b["response_mask"][row, :n].to(torch.int64).clone()
        prompt = template["prompts"].to(torch.int64)
        record = {
            name: value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            for name, value in template.items()
        }
        record["responses"] = response
        record["response_mask"] = mask
        record["loss_mask"] = mask.clone()
        record["rollout_log_probs"] = b[BEHAVIOUR_LOG_PROBS_KEY][row, :n].to(torch.float32).clone()
        record["rm_scores"] = torch.zeros(n, dtype=torch.float32)
        record["input_ids"] = torch.cat([prompt, response])
        record["position_ids"] = torch.arange(len(prompt) + n, dtype=torch.int64)
        record["num_turns"] = turn_count(mask.numpy())
        session = k - 1 + j
        record["session_id"] = session
        version = int(collected_steps[j]) - 1
        extra = dict(record.get("extra_fields") or {})
        extra.update({"turn_scores": None, "tool_rewards": None, REWARD_EXTRA_FIELD: {}})
        extra.update({"min_global_steps": version, "max_global_steps": version})
        record["extra_fields"] = extra
        uid = str(template["uid"])
        keys.append(tq_key(uid, session))
        fields.append(record)
        tags.append(
            {
                **dict(tag),
                "status": "success",
                "prompt_len": len(prompt),
                "response_len": n,
                "seq_len": len(prompt) + n,
                "min_global_steps": version,
                "max_global_steps": version,
            }
        )
    return keys, fields, tags
