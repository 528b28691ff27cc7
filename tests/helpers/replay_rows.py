"""Rows of a step shaped like verl's agent-loop output, made by hand for the replay step's tests."""

from __future__ import annotations

import numpy as np
import torch

from recipe.exgrpo.replay_step import Rows
from recipe.exgrpo.replay_step.fields import QUESTION_ID_KEY

PAD = 0
P_LEN, R_LEN = 5, 6


def generated_rows(prompt_lens, response_lens, uids, seed=0) -> Rows:
    """Rows shaped like verl's agent-loop output after ``batch.union(gen_output)``."""
    g = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    prompts = torch.full((n, P_LEN), PAD)
    responses = torch.full((n, R_LEN), PAD)
    attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        prompts[i, P_LEN - p :] = torch.randint(3, 50, (p,), generator=g)
        responses[i, :r] = torch.randint(3, 50, (r,), generator=g)
        attn[i, P_LEN - p : P_LEN + r] = 1
    response_mask = attn[:, P_LEN:].clone()
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": attn,
        "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
        "rm_scores": torch.zeros(n, R_LEN),
        "rollout_log_probs": -torch.rand(n, R_LEN, generator=g),
    }
    non_tensor = {
        "uid": np.array(uids, dtype=object),
        "data_source": np.array(["toy"] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": str(i)} for i in range(n)], dtype=object),
    }
    return Rows.of(batch, non_tensor)


# ------------------------------------------------------------------------------ a whole step through a fake backend
#: the fake reward: a response passes when it holds this token
PASS_TOKEN = 7


def token_entropy(ids: torch.Tensor) -> torch.Tensor:
    """The fake actor's per-token entropy: a function of the token alone, so every candidate's mean is known."""
    return (ids.float() % 11 + 1) / 11.0


class FakeBackend:
    """The replay step's backend made of hand-written functions: the actor's log-probs and entropies are functions
    of the tokens, the reward is 1 when a response holds :data:`PASS_TOKEN`. Records each call's row count."""

    def __init__(self) -> None:
        self.log_prob_calls: list[int] = []
        self.score_calls: list[int] = []

    def log_probs_and_entropies(self, rows: Rows, state) -> Rows:
        self.log_prob_calls.append(len(rows))
        mask = rows.tensors["response_mask"].float()
        ids = rows.tensors["responses"]
        rows.tensors["old_log_probs"] = -(ids.float() % 5 + 1) / 10.0 * mask
        rows.tensors["entropys"] = token_entropy(ids) * mask
        return rows

    def score_rows(self, rows: Rows, state) -> Rows:
        self.score_calls.append(len(rows))
        width = rows.tensors["responses"].shape[1]
        lengths = rows.tensors["attention_mask"][:, -width:].sum(-1)
        scores = torch.zeros(len(rows), width)
        for i in range(len(rows)):
            n = int(lengths[i])
            scores[i, n - 1] = float(PASS_TOKEN in rows.tensors["responses"][i, :n].tolist())
        return Rows.of({"rm_scores": scores}, reward_extra_keys=[])


def prompt_rows(
    prompt_ids: list[list[int]], counts, responses: list[list[int]], question_ids: list[str], uid_prefix: str = "u"
) -> Rows:
    """The generated rows of a step as an adapter hands them over: prompt i repeated ``counts[i]`` times, each with its
    response, one uid per prompt, the question ids, and the reward's scores (as verl's agent loop scores them)."""
    n = int(sum(counts))
    prompts = torch.full((n, P_LEN), PAD)
    resp = torch.full((n, R_LEN), PAD)
    attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
    uids, qids, row = [], [], 0
    for i, (p, c) in enumerate(zip(prompt_ids, counts)):
        for _ in range(int(c)):
            qids.append(question_ids[i])
            r = responses[row]
            prompts[row, P_LEN - len(p) :] = torch.as_tensor(p)
            resp[row, : len(r)] = torch.as_tensor(r)
            attn[row, P_LEN - len(p) : P_LEN + len(r)] = 1
            uids.append(f"{uid_prefix}{i}")
            row += 1
    tensors = {
        "prompts": prompts,
        "responses": resp,
        "response_mask": attn[:, P_LEN:].clone(),
        "input_ids": torch.cat([prompts, resp], 1),
        "attention_mask": attn,
        "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
    }
    rows = Rows.of(tensors, {"uid": np.array(uids, dtype=object), QUESTION_ID_KEY: np.array(qids, dtype=object)})
    return rows.union(FakeBackend().score_rows(rows, None))
