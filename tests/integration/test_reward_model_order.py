"""A colocated reward model is never called after an actor pass: the trainer's own step (``_run_step``, every
stage in fit's order) with replay, on hand-made DataProtos, with verl's worker groups replaced by recorders.

Colocated, the reward model shares the actor's GPUs: it must score while the rollout sleeps and before any actor
compute, as verl's own ``fit`` does (``_compute_reward_colocate`` right after generation). A reward-model wake-up
after the old-log-prob pass would ask for its ``gpu_memory_utilization`` share while the pass's logits (~9 GiB at the
paper's shape) may still be held by the actor's allocator. So the candidates of the replayed questions are scored
with the generated rows, in one call, before the pass; the selected one keeps its score. In its own pool the model
has its own GPUs, and only the selected members are scored, after the selection.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase  # noqa: E402

from exgrpo.config import ExGRPOConfig  # noqa: E402
from exgrpo.experience.experience_pool import GroupMember  # noqa: E402
from exgrpo.experience.manager import ExperienceManager  # noqa: E402
from recipe.exgrpo.config_bridge import reward_model_colocated  # noqa: E402
from recipe.exgrpo.dataproto import as_dataproto  # noqa: E402
from recipe.exgrpo.dataset import QUESTION_ID_KEY, ROW_KEY  # noqa: E402
from recipe.exgrpo.legacy.trainer import RayExGRPOTrainer  # noqa: E402
from recipe.exgrpo.replay_step import ReplayStep  # noqa: E402
from recipe.exgrpo.replay_step.batch import generation_counts  # noqa: E402
from recipe.exgrpo.replay_step.fields import IS_REPLAY_KEY  # noqa: E402
from recipe.exgrpo.tool_turns import ToolCallDetector  # noqa: E402

PAD = 0
P_LEN, R_LEN = 5, 8
K = 4


def rm_score(response: torch.Tensor) -> float:
    """The stand-in reward model's score of one response: a function of its tokens, so each row's score is known."""
    tokens = [int(t) for t in response if int(t) != PAD]
    return float(sum(tokens) % 97) / 97.0


class _Recorder:
    def __init__(self):
        self.events: list[tuple[str, int]] = []


class _Step(RayExGRPOTrainer):
    """The trainer's step with Ray's pieces replaced by recorders (no super().__init__: no Ray)."""

    def __init__(self, tmp_path, experience, plan, prompt_rows, own_pool=False, replay_reward="rescore"):
        self.rec = _Recorder()
        self.tokenizer = SimpleNamespace(pad_token_id=PAD)
        self._plan, self._prompt_rows = plan, prompt_rows
        self.config = OmegaConf.create(
            {
                "trainer": {"balance_batch": False, "save_freq": -1, "default_local_dir": str(tmp_path)},
                "algorithm": {"norm_adv_by_std_in_grpo": False},
                "actor_rollout_ref": {
                    "rollout": {
                        "n": K,
                        "temperature": 1.0,
                        "agent": {"num_workers": 1},
                        "log_prob_use_dynamic_bsz": False,
                        "log_prob_micro_batch_size_per_gpu": 1,
                    }
                },
                "reward": {"reward_model": {"enable": True, "enable_resource_pool": own_pool}},
            }
        )
        self.replay = ReplayStep(
            experience.cfg,
            experience=experience,
            questions_per_step=len(prompt_rows),
            question_ids=[q for q, _ in prompt_rows],
            row_of_question={q: i for i, (q, _) in enumerate(prompt_rows)},
            epoch_batches=list,
            pad_token_id=PAD,
            response_width=R_LEN,
            ends_in_tool_call=ToolCallDetector.from_config(self.config, self.tokenizer),  # as the trainer: no tools
            colocated_reward_model=reward_model_colocated(self.config),
            trace_dir=str(tmp_path),
        )
        self.actor_rollout_wg = None
        rec = self.rec
        self.async_rollout_manager = SimpleNamespace(generate_sequences=self._generate_sequences)
        self.checkpoint_manager = SimpleNamespace(
            sleep_replicas=lambda: rec.events.append(("rollout_sleep", 0)),
            update_weights=lambda step: rec.events.append(("weight_sync", step)),
        )
        self.reward_loop_manager = SimpleNamespace(compute_rm_score=self._compute_rm_score)

    # ------------------------------------------------------------------ the stand-ins
    def _draw_questions(self, state):
        fresh = len(self._prompt_rows) - len(self._plan)
        state.plan, state.fresh_rows = self._plan, list(range(fresh))
        state.counts = generation_counts(fresh, len(self._plan), K)
        state.trace = {"event": "step", "step": state.step}
        return self._prompt_batch()

    def run_step(self):
        """The trainer's ``_run_step`` at step 2: the step's rows, its plan and its number of fresh prompts."""
        state = self.replay.begin(2, is_last=False)
        self._run_step(state)
        return as_dataproto(state.rows), state.plan, state.num_fresh

    def _prompt_batch(self) -> DataProto:
        n = len(self._prompt_rows)
        return DataProto.from_single_dict(
            {
                "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
                "data_source": np.array(["toy"] * n, dtype=object),
                "reward_model": np.array([{"ground_truth": ""}] * n, dtype=object),
                "extra_info": np.array([{"index": i} for i in range(n)], dtype=object),
                QUESTION_ID_KEY: np.array([q for q, _ in self._prompt_rows], dtype=object),
                ROW_KEY: np.arange(n),
                "toy_prompt": np.array([p for _, p in self._prompt_rows] + [None], dtype=object)[:n],
                "dummy_tensor": torch.zeros(n, 1, dtype=torch.uint8),  # as verl's RLHFDataset rows carry
            }
        )

    def _generate_sequences(self, gen_batch: DataProto) -> DataProto:
        self.rec.events.append(("generate", len(gen_batch)))
        rng = np.random.default_rng(len(gen_batch))
        n = len(gen_batch)
        prompts = torch.full((n, P_LEN), PAD)
        responses = torch.full((n, R_LEN), PAD)
        attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
        for i, p in enumerate(gen_batch.non_tensor_batch["toy_prompt"]):
            r = rng.integers(1, 40, size=int(rng.integers(2, R_LEN + 1)))
            prompts[i, P_LEN - len(p) :] = torch.as_tensor(p)
            responses[i, : len(r)] = torch.as_tensor(r)
            attn[i, P_LEN - len(p) : P_LEN + len(r)] = 1
        return DataProto.from_dict(
            {
                "prompts": prompts,
                "responses": responses,
                "input_ids": torch.cat([prompts, responses], 1),
                "attention_mask": attn,
                "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
            }
        )

    def _compute_rm_score(self, data: DataProto) -> DataProto:
        self.rec.events.append(("reward_model", len(data)))
        scores = [rm_score(r) for r in data.batch["responses"]]
        return DataProto.from_dict(
            tensors={"rm_scores": RewardManagerBase.assemble_rm_scores(data, scores)},
            meta_info={"reward_extra_keys": []},
        )

    def _get_dp_size(self, worker_group, role):
        return 1

    def _compute_old_log_prob(self, batch):
        self.rec.events.append(("actor_log_prob", len(batch)))
        n = len(batch)
        mask = batch.batch["response_mask"].float()
        # a per-row entropy that differs between candidates (their response tokens), so selection is well defined
        entropy = (batch.batch["responses"].float() % 7 + 1) * mask / 7.0
        return DataProto.from_dict({"old_log_probs": -0.5 * mask, "entropys": entropy.reshape(n, -1)}), 0.0

    def _update_actor(self, batch):
        self.rec.events.append(("actor_update", len(batch)))
        return DataProto(meta_info={"metrics": {}})


def _pool_and_plan(replay_reward: str):
    """A continuous pool with three partly solved questions (2-3 stored responses each); a step replaying two."""
    rng = np.random.default_rng(0)
    cfg = ExGRPOConfig.from_dict(
        {"reward_mode": "continuous", "replay_ratio": 0.5, "seed": 3, "replay_reward": replay_reward}, k=K
    )
    mgr = ExperienceManager(cfg)
    for q in ("q0", "q1", "q2"):
        rewards = [0.9, 0.8, 0.1, 0.7] if q != "q1" else [0.9, 0.2, 0.1, 0.0]
        members = [
            GroupMember(rng.integers(1, 40, size=int(rng.integers(2, R_LEN + 1))).astype(np.int32), None, r)
            for r in rewards
        ]
        members = [GroupMember(m.token_ids, -np.ones(len(m.token_ids), dtype=np.float32), m.reward) for m in members]
        mgr.collect(1, {q: members})
    plan = mgr.plan_replay(4, 2, max_response_length=R_LEN)
    assert len(plan) == 2 and plan.num_candidates >= 3, (len(plan), plan.num_candidates)
    prompt_rows = [("f0", [3, 4, 5]), ("f1", [6, 7])] + [(q, [8, 9, 10]) for q in plan.question_ids]
    return mgr, plan, prompt_rows


def _events(step: _Step) -> list[str]:
    return [name for name, _ in step.rec.events]


def test_a_colocated_reward_model_scores_everything_before_the_actor_pass(tmp_path):
    mgr, plan, prompt_rows = _pool_and_plan("rescore")
    step = _Step(tmp_path, mgr, plan, prompt_rows)
    batch, out_plan, num_fresh = step.run_step()
    events = _events(step)
    first_actor = events.index("actor_log_prob")
    assert "reward_model" in events[:first_actor], events
    assert "reward_model" not in events[first_actor:], f"a reward-model call after an actor pass: {events}"
    assert events[:2] == ["generate", "rollout_sleep"] and events[-2:] == ["actor_update", "weight_sync"]
    # one call, before the pass: the generated rows and every candidate of the replayed questions
    counts = generation_counts(num_fresh, len(out_plan), K)
    ((_, scored),) = [e for e in step.rec.events if e[0] == "reward_model"]
    assert scored == int(counts.sum()) + out_plan.num_candidates
    # the replayed member kept the score the model gave its stored response, like every generated row
    rewards = batch.batch["token_level_scores"].sum(-1)
    for i in range(len(batch)):
        assert float(rewards[i]) == pytest.approx(rm_score(batch.batch["responses"][i]))
    assert int(batch.batch[IS_REPLAY_KEY].sum()) == len(out_plan) == 2


def test_stored_replay_rewards_score_only_the_generated_rows(tmp_path):
    mgr, plan, prompt_rows = _pool_and_plan("stored")
    step = _Step(tmp_path, mgr, plan, prompt_rows)
    step.run_step()
    events = _events(step)
    assert "reward_model" not in events[events.index("actor_log_prob") :], events
    ((_, scored),) = [e for e in step.rec.events if e[0] == "reward_model"]
    assert scored == int(generation_counts(2, 2, K).sum())  # no candidate scored: their rewards are stored


def test_a_reward_model_in_its_own_pool_scores_only_the_selected_members_after_selection(tmp_path):
    """Its own GPUs: the agent loop scored the generated rows (they come with rm_scores); the trainer scores the
    selected members only, after the pass, since no actor memory is in its way."""
    mgr, plan, prompt_rows = _pool_and_plan("rescore")
    step = _Step(tmp_path, mgr, plan, prompt_rows, own_pool=True)
    generate = step._generate_sequences

    def scored_while_generating(gen_batch):
        out = generate(gen_batch)
        scores = [rm_score(r) for r in out.batch["responses"]]
        out.batch["rm_scores"] = RewardManagerBase.assemble_rm_scores(out, scores)
        out.meta_info["reward_extra_keys"] = []
        return out

    step.async_rollout_manager.generate_sequences = scored_while_generating
    batch, *_ = step.run_step()
    calls = [e for e in step.rec.events if e[0] == "reward_model"]
    assert calls == [("reward_model", 2)] and _events(step).index("reward_model") > _events(step).index(
        "actor_log_prob"
    )
    rewards = batch.batch["token_level_scores"].sum(-1)
    assert all(float(rewards[i]) == pytest.approx(rm_score(batch.batch["responses"][i])) for i in range(len(batch)))
