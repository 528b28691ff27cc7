"""``RayExGRPOTrainer``: verl's ``RayPPOTrainer`` with ExGRPO's experience replay (docs/algorithm.md).

``fit`` runs one step as a sequence of stages, one method each (docs/trainer.md, "One step"):

1. ``_draw_questions``: replayed questions drawn from the pool's buckets (after the delayed start) with their
   candidate stored trajectories, and fresh prompts (leftovers first, then the data loader; retired skipped);
2. ``_generate``: K samples per fresh prompt, K−1 per replayed one (``generation.generate_with_counts``); then
   the rollout replicas sleep;
3. ``_score_and_select``: ONE old-log-prob pass of the actor over the generated rows AND every candidate
   trajectory (each a row of its question's group); the candidates' per-token entropies select each replayed
   question's trajectory (the core's selector), whose row becomes the replayed member with its old log-probs
   from this same pass; the other candidates are dropped and the replayed members are re-scored. Nothing runs
   on the actor while the rollout is awake, and a step makes as many actor forward calls as a GRPO step;
4. ``_prepare_update``: the per-row step fields the loss reads (mixed mode, replay groups, ρ) and the dp balance;
5. ``_rewards_and_advantages``: group-relative advantages on the mixed groups (``exgrpo.advantage``);
6. ``_update_policy``: verl's actor update with the mixed loss (installed once at start-up);
7. ``_collect_and_schedule``: collection into the pool, retirement, the delayed-start check;
8. ``_save_and_sync``: checkpoint on its cadence (pool inside ``global_step_N/exgrpo``), weights to the rollout;
   then ``_validate_on_cadence`` and ``_step_metrics``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import deque
from functools import partial
from pprint import pprint

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm import tqdm
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_response_mask
from verl.trainer.ppo.reward import extract_reward
from verl.utils.debug import marked_timer
from verl.utils.metric import reduce_metrics

from exgrpo.advantage import group_relative_advantages, token_level_advantages
from exgrpo.experience.manager import ExperienceManager, ReplayPlan
from exgrpo.fresh_prompts import FreshPromptFilter
from exgrpo.gradient_signal import group_signal_metrics
from exgrpo.objective import LossSettings
from exgrpo.schedule import batch_pass_rate
from recipe.exgrpo import verl_compat
from recipe.exgrpo.actor_loss import exgrpo_actor_loss
from recipe.exgrpo.config_bridge import exgrpo_config_from_hydra
from recipe.exgrpo.dataset import QUESTION_ID_KEY, ROW_KEY
from recipe.exgrpo.legacy.generation import expand_by_counts, generate_with_counts
from recipe.exgrpo.replay_step.batch import (
    CANDIDATE_KEY,
    IS_REPLAY_KEY,
    MIXED_KEY,
    append_candidates,
    candidate_token_stats,
    collection_groups,
    generation_counts,
    keep_selected,
    mark_fresh,
    mark_replay_groups,
    replayed_row_digests,
    selected_candidate_indices,
)
from recipe.exgrpo.replay_step.scoring import (
    mode_reward_metrics,
    reward_model_colocated,
    score_with_colocated_reward_model,
    set_stored_replay_rewards,
    with_prompt_for_reward_functions,
)
from recipe.exgrpo.runtime.stage_deadlines import StageClock, deadlines_from_config
from recipe.exgrpo.tool_turns import ToolCallDetector, tool_turn_metrics

POOL_DIRNAME = "exgrpo"
TRACE_FILE = "exgrpo_trace.jsonl"
#: per row of the old-log-prob pass: its position before padding and balancing (-1 on padding rows)
PASS_ROW_KEY = "exgrpo_pass_row"


def replay_group_metrics(batch: DataProto) -> dict[str, float]:
    """Members per replay group (K: the stored trajectory plus K−1 fresh rollouts) and replayed rows."""
    uids = batch.non_tensor_batch["uid"]
    is_replay = batch.batch[IS_REPLAY_KEY].numpy().astype(bool)
    replay_uids = set(uids[is_replay].tolist())
    sizes = [int((uids == u).sum()) for u in replay_uids]
    return {
        "exgrpo/replayed_rows": float(is_replay.sum()),
        "exgrpo/replay_group_size_min": float(min(sizes)) if sizes else 0.0,
        "exgrpo/replay_group_size_max": float(max(sizes)) if sizes else 0.0,
    }


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


def rollout_actor_agreement(batch: DataProto, first_diff_mean: float | None = None) -> dict[str, float]:
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
    if "rollout_log_probs" not in batch.batch.keys() or "old_log_probs" not in batch.batch.keys():
        return {}
    mask = batch.batch["response_mask"].bool()
    if IS_REPLAY_KEY in batch.batch.keys():
        mask = mask & ~batch.batch[IS_REPLAY_KEY].bool().unsqueeze(-1)
    if not bool(mask.any()):
        return {}
    rollout = batch.batch["rollout_log_probs"].double()[mask]
    actor = batch.batch["old_log_probs"].double()[mask]
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


def replay_response_width(config) -> int:
    """The response width of a step's rows: stored trajectories longer than this cannot join them.

    verl's agent loop pads every generated response to ``actor_rollout_ref.rollout.response_length`` (which
    defaults to ``data.max_response_length`` but may be set lower), and the candidate rows copy that width; the
    smaller of the two settings is the bound, so a long stored trajectory is left out of the plan (and counted)
    instead of failing the step when it is appended.
    """
    widths = [int(config.data.max_response_length)]
    rollout_width = OmegaConf.select(config, "actor_rollout_ref.rollout.response_length", default=None)
    if rollout_width is not None:
        widths.append(int(rollout_width))
    return min(widths)


def sampled_pass_rate(scores: np.ndarray, batch: DataProto) -> float:
    """Pass rate of the responses generated this step: replayed members (stored correct answers) left out."""
    generated = ~batch.batch[IS_REPLAY_KEY].bool().numpy()
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


class RayExGRPOTrainer(RayPPOTrainer):
    """verl's legacy PPO trainer with the ExGRPO experience manager between rollout and actor update."""

    #: the first measured rollout/actor mean log-prob gap of this process (``rollout_actor_agreement``)
    _first_agreement: float | None = None
    #: the stages of each step run inside ``stage_clock.stage(name, step)``; the task runner's watchdog
    #: (``stage_deadlines.StageSupervisor``) puts its own clock here and stops the run when one passes its deadline
    stage_clock: StageClock = StageClock()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from verl.utils.dataset.rl_dataset import collate_fn as default_collate_fn

        # the trainer builds each step's prompt batch itself (fresh rows + replayed rows)
        self.collate_fn = kwargs.get("collate_fn") or default_collate_fn
        self.k = int(self.config.actor_rollout_ref.rollout.n)
        self.exgrpo = exgrpo_config_from_hydra(self.config)
        self.questions_per_step = int(self.config.data.train_batch_size)
        self.experience = ExperienceManager(self.exgrpo)
        if not hasattr(self.train_dataset, "question_ids"):
            raise TypeError(
                "ExGRPO needs data.custom_cls = recipe/exgrpo/dataset.py:ExGRPODataset (stable question ids); got "
                f"{type(self.train_dataset).__name__}"
            )
        self.row_of_question = self.train_dataset.row_of()
        self.leftover_rows: deque[int] = deque()
        self.loader_epoch = 0
        self.fresh_filter = FreshPromptFilter(immediate=self.exgrpo.retire_fresh_prompts)
        self._loader_iter = None
        self.actor_log_prob_calls = 0  # actor compute_log_prob calls, logged per step
        self.stage_clock = StageClock(deadlines_from_config(self.config))
        # rollouts that may call tools: a trajectory whose exchange ended on an unanswered tool call is not stored
        self.ends_in_tool_call = ToolCallDetector.from_config(self.config, self.tokenizer)

    # ------------------------------------------------------------------ start-up
    def init_workers(self):
        super().init_workers()
        # Installed once: verl warns that swapping the loss per step is unreliable (docs/cpu_backend.md).
        from verl.utils.config import omega_conf_to_dataclass

        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        loss_fn = partial(exgrpo_actor_loss, config=actor_config, settings=LossSettings.from_config(self.exgrpo))
        self.actor_rollout_wg.set_loss_fn(loss_fn)
        # Count every actor forward call (the old-log-prob pass, and any other caller): a step must make as many
        # as a GRPO step (logged as exgrpo/actor_log_prob_calls).
        compute_log_prob = self.actor_rollout_wg.compute_log_prob

        def counted_compute_log_prob(*args, **kwargs):
            self.actor_log_prob_calls += 1
            return compute_log_prob(*args, **kwargs)

        self.actor_rollout_wg.compute_log_prob = counted_compute_log_prob

    # ------------------------------------------------------------------ trace
    def _trace(self, record: dict) -> None:
        """Append one JSON line to ``<trainer.default_local_dir>/exgrpo_trace.jsonl``: what each step replayed
        and drew fresh, and what a resume restored, so runs can be audited and compared after the fact."""
        folder = self.config.trainer.default_local_dir
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, TRACE_FILE), "a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")

    # ------------------------------------------------------------------ fresh prompts
    def _next_loader_rows(self) -> list[int]:
        """Row numbers of the next data-loader batch; a new epoch starts when one is exhausted."""
        for _ in range(2):
            if self._loader_iter is None:
                self._loader_iter = iter(self.train_dataloader)
            try:
                batch_dict = next(self._loader_iter)
                return [int(r) for r in batch_dict[ROW_KEY]]
            except StopIteration:
                self._loader_iter = None
                self.loader_epoch += 1
                self.fresh_filter.on_epoch_boundary(
                    len(self.train_dataset), self.questions_per_step, self.experience.retired
                )
        raise RuntimeError("the training data loader yields no batch: is data.train_files empty after filtering?")

    def _take_fresh_rows(self, n: int, exclude: set[str], metrics: dict) -> list[int]:
        """``n`` fresh prompt rows: leftovers first, then the data loader. Nothing is silently dropped:
        unused rows stay in ``leftover_rows`` (and in the checkpoint); retired questions are skipped and counted.
        """
        rows, deferred, skipped_retired = [], [], 0
        chosen: set[str] = set()
        qids = self.train_dataset.question_ids
        retired = self.experience.retired
        guard = 0
        while len(rows) < n:
            if not self.leftover_rows:
                self.leftover_rows.extend(self._next_loader_rows())
                guard += 1
                if guard > 4 * (len(self.train_dataset) // max(1, self.questions_per_step) + 2):
                    raise RuntimeError(
                        "could not find enough fresh prompts that are neither retired nor replayed this step: "
                        f"{len(self.experience.retired)} of {len(self.train_dataset)} questions are retired"
                    )
            row = self.leftover_rows.popleft()
            qid = qids[row]
            if self.fresh_filter.skips(qid, retired):
                skipped_retired += 1
            elif qid in exclude or qid in chosen:
                deferred.append(row)  # replayed this step (or a duplicate draw): keep it for a later step
            else:
                rows.append(row)
                chosen.add(qid)
        self.leftover_rows.extendleft(reversed(deferred))
        metrics["exgrpo/fresh_skipped_retired"] = skipped_retired
        metrics["exgrpo/fresh_removed_retired"] = self.fresh_filter.num_removed(retired)
        metrics["exgrpo/leftover_prompts"] = len(self.leftover_rows)
        return rows

    # ------------------------------------------------------------------ checkpoint
    def _save_checkpoint(self):
        # The pool is written first, so verl's tracker file (written last by super()) never points to a
        # checkpoint without its pool.
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self.experience.save(
            os.path.join(folder, POOL_DIRNAME),
            trainer_state={
                "leftover_rows": list(self.leftover_rows),
                "loader_epoch": self.loader_epoch,
                "global_steps": self.global_steps,
                "fresh_filter": self.fresh_filter.state_dict(),
            },
        )
        # what was saved, from the live state (not read back): a resume's record must equal it
        self._trace(
            {
                "event": "save",
                "to": os.path.abspath(folder),
                "global_steps": self.global_steps,
                "state_digest": self.experience.state_digest(),
                "leftover_rows": list(self.leftover_rows),
                "loader_epoch": self.loader_epoch,
            }
        )
        super()._save_checkpoint()
        removed = prune_pools(self.config.trainer.default_local_dir, self.config.trainer.get("max_actor_ckpt_to_keep"))
        if removed:
            print(f"[exgrpo] removed the pools of older checkpoints (trainer.max_actor_ckpt_to_keep): {removed}")

    def _load_checkpoint(self):
        result = super()._load_checkpoint()
        if self.global_steps == 0:  # nothing was resumed
            return result
        # the folder verl just loaded (its _load_checkpoint does not return it)
        if self.config.trainer.resume_mode == "resume_path":
            folder = self.config.trainer.resume_from_path
        else:
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        folder = os.path.abspath(folder)
        # verl skips the data-loader state when global_steps is a multiple of the epoch length; with replay the
        # loader runs behind global_steps, so restore it in that case too.
        data_pt = os.path.join(folder, "data.pt")
        steps_per_epoch = len(self.train_dataloader)
        if os.path.exists(data_pt) and steps_per_epoch > 0 and self.global_steps % steps_per_epoch == 0:
            self.train_dataloader.load_state_dict(torch.load(data_pt, weights_only=False))
        pool_dir = os.path.join(folder, POOL_DIRNAME)
        if not os.path.isdir(pool_dir):
            if self.exgrpo.resume_pool == "empty":
                print(f"[exgrpo] no pool in {folder}: starting with an empty pool (exgrpo.resume_pool=empty)")
                return result
            raise FileNotFoundError(
                f"resuming from {folder} but it holds no ExGRPO pool ({pool_dir} is missing). Resume from a checkpoint "
                "written by this recipe, or set exgrpo.resume_pool=empty to start with an empty pool deliberately."
            )
        trainer_state = self.experience.load(pool_dir)
        self.leftover_rows = deque(int(r) for r in trainer_state.get("leftover_rows", []))
        self.loader_epoch = int(trainer_state.get("loader_epoch", 0))
        self.fresh_filter.load_state_dict(trainer_state.get("fresh_filter"))
        print(
            f"[exgrpo] restored pool from {pool_dir}: {self.experience.summary()}; "
            f"{len(self.leftover_rows)} leftover prompts"
        )
        self._trace(
            {
                "event": "resume",
                "from": folder,
                "global_steps": self.global_steps,
                "state_digest": self.experience.state_digest(),
                "leftover_rows": list(self.leftover_rows),
                "loader_epoch": self.loader_epoch,
            }
        )
        return result

    # ------------------------------------------------------------------ one step
    def _plan_replay(self) -> ReplayPlan:
        """This step's replayed questions and the candidates that fit the rows they join
        (:func:`replay_response_width`; longer ones are counted in ``exgrpo/selection/too_long_candidates``, a
        question with none left in ``exgrpo/replay/dropped_too_long``)."""
        return self.experience.plan_replay(
            self.questions_per_step, self.global_steps, max_response_length=replay_response_width(self.config)
        )

    def _draw_questions(self, metrics: dict, timing_raw: dict) -> tuple[DataProto, int, ReplayPlan]:
        """Replayed questions (with their candidate trajectories) and fresh prompts; returns the prompt batch
        (fresh rows first, then one row per replayed question), the number of fresh rows and the replay plan."""
        b = self.questions_per_step
        plan = ReplayPlan([], [])
        if self._replaying:
            with marked_timer("exgrpo_sample", timing_raw):
                plan = self._plan_replay()
        fresh_rows = self._take_fresh_rows(b - len(plan), exclude=set(plan.question_ids), metrics=metrics)
        rows = fresh_rows + [self.row_of_question[q] for q in plan.question_ids]
        batch_dict = self.collate_fn([self.train_dataset[r] for r in rows])
        batch = DataProto.from_single_dict(batch_dict)
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in rows], dtype=object)
        self._step_trace = {
            "event": "step",
            "step": self.global_steps,
            "mixed": bool(self.experience.mixed),
            "replay_question_ids": list(plan.question_ids),
            "fresh_rows": list(fresh_rows),
            "selected_entry_ids": [],  # filled once the old-log-prob pass has selected them
            "selected_scores": [],
            "replayed_members": [],
        }
        return batch, len(fresh_rows), plan

    def _generate(self, batch: DataProto, counts: np.ndarray, timing_raw: dict) -> DataProto:
        """``counts[i]`` samples of prompt i (``generate_with_counts``); the rollout replicas are asleep when this
        returns. Returns the prompt rows repeated by ``counts`` with their generated responses."""
        gen_batch = verl_compat.gen_batch(self, batch)
        # the generation batch takes every non-reward key from the batch; keep ours on the batch too
        for key in (QUESTION_ID_KEY, ROW_KEY):
            batch.non_tensor_batch[key] = gen_batch.non_tensor_batch[key]
        gen_batch.meta_info["global_steps"] = self.global_steps
        with self.stage_clock.stage("generate", self.global_steps), marked_timer("gen", timing_raw, color="red"):
            gen_output = generate_with_counts(self, gen_batch, counts)
        timing_raw.update(gen_output.meta_info.pop("timing", {}))
        batch = expand_by_counts(batch, counts).union(gen_output)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        return batch

    def _old_log_prob_pass(self, batch: DataProto, metrics: dict) -> DataProto:
        """verl's old-log-prob pass (with per-token entropies) over every row of ``batch``, in one call.

        The rows are padded to what verl's dispatch needs (the dp size, times the micro-batch size without
        dynamic batch size) and balanced across dp ranks; the padding rows are dropped afterwards and the rows
        come back in their original order.
        """
        n = len(batch)
        batch.batch[PASS_ROW_KEY] = torch.arange(n, dtype=torch.int64)
        divisor = verl_compat.dp_size(self, self.actor_rollout_wg, "actor")
        rollout_cfg = self.config.actor_rollout_ref.rollout
        if not rollout_cfg.get("log_prob_use_dynamic_bsz", False):
            divisor *= int(rollout_cfg.get("log_prob_micro_batch_size_per_gpu") or 1)
        batch, pad = pad_dataproto_to_divisor(batch, divisor)
        if pad:
            batch.batch[PASS_ROW_KEY][n:] = -1
        if self.config.trainer.balance_batch:
            verl_compat.balance_batch(self, batch, metrics, logging_prefix="exgrpo/old_log_prob_seqlen")
        # the worker's MFU figure reads these (as in verl's own step)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = []
        with self.stage_clock.stage("old_log_prob", self.global_steps):
            old_log_prob, mfu = verl_compat.old_log_probs(self, batch)
        metrics["perf/mfu/actor_infer"] = mfu
        batch = batch.union(old_log_prob)
        position = batch.batch[PASS_ROW_KEY]
        real = torch.nonzero(position >= 0).flatten()
        batch = batch.select_idxs(real[torch.argsort(position[real])])
        batch.batch.pop(PASS_ROW_KEY)
        return batch

    def _score_and_select(
        self, batch: DataProto, counts: np.ndarray, num_fresh: int, plan: ReplayPlan, metrics: dict, timing_raw: dict
    ) -> DataProto:
        """Old log-probs of the step and trajectory selection in ONE actor pass (module docstring, step 3).

        Returns the step's rows: the generated ones, then one replayed member per replayed question (re-scored
        by the reward function or model), all with their old log-probs; the unselected candidates are gone.

        A reward model colocated with the actor scores before the pass, as in verl's own step (the rollout is
        asleep, no actor compute has run): the generated rows and, when replayed members are re-scored, every
        candidate row, in one call (:meth:`_score_before_the_pass`). After the pass no reward-model call follows:
        its wake-up would meet the pass's activations still held by the actor's allocator. Elsewhere (a reward
        function, a reward model in its own pool) only the selected members are scored, after the selection.
        """
        mark_fresh(batch)
        candidates_scored = self._candidates_scored_before_the_pass()
        if not candidates_scored:
            batch = self._score_before_the_pass(batch, timing_raw)
        if plan.question_ids:
            batch = append_candidates(batch, counts, num_fresh, plan.candidates, self.tokenizer.pad_token_id)
        if candidates_scored:
            batch = self._score_before_the_pass(batch, timing_raw)
        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._old_log_prob_pass(batch, metrics)
        if plan.question_ids:
            with marked_timer("exgrpo_select", timing_raw):
                stats = candidate_token_stats(batch) if plan.needs_scores else None
                selected = self.experience.select(plan, stats)
                batch = keep_selected(batch, selected_candidate_indices(plan.candidates, selected))
            with marked_timer("exgrpo_replay_reward", timing_raw):
                self._score_replayed_members(batch, selected, already_scored=candidates_scored)
            metrics.update(replay_group_metrics(batch))
            metrics["exgrpo/old_log_prob_candidate_rows"] = float(plan.num_candidates)
            self._step_trace["selected_entry_ids"] = [s.entry_id for s in selected]
            self._step_trace["selected_scores"] = [s.score for s in selected]
            self._step_trace["replayed_members"] = replayed_row_digests(batch)  # tokens and mask, as trained
        else:
            batch.batch.pop(CANDIDATE_KEY, None)
        batch.batch.pop("entropys")
        metrics.update(self._rollout_actor_agreement(batch))  # the weight sync's health, on the generated rows
        return batch

    def _candidates_scored_before_the_pass(self) -> bool:
        """A colocated reward model re-scores the replayed members: every candidate is scored with the generated
        rows before the pass (the selected one keeps its score; a model scores the same text the same way)."""
        return reward_model_colocated(self.config) and self.experience.cfg.replay_reward != "stored"

    def _score_before_the_pass(self, batch: DataProto, timing_raw: dict) -> DataProto:
        """The colocated reward model's scores of every row of ``batch`` that has none (nothing otherwise)."""
        with self.stage_clock.stage("reward", self.global_steps):
            return score_with_colocated_reward_model(self, batch, timing_raw)

    def _rollout_actor_agreement(self, batch: DataProto) -> dict[str, float]:
        """``rollout_actor_agreement`` against the first step this process measured (its noise floor)."""
        out = rollout_actor_agreement(batch, self._first_agreement)
        mean = out.get("exgrpo/rollout_actor_log_prob_diff_mean")
        if self._first_agreement is None and mean is not None and mean > 0:
            self._first_agreement = mean
            out["exgrpo/rollout_actor_log_prob_diff_mean_vs_first"] = 1.0
        return out

    def _score_replayed_members(self, batch: DataProto, selected=None, already_scored: bool = False) -> None:
        """Reward of the replayed members, like any other member's (their rows carry zeroed ``rm_scores``); with
        ``exgrpo.replay_reward=stored`` the reward stored with each ``selected`` trajectory instead. Nothing when the
        members were scored before the pass (``already_scored``: a colocated reward model scored every candidate)."""
        if self.experience.cfg.replay_reward == "stored":
            set_stored_replay_rewards(batch, [s.candidate.reward for s in selected])
            return
        if already_scored:
            return
        rows = torch.nonzero(batch.batch[IS_REPLAY_KEY]).flatten()
        with self.stage_clock.stage("reward", self.global_steps):
            scored = self.reward_loop_manager.compute_rm_score(
                with_prompt_for_reward_functions(batch.select_idxs(rows))
            )
        batch.batch["rm_scores"][rows] = scored.batch["rm_scores"].to(batch.batch["rm_scores"].dtype)
        for key, value in scored.non_tensor_batch.items():
            if key in batch.non_tensor_batch:
                batch.non_tensor_batch[key][rows.numpy()] = value
            else:  # a key only the replayed rows carry: fill the generated rows with None
                column = np.full(len(batch), None, dtype=object)
                column[rows.numpy()] = value
                batch.non_tensor_batch[key] = column

    def _prepare_update(self, batch: DataProto, mixed: bool, metrics: dict) -> None:
        """The per-row fields of the step that travel with every micro-batch to the loss, and the dp balance."""
        batch.batch[MIXED_KEY] = torch.full((len(batch),), mixed, dtype=torch.bool)
        # rows of replay groups + this step's scheduled ρ: the Eq. 4 term weights (exgrpo.weight_terms_by_ratio)
        mark_replay_groups(batch, self.experience.schedule.replay_ratio(self.global_steps) if mixed else 0.0)
        if self.config.trainer.balance_batch:  # for the update (the pass balanced its own rows)
            verl_compat.balance_batch(self, batch, metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = []

    def _rewards_and_advantages(self, batch: DataProto, metrics: dict, timing_raw: dict) -> np.ndarray:
        """Every member's reward (generated rows: scored by verl's reward loop during generation; replayed
        members: re-scored in ``_score_and_select``) and the group-relative advantages of the mixed groups
        (docs/algorithm.md §7). Returns the per-row scores."""
        with marked_timer("reward", timing_raw, color="yellow"):
            reward_tensor, reward_extra_infos = extract_reward(batch)
            metrics.update(reward_health(reward_extra_infos or {}))
        with marked_timer("adv", timing_raw, color="brown"):
            batch.batch["token_level_scores"] = reward_tensor
            batch.batch["token_level_rewards"] = reward_tensor  # no KL in the reward (no reference model)
            if reward_extra_infos:
                batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra_infos.items()})
            scores = reward_tensor.sum(-1).numpy()
            metrics.update(mode_reward_metrics(self.experience.mode, scores, batch, reward_extra_infos))
            adv = group_relative_advantages(
                scores,
                batch.non_tensor_batch["uid"],
                norm_by_std=bool(self.config.algorithm.get("norm_adv_by_std_in_grpo", False)),
            )
            # groups without reward variance (no gradient), fresh vs replayed, and replay's share of |A|
            metrics.update(
                group_signal_metrics(scores, batch.non_tensor_batch["uid"], batch.batch[IS_REPLAY_KEY].numpy(), adv)
            )
            adv_t = token_level_advantages(adv, batch.batch["response_mask"])
            batch.batch["advantages"] = adv_t
            batch.batch["returns"] = adv_t
        return scores

    def _update_policy(self, batch: DataProto, metrics: dict, timing_raw: dict) -> None:
        """verl's actor update; the mixed loss was installed in every worker at start-up (``init_workers``)."""
        with self.stage_clock.stage("update", self.global_steps), marked_timer("update_actor", timing_raw, color="red"):
            actor_output = verl_compat.update_actor(self, batch)
        metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))

    def _collect_and_schedule(self, batch: DataProto, scores: np.ndarray, metrics: dict, timing_raw: dict) -> float:
        """Collection into the pool and retirement (docs/algorithm.md §3), then the delayed-start check on the
        batch pass rate (§9) and the re-add ablation. Returns the batch pass rate."""
        with marked_timer("exgrpo_collect", timing_raw):
            if self.exgrpo.enable:
                groups = collection_groups(batch, self.ends_in_tool_call)
                metrics.update(self.experience.collect(self.global_steps, groups))
            pass_rate = batch_pass_rate(scores)
            metrics["exgrpo/sampled_pass_rate"] = sampled_pass_rate(scores, batch)
            if self.ends_in_tool_call is not None:  # a run whose rollouts may call tools
                generated = ~batch.batch[IS_REPLAY_KEY].bool().numpy()
                metrics.update(tool_turn_metrics(scores, batch.batch["response_mask"].numpy(), generated))
            self.experience.observe_rewards(scores, self.global_steps)  # the pass rate, or §13's signal
            self.experience.readd_retired(self.global_steps)
        return pass_rate

    def _save_and_sync(self, is_last_step: bool, timing_raw: dict) -> None:
        """A checkpoint every ``trainer.save_freq`` steps and at the last one, then the new weights to the rollout."""
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and (is_last_step or self.global_steps % save_freq == 0):
            with self.stage_clock.stage("save_checkpoint", self.global_steps):
                with marked_timer("save_checkpoint", timing_raw, color="green"):
                    self._save_checkpoint()
        with self.stage_clock.stage("weight_sync", self.global_steps):
            with marked_timer("update_weights", timing_raw, color="red"):
                self.checkpoint_manager.update_weights(self.global_steps)

    def _validate_on_cadence(self, is_last_step: bool, timing_raw: dict) -> dict | None:
        """verl's validation every ``trainer.test_freq`` steps and at the last one; None when not due."""
        test_freq = self.config.trainer.test_freq
        if not (test_freq > 0 and (is_last_step or self.global_steps % test_freq == 0)):
            return None
        with self.stage_clock.stage("validate", self.global_steps), marked_timer("testing", timing_raw, color="green"):
            return verl_compat.validate(self)

    def _step_metrics(
        self,
        batch: DataProto,
        plan: ReplayPlan,
        num_fresh: int,
        mixed: bool,
        pass_rate: float,
        actor_calls: int,
        timing_raw: dict,
    ) -> dict:
        """The step's metrics beyond those its stages logged: pool and schedule state, the step's draw, verl's
        data, timing and throughput figures (docs/trainer.md, "Metrics")."""
        metrics = dict(self.experience.metrics(self.global_steps))
        metrics["exgrpo/batch_pass_rate"] = pass_rate
        metrics["exgrpo/actor_log_prob_calls"] = actor_calls
        metrics["exgrpo/replayed_questions"] = len(plan)
        metrics["exgrpo/fresh_questions"] = num_fresh
        metrics["exgrpo/mixed"] = float(mixed)
        metrics["exgrpo/loader_epoch"] = self.loader_epoch
        metrics.update({"training/global_step": self.global_steps, "training/epoch": self.loader_epoch})
        metrics.update(compute_data_metrics(batch=batch, use_critic=False))
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
        n_gpus = self.resource_pool_manager.get_n_gpus()
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=n_gpus))
        return metrics

    @property
    def _replaying(self) -> bool:
        """Replay is on for this step: ExGRPO is enabled and the delayed start has happened."""
        return bool(self.exgrpo.enable and self.experience.mixed)

    # ------------------------------------------------------------------ the loop
    def _start(self, logger) -> bool:
        """Resume (verl's state and the pool), push the weights to the rollout, validate before training.
        False when ``trainer.val_only`` asks for nothing more."""
        self.global_steps = 0
        self._load_checkpoint()
        with self.stage_clock.stage("weight_sync", self.global_steps):
            self.checkpoint_manager.update_weights(self.global_steps)
        if self.config.trainer.get("val_before_train", True):
            with self.stage_clock.stage("validate", self.global_steps):
                val_metrics = verl_compat.validate(self)
            pprint(f"Initial validation metrics: {val_metrics}")
            logger.log(data=val_metrics, step=self.global_steps)
            if self.config.trainer.get("val_only", False):
                return False
        return True

    def _run_step(
        self, metrics: dict, timing_raw: dict, is_last_step: bool
    ) -> tuple[DataProto, ReplayPlan, int, bool, float]:
        """The stages of one training step, in order (docs/trainer.md, "One step"); returns the step's rows, its
        replay plan, the number of fresh prompts, whether it was mixed and its batch pass rate."""
        mixed = self._replaying
        with marked_timer("step", timing_raw):
            batch, num_fresh, plan = self._draw_questions(metrics, timing_raw)
            counts = generation_counts(num_fresh, len(plan), self.k)
            batch = self._generate(batch, counts, timing_raw)
            batch = self._score_and_select(batch, counts, num_fresh, plan, metrics, timing_raw)
            self._trace(self._step_trace)
            self._prepare_update(batch, mixed, metrics)
            scores = self._rewards_and_advantages(batch, metrics, timing_raw)
            self._update_policy(batch, metrics, timing_raw)
            pass_rate = self._collect_and_schedule(batch, scores, metrics, timing_raw)
            self._save_and_sync(is_last_step, timing_raw)
        return batch, plan, num_fresh, mixed, pass_rate

    def fit(self):
        from verl.utils.tracking import Tracking

        logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        if not self._start(logger):
            return
        progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="ExGRPO training")
        self.global_steps += 1
        last_val_metrics = None
        while self.global_steps <= self.total_training_steps:
            metrics: dict = {}
            timing_raw: dict = {}
            is_last_step = self.global_steps >= self.total_training_steps
            calls_before = self.actor_log_prob_calls
            batch, plan, num_fresh, mixed, pass_rate = self._run_step(metrics, timing_raw, is_last_step)
            val_metrics = self._validate_on_cadence(is_last_step, timing_raw)
            if val_metrics is not None:
                metrics.update(val_metrics)
                if is_last_step:
                    last_val_metrics = val_metrics
            actor_calls = self.actor_log_prob_calls - calls_before
            metrics.update(self._step_metrics(batch, plan, num_fresh, mixed, pass_rate, actor_calls, timing_raw))
            logger.log(data=metrics, step=self.global_steps)
            progress_bar.update(1)
            self.global_steps += 1
            if is_last_step:
                pprint(f"Final validation metrics: {last_val_metrics}")
                break
        progress_bar.close()
        logger.finish()  # flush the file/TensorBoard/W&B backends
