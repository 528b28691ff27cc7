"""What one ExGRPO step adds to a GRPO step, for any trainer: :class:`ReplayStep` and the :class:`StepState` it fills.

A trainer adapter (verl's legacy ``RayPPOTrainer`` in ``recipe/exgrpo/legacy/``; another trainer the same way) runs its
own generation, reward extraction, actor update, checkpoint and weight sync, and calls the replay step between them,
carrying one :class:`StepState` from stage to stage (docs/trainer.md, "One step"):

1. :meth:`ReplayStep.draw`: replayed questions from the pool (after the delayed start) with their candidate stored
   trajectories, then fresh prompts (:class:`~recipe.exgrpo.replay_step.fresh.FreshPrompts`); the dataset rows of the
   step's prompts, fresh first; :meth:`ReplayStep.generation_counts`: K samples per fresh prompt, K−1 per replayed one;
2. the adapter generates them and hands the rows over as :class:`~recipe.exgrpo.replay_step.rows.Rows`;
3. :meth:`ReplayStep.score_and_select`: ONE old-log-prob pass over the generated rows AND every candidate (each a row
   of its question's group), through the adapter's :class:`ReplayBackend`; the candidates' per-token entropies
   select each replayed question's trajectory, whose row becomes the replayed member with its old log-probs from the
   same pass; the other candidates are dropped, the replayed members re-scored;
4. :meth:`ReplayStep.mark_update_rows`: the per-row fields the mixed loss reads (mixed mode, replay groups, ρ);
5. :meth:`ReplayStep.advantages`: group-relative advantages on the mixed groups, from the rewards the adapter read;
6. the adapter updates the actor (the mixed loss, ``recipe/exgrpo/actor_loss.py``, installed once);
7. :meth:`ReplayStep.collect`: collection into the pool, retirement, the delayed-start check;
8. :meth:`ReplayStep.save` / :meth:`ReplayStep.restore` inside the adapter's checkpoint; :meth:`ReplayStep.metrics`.

The backend is two calls: the actor's old log-probs and per-token entropies of some rows, and the reward's scores of
some rows. Nothing here imports verl or a trainer (tests/unit/test_import_graph.py): rows are plain tensors and numpy
columns, and a unit test drives a whole step through a backend made of hand-written functions.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from exgrpo.advantage import group_relative_advantages, token_level_advantages
from exgrpo.config import ExGRPOConfig
from exgrpo.experience.manager import ExperienceManager, ReplayPlan
from exgrpo.experience.selection import SelectedTrajectory
from exgrpo.gradient_signal import group_signal_metrics
from exgrpo.schedule import batch_pass_rate
from recipe.exgrpo.replay_step.batch import (
    ToolCallCheck,
    append_candidates,
    candidate_token_stats,
    collection_groups,
    generation_counts,
    keep_selected,
    mark_fresh,
    mark_replay_groups,
    replayed_row_digests,
    response_lengths,
    row_records,
    selected_candidate_indices,
)
from recipe.exgrpo.replay_step.fields import CANDIDATE_KEY, ENTROPY_KEY, IS_REPLAY_KEY, MIXED_KEY
from recipe.exgrpo.replay_step.fresh import FreshPrompts
from recipe.exgrpo.replay_step.metrics import (
    replay_group_metrics,
    reward_health,
    rollout_actor_agreement,
    sampled_pass_rate,
    tool_turn_metrics,
)
from recipe.exgrpo.replay_step.rows import Rows
from recipe.exgrpo.replay_step.scoring import (
    mode_reward_metrics,
    set_stored_replay_rewards,
    with_prompt_for_reward_functions,
)

__all__ = ["POOL_DIRNAME", "TRACE_FILE", "ReplayBackend", "ReplayStep", "StepState", "prune_pools", "simple_timer"]

#: the pool's folder inside a checkpoint's ``global_step_N/``
POOL_DIRNAME = "exgrpo"
#: the step trace, one JSON line per step, save and resume, in the run's checkpoint folder
TRACE_FILE = "exgrpo_trace.jsonl"

#: ``timer(name, timings)``: a context manager that adds the seconds it encloses to ``timings[name]``
Timer = Callable[[str, dict], AbstractContextManager]


@contextmanager
def simple_timer(name: str, timings: dict) -> Iterator[None]:
    """Add the seconds of the enclosed block to ``timings[name]`` (an adapter may pass its trainer's own timer, with
    the profiler's markers)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0) + time.perf_counter() - start


@dataclass
class StepState:
    """Everything of one training step, carried from stage to stage and dropped when the step ends."""

    step: int
    #: the last step of the run (a checkpoint and a validation are due)
    is_last: bool
    #: replay is on in this step (ExGRPO enabled and past the delayed start), fixed when the step begins
    mixed: bool
    #: the replayed questions and their candidate trajectories (empty before the delayed start)
    plan: ReplayPlan = field(default_factory=lambda: ReplayPlan([], []))
    #: dataset rows of the fresh prompts, in the order of the step's prompt rows
    fresh_rows: list[int] = field(default_factory=list)
    #: samples to generate per prompt row: K per fresh prompt, K−1 per replayed one
    counts: np.ndarray | None = None
    #: the step's rows: generated, then (after the pass) one replayed member per replayed question
    rows: Rows | None = None
    #: per-row rewards (summed over tokens) once the advantages are computed
    scores: np.ndarray | None = None
    #: the batch pass rate the delayed start watches
    pass_rate: float = float("nan")
    #: the actor's forward calls this step (a GRPO step makes one)
    actor_calls: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    #: the step's record in the trace file (``TRACE_FILE``)
    trace: dict[str, Any] = field(default_factory=dict)
    #: what the trainer adapter keeps of this step for its own stages (e.g. the rows' keys in its store)
    adapter: dict[str, Any] = field(default_factory=dict)
    timer: Timer = simple_timer

    @property
    def num_fresh(self) -> int:
        return len(self.fresh_rows)

    def timed(self, name: str) -> AbstractContextManager:
        """A timer that adds to ``timing[name]``."""
        return self.timer(name, self.timing)


class ReplayBackend(Protocol):
    """What the replay step asks of a trainer: two calls over rows, each run under the trainer's own bookkeeping
    (stage deadlines, padding and balancing across data-parallel ranks)."""

    def log_probs_and_entropies(self, rows: Rows, state: StepState) -> Rows:
        """The rows with the actor's ``old_log_probs`` and per-token ``entropys`` of every row, computed in ONE actor
        call, in the order given."""
        ...

    def score_rows(self, rows: Rows, state: StepState) -> Rows:
        """The reward's scores of ``rows``: per-token ``rm_scores`` and the reward's extra columns (their names in
        meta ``reward_extra_keys``), one row per row given."""
        ...


class ReplayStep:
    """The replay step of a run: the experience manager (pool, sampler, schedule), the fresh prompts, and the stages of
    module docstring, each over a :class:`StepState`.

    ``cfg``: the validated ``exgrpo:`` block (K inside). ``question_ids`` / ``row_of_question``: the training data's
    stable question id per row and the reverse. ``epoch_batches``: the dataset rows of each data-loader batch of one
    pass over the data (called again for each pass). ``pad_token_id``: the tokenizer's. ``response_width``: the width of
    a step's response rows (a stored trajectory longer than that cannot join them). ``ends_in_tool_call``: for a run
    whose rollouts may call tools, the check of an exchange cut in a tool call (``recipe/exgrpo/tool_turns.py``).
    ``colocated_reward_model``: a reward model shares the actor's devices, so the rows are scored after generation by
    the step itself. ``norm_adv_by_std``: the GRPO advantage divides by the group's std. ``trace_dir``: where the trace
    file is written (the run's checkpoint folder); None writes none.
    """

    def __init__(
        self,
        cfg: ExGRPOConfig,
        *,
        questions_per_step: int,
        question_ids: Sequence[str],
        row_of_question: Mapping[str, int],
        epoch_batches: Callable[[], Iterable[Sequence[int]]],
        pad_token_id: int,
        response_width: int,
        ends_in_tool_call: ToolCallCheck | None = None,
        colocated_reward_model: bool = False,
        norm_adv_by_std: bool = False,
        trace_dir: str | os.PathLike[str] | None = None,
        experience: ExperienceManager | None = None,
    ) -> None:
        if cfg.k is None:
            raise ValueError("the exgrpo config has no K (exgrpo.k): build it with ExGRPOConfig.from_dict(d, k=K)")
        self.cfg = cfg
        self.k = int(cfg.k)
        self.questions_per_step = int(questions_per_step)
        self.experience = ExperienceManager(cfg) if experience is None else experience
        self.fresh = FreshPrompts(
            question_ids, questions_per_step, epoch_batches, self._retired, immediate=cfg.retire_fresh_prompts
        )
        self.row_of_question = row_of_question
        self.pad_token_id = int(pad_token_id)
        self.response_width = int(response_width)
        self.ends_in_tool_call = ends_in_tool_call
        self.colocated_reward_model = bool(colocated_reward_model)
        self.norm_adv_by_std = bool(norm_adv_by_std)
        self.trace_dir = None if trace_dir is None else os.fspath(trace_dir)
        #: a generated row is stored with its rollout log-probs, not the step's old log-probs (asynchronous rollouts,
        #: docs/algorithm.md §15); the trainer adapter sets it
        self.behaviour_from_rollout = False
        #: the first measured rollout/actor mean log-prob gap of this process (the run's noise floor)
        self.first_agreement: float | None = None

    def _retired(self) -> Collection[str]:
        return self.experience.retired

    @property
    def replaying(self) -> bool:
        """Replay is on: ExGRPO is enabled and the delayed start has happened."""
        return bool(self.cfg.enable and self.experience.mixed)

    @property
    def scores_candidates_before_the_pass(self) -> bool:
        """A colocated reward model re-scores the replayed members: every candidate is scored with the generated
        rows before the pass (the selected one keeps its score; a model scores the same text the same way)."""
        return self.colocated_reward_model and self.cfg.replay_reward != "stored"

    # ------------------------------------------------------------------ 1. the draw
    def begin(self, step: int, is_last: bool, timer: Timer = simple_timer) -> StepState:
        """A new step's state; whether it is mixed is fixed now."""
        return StepState(step=step, is_last=is_last, mixed=self.replaying, timer=timer)

    def draw(self, state: StepState) -> list[int]:
        """Replayed questions (with their candidate trajectories) and fresh prompts; returns the dataset rows of the
        step's prompts: the fresh ones first, then one per replayed question. Fills ``plan``, ``fresh_rows`` and the
        step's trace record."""
        if state.mixed:
            with state.timed("exgrpo_sample"):
                state.plan = self.experience.plan_replay(
                    self.questions_per_step, state.step, max_response_length=self.response_width
                )
        plan = state.plan
        state.fresh_rows = self.fresh.take(
            self.questions_per_step - len(plan), exclude=set(plan.question_ids), metrics=state.metrics
        )
        state.counts = generation_counts(len(state.fresh_rows), len(plan), self.k)
        state.trace = {
            "event": "step",
            "step": state.step,
            "mixed": bool(self.experience.mixed),
            "replay_question_ids": list(plan.question_ids),
            "fresh_rows": list(state.fresh_rows),
            "selected_entry_ids": [],  # filled once the old-log-prob pass has selected them
            "selected_scores": [],
            "replayed_members": [],
        }
        return state.fresh_rows + [self.row_of_question[q] for q in plan.question_ids]

    # ------------------------------------------------------------------ 3. the one pass
    def score_and_select(self, state: StepState, rows: Rows, backend: ReplayBackend) -> None:
        """Old log-probs of the step and trajectory selection in ONE actor pass (module docstring, step 3).

        ``rows``: the generated rows, grouped by prompt as ``state.counts`` says. Sets ``state.rows``: the generated
        rows, then one replayed member per replayed question (re-scored by the reward function or model), all with
        their old log-probs; the unselected candidates are gone.

        A reward model colocated with the actor scores before the pass, as in verl's own step (the rollout is asleep,
        no actor compute has run): the generated rows and, when replayed members are re-scored, every candidate row,
        in one call. After the pass no reward-model call follows: its wake-up would meet the pass's activations still
        held by the actor's allocator. Elsewhere (a reward function, a reward model in its own pool) only the
        selected members are scored, after the selection.
        """
        plan = state.plan
        mark_fresh(rows)
        candidates_scored = self.scores_candidates_before_the_pass
        if not candidates_scored:
            rows = self._score_unscored(state, rows, backend)
        if plan.question_ids:
            rows = append_candidates(rows, state.counts, state.num_fresh, plan.candidates, self.pad_token_id)
        if candidates_scored:
            rows = self._score_unscored(state, rows, backend)
        with state.timed("old_log_prob"):
            rows = backend.log_probs_and_entropies(rows, state)
        if plan.question_ids:
            with state.timed("exgrpo_select"):
                stats = candidate_token_stats(rows) if plan.needs_scores else None
                selected = self.experience.select(plan, stats)
                rows = keep_selected(rows, selected_candidate_indices(plan.candidates, selected))
            with state.timed("exgrpo_replay_reward"):
                self._score_replayed_members(state, rows, selected, candidates_scored, backend)
            state.metrics.update(replay_group_metrics(rows))
            state.metrics["exgrpo/old_log_prob_candidate_rows"] = float(plan.num_candidates)
            state.trace["selected_entry_ids"] = [s.entry_id for s in selected]
            state.trace["selected_scores"] = [s.score for s in selected]
            state.trace["replayed_members"] = replayed_row_digests(rows)  # tokens and mask, as trained
        else:
            rows.tensors.pop(CANDIDATE_KEY, None)
        rows.tensors.pop(ENTROPY_KEY)
        state.metrics.update(self._rollout_actor_agreement(rows))  # the weight sync's health, on the generated rows
        state.rows = rows

    def _score_unscored(self, state: StepState, rows: Rows, backend: ReplayBackend) -> Rows:
        """The colocated reward model's scores of ``rows`` when they carry none (nothing otherwise: the rollout scored
        them while generating)."""
        if not self.colocated_reward_model or "rm_scores" in rows.tensors.keys():
            return rows
        with state.timed("reward_model"):
            scored = backend.score_rows(with_prompt_for_reward_functions(rows), state)
        return rows.union(scored)

    def _score_replayed_members(
        self,
        state: StepState,
        rows: Rows,
        selected: Sequence[SelectedTrajectory],
        already_scored: bool,
        backend: ReplayBackend,
    ) -> None:
        """Reward of the replayed members, like any other member's (their rows carry zeroed ``rm_scores``); with
        ``exgrpo.replay_reward=stored`` the reward stored with each ``selected`` trajectory instead. Nothing when the
        members were scored before the pass (``already_scored``: a colocated reward model scored every candidate)."""
        if self.cfg.replay_reward == "stored":
            set_stored_replay_rewards(rows, [s.candidate.reward for s in selected])
            return
        if already_scored:
            return
        idx = torch.nonzero(rows.tensors[IS_REPLAY_KEY]).flatten()
        scored = backend.score_rows(with_prompt_for_reward_functions(rows.select(idx)), state)
        rows.tensors["rm_scores"][idx] = scored.tensors["rm_scores"].to(rows.tensors["rm_scores"].dtype)
        positions = idx.numpy()
        for key, value in scored.columns.items():
            if key in rows.columns:
                rows.columns[key][positions] = value
            else:  # a key only the replayed rows carry: fill the generated rows with None
                column = np.full(len(rows), None, dtype=object)
                column[positions] = value
                rows.columns[key] = column

    def _rollout_actor_agreement(self, rows: Rows) -> dict[str, float]:
        """``rollout_actor_agreement`` against the first step this process measured (its noise floor)."""
        out = rollout_actor_agreement(rows, self.first_agreement)
        mean = out.get("exgrpo/rollout_actor_log_prob_diff_mean")
        if self.first_agreement is None and mean is not None and mean > 0:
            self.first_agreement = mean
            out["exgrpo/rollout_actor_log_prob_diff_mean_vs_first"] = 1.0
        return out

    def write_trace(self, record: Mapping[str, Any]) -> None:
        """Append one JSON line to the trace file: what each step replayed and drew fresh, and what a save and a
        resume held, so runs can be audited and compared after the fact."""
        if self.trace_dir is None:
            return
        os.makedirs(self.trace_dir, exist_ok=True)
        with open(os.path.join(self.trace_dir, TRACE_FILE), "a", encoding="utf-8") as f:
            f.write(json.dumps(dict(record), default=str) + "\n")

    # ------------------------------------------------------------------ 4.-5. the update's rows
    def mark_update_rows(self, state: StepState) -> None:
        """The per-row fields of the step that travel with every micro-batch to the loss: the mixed flag, the rows of
        replay groups and this step's scheduled ρ (the Eq. 4 term weights, ``exgrpo.weight_terms_by_ratio``)."""
        rows = state.rows
        rows.tensors[MIXED_KEY] = torch.full((len(rows),), state.mixed, dtype=torch.bool)
        mark_replay_groups(rows, self.experience.schedule.replay_ratio(state.step) if state.mixed else 0.0)

    def advantages(
        self, state: StepState, reward_tensor: torch.Tensor, reward_extra_infos: Mapping[str, Sequence] | None
    ) -> None:
        """Every member's reward (``reward_tensor``: per token, as the adapter read it from the rows) and the
        group-relative advantages of the mixed groups (docs/algorithm.md §7). Sets ``state.scores``."""
        rows = state.rows
        rows.tensors["token_level_scores"] = reward_tensor
        rows.tensors["token_level_rewards"] = reward_tensor  # no KL in the reward (no reference model)
        if reward_extra_infos:
            rows.columns.update({k: np.array(v) for k, v in reward_extra_infos.items()})
        scores = reward_tensor.sum(-1).numpy()
        state.metrics.update(mode_reward_metrics(self.experience.mode, scores, rows, reward_extra_infos))
        adv = group_relative_advantages(scores, rows.columns["uid"], norm_by_std=self.norm_adv_by_std)
        # groups without reward variance (no gradient), fresh vs replayed, and replay's share of |A|
        state.metrics.update(
            group_signal_metrics(scores, rows.columns["uid"], rows.tensors[IS_REPLAY_KEY].numpy(), adv)
        )
        adv_t = token_level_advantages(adv, rows.tensors["response_mask"])
        rows.tensors["advantages"] = adv_t
        rows.tensors["returns"] = adv_t
        state.scores = scores

    # ------------------------------------------------------------------ 7. collection
    def collect(self, state: StepState, end_of_step: bool = True) -> None:
        """Collection into the pool and retirement (docs/algorithm.md §3), then the delayed-start check on the batch
        pass rate (§9) and the re-add ablation. Sets ``state.pass_rate``. The step ends here: its record goes into the
        trace file (with every row's, under ``exgrpo.trace_rows``).

        ``end_of_step=False``: a part of a step (a local update of verl's ``separate_async``), whose delayed-start
        check and re-add belong to the whole step: the adapter calls :meth:`end_step` once with all its rewards."""
        rows, scores = state.rows, state.scores
        with state.timed("exgrpo_collect"):
            if self.cfg.enable:
                groups = collection_groups(rows, self.ends_in_tool_call, self.behaviour_from_rollout)
                state.metrics.update(self.experience.collect(state.step, groups))
            state.pass_rate = batch_pass_rate(scores)
            state.metrics["exgrpo/sampled_pass_rate"] = sampled_pass_rate(scores, rows)
            if self.ends_in_tool_call is not None:  # a run whose rollouts may call tools
                generated = ~rows.tensors[IS_REPLAY_KEY].bool().numpy()
                masks, lengths = rows.tensors["response_mask"].numpy(), response_lengths(rows).numpy()
                state.metrics.update(tool_turn_metrics(scores, masks, generated, lengths))
            if end_of_step:
                self.end_step(scores, state.step)
        if self.cfg.trace_rows:
            state.trace["rows"] = row_records(rows, scores)
        self.write_trace(state.trace)

    def end_step(self, scores: np.ndarray, step: int) -> None:
        """What happens once a step, after its collection: the delayed-start check on the step's rewards (every member
        of every group: the batch pass rate, or §13's signal) and the re-add ablation."""
        self.experience.observe_rewards(scores, step)
        self.experience.readd_retired(step)

    # ------------------------------------------------------------------ 8. metrics, checkpoint
    def metrics(self, state: StepState) -> dict[str, Any]:
        """The step's own figures beyond those its stages logged: pool and schedule state, the step's draw."""
        out = dict(self.experience.metrics(state.step))
        out["exgrpo/batch_pass_rate"] = state.pass_rate
        out["exgrpo/actor_log_prob_calls"] = state.actor_calls
        out["exgrpo/replayed_questions"] = len(state.plan)
        out["exgrpo/fresh_questions"] = state.num_fresh
        out["exgrpo/mixed"] = float(state.mixed)
        out["exgrpo/loader_epoch"] = self.fresh.loader_epoch
        out.update({"training/global_step": state.step, "training/epoch": self.fresh.loader_epoch})
        return out

    @staticmethod
    def reward_health(reward_extra_infos: Mapping[str, Sequence] | None) -> dict[str, float]:
        """The reward's health figures of a step (``metrics.reward_health``)."""
        return reward_health(dict(reward_extra_infos or {}))

    def save(self, folder: str | os.PathLike[str], step: int) -> None:
        """The pool and the fresh-prompt state into ``<folder>/exgrpo`` (the checkpoint's ``global_step_N``), and a
        trace record of what was saved. Call it before the trainer writes its own state, so that the trainer's tracker
        file (written last) never points to a checkpoint without its pool."""
        folder = os.fspath(folder)
        fresh = self.fresh.state_dict()
        trainer_state = {
            "leftover_rows": fresh["leftover_rows"],
            "loader_epoch": fresh["loader_epoch"],
            "global_steps": step,
            "fresh_filter": fresh["fresh_filter"],
        }
        self.experience.save(os.path.join(folder, POOL_DIRNAME), trainer_state=trainer_state)
        # what was saved, from the live state (not read back): a resume's record must equal it
        self.write_trace(
            {
                "event": "save",
                "to": os.path.abspath(folder),
                "global_steps": step,
                "state_digest": self.experience.state_digest(),
                "leftover_rows": list(self.fresh.leftover_rows),
                "loader_epoch": self.fresh.loader_epoch,
            }
        )

    def restore(self, folder: str | os.PathLike[str], step: int) -> bool:
        """The pool and the fresh-prompt state saved in ``folder`` (a resumed ``global_step_N``); False when it holds
        no pool and ``exgrpo.resume_pool=empty`` allows starting with an empty one. FileNotFoundError naming the folder
        otherwise."""
        folder = os.path.abspath(os.fspath(folder))
        pool_dir = os.path.join(folder, POOL_DIRNAME)
        if not os.path.isdir(pool_dir):
            if self.cfg.resume_pool == "empty":
                print(f"[exgrpo] no pool in {folder}: starting with an empty pool (exgrpo.resume_pool=empty)")
                return False
            raise FileNotFoundError(
                f"resuming from {folder} but it holds no ExGRPO pool ({pool_dir} is missing). Resume from a checkpoint "
                "written by this recipe, or set exgrpo.resume_pool=empty to start with an empty pool deliberately."
            )
        trainer_state = self.experience.load(pool_dir)
        self.fresh.load_state_dict(trainer_state)
        print(
            f"[exgrpo] restored pool from {pool_dir}: {self.experience.summary()}; "
            f"{len(self.fresh.leftover_rows)} leftover prompts"
        )
        self.write_trace(
            {
                "event": "resume",
                "from": folder,
                "global_steps": step,
                "state_digest": self.experience.state_digest(),
                "leftover_rows": list(self.fresh.leftover_rows),
                "loader_epoch": self.fresh.loader_epoch,
            }
        )
        return True


def prune_pools(checkpoint_dir: str, keep: int | None) -> list[str]:
    """Remove the ``global_step_N/exgrpo`` pools of all but the newest ``keep`` checkpoints that hold one.

    verl's retention (``trainer.max_actor_ckpt_to_keep``) deletes only the old ``global_step_N/actor`` folders;
    the pools (up to a few GB each at the paper's scale) follow the same rule here. ``keep`` None or <= 0 keeps
    every pool, as verl keeps every actor. Counted from the step numbers, not from which ``actor/`` folders
    exist, so a driver that cannot see the workers' files never removes a pool it should keep.
    """
    if keep is None or int(keep) <= 0 or not os.path.isdir(checkpoint_dir):
        return []
    steps = []
    for name in os.listdir(checkpoint_dir):
        if name.startswith("global_step_") and name[len("global_step_") :].isdigit():
            if os.path.isdir(os.path.join(checkpoint_dir, name, POOL_DIRNAME)):
                steps.append(int(name[len("global_step_") :]))
    removed = []
    for step in sorted(steps)[: -int(keep)]:
        path = os.path.join(checkpoint_dir, f"global_step_{step}", POOL_DIRNAME)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
