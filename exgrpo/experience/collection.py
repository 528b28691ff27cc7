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

What a group's rewards mean is the reward mode's (``exgrpo.modes``): for each collect call the mode gives a planner
that says, per group, whether the question retires, its bucket (none: no learning signal, the ``zero_success`` rule
applies) and which fresh members to store — success counts in the binary mode, the normalised reward spread in the
continuous mode (docs/algorithm.md §13), which plans the whole call first. The writer applies every plan the same
way: retirement, ``collect_from``, the ``zero_success`` rule, the bounds, dedup, the caps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_
from typing import Any, TypeAlias

import numpy as np

from exgrpo.experience import masks
from exgrpo.experience.buckets import BucketIndex
from exgrpo.experience.entries import EntryBatch, EntryTable
from exgrpo.experience.records import (
    CollectStats,
    Group,
    GroupMember,
    MemberArrays,
    MemberColumns,
    QuestionId,
    member_arrays,
    member_arrays_many,
)
from exgrpo.experience.storage import TokenStorage
from exgrpo.modes.base import GroupPlan, RewardMode
from exgrpo.modes.binary import BinaryMode

__all__ = ["COUNTERS", "CollectionRules"]

#: the arrays of one group's members to store, checked with the call's others: the call's columns, the group's range
#: in them, and the rewards of the call's members as floats where the whole call is clean (no member with a defect or
#: arrays the pool cannot convert, no per-question cap), else None
Prepared: TypeAlias = tuple[MemberColumns, int, int, list[float] | None]


@dataclass(slots=True)
class NewEntries:
    """A group's new entries for the EntryBatch, column by column: its question index, their entry ids (reserved),
    token ids, stored log-probs, rewards and masked-token counts."""

    qi: int
    entry_ids: range
    token_ids: list[np.ndarray]
    log_probs: list[np.ndarray]
    rewards: list[float]
    masked: list[int]

    def __len__(self) -> int:
        return len(self.token_ids)

    def after(self, n: int) -> NewEntries:
        """All but the first ``n``."""
        return NewEntries(
            self.qi,
            self.entry_ids[n:],
            self.token_ids[n:],
            self.log_probs[n:],
            self.rewards[n:],
            self.masked[n:],
        )


NO_NEW_ENTRIES = NewEntries(-1, range(0), [], [], [], [])

#: Running totals kept by the writer (logged as ``pool/<name>_total``).
COUNTERS = ("collected", "duplicates", "evicted", "retired", "unretired", "collect_calls")


class CollectionRules:
    """Collection (§3) into the given components. Settings as in ``ExGRPOConfig`` (bucket_lbound, ...), whose
    validation checks them (``0 <= lbound < rbound <= K-1``, the choices of ``zero_success`` and ``collect_from``)
    once, at start-up: they are not checked again here."""

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
        mode: RewardMode | None = None,
    ):
        """``mode``: the reward mode whose rules plan each group (``exgrpo.modes``); None = the binary mode."""
        k = buckets.k
        rbound = k - 1 if rbound is None else rbound
        self.table, self.tokens, self.buckets = table, tokens, buckets
        self.k = k
        self.lbound = lbound
        self.rbound = rbound
        self.count_replayed_in_k = count_replayed_in_k
        self.zero_success = zero_success
        self.collect_from = collect_from
        self.max_entries_per_question = max_entries_per_question
        self.max_total_tokens = max_total_tokens
        self.mode = BinaryMode() if mode is None else mode
        self.clear()

    def clear(self) -> None:
        self.retired: dict[QuestionId, int] = {}  # question -> step retired (insertion-ordered set)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.last_step = -1

    @property
    def reward_mode(self) -> str:
        return self.mode.name

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
        out.update(self.mode.settings())  # the mode's tag (none for the binary mode: its header is as it always was)
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
            lengths = batch.lengths()
            slots = self.table.allocate(batch, lengths)
            self.tokens.resize(self.table.capacity)
            self.tokens.put_many(slots, batch.token_ids, batch.log_probs, lengths)
            batch.clear()

    def _free(self, slot: int) -> int:
        self.tokens.free(slot)
        return self.table.release(slot)

    def add(
        self,
        qid: QuestionId,
        token_ids: Any,
        behaviour_log_probs: Any,
        *,
        reward: float,
        step: int,
        loss_mask: Any = None,
    ) -> int | None:
        """Store one trajectory now (dedup by token ids and mask within the question); its entry id, or None for a
        dup. ValueError for a trajectory whose mask and log-probs disagree (``exgrpo.experience.masks``)."""
        if qid in self.retired:
            raise ValueError(f"question {qid!r} is retired; it can no longer be stored")
        arrays = member_arrays(qid, token_ids, behaviour_log_probs, loss_mask)
        if arrays.defect is not None:
            raise ValueError(f"question {qid!r}: the trajectory cannot be stored: {arrays.defect[1]}")
        qi = self.table.question_index(qid)
        if not self._new_trajectories(qi, [arrays]):
            return None
        batch = EntryBatch()
        entry_id = self.table.reserve_entry_ids(1)
        batch.append(qi, entry_id, arrays.token_ids, arrays.stored_log_probs, float(reward), step, arrays.masked)
        self.store(batch)
        return entry_id

    def _new_trajectories(self, qi: int, candidates: Sequence[MemberArrays]) -> list[int]:
        """Indices of the ``candidates`` (in order) that neither the question holds nor an earlier candidate
        repeats: dedup by exact token ids and loss mask (the same tokens with another mask train other tokens),
        compared only where the lengths agree. Counts duplicates."""
        seen: dict[int, list[Any]] = {}  # length -> stored slots (ints) and accepted candidates (MemberArrays)
        stored = self.table.slots(qi)
        if stored:
            wanted = {c.token_ids.shape[0] for c in candidates}
            for s, n in zip(stored, self.table.columns["length"][stored].tolist(), strict=True):
                if n in wanted:
                    seen.setdefault(n, []).append(s)
        out = []
        for i, c in enumerate(candidates):
            same = seen.get(c.token_ids.shape[0])
            if same is None:
                seen[c.token_ids.shape[0]] = [c]
            elif any(self._same_trajectory(x, c) for x in same):
                self.counters["duplicates"] += 1
                continue
            else:
                same.append(c)
            out.append(i)
        self.counters["collected"] += len(out)
        return out

    def _same_trajectory(self, x: int | MemberArrays, c: MemberArrays) -> bool:
        """Whether the stored slot or staged member ``x`` holds the token ids and loss mask of ``c``."""
        if isinstance(x, int):
            ids, lps, masked = *self.tokens.view(x), self.table.masked(x)
        else:
            ids, lps, masked = x.token_ids, x.stored_log_probs, x.masked
        if masked != c.masked or not np.array_equal(ids, c.token_ids):
            return False
        return masked == 0 or np.array_equal(np.isnan(lps), np.isnan(c.stored_log_probs))

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
        """Apply the collection rules to this step's groups; see :meth:`ExperiencePool.collect`.

        In three passes, with the result of applying each group in turn: (1) every group's plan, asked of the mode
        in order (a question an earlier group of the call retires is ignored from then on, as it would be once
        retired); (2) the log-probs and masks of every member a plan stores, checked in one vectorised pass
        (:func:`~exgrpo.experience.masks.prepare_many`; it changes nothing and raises nothing); (3) the plans
        applied in order. A group that stops the planning (a malformed one) has the groups before it applied
        before its error is raised, as when one pass did everything.
        """
        groups = list(groups)
        stats = CollectStats(step=step, groups=len(groups), mode=self.mode, mode_stats=self.mode.new_stats())
        planner = self.mode.planner(
            groups, self.k, count_replayed=self.count_replayed_in_k, stats=stats, check_size=self._check_size
        )
        self.counters["collect_calls"] += 1
        self.last_step = step
        retire_only = self.collect_from == "mixed" and not mixed
        stats.skipped = retire_only
        plans: list[GroupPlan | None] = []  # None: the group of a retired question (nothing done)
        failure: Exception | None = None
        retiring: set[QuestionId] = set()  # retired by a plan of this call
        try:
            for i, g in enumerate(groups):
                if g.question_id in self.retired or g.question_id in retiring:
                    self._check_size(g)
                    plans.append(None)
                    continue
                self._check_size(g)
                plan = planner(i, g)
                if plan.retire:
                    retiring.add(g.question_id)
                plans.append(plan)
        except Exception as e:  # the groups planned so far are applied first
            failure = e
        batch = EntryBatch()
        pending: set[QuestionId] = set()  # questions with entries in ``batch``
        try:
            prepared = self._prepare_members(groups, plans, retire_only)
            for i, plan in enumerate(plans):
                g = groups[i]
                if plan is None:
                    stats.ignored_retired += 1
                    continue
                if g.question_id in pending:  # the same question twice in one call: its first entries first
                    self.store(batch)
                    pending.clear()
                checked = prepared.get(i)
                if checked is not None and self._admit_new_question(g, plan, step, stats, batch, checked):
                    pending.add(g.question_id)
                elif self._collect_group(g, plan, step, retire_only, stats, batch, checked):
                    pending.add(g.question_id)
        finally:  # also when a later group is malformed: what was decided is stored, the pool stays consistent
            try:
                self.store(batch)
            finally:
                self.tokens.unstage()
        if failure is not None:
            raise failure
        if self.max_total_tokens is not None and self.table.total_tokens > self.max_total_tokens:
            n, t = self.evict_oldest_until(self.max_total_tokens)
            stats.evicted_entries += n
            stats.evicted_tokens += t
        self.counters["evicted"] += stats.evicted_entries
        return stats

    def _stores(self, plan: GroupPlan, retire_only: bool) -> bool:
        """Whether applying ``plan`` stages its members (:meth:`_collect_group`'s way to :meth:`_admit`)."""
        return (
            not plan.retire and not retire_only and plan.bucket is not None and self.lbound < plan.bucket <= self.rbound
        )

    def _prepare_members(
        self, groups: Sequence[Group], plans: Sequence[GroupPlan | None], retire_only: bool
    ) -> dict[int, Prepared]:
        """Per group index, the arrays of the members its plan stores (in the plan's order), all checked in one pass
        (``member_arrays_many``): the call's columns and the group's range in them. A member whose arrays raise an
        error has none (the third pass raises it where applying the groups one by one would). Empty when anything
        else is amiss (e.g. a plan naming a member its group lacks): the third pass then meets it in its place."""
        spans: dict[int, tuple[int, int]] = {}  # group index -> its members' range in ``todo``
        qids: list[QuestionId] = []
        todo: list[GroupMember] = []
        try:
            for i, plan in enumerate(plans):
                if plan is not None and self._stores(plan, retire_only):
                    g = groups[i]
                    start = len(todo)
                    members = g.members
                    todo += [members[index] for index in plan.members]
                    qids += [g.question_id] * (len(todo) - start)
                    spans[i] = (start, len(todo))
        except Exception:
            return {}
        columns = member_arrays_many(qids, todo, stage=self.tokens.stage)
        rewards = None
        try:  # what raises here is raised again where the general path meets it, in its place
            if (
                self.max_entries_per_question is None
                and not any(columns.defect)
                and not any(map(is_, columns.token_ids, repeat(None)))
                and not any([m.defect is not None for m in todo])
            ):
                rewards = [float(m.reward) for m in todo]
        except Exception:
            rewards = None
        return {i: (columns, start, stop, rewards) for i, (start, stop) in spans.items()}

    def _check_size(self, g: Group) -> None:
        if len(g.members) != self.k:
            raise ValueError(
                f"group of question {g.question_id!r} has {len(g.members)} members; expected K={self.k} "
                "(a replayed question: its replayed member plus K-1 fresh ones)"
            )

    def _collect_group(
        self,
        g: Group,
        plan: GroupPlan,
        step: int,
        retire_only: bool,
        stats: CollectStats,
        batch: EntryBatch,
        prepared: Prepared | None = None,
    ) -> bool:
        """Apply the mode's ``plan`` for one group; True when it put entries into ``batch``. ``prepared``: the
        arrays of the members the plan stores (:meth:`_prepare_members`)."""
        qid = g.question_id
        if plan.retire:
            self.retire(qid, step)
            stats.retired += 1
            return False
        if retire_only:
            return False
        if plan.bucket is None:  # no learning signal (binary 0/K, a flat continuous group)
            self.mode.count_no_signal(stats)
            if self.zero_success == "bucket0" and self.table.slots_of(qid):
                self.buckets.set(qid, 0)
                stats.moved_to_bucket0 += 1
            return False
        self.mode.count_bucket(stats, plan.bucket)
        if not self.lbound < plan.bucket <= self.rbound:
            stats.out_of_range += 1
            return False
        return self._admit(qid, [g.members[i] for i in plan.members], plan.bucket, step, stats, batch, prepared)

    def _admit_new_question(
        self, g: Group, plan: GroupPlan, step: int, stats: CollectStats, batch: EntryBatch, prepared: Prepared
    ) -> bool:
        """The common case of :meth:`_collect_group` in one call, for a group whose plan stores members (the only
        groups with ``prepared`` arrays) in a clean call (its rewards known): a question that holds no trajectory
        yet and members of distinct lengths (so no duplicate to look for). Puts them into ``batch`` and sets the
        bucket exactly as the general path does, and returns True; returns False, having changed nothing, for any
        other group (the general path then applies it). Most groups of a collect call are of this kind, and one
        call instead of the general path's five is most of what applying them costs."""
        columns, start, stop, rewards = prepared
        if rewards is None or start == stop:
            return False
        lengths = columns.lengths[start:stop]
        n = stop - start
        qid = g.question_id
        if len(set(lengths)) != n or self.table.slots_of(qid):
            return False
        qi = self.table.question_index(qid)
        self.mode.count_bucket(stats, plan.bucket)  # type: ignore[arg-type]
        self.counters["collected"] += n
        stats.added_entries += n
        stats.added_tokens += sum(lengths)
        first = self.table.reserve_entry_ids(n)
        batch.extend(
            qi,
            range(first, first + n),
            columns.token_ids[start:stop],  # type: ignore[arg-type]
            columns.stored_log_probs[start:stop],  # type: ignore[arg-type]
            rewards[start:stop],
            step,
            columns.masked[start:stop],
        )
        self.buckets.set(qid, plan.bucket)  # type: ignore[arg-type]
        stats.bucket_updates += 1
        return True

    def _admit(
        self,
        qid: QuestionId,
        fresh: Sequence[GroupMember],
        bucket: int,
        step: int,
        stats: CollectStats,
        batch: EntryBatch,
        prepared: Prepared | None = None,
    ) -> bool:
        """Stage the new ``fresh`` members (dedup), apply the per-question cap and set the question's bucket; True
        when entries went into ``batch``."""
        new = self._stage(qid, fresh, step, stats, prepared)
        stored = len(self.table.slots_of(qid))
        cap = self.max_entries_per_question
        if cap is not None and stored + len(new) > cap:  # evict the oldest: stored ones first, then new ones
            over = stored + len(new) - cap
            from_stored = min(over, stored)
            for s in self.table.drop_front(self.table.question_index(qid), from_stored):
                stats.evicted_tokens += self._free(s)
            dropped = over - from_stored  # the oldest new ones: never stored, their ids consumed
            stats.evicted_tokens += sum(map(len, new.token_ids[:dropped]))
            new = new.after(dropped)
            stats.evicted_entries += over
            stored -= from_stored
        if len(new):
            batch.extend(new.qi, new.entry_ids, new.token_ids, new.log_probs, new.rewards, step, new.masked)
        if stored + len(new) > 0:
            self.buckets.set(qid, bucket)
            stats.bucket_updates += 1
        else:
            self.buckets.remove(qid)
        return bool(len(new))

    def _stage(
        self,
        qid: QuestionId,
        members: Sequence[GroupMember],
        step: int,
        stats: CollectStats,
        prepared: Prepared | None = None,
    ) -> NewEntries:
        """The members to add to the EntryBatch: checked (a member whose loss mask and log-probs disagree, or whose
        exchange was cut in a tool turn, is counted and left out), deduplicated, entry ids reserved in order.
        ``prepared``: their arrays, checked with the call's others (:meth:`_prepare_members`)."""
        if prepared is not None:  # the common case, as the loop below takes it: converted, and no defect found
            columns, start, stop, _ = prepared
            ids = columns.token_ids[start:stop]
            for m, i, d in zip(members, ids, columns.defect[start:stop]):
                if i is None or d is not None or m.defect is not None:
                    break
            else:
                stored, masked = columns.stored_log_probs[start:stop], columns.masked[start:stop]
                lengths = columns.lengths[start:stop]
                return self._new_entries(qid, ids, stored, masked, members, step, stats, lengths)  # type: ignore[arg-type]
        arrays, fit = [], []
        for j, m in enumerate(members):
            a = None if prepared is None else prepared[0].arrays(prepared[1] + j)
            if a is None:
                a = member_arrays(qid, m.token_ids, m.behaviour_log_probs, m.loss_mask)
            defect = m.defect
            if defect is not None and callable(defect):  # the trainer's check, asked of a member to store only
                defect = defect()
            if defect is None and a.defect is not None:
                defect = a.defect[0]
            if defect is None:
                arrays.append(a)
                fit.append(m)
            elif defect == masks.TRUNCATED:
                stats.rejected_truncated += 1
            elif defect == masks.INCONSISTENT:
                stats.rejected_inconsistent += 1
            else:
                raise ValueError(f"question {qid!r}: unknown member defect {defect!r}; expected one of {masks.DEFECTS}")
        ids = [a.token_ids for a in arrays]
        return self._new_entries(
            qid, ids, [a.stored_log_probs for a in arrays], [a.masked for a in arrays], fit, step, stats
        )

    def _new_entries(
        self,
        qid: QuestionId,
        ids: Sequence[np.ndarray],
        stored: Sequence[np.ndarray],
        masked: Sequence[int],
        fit: Sequence[GroupMember],
        step: int,
        stats: CollectStats,
        lengths: list[int] | None = None,
    ) -> NewEntries:
        """The members ``fit`` (their token ids, stored log-probs, masked counts and, when known, lengths) that are
        new (dedup), entry ids reserved."""
        if not ids:
            return NO_NEW_ENTRIES
        qi = self.table.question_index(qid)  # a question gets its index with its first member to store
        if lengths is None:
            lengths = list(map(len, ids))  # 1-D
        if not self.table.slots(qi) and len(set(lengths)) == len(lengths):  # nothing to compare: every one is new
            self.counters["collected"] += len(ids)
            stats.added_entries += len(ids)
            stats.added_tokens += sum(lengths)
            first = self.table.reserve_entry_ids(len(ids))
            rewards = [float(m.reward) for m in fit]
            return NewEntries(qi, range(first, first + len(ids)), ids, stored, rewards, masked)
        keep = self._new_trajectories(qi, list(map(MemberArrays, ids, stored, masked, repeat(None))))
        stats.duplicates += len(ids) - len(keep)
        stats.added_entries += len(keep)
        stats.added_tokens += sum([lengths[j] for j in keep])
        first = self.table.reserve_entry_ids(len(keep))
        return NewEntries(
            qi,
            range(first, first + len(keep)),
            [ids[j] for j in keep],
            [stored[j] for j in keep],
            [float(fit[j].reward) for j in keep],
            [masked[j] for j in keep],
        )
