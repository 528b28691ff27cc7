"""The collection rules (docs/algorithm.md §3): the pool's writer, the one component that changes what is stored.

Like torchrl's writer it decides *what* goes where and the storage only stores: per group it counts the successes
k, retires K/K questions, applies the 0/K rule and the collection bounds, dedups the correct fresh members against
what the question already holds, applies the caps, and sets the question's bucket. It works on the pool's
components (the entry table, the token storage, the bucket index) and owns the collection state: the retired set
(question -> step retired), the counters and the step of the last collect call.

A collect call stores all its new trajectories together at the end (one slot allocation, one copy per arena chunk
they land in) rather than one by one; every decision is still taken group by group in order, so the result is
the same as storing each trajectory at once (a question that appears twice in one call has its first group's
entries stored before its second group is looked at).

In the continuous reward mode (``continuous`` set, docs/algorithm.md §13) the bucket is the group's normalised
reward spread instead of k, which needs every group of the call: ``exgrpo.experience.continuous.plan_groups`` plans
them all first, then the same per-group order applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from exgrpo.experience.buckets import BucketIndex
from exgrpo.experience.continuous import ContinuousRules, SpreadPlan, plan_groups
from exgrpo.experience.entries import EntryBatch, EntryTable
from exgrpo.experience.records import CollectStats, Group, GroupMember, QuestionId, as_member_arrays, is_success
from exgrpo.experience.storage import TokenStorage

__all__ = ["COUNTERS", "CollectionRules"]

ZERO_SUCCESS_CHOICES = ("bucket0", "keep")
COLLECT_FROM_CHOICES = ("start", "mixed")
#: Running totals kept by the writer (logged as ``pool/<name>_total``).
COUNTERS = ("collected", "duplicates", "evicted", "retired", "unretired", "collect_calls")


class CollectionRules:
    """Collection (§3) into the given components. Settings as in ``ExGRPOConfig`` (bucket_lbound, ...)."""

    def __init__(
        self,
        table: EntryTable,
        tokens: TokenStorage,
        buckets: BucketIndex,
        *,
        lbound: int = 0,
        rbound: int | None = None,
        count_replayed_in_k: bool = True,
        zero_success: str = "bucket0",
        collect_from: str = "start",
        max_entries_per_question: int | None = None,
        max_total_tokens: int | None = None,
        continuous: ContinuousRules | None = None,
    ):
        """``continuous``: the continuous reward mode's rules (docs/algorithm.md §13); None = the binary mode."""
        k = buckets.k
        rbound = k - 1 if rbound is None else rbound
        if not 0 <= lbound < rbound <= k - 1:
            raise ValueError(f"collection bounds must satisfy 0 <= lbound < rbound <= K-1, got {lbound}, {rbound}")
        if zero_success not in ZERO_SUCCESS_CHOICES:
            raise ValueError(f"zero_success must be 'bucket0' or 'keep', got {zero_success!r}")
        if collect_from not in COLLECT_FROM_CHOICES:
            raise ValueError(f"collect_from must be 'start' or 'mixed', got {collect_from!r}")
        self.table, self.tokens, self.buckets = table, tokens, buckets
        self.k = k
        self.lbound = lbound
        self.rbound = rbound
        self.count_replayed_in_k = count_replayed_in_k
        self.zero_success = zero_success
        self.collect_from = collect_from
        self.max_entries_per_question = max_entries_per_question
        self.max_total_tokens = max_total_tokens
        self.continuous = continuous
        self.clear()

    def clear(self) -> None:
        self.retired: dict[QuestionId, int] = {}  # question -> step retired (insertion-ordered set)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.last_step = -1

    @property
    def reward_mode(self) -> str:
        return "binary" if self.continuous is None else "continuous"

    def settings(self) -> dict[str, Any]:
        out = {
            "k": self.k,
            "lbound": self.lbound,
            "rbound": self.rbound,
            "count_replayed_in_k": self.count_replayed_in_k,
            "zero_success": self.zero_success,
            "collect_from": self.collect_from,
            "max_entries_per_question": self.max_entries_per_question,
            "max_total_tokens": self.max_total_tokens,
        }
        if self.continuous is not None:  # a binary pool's settings (and its saved header) are as they always were
            out["reward_mode"] = "continuous"
            out["continuous"] = self.continuous.settings()
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """``retired`` ([question, step] pairs in retirement order), ``counters``, ``last_step`` (JSON-able)."""
        return {
            "retired": [[q, s] for q, s in self.retired.items()],
            "counters": dict(self.counters),
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        counters = {k: int(v) for k, v in state["counters"].items()}
        unknown = set(counters) - set(COUNTERS)
        if unknown:
            raise ValueError(f"unknown collection counters {sorted(unknown)}; expected {list(COUNTERS)}")
        retired = {q: int(s) for q, s in state["retired"]}
        last_step = int(state["last_step"])
        self.clear()
        self.counters.update(counters)
        self.retired, self.last_step = retired, last_step

    # ------------------------------------------------------------------ primitives
    def store(self, batch: EntryBatch) -> None:
        """Store a batch of new entries (slots, metadata, tokens) and empty it."""
        if len(batch):
            slots = self.table.allocate(batch)
            self.tokens.resize(self.table.capacity)
            self.tokens.put_many(slots, batch.token_ids, batch.log_probs, batch.lengths())
            batch.clear()

    def _free(self, slot: int) -> int:
        self.tokens.free(slot)
        return self.table.release(slot)

    def add(self, qid: QuestionId, token_ids: Any, behaviour_log_probs: Any, *, reward: float, step: int) -> int | None:
        """Store one trajectory now (dedup by token ids within the question); its entry id, or None for a dup."""
        if qid in self.retired:
            raise ValueError(f"question {qid!r} is retired; it can no longer be stored")
        ids, lps = as_member_arrays(qid, token_ids, behaviour_log_probs)
        qi = self.table.question_index(qid)
        if not self._new_trajectories(qi, [ids]):
            return None
        batch = EntryBatch()
        entry_id = self.table.reserve_entry_ids(1)
        batch.append(qi, entry_id, ids, lps, float(reward), step)
        self.store(batch)
        return entry_id

    def _new_trajectories(self, qi: int, candidates: Sequence[np.ndarray]) -> list[int]:
        """Indices of the ``candidates`` (token id arrays, in order) that neither the question holds nor an earlier
        candidate repeats: dedup by exact token ids, compared only where the lengths agree. Counts duplicates."""
        seen: dict[int, list[Any]] = {}  # length -> stored slots (ints) and accepted candidates (arrays)
        stored = self.table.slots(qi)
        if stored:
            wanted = {c.shape[0] for c in candidates}
            for s, n in zip(stored, self.table.columns["length"][stored].tolist(), strict=True):
                if n in wanted:
                    seen.setdefault(n, []).append(s)
        out = []
        for i, ids in enumerate(candidates):
            same = seen.get(ids.shape[0])
            if same is None:
                seen[ids.shape[0]] = [ids]
            elif any(np.array_equal(self.tokens.view(x)[0] if isinstance(x, int) else x, ids) for x in same):
                self.counters["duplicates"] += 1
                continue
            else:
                same.append(ids)
            out.append(i)
        self.counters["collected"] += len(out)
        return out

    def retire(self, qid: QuestionId, step: int | None = None) -> None:
        """Retire for good (§3, k = K): drop its trajectories and bucket; never stored or replayed again."""
        qi = self.table.find(qid)
        if qi is not None:
            for s in self.table.drop_all(qi):
                self._free(s)
        self.buckets.remove(qid)
        if qid not in self.retired:
            self.retired[qid] = self.last_step if step is None else step
            self.counters["retired"] += 1

    def unretire(self, question_ids: Iterable[QuestionId]) -> int:
        """Un-retire questions; returns how many were retired."""
        n = sum(1 for qid in question_ids if self.retired.pop(qid, None) is not None)
        self.counters["unretired"] += n
        return n

    def remove_entry(self, qid: QuestionId, entry_id: int) -> None:
        """Evict one stored trajectory (the question leaves its bucket if it has none left)."""
        qi = self.table.find(qid)
        for s in self.table.slots(qi) if qi is not None else []:
            if self.table.columns["entry_id"][s] == entry_id:
                self.table.drop(qi, s)  # type: ignore[arg-type]
                self._free(s)
                if not self.table.slots(qi):  # type: ignore[arg-type]
                    self.buckets.remove(qid)
                return
        raise KeyError(f"entry {entry_id} of question {qid!r} is not in the experience pool")

    def evict_oldest_until(self, max_tokens: int) -> tuple[int, int]:
        """Global oldest-first eviction (entry ids increase with insertion) until <= max_tokens are held."""
        victims = self.table.oldest(self.table.total_tokens - max_tokens)
        touched = set()
        tokens = 0
        qcol = self.table.columns["question"]
        for s in victims:
            qi = int(qcol[s])
            self.table.drop(qi, s)
            tokens += self._free(s)
            touched.add(qi)
        for qi in touched:
            if not self.table.slots(qi):
                self.buckets.remove(self.table.question_id(qi))
        return len(victims), tokens

    # ------------------------------------------------------------------ collection
    def collect(self, step: int, groups: Iterable[Group], *, mixed: bool = True) -> CollectStats:
        """Apply the collection rules to this step's groups; see :meth:`ExperiencePool.collect`."""
        groups = list(groups)
        stats = CollectStats(step=step, groups=len(groups))
        plans = self._plan_continuous(groups, stats) if self.continuous is not None else None
        self.counters["collect_calls"] += 1
        self.last_step = step
        retire_only = self.collect_from == "mixed" and not mixed
        stats.skipped = retire_only
        batch = EntryBatch()
        pending: set[QuestionId] = set()  # questions with entries in ``batch``
        try:
            for i, g in enumerate(groups):
                if g.question_id in self.retired:
                    self._check_size(g)
                    stats.ignored_retired += 1
                    continue
                if g.question_id in pending:  # the same question twice in one call: its first entries first
                    self.store(batch)
                    pending.clear()
                if plans is None:
                    added = self._collect_group(g, step, retire_only, stats, batch)
                else:
                    added = self._collect_spread_group(g, plans[i], step, retire_only, stats, batch)
                if added:
                    pending.add(g.question_id)
        finally:  # also when a later group is malformed: what was decided is stored, the pool stays consistent
            self.store(batch)
        if self.max_total_tokens is not None and self.table.total_tokens > self.max_total_tokens:
            n, t = self.evict_oldest_until(self.max_total_tokens)
            stats.evicted_entries += n
            stats.evicted_tokens += t
        self.counters["evicted"] += stats.evicted_entries
        return stats

    def _check_size(self, g: Group) -> None:
        if len(g.members) != self.k:
            raise ValueError(
                f"group of question {g.question_id!r} has {len(g.members)} members; expected K={self.k} "
                "(a replayed question: its replayed member plus K-1 fresh ones)"
            )

    def _collect_group(self, g: Group, step: int, retire_only: bool, stats: CollectStats, batch: EntryBatch) -> bool:
        """The rules for one group; True when it put entries into ``batch``."""
        self._check_size(g)
        qid, members = g.question_id, g.members
        ok = [is_success(m.reward) for m in members]
        counted = ok if self.count_replayed_in_k else [o for m, o in zip(members, ok) if not m.is_replayed]
        k_succ = sum(counted)
        stats.success_counts.append(k_succ)
        if k_succ == len(counted):
            self.retire(qid, step)
            stats.retired += 1
            return False
        if retire_only:
            return False
        if k_succ == 0:
            stats.zero_success += 1
            if self.zero_success == "bucket0" and self.table.slots_of(qid):
                self.buckets.set(qid, 0)
                stats.moved_to_bucket0 += 1
            return False
        if not self.lbound < k_succ <= self.rbound:
            stats.out_of_range += 1
            return False
        # a replayed member is already stored (with its original behaviour log-probs): never re-inserted
        fresh = [m for m, o in zip(members, ok) if o and not m.is_replayed]
        return self._admit(qid, fresh, k_succ, step, stats, batch)

    def _plan_continuous(self, groups: Sequence[Group], stats: CollectStats) -> list[SpreadPlan]:
        """The continuous mode's per-group plans (σ̃ needs every group of the call); every group is checked first,
        so a malformed one stops the call before anything changes."""
        assert self.continuous is not None
        for g in groups:
            self._check_size(g)
        plans = plan_groups(groups, self.continuous, self.k, count_replayed=self.count_replayed_in_k)
        stats.continuous = True
        stats.group_stds = [p.sigma for p in plans]
        return plans

    def _collect_spread_group(
        self, g: Group, plan: SpreadPlan, step: int, retire_only: bool, stats: CollectStats, batch: EntryBatch
    ) -> bool:
        """The continuous mode's rules for one group (docs/algorithm.md §13); True when it put entries into
        ``batch``. A flat group is what k = K (retire, when its mean reaches retire_mean_reward) and k = 0 (the
        zero_success rule) are in the binary mode; any other group has the bucket of its normalised spread."""
        qid = g.question_id
        if plan.retire:
            self.retire(qid, step)
            stats.retired += 1
            return False
        if retire_only:
            return False
        if plan.flat:
            stats.flat_groups += 1
            if self.zero_success == "bucket0" and self.table.slots_of(qid):
                self.buckets.set(qid, 0)
                stats.moved_to_bucket0 += 1
            return False
        assert plan.bucket is not None
        stats.spread_buckets.append(plan.bucket)
        if not self.lbound < plan.bucket <= self.rbound:
            stats.out_of_range += 1
            return False
        return self._admit(qid, [g.members[i] for i in plan.members], plan.bucket, step, stats, batch)

    def _admit(
        self,
        qid: QuestionId,
        fresh: Sequence[GroupMember],
        bucket: int,
        step: int,
        stats: CollectStats,
        batch: EntryBatch,
    ) -> bool:
        """Stage the new ``fresh`` members (dedup), apply the per-question cap and set the question's bucket; True
        when entries went into ``batch``."""
        new = self._stage(qid, fresh, step, stats)
        stored = len(self.table.slots_of(qid))
        cap = self.max_entries_per_question
        if cap is not None and stored + len(new) > cap:  # evict the oldest: stored ones first, then new ones
            over = stored + len(new) - cap
            from_stored = min(over, stored)
            for s in self.table.drop_front(self.table.question_index(qid), from_stored):
                stats.evicted_tokens += self._free(s)
            dropped, new = new[: over - from_stored], new[over - from_stored :]  # never stored, ids consumed
            stats.evicted_tokens += sum(row[2].shape[0] for row in dropped)
            stats.evicted_entries += over
            stored -= from_stored
        for e in new:
            batch.append(*e)
        if stored + len(new) > 0:
            self.buckets.set(qid, bucket)
            stats.bucket_updates += 1
        else:
            self.buckets.remove(qid)
        return bool(new)

    def _stage(
        self, qid: QuestionId, members: Sequence[GroupMember], step: int, stats: CollectStats
    ) -> list[tuple[int, int, np.ndarray, np.ndarray, float, int]]:
        """The members to add as EntryBatch rows: deduplicated, entry ids reserved in order."""
        if not members:
            return []
        arrays = [as_member_arrays(qid, m.token_ids, m.behaviour_log_probs) for m in members]
        qi = self.table.question_index(qid)  # a question gets its index with its first member to store
        keep = self._new_trajectories(qi, [a[0] for a in arrays])
        stats.duplicates += len(arrays) - len(keep)
        stats.added_entries += len(keep)
        first = self.table.reserve_entry_ids(len(keep))
        rows = []
        for j, i in enumerate(keep):
            ids, lps = arrays[i]
            stats.added_tokens += ids.shape[0]
            rows.append((qi, first + j, ids, lps, float(members[i].reward), step))
        return rows
