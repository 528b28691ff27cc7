"""The experience manager: pool + bucket sampler + trajectory selector + delayed-start schedule as one object.

This is what a trainer adapter talks to each step (docs/algorithm.md §2–6, §9), framework-free:

1. ``plan_replay(B, step, max_response_length=L)``: the replayed questions (none before the delayed start) and,
   per question, the candidate trajectories the trainer must score (all stored ones, capped, that fit in L
   tokens; only the pre-selected one when the metric needs no model).
2. ``select(plan, token_stats)``: one stored trajectory per replayed question, from the per-token entropies /
   log-probs of the candidates under the current policy (:class:`CandidateTokenStats`). The trainer computes
   them in the old-log-prob pass it runs anyway, with the candidates appended to the step's rows (the prompt
   of each candidate row is its question's prompt in the batch, so the pool stores no prompts).
3. ``collect(step, groups)`` after the rewards and old log-probs are known, then
   ``observe_rewards(rewards, step)`` (the delayed-start check on the batch pass rate, or in the continuous reward
   mode on its own signal, §13; collection uses the flag of *this* step).

Everything is saved/loaded together: ``save(dir, trainer_state)`` / ``load(dir)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exgrpo.config import ExGRPOConfig
from exgrpo.experience.experience_pool import ExperiencePool
from exgrpo.experience.persistence import load_experience, save_experience
from exgrpo.experience.records import Candidate, Group, GroupMember, QuestionId
from exgrpo.experience.sampler import BucketSampler
from exgrpo.experience.selection import (
    CandidateTokenStats,
    SelectedTrajectory,
    TrajectorySelector,
    selection_metrics,
)
from exgrpo.schedule import ExperienceSchedule

POOL_SUBDIR = "pool"


@dataclass(frozen=True)
class ReplayPlan:
    """The replayed questions of one step and the candidate trajectories the trainer scores for them.

    ``candidates[i]`` belongs to ``question_ids[i]`` (oldest first, never empty). ``preselected`` is set when the
    selection metric needs no model (random, diversity): then ``candidates[i]`` is just the chosen trajectory.
    """

    question_ids: list[QuestionId]
    candidates: list[list[Candidate]]
    preselected: list[SelectedTrajectory] | None = None

    def __len__(self) -> int:
        return len(self.question_ids)

    @property
    def num_candidates(self) -> int:
        return sum(len(g) for g in self.candidates)

    @property
    def needs_scores(self) -> bool:
        """Whether :meth:`ExperienceManager.select` needs the candidates' token statistics."""
        return self.preselected is None and bool(self.question_ids)


class ExperienceManager:
    """Everything ExGRPO keeps across steps, behind the five calls a trainer makes."""

    def __init__(self, cfg: ExGRPOConfig):
        if cfg.k is None:
            raise ValueError("ExGRPOConfig.k (the group size, rollout.n) must be set before building the manager")
        self.cfg = cfg
        #: the reward mode (``exgrpo.modes``): collection rules, start signal, reward figures
        self.mode = cfg.mode.from_config(cfg)
        self.pool = ExperiencePool.from_config(cfg, mode=self.mode)
        self.sampler = BucketSampler.from_config(cfg)
        self.selector = TrajectorySelector.from_config(cfg)
        self.schedule = ExperienceSchedule.from_config(cfg)
        self._last: dict[str, float] = {}

    # ------------------------------------------------------------------ state queries
    @property
    def mixed(self) -> bool:
        return self.schedule.mixed

    @property
    def retired(self):
        return self.pool.retired

    def summary(self) -> str:
        return (
            f"{len(self.pool)} trajectories of {self.pool.num_questions} questions, "
            f"{len(self.pool.retired)} retired, mixed={self.schedule.mixed}"
        )

    # ------------------------------------------------------------------ step calls
    def draw_replay(self, batch_size: int, step: int, exclude: set[QuestionId] | None = None) -> list[QuestionId]:
        """Replayed questions of ``step``: floor(ρ_t·B) drawn across buckets (§4), none before the switch."""
        self._last = {}
        if not (self.cfg.enable and self.schedule.mixed):
            return []
        requested = self.schedule.num_replay(step, batch_size)
        if requested == 0:
            return []
        draw = self.sampler.draw(self.pool, requested, exclude=exclude)
        self._last.update(draw.as_metrics("exgrpo/replay/"))
        return list(draw.question_ids)

    def candidates(
        self, question_ids: Sequence[QuestionId], *, max_response_length: int | None = None
    ) -> list[list[Candidate]]:
        """Per question, the stored trajectories that fit in ``max_response_length`` tokens (the newest
        ``max_candidates_per_question`` of them when capped); too long ones are counted in the metrics."""
        if max_response_length is not None:
            too_long = sum(int((self.pool.lengths(q) > max_response_length).sum()) for q in question_ids)
            self._last["exgrpo/selection/too_long_candidates"] = float(too_long)
        return self.pool.candidates(
            question_ids, max_per_question=self.cfg.max_candidates_per_question, max_length=max_response_length
        )

    def plan_replay(
        self,
        batch_size: int,
        step: int,
        *,
        exclude: set[QuestionId] | None = None,
        max_response_length: int | None = None,
    ) -> ReplayPlan:
        """Draw this step's replayed questions (:meth:`draw_replay`) and gather the candidates to score.

        A drawn question none of whose stored trajectories fits in ``max_response_length`` (possible after a
        resume with a lower response limit) is not replayed this step (counted as
        ``exgrpo/replay/dropped_too_long``); the trainer fills its place with a fresh prompt. When the
        selection metric needs no model (random, diversity) the selection is made here and only the chosen
        trajectory is handed to the trainer's pass.
        """
        qids = self.draw_replay(batch_size, step, exclude=exclude)
        return self.plan_questions(qids, max_response_length=max_response_length)

    def plan_questions(self, qids: Sequence[QuestionId], *, max_response_length: int | None = None) -> ReplayPlan:
        """The plan of replaying ``qids`` (drawn earlier: an asynchronous run draws a question when it issues its
        prompt and gathers its candidates when its group is trained, docs/algorithm.md §15); the rest as
        :meth:`plan_replay`."""
        qids = list(qids)
        if not qids:
            return ReplayPlan([], [])
        groups = self.candidates(qids, max_response_length=max_response_length)
        kept = [(q, g) for q, g in zip(qids, groups) if g]
        if max_response_length is not None:
            self._last["exgrpo/replay/dropped_too_long"] = float(len(qids) - len(kept))
        if not kept:
            return ReplayPlan([], [])
        qids, groups = [q for q, _ in kept], [g for _, g in kept]
        if self.selector.needs_scores:
            return ReplayPlan(qids, groups)
        selected = self._select(groups, None)
        return ReplayPlan(qids, [[s.candidate] for s in selected], preselected=selected)

    def select(self, plan: ReplayPlan, token_stats: CandidateTokenStats | None = None) -> list[SelectedTrajectory]:
        """One stored trajectory per replayed question of ``plan`` (§5).

        ``token_stats``: the per-token figures of ``plan``'s candidates (flattened in order) under the current
        policy; required when the metric scores with the model (entropy, nll), ignored otherwise.
        """
        if plan.preselected is not None or not plan.question_ids:
            return list(plan.preselected or [])
        if token_stats is None:
            raise ValueError(f"trajectory metric {self.cfg.trajectory_metric!r} needs the candidates' token statistics")
        return self._select(plan.candidates, token_stats)

    def _select(
        self, groups: Sequence[Sequence[Candidate]], token_stats: CandidateTokenStats | None
    ) -> list[SelectedTrajectory]:
        provider = token_stats.provider() if token_stats is not None else None
        selected = self.selector.select(groups, provider)
        self._last.update(selection_metrics(selected, prefix="exgrpo/selection/"))
        return selected

    def collect(self, step: int, groups: Mapping[QuestionId, Sequence[GroupMember]]) -> dict[str, float]:
        """Collection (§3) of this step's groups: ``{question_id: members}``."""
        if not self.cfg.enable:
            return {}
        stats = self.pool.collect(
            step, (Group(qid, list(members)) for qid, members in groups.items()), mixed=self.schedule.mixed
        )
        metrics = stats.as_metrics("exgrpo/collect/")
        self._last.update(metrics)
        return metrics

    def observe_rewards(self, rewards: Any, step: int) -> bool:
        """Delayed-start check (§9) with this step's rewards (every member of every group), on the reward mode's
        signal (the batch pass rate in the binary mode, §13's in the continuous one). True when mixed mode switched
        on now."""
        return self.observe_signal(self.mode.start_signal(rewards), step)

    def observe_signal(self, value: float, step: int) -> bool:
        """Delayed-start check (§9) with this step's value of the mode's start signal; True when mixed mode switched
        on now."""
        switched = self.schedule.update(step, value)
        if switched:
            print(self.mode.switch_message(step, value, self.schedule))
        return switched

    # the binary mode's name of the same call (its signal is the batch pass rate)
    observe_pass_rate = observe_signal

    def readd_retired(self, step: int) -> list[QuestionId]:
        """The "retired questions re-added" ablation (paper Table 6): every ``readd_retired_every`` steps,
        ⌊fraction · |retired|⌋ retired questions, drawn with the sampler's (checkpointed) RNG, are un-retired."""
        fraction, every = self.cfg.readd_retired_fraction, self.cfg.readd_retired_every
        if not self.cfg.enable or fraction <= 0 or step % every != 0:
            return []
        retired = list(self.pool.retired)
        n = int(fraction * len(retired))
        if n == 0:
            return []
        chosen = [retired[i] for i in sorted(self.sampler.rng.choice(len(retired), size=n, replace=False))]
        self.pool.unretire(chosen)
        self._last["exgrpo/readded_retired"] = float(n)
        return chosen

    def metrics(self, step: int) -> dict[str, float]:
        """Pool, bucket, schedule and last draw/selection/collection figures, under ``exgrpo/``."""
        out = dict(self._last)
        out.update(self.pool.stats(prefix="exgrpo/pool/"))
        out.update(self.schedule.metrics(step, prefix="exgrpo/"))
        return out

    def state_digest(self) -> dict[str, str]:
        """SHA-256 of each part of the state (pool, sampler, selector, schedule): equal digests mean an equal
        state, so a resumed run can prove it restored exactly what was saved."""
        pool_state = self.pool.state_dict()
        h = hashlib.sha256(json.dumps(pool_state["meta"], sort_keys=True, default=str).encode())
        for name in sorted(pool_state["entries"]):
            h.update(name.encode() + np.ascontiguousarray(pool_state["entries"][name]).tobytes())
        h.update(np.ascontiguousarray(pool_state["token_ids"]).tobytes())
        h.update(np.ascontiguousarray(pool_state["behaviour_log_probs"]).tobytes())

        def js(obj: Any) -> str:
            return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

        return {
            "pool": h.hexdigest(),
            "sampler": js(self.sampler.state_dict()),
            "selector": js(self.selector.state_dict()),
            "schedule": js(self.schedule.state_dict()),
        }

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike[str], trainer_state: dict[str, Any] | None = None) -> pathlib.Path:
        """Save pool, sampler, selector, schedule and ``trainer_state`` to ``directory/pool`` (atomic, see
        :func:`save_experience`). The caller writes its own "checkpoint complete" marker after this returns."""
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_experience(
            directory / POOL_SUBDIR,
            pool=self.pool,
            sampler=self.sampler,
            selector=self.selector,
            schedule=self.schedule,
            extra={"trainer_state": trainer_state or {}, "config": self.cfg.to_dict()},
        )
        return directory

    def load(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore everything :meth:`save` wrote; returns the saved ``trainer_state``.

        Raises :class:`PoolCheckpointError` naming the file when anything is missing or damaged. Checkpoints of
        earlier versions also hold ``prompts.arrow`` and ``manifest.json`` (a prompt store that is no longer
        needed): they load, and those files are ignored.
        """
        extra = load_experience(
            pathlib.Path(directory) / POOL_SUBDIR,
            pool=self.pool,
            sampler=self.sampler,
            selector=self.selector,
            schedule=self.schedule,
        )
        return dict(extra.get("trainer_state", {}))
