"""Trajectory selection folded into the old-log-prob pass, without Ray: the trainer's own step code
(``RayExGRPOTrainer._score_and_select``: the replay step over the trainer's old-log-prob pass) on hand-made DataProtos
and a fixed actor (a tiny random Qwen2 in float64).

It must select the same stored trajectories as the two-pass method it replaced (each candidate scored on its own:
its question's prompt + the stored response, unpadded), give the replayed member the old log-probs a separate
forward over it gives, and make exactly one actor call per step, padding and dp balancing included.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402

from exgrpo.config import ExGRPOConfig  # noqa: E402
from exgrpo.experience.experience_pool import GroupMember  # noqa: E402
from exgrpo.experience.manager import ExperienceManager  # noqa: E402
from recipe.exgrpo.config_bridge import replay_response_width  # noqa: E402
from recipe.exgrpo.dataproto import as_dataproto, rows_of  # noqa: E402
from recipe.exgrpo.legacy.trainer import RayExGRPOTrainer  # noqa: E402
from recipe.exgrpo.replay_step import ReplayStep, StepState  # noqa: E402
from recipe.exgrpo.replay_step.fields import BEHAVIOUR_LOG_PROBS_KEY, CANDIDATE_KEY, IS_REPLAY_KEY  # noqa: E402
from tests.helpers.tiny_qwen2 import tiny_qwen2  # noqa: E402

PAD, VOCAB = 0, 40
P_LEN, R_LEN = 6, 9
K = 4


@pytest.fixture(scope="module")
def actor():
    torch.manual_seed(0)
    return tiny_qwen2(VOCAB, attn_implementation="sdpa").double().eval()


def _forward(actor, input_ids, attention_mask, position_ids, n_prompt):
    """Per response token: log-prob of the token and entropy of the distribution that predicted it."""
    with torch.no_grad():
        logits = actor(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logits = logits[:, n_prompt - 1 : -1]
    logp = torch.log_softmax(logits, dim=-1)
    token_lp = logp.gather(-1, input_ids[:, n_prompt:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return token_lp, entropy


def _alone(actor, prompt: np.ndarray, response: np.ndarray):
    """The two-pass reference: one candidate, unpadded, on its own."""
    ids = torch.as_tensor(np.concatenate([prompt, response]), dtype=torch.int64).unsqueeze(0)
    ones = torch.ones_like(ids)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    lp, ent = _forward(actor, ids, ones, pos, len(prompt))
    return lp[0], ent[0]


class _Harness(RayExGRPOTrainer):
    """The trainer's step methods with Ray's worker groups replaced: a fixed actor and a rule-based reward."""

    def __init__(self, actor, experience, dp_size=2, micro_batch=2, balance=True):  # no super(): no Ray
        self.actor = actor
        self.dp_size = dp_size
        self.replay = ReplayStep(
            experience.cfg,
            experience=experience,
            questions_per_step=4,
            question_ids=[],
            row_of_question={},
            epoch_batches=list,
            pad_token_id=PAD,
            response_width=R_LEN,
        )
        self.tokenizer = SimpleNamespace(pad_token_id=PAD)
        self.config = OmegaConf.create(
            {
                "trainer": {"balance_batch": balance},
                "actor_rollout_ref": {
                    "rollout": {"log_prob_use_dynamic_bsz": False, "log_prob_micro_batch_size_per_gpu": micro_batch}
                },
            }
        )
        self.pass_sizes: list[int] = []
        self.reward_loop_manager = SimpleNamespace(compute_rm_score=self._reward)
        self.actor_rollout_wg = None  # _get_dp_size is overridden; _compute_old_log_prob is the fixed actor
        self.trace: dict = {}  # the last step's trace record

    def select(self, batch, counts, num_fresh, plan):
        """The trainer's ``_score_and_select`` at step 2 on ``batch`` (generated rows grouped by ``counts``)."""
        fresh_rows = list(range(num_fresh))
        state = StepState(step=2, is_last=False, mixed=True, plan=plan, fresh_rows=fresh_rows, counts=counts)
        state.rows = rows_of(batch)
        self._score_and_select(state)
        self.trace = state.trace
        return as_dataproto(state.rows)

    def _get_dp_size(self, worker_group, role):
        return self.dp_size

    def _compute_old_log_prob(self, batch):
        n = len(batch)
        assert n % (self.dp_size * 2) == 0, "the pass must be padded to dp size x micro-batch size"
        self.pass_sizes.append(n)
        b = batch.batch
        lp, ent = _forward(self.actor, b["input_ids"], b["attention_mask"], b["position_ids"], P_LEN)
        mask = b["response_mask"].bool()  # padding positions may be NaN in a padded eager forward: zero them
        lp, ent = torch.where(mask, lp, 0.0), torch.where(mask, ent, 0.0)
        out = DataProto.from_dict({"old_log_probs": lp.float(), "entropys": ent.float()})
        return out, 0.0

    @staticmethod
    def _reward(data):
        # reward 1 at the last response token when the response holds token 7 (the stored ones all do)
        scores = torch.zeros_like(data.batch["rm_scores"])
        for i in range(len(data)):
            r = int(data.batch["response_mask"][i].sum())
            scores[i, r - 1] = float(7 in data.batch["responses"][i, :r].tolist())
        return DataProto.from_dict({"rm_scores": scores})


def _rows(prompts, responses, uids):
    n = len(prompts)
    p = torch.full((n, P_LEN), PAD)
    r = torch.full((n, R_LEN), PAD)
    attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
    for i, (pi, ri) in enumerate(zip(prompts, responses)):
        p[i, P_LEN - len(pi) :] = torch.as_tensor(pi)
        r[i, : len(ri)] = torch.as_tensor(ri)
        attn[i, P_LEN - len(pi) : P_LEN + len(ri)] = 1
    return DataProto.from_single_dict(
        {
            "prompts": p,
            "responses": r,
            "response_mask": attn[:, P_LEN:].clone(),
            "input_ids": torch.cat([p, r], 1),
            "attention_mask": attn,
            "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
            "rm_scores": torch.zeros(n, R_LEN),
            "uid": np.array(uids, dtype=object),
            "data_source": np.array(["toy"] * n, dtype=object),
        }
    )


def _step(actor, rng, metric="entropy", dp_size=2, balance=True):
    """A pool with three questions (2-4 stored trajectories each), a step that replays two of them."""
    cfg = ExGRPOConfig.from_dict(
        {"delayed_start_threshold": -1.0, "replay_ratio": 0.5, "seed": 3, "trajectory_metric": metric}, k=K
    )
    mgr = ExperienceManager(cfg)
    prompt_of = {}
    for q, n_correct in (("q0", 3), ("q1", 2), ("q2", 3)):
        members = []
        for j in range(K):
            length = int(rng.integers(2, R_LEN + 1))
            tokens = rng.integers(1, VOCAB, size=length)
            tokens[0] = 7 if j < n_correct else 8  # the reward rule: correct ones hold token 7
            tokens[1:] = np.where(tokens[1:] == 7, 9, tokens[1:]) if j >= n_correct else tokens[1:]
            members.append(
                GroupMember(
                    tokens.astype(np.int32),
                    rng.normal(-1, 0.2, length).astype(np.float32),
                    1.0 if j < n_correct else 0.0,
                )
            )
        mgr.collect(1, {q: members})
        prompt_of[q] = rng.integers(1, VOCAB, size=int(rng.integers(2, P_LEN + 1)))
    plan = mgr.plan_replay(4, 2)  # floor(0.5 * 4) = 2 replayed questions, 2 fresh prompts
    assert len(plan) == 2 and plan.num_candidates >= (4 if plan.needs_scores else 2)
    fresh = [rng.integers(1, VOCAB, size=int(rng.integers(2, P_LEN + 1))) for _ in range(2)]
    prompts = fresh + [prompt_of[q] for q in plan.question_ids]
    counts = np.array([K, K, K - 1, K - 1])
    row_prompts, row_resp, uids = [], [], []
    for i, (p, c) in enumerate(zip(prompts, counts)):
        for _ in range(c):
            row_prompts.append(p)
            row_resp.append(rng.integers(1, VOCAB, size=int(rng.integers(1, R_LEN + 1))))
            uids.append(f"u{i}")
    batch = _rows(row_prompts, row_resp, uids)
    harness = _Harness(actor, mgr, dp_size=dp_size, balance=balance)
    out = harness.select(batch.select_idxs(np.arange(len(batch))), counts, 2, plan)
    return harness, plan, batch, out, prompt_of


@pytest.mark.parametrize("dp_size,balance", [(2, True), (1, False), (4, True)])
def test_fused_pass_selects_what_the_two_pass_method_selects(actor, dp_size, balance):
    harness, plan, gen, out, prompt_of = _step(actor, np.random.default_rng(dp_size), dp_size=dp_size, balance=balance)
    assert len(harness.pass_sizes) == 1, "one actor call per step"
    n_gen = len(gen)
    assert harness.pass_sizes[0] >= n_gen + plan.num_candidates
    # the two-pass reference: every candidate alone, mean token entropy, argmin (ties: the oldest)
    expected = []
    for q, cands in zip(plan.question_ids, plan.candidates):
        means = [float(_alone(actor, prompt_of[q], c.token_ids)[1].mean()) for c in cands]
        expected.append(cands[int(np.argmin(means))])
        assert len(set(np.round(means, 6))) == len(means), "test data must not tie"
    assert harness.trace["selected_entry_ids"] == [c.entry_id for c in expected]
    # the step's rows: the generated ones unchanged, then the replayed members
    assert len(out) == n_gen + len(plan) and CANDIDATE_KEY not in out.batch.keys()
    assert "entropys" not in out.batch.keys()
    assert torch.equal(out.batch["responses"][:n_gen], gen.batch["responses"])
    assert out.batch[IS_REPLAY_KEY].tolist() == [False] * n_gen + [True] * len(plan)
    for j, c in enumerate(expected):
        row = n_gen + j
        r = c.length
        assert out.batch["responses"][row, :r].tolist() == c.token_ids.tolist()
        assert out.non_tensor_batch["uid"][row] == f"u{2 + j}"  # joined its question's group
        lp_alone, _ = _alone(actor, prompt_of[plan.question_ids[j]], c.token_ids)
        torch.testing.assert_close(out.batch["old_log_probs"][row, :r].double(), lp_alone, atol=1e-6, rtol=0)
        torch.testing.assert_close(out.batch[BEHAVIOUR_LOG_PROBS_KEY][row, :r], torch.as_tensor(c.behaviour_log_probs))
        assert float(out.batch["rm_scores"][row].sum()) == 1.0  # re-scored like any member
    # the generated rows' old log-probs are what a direct forward over them gives (order restored)
    b = gen.batch
    lp, _ = _forward(actor, b["input_ids"], b["attention_mask"], b["position_ids"], P_LEN)
    lp = torch.where(b["response_mask"].bool(), lp, 0.0)
    torch.testing.assert_close(out.batch["old_log_probs"][:n_gen].double(), lp, atol=1e-6, rtol=0)


def test_model_free_metric_puts_only_the_chosen_trajectory_in_the_pass(actor):
    harness, plan, gen, out, _ = _step(actor, np.random.default_rng(11), metric="random")
    assert not plan.needs_scores and plan.num_candidates == 2
    assert len(harness.pass_sizes) == 1 and len(out) == len(gen) + 2
    assert harness.trace["selected_entry_ids"] == [s.entry_id for s in plan.preselected]


def test_a_step_without_replay_is_one_plain_pass(actor):
    rng = np.random.default_rng(5)
    cfg = ExGRPOConfig.from_dict({"delayed_start_threshold": 0.5}, k=K)
    harness = _Harness(actor, ExperienceManager(cfg))
    plan = harness.replay.experience.plan_replay(4, 1)
    assert len(plan) == 0
    gen = _rows([rng.integers(1, VOCAB, 3)] * 8, [rng.integers(1, VOCAB, 4)] * 8, ["a"] * 4 + ["b"] * 4)
    out = harness.select(gen, np.array([K, K]), 2, plan)
    assert harness.pass_sizes == [8] and len(out) == 8 and not bool(out.batch[IS_REPLAY_KEY].any())


def test_candidates_longer_than_the_generated_rows_are_left_out_and_counted(actor):
    """``rollout.response_length`` set below ``data.max_response_length``: the generated rows (padded by verl's agent
    loop to the rollout's length) are narrower than some stored trajectories. Those are not planned (counted as too
    long), a question with none left is not replayed, and the step's pass runs on the narrower rows."""
    width = 5
    cfg = ExGRPOConfig.from_dict({"delayed_start_threshold": -1.0, "replay_ratio": 0.5, "seed": 0}, k=K)
    mgr = ExperienceManager(cfg)
    rng = np.random.default_rng(7)

    def stored(lengths):  # two correct members of the given lengths, two wrong ones: a partial success
        out = []
        for j, length in enumerate(lengths + [3, 3]):
            tokens = rng.integers(10, VOCAB, size=length).astype(np.int32)
            tokens[0] = 7 if j < 2 else 8
            out.append(GroupMember(tokens, rng.normal(-1, 0.2, length).astype(np.float32), float(j < 2)))
        return out

    mgr.collect(1, {"fits": stored([R_LEN, 4]), "too_long": stored([R_LEN, width + 1])})
    harness = _Harness(actor, mgr)
    harness.config = OmegaConf.merge(
        harness.config,
        {"data": {"max_response_length": R_LEN}, "actor_rollout_ref": {"rollout": {"response_length": width}}},
    )
    plan = mgr.plan_replay(4, 2, max_response_length=replay_response_width(harness.config))
    # the step as the trainer runs it: B - n_exp fresh prompts x K, then K-1 rows per replayed question, every row
    # of the rollout's width (a stored trajectory wider than that used to fail here, in append_candidates)
    num_fresh = 4 - len(plan)
    counts = np.array([K] * num_fresh + [K - 1] * len(plan))
    prompts = [rng.integers(1, VOCAB, size=3) for _ in counts]
    rows = [(p, rng.integers(10, VOCAB, size=int(rng.integers(1, width + 1)))) for p in prompts]
    rows = [r for r, c in zip(rows, counts) for _ in range(c)]
    batch = _rows([p for p, _ in rows], [r for _, r in rows], [f"u{i}" for i, c in enumerate(counts) for _ in range(c)])
    batch = batch.select_idxs(np.arange(len(batch)))
    for key in ("responses", "response_mask", "rm_scores"):
        batch.batch[key] = batch.batch[key][:, :width]
    for key in ("input_ids", "attention_mask", "position_ids"):
        batch.batch[key] = batch.batch[key][:, : P_LEN + width]
    out = harness.select(batch, counts, num_fresh, plan)
    assert len(out) == len(batch) + len(plan) and out.batch["responses"].shape[1] == width
    # what was left out: one candidate of "fits", both of "too_long", which is not replayed (a fresh prompt took
    # its place)
    metrics = mgr.metrics(2)
    assert plan.question_ids == ["fits"] and [c.length for c in plan.candidates[0]] == [4]
    assert metrics["exgrpo/selection/too_long_candidates"] == 3.0
    assert metrics["exgrpo/replay/dropped_too_long"] == 1.0
    assert out.batch[IS_REPLAY_KEY].tolist()[-1] is True


def _multi_turn_step(actor, rng):
    """Two questions with three stored two-turn exchanges each (model turn, tool output, model turn), a step that
    replays both."""
    cfg = ExGRPOConfig.from_dict({"delayed_start_threshold": -1.0, "replay_ratio": 0.5, "seed": 3}, k=K)
    mgr = ExperienceManager(cfg)
    prompt_of = {}
    for q in ("q0", "q1"):
        members = []
        for _ in range(3):
            first, tool, second = int(rng.integers(1, 3)), int(rng.integers(2, 4)), int(rng.integers(1, 3))
            tokens = rng.integers(1, VOCAB, size=first + tool + second)
            tokens[0] = 7  # the reward rule: correct ones hold token 7
            mask = np.array([1] * first + [0] * tool + [1] * second)
            lps = rng.normal(-1, 0.2, len(tokens)).astype(np.float32)
            members.append(GroupMember(tokens.astype(np.int32), lps, 1.0, loss_mask=mask))
        wrong = GroupMember(np.array([8, 9], dtype=np.int32), np.array([-1.0, -1.0], np.float32), 0.0)
        mgr.collect(1, {q: members + [wrong]})
        prompt_of[q] = rng.integers(1, VOCAB, size=int(rng.integers(2, P_LEN + 1)))
    plan = mgr.plan_replay(4, 2)
    assert len(plan) == 2 and plan.num_candidates == 6
    counts = np.array([K, K, K - 1, K - 1])
    prompts = [rng.integers(1, VOCAB, size=3), rng.integers(1, VOCAB, size=4)] + [
        prompt_of[q] for q in plan.question_ids
    ]
    row_prompts, row_resp, uids = [], [], []
    for i, (p, c) in enumerate(zip(prompts, counts)):
        for _ in range(c):
            row_prompts.append(p)
            row_resp.append(rng.integers(1, VOCAB, size=int(rng.integers(1, R_LEN + 1))))
            uids.append(f"u{i}")
    batch = _rows(row_prompts, row_resp, uids)
    harness = _Harness(actor, mgr)
    out = harness.select(batch.select_idxs(np.arange(len(batch))), counts, 2, plan)
    return harness, plan, batch, out, prompt_of


def test_the_fused_pass_selects_multi_turn_exchanges_by_their_model_tokens_entropy(actor):
    """The replayed exchange is the argmin of the mean token entropy over the *model's* tokens (the tool outputs are
    context, not the policy's choices), and its row carries the stored mask."""
    harness, plan, gen, out, prompt_of = _multi_turn_step(actor, np.random.default_rng(17))
    expected, differs = [], False
    for q, cands in zip(plan.question_ids, plan.candidates):
        entropies = [_alone(actor, prompt_of[q], c.token_ids)[1] for c in cands]
        model_mean = [float(e[torch.as_tensor(c.mask)].mean()) for e, c in zip(entropies, cands)]
        all_mean = [float(e.mean()) for e in entropies]
        assert len(set(np.round(model_mean, 6))) == len(model_mean), "test data must not tie"
        expected.append(cands[int(np.argmin(model_mean))])
        differs |= int(np.argmin(model_mean)) != int(np.argmin(all_mean))
    assert differs, "test data must tell the model tokens' entropy from the whole exchange's"
    assert harness.trace["selected_entry_ids"] == [c.entry_id for c in expected]
    n_gen = len(gen)
    for j, c in enumerate(expected):
        row = n_gen + j
        assert out.batch["responses"][row, : c.length].tolist() == c.token_ids.tolist()
        assert out.batch["response_mask"][row].tolist() == c.mask.astype(int).tolist() + [0] * (R_LEN - c.length)
        assert out.batch["attention_mask"][row, P_LEN:].tolist() == [1] * c.length + [0] * (R_LEN - c.length)
        lp_alone, _ = _alone(actor, prompt_of[plan.question_ids[j]], c.token_ids)
        model = torch.as_tensor(c.mask)
        torch.testing.assert_close(
            out.batch["old_log_probs"][row, : c.length][model].double(), lp_alone[model], atol=1e-6, rtol=0
        )
