"""``ExGRPOTrainerV1ColocateAsync``: ExGRPO on verl's v1 ``colocate_async`` mode (``trainer.use_v1=true``,
``trainer.v1.trainer_mode=colocate_async``): the rollout keeps generating while the trainer updates, with partial
rollout (docs/algorithm.md §15).

The step is the synchronous adapter's (``recipe/exgrpo/v1/trainer.py``) from the one pass on; what differs is where
its groups come from. Prompts are *issued* ahead of training, and every issue is recorded in the :class:`IssueLedger`
under its uid (question, dataset row, fresh or replayed, the issuing step, its sample count):

- ``prepare_step`` (verl issues one ``train_batch_size`` of prompts a step) and the warm-up (``num_warmup_batches``)
  issue through the replay step: ⌊ρ_t·n⌋ replayed questions drawn from the pool, the rest fresh prompts, no question
  that is already in flight in either draw;
- verl's refill of evicted groups (stale under ``max_off_policy_strategy=drop``, or failed) issues fresh prompts only;
- the step's groups are whatever verl's asynchronous sampler returns (the oldest finished ones): the ledger says
  which are replayed; their candidate trajectories are read from the pool now and scored in the step's one pass;
- a ledger entry that left TransferQueue without being trained was evicted (counted, and a replayed question so
  released goes back to being drawable).

The ledger is saved with the pool in each checkpoint; on resume verl re-issues the prompts that were in flight, and the
adapter gives each its ledger's sample count (K−1 for a replayed one), so it is replayed when it trains.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.utils import MetricsAggregator
from verl.utils.debug import marked_timer

from exgrpo.experience.manager import ReplayPlan
from exgrpo.objective import LOSS_METRIC_KINDS
from recipe.exgrpo import verl_compat
from recipe.exgrpo.actor_loss import METRIC_PREFIX
from recipe.exgrpo.replay_step import StepState
from recipe.exgrpo.replay_step.batch import response_lengths
from recipe.exgrpo.replay_step.fields import IS_REPLAY_KEY, QUESTION_ID_KEY
from recipe.exgrpo.v1.tq_rows import TQ_KEY, rows_from_tq, split_key
from recipe.exgrpo.v1.trainer import PARTITION, ExGRPOV1Steps, _tq

__all__ = [
    "LEDGER_FILE",
    "ExGRPOAsyncSteps",
    "ExGRPOTrainerV1ColocateAsync",
    "ExGRPOTrainerV1SeparateAsync",
    "Issue",
    "IssueLedger",
    "LocalUpdateMetrics",
    "local_update_metrics",
    "staleness_metrics",
]

#: the ledger's file inside a checkpoint's ``global_step_N/``
LEDGER_FILE = "exgrpo_issue_ledger.json"
#: the generated rows of a step that span policy versions whose tokens and rollout log-probs go into the step's trace
MAX_TRACED_SPANNING_ROWS = 16


@dataclass
class Issue:
    """One prompt handed to the rollout: its question, dataset row, whether it is replayed, the step that issued it
    and its sample count (K fresh, K−1 replayed)."""

    question_id: str
    row: int
    replayed: bool
    step: int
    n: int


class IssueLedger:
    """The prompts issued and not yet trained or evicted, by uid (docs/algorithm.md §15)."""

    def __init__(self) -> None:
        self.issues: dict[str, Issue] = {}

    def __len__(self) -> int:
        return len(self.issues)

    def add(self, uid: str, issue: Issue) -> None:
        if uid in self.issues:
            raise ValueError(f"uid {uid} issued twice")
        self.issues[uid] = issue

    def questions(self) -> set[str]:
        """The questions in flight (a question is never issued twice before its group trains or is evicted)."""
        return {i.question_id for i in self.issues.values()}

    def pop(self, uid: str) -> Issue:
        if uid not in self.issues:
            raise KeyError(f"the sampler returned a group this run did not issue (uid {uid})")
        return self.issues.pop(uid)

    def forget_missing(self, present: set[str]) -> list[Issue]:
        """Drop (and return) the issues whose prompt is no longer in TransferQueue: the sampler evicted them."""
        gone = [uid for uid in self.issues if uid not in present]
        return [self.issues.pop(uid) for uid in gone]

    def state_dict(self) -> dict:
        return {"issues": {uid: asdict(i) for uid, i in self.issues.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        self.issues = {uid: Issue(**d) for uid, d in dict(state.get("issues", {})).items()}


def _version_tags(tag: Mapping) -> tuple[int, int]:
    lo, hi = tag.get("min_global_steps"), tag.get("max_global_steps")
    if lo is None or hi is None:
        raise KeyError(f"a trajectory's tag carries no policy versions (min/max_global_steps): {dict(tag)}")
    return int(lo), int(hi)


def staleness_metrics(step: int, fresh_versions, replay_steps, ratio_rows=()) -> dict[str, float]:
    """``exgrpo/staleness/*`` of a step trained with the weights of version ``step − 1``.

    ``fresh_versions``: (min, max) policy version of each generated row; ``replay_steps``: the step that collected each
    replayed member; ``ratio_rows``: per generated row (its age, its per-token log π_old − log π_rollout over its model
    tokens). A fresh row's age is ``step − 1 − min``, its span ``max − min`` (versions a partial rollout crossed); a
    replayed member's age is ``step − collected step``. The ratio exp(log π_old − log π_rollout) (the rollout/anchor
    mismatch the fresh term leaves uncorrected) is summarised per age: 0, 1, 2 and more.
    """
    out: dict[str, float] = {}
    current = step - 1
    if len(fresh_versions):
        v = np.asarray(fresh_versions, dtype=np.int64)
        ages, spans = current - v[:, 0], v[:, 1] - v[:, 0]
        out.update(
            {
                "exgrpo/staleness/fresh_age_mean": float(ages.mean()),
                "exgrpo/staleness/fresh_age_max": float(ages.max()),
                "exgrpo/staleness/fresh_span_mean": float(spans.mean()),
                "exgrpo/staleness/fresh_span_max": float(spans.max()),
                "exgrpo/staleness/fresh_spanning_rows": float((spans > 0).sum()),
            }
        )
    if len(replay_steps):
        r = step - np.asarray(replay_steps, dtype=np.int64)
        out.update(
            {"exgrpo/staleness/replay_age_mean": float(r.mean()), "exgrpo/staleness/replay_age_max": float(r.max())}
        )
    by_age: dict[str, list[np.ndarray]] = {}
    for age, diff in ratio_rows:
        by_age.setdefault(str(int(age)) if age < 2 else "2plus", []).append(np.asarray(diff, dtype=np.float64))
    for name, diffs in sorted(by_age.items()):
        d = np.concatenate(diffs) if diffs else np.zeros(0)
        if d.size == 0:
            continue
        w = np.exp(d)
        prefix = f"exgrpo/staleness/old_vs_rollout_ratio/age_{name}"
        out.update(
            {
                f"{prefix}/mean": float(w.mean()),
                f"{prefix}/min": float(w.min()),
                f"{prefix}/max": float(w.max()),
                f"{prefix}/abs_log_mean": float(np.abs(d).mean()),
                f"{prefix}/tokens": float(d.size),
            }
        )
    return out


class ExGRPOAsyncSteps(ExGRPOV1Steps):
    """The ExGRPO step on verl's asynchronous v1 trainers (module docstring): prompts issued through the ledger, the
    step's groups taken from verl's asynchronous sampler; mixed in before verl's trainer class."""

    def __init__(self, config):
        super().__init__(config)
        self.ledger = IssueLedger()
        #: verl's refill of evicted groups issues fresh prompts only; the warm-up and the steps' issues draw replay
        self._issues_draw_replay = True
        self._issue_counts = {"fresh": 0, "replayed": 0, "refill": 0}
        self._issue_metrics: dict = {}

    def _init_dataloader(self):
        super()._init_dataloader()
        self.replay.behaviour_from_rollout = True

    # ------------------------------------------------------------------ issuing prompts
    def prepare_step(self) -> dict:
        """The step's issue: one ``train_batch_size`` of prompts, as verl's asynchronous ``prepare_step``."""
        self._issue(int(self.config.data.train_batch_size), draw_replay=True)
        return {}

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        """verl's warm-up (replay drawn) and its refill of evicted groups (fresh prompts only)."""
        return self._issue(int(num_prompts), draw_replay=self._issues_draw_replay)

    def on_train_begin(self):
        self._issues_draw_replay = True
        super().on_train_begin()  # the warm-up batches

    def _issue(self, n: int, draw_replay: bool) -> int:
        """``n`` prompts to the rollout: ⌊ρ_t·n⌋ replayed questions (``draw_replay`` and past the delayed start), the
        rest fresh; no question already in flight; each recorded in the ledger."""
        from verl.utils import tensordict_utils as tu

        if n <= 0:
            return 0
        replay, step = self.replay, max(int(self.global_steps), 1)
        in_flight = self.ledger.questions()
        replayed: list[str] = []
        if draw_replay and replay.replaying:
            drawn = replay.experience.draw_replay(n, step, exclude=in_flight)
            plan = replay.experience.plan_questions(drawn, max_response_length=replay.response_width)
            replayed = list(plan.question_ids)
        metrics = self._issue_metrics  # the fresh prompts' figures, logged with the next step's
        fresh_rows = replay.fresh.take(n - len(replayed), exclude=in_flight | set(replayed), metrics=metrics)
        rows = fresh_rows + [replay.row_of_question[q] for q in replayed]
        k = replay.k
        counts = [k] * len(fresh_rows) + [k - 1] * len(replayed)
        batch_dict = self.collate_fn([self.train_dataset[r] for r in rows])
        uids = [uuid.uuid4().hex for _ in rows]
        batch_dict["uid"] = np.array(uids, dtype=object)
        batch_dict["__rollout_n__"] = np.array(counts, dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", int(self.global_steps))
        qids = replay.fresh.question_ids
        for uid, row, c in zip(uids, rows, counts):
            self.ledger.add(uid, Issue(str(qids[row]), int(row), c == k - 1, int(self.global_steps), int(c)))
        self._issue_counts["fresh"] += len(fresh_rows)
        self._issue_counts["replayed"] += len(replayed)
        if not draw_replay:
            self._issue_counts["refill"] += n
        verl_compat.v1_submit_prompts(self, batch)
        return n

    def _reissue_inflight_prompts(self, partition_id: str = "train") -> int:
        """verl re-issues the prompts that were in flight at the checkpoint; each keeps its ledger's sample count (K−1
        for a replayed question, so it is replayed when it trains), and its issue step becomes the resumed step (verl
        re-tags it so)."""
        manager = self.agent_loop_manager
        original = manager.generate_sequences
        ledger = self.ledger
        step = int(self.global_steps)

        def with_ledger_counts(batch):
            from verl.utils import tensordict_utils as tu

            uids = [str(u) for u in batch["uid"]]
            counts = np.array([ledger.issues[u].n for u in uids], dtype=object)
            batch.update(tu.get_tensordict({"__rollout_n__": counts}))
            for u in uids:
                ledger.issues[u].step = step
            self._reissued = {"fresh": sum(not ledger.issues[u].replayed for u in uids)}
            self._reissued["replayed"] = len(uids) - self._reissued["fresh"]
            return original(batch)

        manager.generate_sequences = with_ledger_counts
        try:
            return super()._reissue_inflight_prompts(partition_id)
        finally:
            del manager.generate_sequences  # the method again

    # ------------------------------------------------------------------ the step's groups
    def _generate(self, state: StepState) -> None:
        """The step's issue, then its groups (:meth:`_take_groups`)."""
        self._issues_draw_replay = False  # from now on, verl's refills are fresh prompts
        with state.timed("exgrpo_issue"):
            state.metrics.update(self.prepare_step() or {})
        self._take_groups(state, self.replay.questions_per_step)

    def _take_groups(self, state: StepState, batch_size: int) -> None:
        """``batch_size`` groups from verl's asynchronous sampler, fresh first, then the replayed ones with their
        candidates read from the pool (``state.plan``); the evicted issues forgotten; the metrics of the accounting."""
        tq = _tq()
        with self.stage_clock.stage("generate", state.step), state.timed("gen"):
            self.on_sample_begin()
            batch, off_policy_metrics = self.replay_buffer.sample(
                global_steps=state.step, partition_id=PARTITION, batch_size=batch_size
            )
            state.metrics.update(off_policy_metrics)  # verl's own: training/off_policy/*, evictions
            self.on_sample_end()
        parsed = [split_key(k) for k in batch.keys]
        uids = list(dict.fromkeys(uid for uid, _, _ in parsed))
        issues = {uid: self.ledger.pop(uid) for uid in uids}
        listed = tq.kv_list(PARTITION).get(PARTITION, {})
        evicted = self.ledger.forget_missing({k for k, tag in listed.items() if (tag or {}).get("is_prompt", False)})
        fresh = [u for u in uids if not issues[u].replayed]
        replayed = [u for u in uids if issues[u].replayed]
        plan = self.replay.experience.plan_questions(
            [issues[u].question_id for u in replayed], max_response_length=self.replay.response_width
        )
        planned = set(plan.question_ids)
        lost = [u for u in replayed if issues[u].question_id not in planned]  # no stored trajectory left
        replayed = [u for u in replayed if issues[u].question_id in planned]
        order = fresh + lost + replayed
        state.plan = ReplayPlan(
            [issues[u].question_id for u in replayed],
            [plan.candidates[plan.question_ids.index(issues[u].question_id)] for u in replayed],
            None
            if plan.preselected is None
            else [plan.preselected[plan.question_ids.index(issues[u].question_id)] for u in replayed],
        )
        state.fresh_rows = [issues[u].row for u in fresh + lost]
        sizes = {u: sum(1 for v, _, _ in parsed if v == u) for u in uids}
        if any(sizes[u] != issues[u].n for u in uids):
            raise RuntimeError(
                "the agent loop returned "
                f"{[sizes[u] for u in order]} trajectories per prompt where they were issued with "
                f"{[issues[u].n for u in order]} (one output per session is supported)"
            )
        state.counts = np.asarray([issues[u].n for u in order], dtype=np.int64)
        state.adapter["uids"] = order
        position = {u: i for i, u in enumerate(order)}
        idx = sorted(range(len(batch.keys)), key=lambda i: (position[parsed[i][0]], parsed[i][1], parsed[i][2]))
        keys = [batch.keys[i] for i in idx]
        tags = [batch.tags[i] for i in idx]
        state.adapter["tags"] = dict(zip(keys, tags))
        state.adapter["issues"] = issues
        data = tq.kv_batch_get(keys=keys, partition_id=PARTITION)
        state.rows = rows_from_tq(data, keys, self.tokenizer.pad_token_id, self.replay.response_width)
        state.trace = {
            "event": "step",
            "step": state.step,
            **({} if "local_update" not in state.adapter else {"local_update": state.adapter["local_update"]}),
            "mixed": bool(self.replay.experience.mixed),
            "replay_question_ids": list(state.plan.question_ids),
            "fresh_rows": list(state.fresh_rows),
            "issued_steps": {u: issues[u].step for u in order},
            "selected_entry_ids": [],
            "selected_scores": [],
            "replayed_members": [],
        }
        m = state.metrics
        m.update(self._issue_metrics)
        self._issue_metrics = {}
        m["exgrpo/async/in_flight"] = float(len(self.ledger))
        m["exgrpo/async/evicted_fresh"] = float(sum(not i.replayed for i in evicted))
        m["exgrpo/async/evicted_replayed"] = float(sum(i.replayed for i in evicted))
        m["exgrpo/async/replayed_without_candidates"] = float(len(lost))
        m["exgrpo/async/issue_age_mean"] = float(np.mean([state.step - issues[u].step for u in order]))
        for name, count in self._issue_counts.items():
            m[f"exgrpo/async/issued_{name}_total"] = float(count)
        for name, count in getattr(self, "_reissued", {}).items():
            m[f"exgrpo/async/reissued_{name}"] = float(count)
        self._reissued = {}

    def _score_and_select(self, state: StepState) -> None:
        super()._score_and_select(state)
        rows, tags = state.rows, state.adapter["tags"]
        keys = list(rows.columns[TQ_KEY])
        is_replay = rows.tensors[IS_REPLAY_KEY].bool().tolist()
        versions, ratio_rows, spanning = [], [], []
        mask = rows.tensors["response_mask"].bool()
        diff = rows.tensors["old_log_probs"].double() - rows.tensors["rollout_log_probs"].double()
        lengths = response_lengths(rows).tolist()
        for i, (key, rep) in enumerate(zip(keys, is_replay)):
            if rep:
                continue
            lo, hi = _version_tags(tags[key])
            versions.append((lo, hi))
            ratio_rows.append((state.step - 1 - lo, diff[i][mask[i]].numpy()))
            if hi > lo and len(spanning) < MAX_TRACED_SPANNING_ROWS:
                n = int(lengths[i])
                spanning.append(
                    {
                        "key": key,
                        "question_id": str(rows.columns[QUESTION_ID_KEY][i]),
                        "min_global_steps": lo,
                        "max_global_steps": hi,
                        "response_ids": rows.tensors["responses"][i, :n].tolist(),
                        "rollout_log_probs": rows.tensors["rollout_log_probs"][i, :n].float().tolist(),
                    }
                )
        state.trace["spanning_rows"] = spanning  # what the pool must store for them, token for token
        selected = set(state.trace.get("selected_entry_ids", []))
        replay_steps = [c.step for group in state.plan.candidates for c in group if c.entry_id in selected]
        state.metrics.update(staleness_metrics(state.step, versions, replay_steps, ratio_rows))

    # ------------------------------------------------------------------ checkpoint, metrics
    def _save_checkpoint(self):
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, LEDGER_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.ledger.state_dict(), f)
        os.replace(tmp, os.path.join(folder, LEDGER_FILE))
        super()._save_checkpoint()  # the pool, verl's checkpoint with TransferQueue's state, the tracker file last

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps == 0:
            return
        if self.config.trainer.resume_mode == "resume_path":
            folder = self.config.trainer.resume_from_path
        else:
            folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        path = os.path.join(os.path.abspath(folder), LEDGER_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"resuming an asynchronous ExGRPO run from {folder}, which holds no issue ledger ({LEDGER_FILE}): "
                "the prompts in flight could not be told fresh from replayed"
            )
        with open(path, encoding="utf-8") as f:
            self.ledger.load_state_dict(json.load(f))
        # verl saves TransferQueue before it clears the saved step's trained rows: they come back without a prompt and
        # would stay for good; every row that belongs to no issued prompt goes
        tq = _tq()
        listed = tq.kv_list(PARTITION).get(PARTITION, {})
        stray = [k for k, tag in listed.items() if not (tag or {}).get("is_prompt", False)]
        stray = [k for k in stray if split_key(k)[0] not in self.ledger.issues]
        if stray:
            tq.kv_clear(keys=stray, partition_id=PARTITION)
        print(
            f"[exgrpo] restored the issue ledger: {len(self.ledger)} prompts in flight or finished and not trained; "
            f"cleared {len(stray)} rows of trained groups that verl's TransferQueue checkpoint kept"
        )

    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        """verl's step metrics and ``exgrpo/v1/leaked_rows``: rows of the train partition that belong neither to the
        step's batch nor to a prompt in the ledger (in flight, or finished and waiting)."""
        super(ExGRPOV1Steps, self)._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        listed = _tq().kv_list(PARTITION).get(PARTITION, {})
        step_keys = set(batch.keys)
        issued = set(self.ledger.issues)
        leaked = [
            k
            for k, tag in listed.items()
            if k not in step_keys and not (tag or {}).get("is_prompt", False) and split_key(k)[0] not in issued
        ]
        metrics["exgrpo/v1/leaked_rows"] = len(leaked)
        metrics["exgrpo/v1/prompt_entries"] = sum(1 for tag in listed.values() if (tag or {}).get("is_prompt", False))


class ExGRPOTrainerV1ColocateAsync(ExGRPOAsyncSteps, PPOTrainerColocateAsync):
    """verl's v1 ``colocate_async`` trainer with the ExGRPO replay step (module docstring)."""


#: figures of a local update that count something it did: a step's figure is their sum over its local updates
_SUMMED_PER_UPDATE = (
    "exgrpo/replayed_questions",
    "exgrpo/fresh_questions",
    "exgrpo/replayed_rows",
    "exgrpo/actor_log_prob_calls",
    "exgrpo/old_log_prob_candidate_rows",
    "exgrpo/readded_retired",
    "exgrpo/fresh_removed_retired",
    "exgrpo/fresh_skipped_retired",
    "exgrpo/staleness/fresh_spanning_rows",
    "exgrpo/async/evicted_fresh",
    "exgrpo/async/evicted_replayed",
    "exgrpo/async/replayed_without_candidates",
    "exgrpo/selection/too_long_candidates",
    "exgrpo/replay/dropped_too_long",
    # the mixed loss's token and row counts, as verl logs them (actor/ + the loss's own names)
    *(f"actor/{METRIC_PREFIX}{name}" for name, kind in LOSS_METRIC_KINDS.items() if kind == "count"),
)
_SUMMED_PREFIXES = ("exgrpo/collect/", "exgrpo/async/reissued_")
#: figures of a state (the pool's, the schedule's, running totals): a step's figure is the last local update's
_LAST_PREFIXES = (
    "exgrpo/pool/",
    "exgrpo/replay/",
    "exgrpo/async/issued_",
    "exgrpo/async/in_flight",
    "exgrpo/mixed",
    "exgrpo/loader_epoch",
    "exgrpo/leftover_prompts",
    "training/epoch",
)


class LocalUpdateMetrics(MetricsAggregator):
    """verl's ``MetricsAggregator`` (the step's figures from those of its ``parameter_sync_step`` local updates), with
    ExGRPO's figures reduced by what they are: counts summed, states taken from the last local update, the rest as
    verl reduces them (rates and means weighted by each update's rows, ``max``/``min`` by name)."""

    def _get_aggregation_type(self, metric_name: str) -> str:
        if metric_name in _SUMMED_PER_UPDATE or metric_name.startswith(_SUMMED_PREFIXES):
            return "sum"
        if metric_name.startswith(_LAST_PREFIXES):
            return "last"
        return super()._get_aggregation_type(metric_name)


def local_update_metrics() -> LocalUpdateMetrics:
    """A fresh :class:`LocalUpdateMetrics` for one step."""
    return LocalUpdateMetrics()


class ExGRPOTrainerV1SeparateAsync(ExGRPOAsyncSteps, PPOTrainerSeparateAsync):
    """verl's v1 ``separate_async`` trainer with the ExGRPO replay step: the rollout runs on its own devices, the
    weights reach it once a step, and a step is ``parameter_sync_step`` = p local updates (docs/algorithm.md §15).

    The step's issue (``train_batch_size`` = B prompts, ⌊ρ_t·B⌋ of them replayed questions) happens once, at the step's
    start, as verl issues its prompts; then each local update i = 0 … p−1 takes the B/p oldest finished groups from the
    sampler and runs the whole replay step on them: the one pass (verl's decoupled π_old: from the second local update
    on, verl's ``_compute_old_log_prob`` restores the step's starting weights for it, so the old log-probs and the
    selection's entropies are those of version t−1 in every local update), the selection, the mixed update (one
    optimizer step: ``ppo_mini_batch_size`` = B/p), the collection. Whether the step is mixed is fixed when it begins,
    as in the sync mode; the delayed-start check and the re-add ablation run once, after the last local update, on the
    whole step's rewards. The step's figures are those of its local updates reduced by :func:`local_update_metrics`."""

    def _setup(self):
        verl_compat.v1_separate_setup(super()._setup)

    def prepare_step(self) -> dict:
        """The step's issue, then verl's wait for the groups the step needs while the trainer's devices lend a hand to
        the rollout (``hybrid_rollout.enable_switch``), which also returns its eviction figures."""
        super().prepare_step()
        return verl_compat.v1_wait_for_sampleable(self)

    def step(self, metrics: dict, timing_raw: dict):
        from transfer_queue import KVBatchMeta

        p = int(self.parameter_sync_step)
        groups = self.replay.questions_per_step // p
        is_last = self.global_steps >= self.total_training_steps
        mixed = self.replay.replaying
        aggregator = local_update_metrics()
        self._issues_draw_replay = False  # from now on, verl's refills are fresh prompts
        with marked_timer("exgrpo_issue", timing_raw):
            prepared = self.prepare_step()
        if prepared:
            aggregator.add_step_metrics(prepared)
        keys: list = []
        tags: list = []
        scores: list = []
        for i in range(p):
            self.local_trigger_step = i  # verl's decoupled π_old reads it in _compute_old_log_prob
            state = self.replay.begin(self.global_steps, is_last, marked_timer)
            state.mixed = mixed
            state.metrics, state.timing = {}, timing_raw
            state.adapter["local_update"] = i
            calls_before = self.actor_log_prob_calls
            self._take_groups(state, groups)
            self._score_and_select(state)
            batch = self._prepare_update(state)
            self._update_policy(state, batch)
            self.replay.collect(state, end_of_step=False)
            scores.append(state.scores)
            if i == p - 1:  # the delayed-start check and the re-add ablation once, on the whole step's rewards
                self.replay.end_step(np.concatenate(scores), state.step)
            state.actor_calls = self.actor_log_prob_calls - calls_before
            state.metrics.update(self.replay.metrics(state))
            real = sum(not t.get("is_padding", False) for t in batch.tags)
            aggregator.add_step_metrics(state.metrics, sample_count=real)
            keys.extend(batch.keys)
            tags.extend(batch.tags)
        metrics.update(aggregator.get_aggregated_metrics())
        metrics["exgrpo/async/local_updates"] = float(p)
        return KVBatchMeta(partition_id=PARTITION, keys=keys, tags=tags)
