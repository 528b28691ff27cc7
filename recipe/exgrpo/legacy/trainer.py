"""``RayExGRPOTrainer``: verl's legacy ``RayPPOTrainer`` with ExGRPO's replay step (docs/algorithm.md, docs/trainer.md).

The replay step itself is trainer-neutral (``recipe/exgrpo/replay_step/``: :class:`ReplayStep` over a step's
:class:`Rows`); this adapter runs verl's parts of a step (generation, the actor's old-log-prob pass, the reward loop,
the actor update, checkpoints, the weight sync, validation), converts between verl's ``DataProto`` and ``Rows``
without copying, and is the replay step's backend (:class:`~recipe.exgrpo.replay_step.ReplayBackend`: the actor's
log-probs and entropies of some rows, the reward's scores of some rows). One step is one :class:`StepState`, carried
from stage to stage by ``_run_step`` (docs/trainer.md, "One step"):

1. ``_draw_questions``: the replay step draws the replayed questions (after the delayed start) with their candidate
   stored trajectories and the fresh prompts (leftovers first, then the data loader; retired skipped); the prompt
   batch;
2. ``_generate``: K samples per fresh prompt, K−1 per replayed one (``generation.generate_with_counts``); then the
   rollout replicas sleep;
3. ``_score_and_select``: the replay step's ONE old-log-prob pass of the actor over the generated rows AND every
   candidate trajectory, the selection by per-token entropy, the replayed members re-scored. Nothing runs on the
   actor while the rollout is awake, and a step makes as many actor forward calls as a GRPO step;
4. ``_prepare_update``: the per-row step fields the loss reads (mixed mode, replay groups, ρ) and the dp balance;
5. ``_rewards_and_advantages``: verl's reward extraction, then group-relative advantages on the mixed groups;
6. ``_update_policy``: verl's actor update with the mixed loss (installed once at start-up);
7. ``_collect_and_schedule``: collection into the pool, retirement, the delayed-start check;
8. ``_save_and_sync``: checkpoint on its cadence (pool inside ``global_step_N/exgrpo``), weights to the rollout;
   then ``_validate_on_cadence`` and ``_step_metrics``.
"""

from __future__ import annotations

import os
import uuid
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

from recipe.exgrpo import verl_compat
from recipe.exgrpo.dataproto import as_dataproto, rows_of
from recipe.exgrpo.legacy.generation import expand_by_counts, generate_with_counts
from recipe.exgrpo.lora import save_lora_adapter
from recipe.exgrpo.replay_step import Rows, StepState, prune_pools
from recipe.exgrpo.replay_step.fields import QUESTION_ID_KEY, ROW_KEY
from recipe.exgrpo.runtime.stage_deadlines import StageClock, deadlines_from_config
from recipe.exgrpo.verl_setup import dataset_rows, install_mixed_loss, replay_step_for

#: per row of the old-log-prob pass: its position before padding and balancing (-1 on padding rows)
PASS_ROW_KEY = "exgrpo_pass_row"


class RayExGRPOTrainer(RayPPOTrainer):
    """verl's legacy PPO trainer with the ExGRPO replay step between rollout and actor update."""

    #: the stages of each step run inside ``stage_clock.stage(name, step)``; the task runner's watchdog
    #: (``stage_deadlines.StageSupervisor``) puts its own clock here and stops the run when one passes its deadline
    stage_clock: StageClock = StageClock()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from verl.utils.dataset.rl_dataset import collate_fn as default_collate_fn

        # the trainer builds each step's prompt batch itself (fresh rows + replayed rows)
        self.collate_fn = kwargs.get("collate_fn") or default_collate_fn
        self.replay = replay_step_for(
            self.config, self.train_dataset, self.tokenizer, lambda: dataset_rows(self.train_dataloader)
        )
        self.actor_log_prob_calls = 0  # actor compute_log_prob calls, logged per step
        self.stage_clock = StageClock(deadlines_from_config(self.config))

    # ------------------------------------------------------------------ start-up
    def init_workers(self):
        super().init_workers()
        install_mixed_loss(self.actor_rollout_wg, self.config, self.replay, self._count_actor_call)

    def _count_actor_call(self) -> None:
        self.actor_log_prob_calls += 1

    # ------------------------------------------------------------------ checkpoint
    def _save_checkpoint(self):
        # The pool is written first, so verl's tracker file (written last by super()) never points to a
        # checkpoint without its pool.
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self.replay.save(folder, self.global_steps)
        super()._save_checkpoint()
        save_lora_adapter(self.config, folder)
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
        self.replay.restore(folder, self.global_steps)
        return result

    # ------------------------------------------------------------------ the replay step's backend
    def log_probs_and_entropies(self, rows: Rows, state: StepState) -> Rows:
        """verl's old-log-prob pass (with per-token entropies) over every row, in one call (``ReplayBackend``).

        The rows are padded to what verl's dispatch needs (the dp size, times the micro-batch size without
        dynamic batch size) and balanced across dp ranks; the padding rows are dropped afterwards and the rows
        come back in their original order.
        """
        batch = as_dataproto(rows)
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
            verl_compat.balance_batch(self, batch, state.metrics, logging_prefix="exgrpo/old_log_prob_seqlen")
        # the worker's MFU figure reads these (as in verl's own step)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = []
        with self.stage_clock.stage("old_log_prob", state.step):
            old_log_prob, mfu = verl_compat.old_log_probs(self, batch)
        state.metrics["perf/mfu/actor_infer"] = mfu
        batch = batch.union(old_log_prob)
        position = batch.batch[PASS_ROW_KEY]
        real = torch.nonzero(position >= 0).flatten()
        batch = batch.select_idxs(real[torch.argsort(position[real])])
        batch.batch.pop(PASS_ROW_KEY)
        return rows_of(batch)

    def score_rows(self, rows: Rows, state: StepState) -> Rows:
        """verl's reward loop on ``rows`` (the reward function, or the reward model it wakes and puts to sleep)."""
        with self.stage_clock.stage("reward", state.step):
            return rows_of(self.reward_loop_manager.compute_rm_score(as_dataproto(rows)))

    # ------------------------------------------------------------------ the stages of a step
    def _draw_questions(self, state: StepState) -> DataProto:
        """The prompt batch of the step: the replay step's draw (fresh rows first, then one row per replayed
        question), collated as verl's data loader would, with a new uid per prompt."""
        rows = self.replay.draw(state)
        batch = DataProto.from_single_dict(self.collate_fn([self.train_dataset[r] for r in rows]))
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in rows], dtype=object)
        return batch

    def _generate(self, state: StepState, prompts: DataProto) -> None:
        """``state.counts[i]`` samples of prompt i (``generate_with_counts``); the rollout replicas are asleep when
        this returns. Sets ``state.rows``: the prompt rows repeated by the counts with their generated responses."""
        gen_batch = verl_compat.gen_batch(self, prompts)
        # the generation batch takes every non-reward key from the batch; keep ours on the batch too
        for key in (QUESTION_ID_KEY, ROW_KEY):
            prompts.non_tensor_batch[key] = gen_batch.non_tensor_batch[key]
        gen_batch.meta_info["global_steps"] = state.step
        with self.stage_clock.stage("generate", state.step), state.timed("gen"):
            gen_output = generate_with_counts(
                self.async_rollout_manager,
                gen_batch,
                state.counts,
                num_workers=int(self.config.actor_rollout_ref.rollout.agent.num_workers),
                sleep=self.checkpoint_manager.sleep_replicas,
            )
        state.timing.update(gen_output.meta_info.pop("timing", {}))
        batch = expand_by_counts(prompts, state.counts).union(gen_output)
        if "response_mask" not in batch.batch.keys():
            batch.batch["response_mask"] = compute_response_mask(batch)
        state.rows = rows_of(batch)

    def _score_and_select(self, state: StepState) -> None:
        """The one old-log-prob pass with the selection and the replayed members' rewards (``ReplayStep``)."""
        self.replay.score_and_select(state, state.rows, backend=self)

    def _prepare_update(self, state: StepState) -> None:
        """The per-row fields of the step that travel with every micro-batch to the loss, and the dp balance."""
        self.replay.mark_update_rows(state)
        batch = as_dataproto(state.rows)
        if self.config.trainer.balance_batch:  # for the update (the pass balanced its own rows)
            verl_compat.balance_batch(self, batch, state.metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        batch.meta_info["images_seqlens"] = []
        state.rows = rows_of(batch)

    def _rewards_and_advantages(self, state: StepState) -> None:
        """Every member's reward (generated rows: scored by verl's reward loop during generation; replayed
        members: re-scored in ``_score_and_select``) and the group-relative advantages of the mixed groups
        (docs/algorithm.md §7)."""
        with state.timed("reward"):
            reward_tensor, reward_extra_infos = extract_reward(as_dataproto(state.rows))
            state.metrics.update(self.replay.reward_health(reward_extra_infos))
        with state.timed("adv"):
            self.replay.advantages(state, reward_tensor, reward_extra_infos)

    def _update_policy(self, state: StepState) -> None:
        """verl's actor update; the mixed loss was installed in every worker at start-up (``init_workers``)."""
        with self.stage_clock.stage("update", state.step), state.timed("update_actor"):
            actor_output = verl_compat.update_actor(self, as_dataproto(state.rows))
        state.metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))

    def _collect_and_schedule(self, state: StepState) -> None:
        """Collection into the pool, retirement and the delayed-start check (``ReplayStep.collect``)."""
        self.replay.collect(state)

    def _save_and_sync(self, state: StepState) -> None:
        """A checkpoint every ``trainer.save_freq`` steps and at the last one, then the new weights to the rollout."""
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and (state.is_last or state.step % save_freq == 0):
            with self.stage_clock.stage("save_checkpoint", state.step), state.timed("save_checkpoint"):
                self._save_checkpoint()
        with self.stage_clock.stage("weight_sync", state.step), state.timed("update_weights"):
            self.checkpoint_manager.update_weights(state.step)

    def _validate_on_cadence(self, state: StepState) -> dict | None:
        """verl's validation every ``trainer.test_freq`` steps and at the last one; None when not due."""
        test_freq = self.config.trainer.test_freq
        if not (test_freq > 0 and (state.is_last or state.step % test_freq == 0)):
            return None
        with self.stage_clock.stage("validate", state.step), state.timed("testing"):
            return verl_compat.validate(self)

    def _step_metrics(self, state: StepState) -> dict:
        """The step's metrics beyond those its stages logged: the replay step's (pool and schedule state, the step's
        draw), verl's data, timing and throughput figures (docs/trainer.md, "Metrics")."""
        metrics = self.replay.metrics(state)
        batch = as_dataproto(state.rows)
        metrics.update(compute_data_metrics(batch=batch, use_critic=False))
        metrics.update(compute_timing_metrics(batch=batch, timing_raw=state.timing))
        n_gpus = self.resource_pool_manager.get_n_gpus()
        metrics.update(compute_throughout_metrics(batch=batch, timing_raw=state.timing, n_gpus=n_gpus))
        return metrics

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

    def _run_step(self, state: StepState) -> None:
        """The stages of one training step, in order (docs/trainer.md, "One step")."""
        with state.timed("step"):
            prompts = self._draw_questions(state)
            self._generate(state, prompts)
            self._score_and_select(state)
            self._prepare_update(state)
            self._rewards_and_advantages(state)
            self._update_policy(state)
            self._collect_and_schedule(state)
            self._save_and_sync(state)

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
            is_last_step = self.global_steps >= self.total_training_steps
            state = self.replay.begin(self.global_steps, is_last_step, timer=marked_timer)
            calls_before = self.actor_log_prob_calls
            self._run_step(state)
            val_metrics = self._validate_on_cadence(state)
            if val_metrics is not None:
                state.metrics.update(val_metrics)
                if is_last_step:
                    last_val_metrics = val_metrics
            state.actor_calls = self.actor_log_prob_calls - calls_before
            state.metrics.update(self._step_metrics(state))
            logger.log(data=state.metrics, step=state.step)
            progress_bar.update(1)
            self.global_steps += 1
            if is_last_step:
                pprint(f"Final validation metrics: {last_val_metrics}")
                break
        progress_bar.close()
        logger.finish()  # flush the file/TensorBoard/W&B backends
