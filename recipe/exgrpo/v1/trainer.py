"""``ExGRPOTrainerV1``: verl's v1 synchronous trainer (``trainer.use_v1=true``, ``trainer.v1.trainer_mode=sync``)
with ExGRPO's replay step (docs/trainer.md, "The v1 step").

The replay step is the one the legacy adapter runs (``recipe/exgrpo/replay_step/``); this adapter moves a step's rows
between verl's TransferQueue and the step's :class:`Rows` (``tq_rows.py``) and is its backend. verl's ``fit`` runs
the loop (validation, the checkpoint cadence, the weight sync of ``on_step_end``, the step's metrics, the clearing of
the step's keys); ``step`` is ExGRPO's, one :class:`StepState` carried through its stages:

1. ``_submit_questions``: the replay step draws the replayed questions and the fresh prompts; each prompt goes to
   the agent loop with its own sample count (``__rollout_n__``: K fresh, K−1 replayed);
2. ``_sample``: verl's replay buffer (a staging queue of generated groups, not experience replay) returns the
   step's groups once all are generated; the rollout sleeps;
3. ``_score_and_select``: ONE old-log-prob pass (verl's ``_compute_old_log_prob``, which returns the per-token
   entropies) over the generated rows and every candidate, put into TransferQueue as rows of their group; the
   selection; the unselected candidates' rows removed from TransferQueue; the replayed members re-scored;
4. ``_prepare_update``: the per-row fields the loss reads, the advantages of the mixed groups, written to
   TransferQueue; the dp balance;
5. ``_update_policy``: verl's actor update with the mixed loss (installed once, ``on_init_end``);
6. ``replay.collect``: collection, retirement, the delayed-start check; the replay step's metrics.

The checkpoint holds the pool (``_save_checkpoint`` / ``_load_checkpoint``, pool first), and every stage runs inside
the stage clock that keeps its deadline, as on the legacy trainer.
"""

from __future__ import annotations

import uuid

import numpy as np
import torch
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug import marked_timer

from recipe.exgrpo import verl_compat
from recipe.exgrpo.dataproto import as_dataproto, rows_of
from recipe.exgrpo.lora import save_lora_adapter
from recipe.exgrpo.replay_step import ReplayStep, Rows, StepState, prune_pools
from recipe.exgrpo.replay_step.batch import response_lengths
from recipe.exgrpo.replay_step.fields import (
    BEHAVIOUR_LOG_PROBS_KEY,
    CANDIDATE_KEY,
    EXPERIENCE_GROUP_KEY,
    IS_REPLAY_KEY,
    MIXED_KEY,
    RATIO_KEY,
)
from recipe.exgrpo.runtime.stage_deadlines import StageClock, deadlines_from_config
from recipe.exgrpo.v1.tq_rows import TQ_KEY, jagged, rows_from_tq, split_key, stored_records
from recipe.exgrpo.verl_setup import dataset_rows, install_mixed_loss, replay_step_for

PARTITION = "train"
#: seconds between the sync sampler's looks for the step's finished groups (verl's default, 2 s, made every step on
#: the CPU backend wait ~2 s after its rollouts; on a GPU it adds up to 2 s to each step's generation)
SAMPLER_POLL_S = 0.1
#: the fields of the kept rows the update and verl's step metrics read beyond what the agent loop wrote
_RESPONSE_WRITES = ("rm_scores", "advantages", "returns", BEHAVIOUR_LOG_PROBS_KEY)
_ROW_WRITES = (IS_REPLAY_KEY, MIXED_KEY, RATIO_KEY, EXPERIENCE_GROUP_KEY)


def _tq():
    import transfer_queue as tq

    return tq


def _batch_meta(keys, tags):
    from transfer_queue import KVBatchMeta

    return KVBatchMeta(keys=list(keys), tags=[dict(t) for t in tags], partition_id=PARTITION)


class ExGRPOV1Steps:
    """The ExGRPO step on any of verl's v1 trainers (module docstring): mixed in before verl's trainer class, so its
    overrides call verl's through ``super()``. ``_generate`` is the mode's: the synchronous one here, the
    asynchronous one in ``recipe/exgrpo/v1/async_trainer.py``."""

    #: the task runner's watchdog (``stage_deadlines.StageSupervisor``) puts its own clock here
    stage_clock: StageClock = StageClock()
    replay: ReplayStep

    def __init__(self, config):
        super().__init__(config)
        self.stage_clock = StageClock(deadlines_from_config(config))
        verl_compat.v1_set_sampler_poll(self, SAMPLER_POLL_S)
        self.actor_log_prob_calls = 0

    # ------------------------------------------------------------------ start-up
    def _init_dataloader(self):
        super()._init_dataloader()
        from verl.utils.dataset.rl_dataset import collate_fn

        self.collate_fn = collate_fn
        self.replay = replay_step_for(
            self.config, self.train_dataset, self.tokenizer, lambda: dataset_rows(self.train_dataloader)
        )

    def on_init_end(self):
        install_mixed_loss(self.actor_rollout_wg, self.config, self.replay, self._count_actor_call)
        with self.stage_clock.stage("weight_sync", self.global_steps):
            super().on_init_end()

    def _count_actor_call(self) -> None:
        self.actor_log_prob_calls += 1

    def on_step_end(self):
        with self.stage_clock.stage("weight_sync", self.global_steps):
            super().on_step_end()

    # ------------------------------------------------------------------ checkpoint, validation
    def _save_checkpoint(self):
        import os

        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        with self.stage_clock.stage("save_checkpoint", self.global_steps):
            self.replay.save(folder, self.global_steps)  # the pool first: verl's tracker file is written last
            super()._save_checkpoint()
            save_lora_adapter(self.config, folder)
        removed = prune_pools(self.config.trainer.default_local_dir, self.config.trainer.get("max_actor_ckpt_to_keep"))
        if removed:
            print(f"[exgrpo] removed the pools of older checkpoints (trainer.max_actor_ckpt_to_keep): {removed}")

    def _load_checkpoint(self):
        import os

        super()._load_checkpoint()
        if self.global_steps == 0:  # nothing was resumed
            return
        if self.config.trainer.resume_mode == "resume_path":
            folder = self.config.trainer.resume_from_path
        else:
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self.replay.restore(os.path.abspath(folder), self.global_steps)

    def _validate(self):
        with self.stage_clock.stage("validate", self.global_steps):
            return super()._validate()

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        """verl's step metrics, and the rows of the train partition that are not the step's batch (which ``fit``
        clears next): a candidate or padding row the step left behind would stay in TransferQueue for good
        (``exgrpo/v1/leaked_rows``, 0 every step; prompt entries, the agent loop's own, are not counted)."""
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        listed = _tq().kv_list(PARTITION).get(PARTITION, {})
        step_keys = set(batch.keys)
        leaked = [k for k, tag in listed.items() if k not in step_keys and not (tag or {}).get("is_prompt", False)]
        metrics["exgrpo/v1/leaked_rows"] = len(leaked)
        metrics["exgrpo/v1/prompt_entries"] = sum(1 for tag in listed.values() if (tag or {}).get("is_prompt", False))

    # ------------------------------------------------------------------ the replay step's backend
    def log_probs_and_entropies(self, rows: Rows, state: StepState) -> Rows:
        """verl's old-log-prob pass over every row in one call (``ReplayBackend``): the candidate rows go into
        TransferQueue first, as rows of their question's group; the batch is balanced (and padded) across dp ranks;
        the log-probs and entropies come back in the rows' order and the padding rows are removed."""
        tq = _tq()
        keys = list(rows.columns[TQ_KEY])
        tags_of = dict(state.adapter["tags"])
        has_candidates = CANDIDATE_KEY in rows.tensors.keys()
        candidates = torch.nonzero(rows.tensors[CANDIDATE_KEY] >= 0).flatten().tolist() if has_candidates else []
        if candidates:
            template_keys = [keys[r] for r in candidates]  # each candidate row carries its template's key
            unique = list(dict.fromkeys(template_keys))
            fetched = tq.kv_batch_get(keys=unique, partition_id=PARTITION)
            record_of = {key: fetched[i] for i, key in enumerate(unique)}
            steps = [c.step for group in state.plan.candidates for c in group]
            new_keys, fields, tags = stored_records(
                rows,
                [record_of[key] for key in template_keys],
                [tags_of[k] for k in template_keys],
                steps,
                self.replay.k,
            )
            from verl.utils.tensordict_utils import list_of_dict_to_tensordict

            tq.kv_batch_put(keys=new_keys, partition_id=PARTITION, fields=list_of_dict_to_tensordict(fields), tags=tags)
            for r, key, tag in zip(candidates, new_keys, tags):
                keys[r] = key
                tags_of[key] = tag
            rows.columns[TQ_KEY] = np.asarray(keys, dtype=object)
            state.adapter["candidate_keys"] = new_keys
        state.adapter["tags"] = tags_of
        batch = _batch_meta(keys, [tags_of[k] for k in keys])
        batch = verl_compat.v1_balance_batch(self, batch, state.metrics, "exgrpo/old_log_prob_seqlen")
        with self.stage_clock.stage("old_log_prob", state.step):
            verl_compat.v1_old_log_probs(self, batch, state.metrics)
        padding = [k for k in batch.keys if k not in tags_of]
        if padding:
            tq.kv_clear(keys=padding, partition_id=PARTITION)
        data = tq.kv_batch_get(keys=keys, partition_id=PARTITION, select_fields=["old_log_probs", "entropy"])
        width = rows.tensors["responses"].shape[1]
        out = rows_from_tq_fields(data, width)
        rows.tensors["old_log_probs"] = out["old_log_probs"]
        rows.tensors["entropys"] = out["entropy"]
        return rows

    def score_rows(self, rows: Rows, state: StepState) -> Rows:
        """verl's reward loop on ``rows`` (the reward function, or the reward model it wakes and puts to sleep)."""
        with self.stage_clock.stage("reward", state.step):
            return rows_of(self.reward_loop_manager.compute_rm_score(as_dataproto(rows)))

    # ------------------------------------------------------------------ the stages of a step
    def step(self, metrics: dict, timing_raw: dict):
        """One ExGRPO step on the v1 trainer (module docstring); returns the batch of the step's kept rows, which
        verl's ``fit`` reads for its metrics and then clears from TransferQueue."""
        state = self.replay.begin(self.global_steps, self.global_steps >= self.total_training_steps, marked_timer)
        state.metrics, state.timing = metrics, timing_raw
        calls_before = self.actor_log_prob_calls
        self._generate(state)
        self._score_and_select(state)
        batch = self._prepare_update(state)
        self._update_policy(state, batch)
        self.replay.collect(state)
        state.actor_calls = self.actor_log_prob_calls - calls_before
        metrics.update(self.replay.metrics(state))
        return batch

    def _generate(self, state: StepState) -> None:
        """The step's questions drawn and generated: ``state.rows`` (the synchronous mode: drawn, submitted and
        sampled in the step)."""
        self._submit_questions(state)
        self._sample(state)

    def _submit_questions(self, state: StepState) -> None:
        """The replay step's draw, as one prompt batch to verl's agent loop: a new uid per prompt (no ``_``: v1 parses
        the key ``{uid}_{session}_{index}``), the sample count of each (``__rollout_n__``)."""
        from verl.utils import tensordict_utils as tu

        rows = self.replay.draw(state)
        batch_dict = self.collate_fn([self.train_dataset[r] for r in rows])
        uids = [uuid.uuid4().hex for _ in rows]
        batch_dict["uid"] = np.array(uids, dtype=object)
        batch_dict["__rollout_n__"] = np.array([int(c) for c in state.counts], dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", state.step)
        state.adapter["uids"] = uids
        verl_compat.v1_submit_prompts(self, batch)

    def _sample(self, state: StepState) -> None:
        """The step's generated groups from verl's replay buffer, once every one is complete; the rollout sleeps.
        Sets ``state.rows``: fresh groups first, then the replayed ones, in the draw's order (the order the replay
        step's rows follow), each group's sessions in order."""
        tq = _tq()
        with self.stage_clock.stage("generate", state.step), state.timed("gen"):
            self.on_sample_begin()
            batch, off_policy_metrics = self.replay_buffer.sample(
                global_steps=state.step, partition_id=PARTITION, batch_size=self.replay.questions_per_step
            )
            state.metrics.update(off_policy_metrics)
            self.on_sample_end()
        position = {uid: i for i, uid in enumerate(state.adapter["uids"])}
        parsed = [split_key(k) for k in batch.keys]
        unknown = sorted({uid for uid, _, _ in parsed if uid not in position})
        if unknown:
            raise RuntimeError(f"the replay buffer returned groups this step did not submit: {unknown[:3]}")
        order = sorted(range(len(batch.keys)), key=lambda i: (position[parsed[i][0]], parsed[i][1], parsed[i][2]))
        keys = [batch.keys[i] for i in order]
        tags = [batch.tags[i] for i in order]
        counts = [sum(1 for uid, _, _ in parsed if uid == u) for u in state.adapter["uids"]]
        if counts != [int(c) for c in state.counts]:
            raise RuntimeError(
                f"the agent loop returned {counts} trajectories per prompt where the step asked for "
                f"{[int(c) for c in state.counts]} (one output per session is supported)"
            )
        state.adapter["tags"] = dict(zip(keys, tags))
        data = tq.kv_batch_get(keys=keys, partition_id=PARTITION)
        state.rows = rows_from_tq(data, keys, self.tokenizer.pad_token_id, self.replay.response_width)

    def _score_and_select(self, state: StepState) -> None:
        """The one old-log-prob pass with the selection and the replayed members' rewards (``ReplayStep``), then the
        unselected candidates' rows out of TransferQueue."""
        self.replay.score_and_select(state, state.rows, backend=self)
        kept = set(state.rows.columns[TQ_KEY])
        dropped = [k for k in state.adapter.get("candidate_keys", []) if k not in kept]
        if dropped:
            _tq().kv_clear(keys=dropped, partition_id=PARTITION)

    def _prepare_update(self, state: StepState):
        """The update's batch: the kept rows in the update's order (with verl's padding rows where its dispatch needs
        them), and in TransferQueue the per-row fields the loss reads, the rewards and the group-relative advantages of
        the mixed groups (neutral ones for padding rows)."""
        from tensordict import TensorDict

        tq = _tq()
        keys = list(state.rows.columns[TQ_KEY])
        tags_of = state.adapter["tags"]
        batch = self._balance_for_update(_batch_meta(keys, [tags_of[k] for k in keys]), state.metrics)
        # the rows in the update's order, which is the legacy trainer's: the pool takes the groups in this order when
        # it collects them (its insertion order, which the bucket sampler's draw follows)
        index_of = {k: i for i, k in enumerate(keys)}
        state.rows = rows = state.rows.select([index_of[k] for k in batch.keys if k in index_of])
        self.replay.mark_update_rows(state)
        reward_extra_infos = {k: list(rows.columns[k]) for k in rows.meta.get("reward_extra_keys", [])}
        with state.timed("reward"):
            state.metrics.update(self.replay.reward_health(reward_extra_infos))
        with state.timed("adv"):
            self.replay.advantages(state, rows.tensors["rm_scores"], reward_extra_infos)
        lengths = response_lengths(rows).tolist()
        fields = {name: jagged(rows.tensors[name], lengths) for name in _RESPONSE_WRITES}
        fields.update({name: rows.tensors[name] for name in _ROW_WRITES})
        real_keys = list(rows.columns[TQ_KEY])
        tq.kv_batch_put(keys=real_keys, partition_id=PARTITION, fields=TensorDict(fields, batch_size=len(rows)))
        padding = [(k, t) for k, t in zip(batch.keys, batch.tags) if t.get("is_padding", False)]
        if padding:  # verl's padding rows copy the first row's fields: give them neutral ones of their own length
            n_pad = [int(t["response_len"]) for _, t in padding]
            zeros = torch.zeros(len(padding), max(n_pad))
            neutral = {name: jagged(zeros, n_pad) for name in _RESPONSE_WRITES}
            neutral.update({name: torch.zeros(len(padding), dtype=rows.tensors[name].dtype) for name in _ROW_WRITES})
            pad_keys = [k for k, _ in padding]
            tq.kv_batch_put(keys=pad_keys, partition_id=PARTITION, fields=TensorDict(neutral, batch_size=len(pad_keys)))
        return batch

    def _balance_for_update(self, batch, metrics: dict):
        """The update's batch padded to what its dispatch needs (whole mini-batches on every dp rank; verl's padding
        rows) and ordered as the legacy trainer orders it (``RayPPOTrainer._balance_batch``: rows balanced across the
        dp ranks by token count, each rank's rows sorted by workload with the smallest at both ends), so both adapters
        train on the same micro-batches."""
        import math

        from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
        from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions, log_seqlen_unbalance

        dp = verl_compat.worker_dp_size(self.actor_rollout_wg, "actor")
        rollout_n = int(self.config.actor_rollout_ref.rollout.n)
        multiple = math.lcm(dp, int(self.config.actor_rollout_ref.actor.ppo_mini_batch_size) * rollout_n)
        batch = upsample_batch_to_divisible_size(batch, multiple, self.tokenizer.eos_token_id)
        seqlens = [int(tag["seq_len"]) for tag in batch.tags]
        workload = calculate_workload(torch.tensor(seqlens, dtype=torch.int64))
        partitions = get_seqlen_balanced_partitions(workload, k_partitions=dp, equal_size=True)
        for i, part in enumerate(partitions):
            part.sort(key=lambda x: (workload[x], x))
            partitions[i] = part[::2] + part[1::2][::-1]
        batch.reorder([j for part in partitions for j in part])
        metrics.update(log_seqlen_unbalance(seqlen_list=seqlens, partitions=partitions, prefix="global_seqlen"))
        return batch

    def _update_policy(self, state: StepState, batch) -> None:
        """verl's actor update; the mixed loss was installed in every worker at start-up (``on_init_end``)."""
        with self.stage_clock.stage("update", state.step), state.timed("update_actor"):
            verl_compat.v1_update_actor(self, batch, state.metrics)


class ExGRPOTrainerV1(ExGRPOV1Steps, PPOTrainerSync):
    """verl's v1 synchronous trainer with the ExGRPO replay step between rollout and actor update."""


def rows_from_tq_fields(data, width: int) -> dict[str, torch.Tensor]:
    """The jagged per-response-token fields of ``data``, right-padded with zeros to ``width``."""
    from recipe.exgrpo.v1.tq_rows import padded

    return {name: padded(list(data.get(name).unbind()), width) for name in data.keys()}
