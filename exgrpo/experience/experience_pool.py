"""The experience pool: correct trajectories of partially solved questions, their buckets and the retired set.

docs/algorithm.md §2 (state) and §3 (collection). The pool keeps, per question, its distinct correct trajectories
(response token ids with EOS, one behaviour log-prob per token, the loss mask of a multi-turn trajectory encoded in
them (``exgrpo.experience.masks``), reward, step collected), the question's latest
success count k (its *bucket*), and the set of retired questions (solved K/K, never replayed again).

It is composed of parts, like torchrl's replay buffer (docs/experience.md has the table):

* ``pool.table`` (:class:`EntryTable`): per-entry metadata, slots, question table; owns ``entries.arrow``;
* ``pool.token_storage`` (:class:`TokenStorage`, ``arena`` or ``per_entry``): the token bytes; owns
  ``tokens.arrow``;
* ``pool.buckets`` (:class:`BucketIndex`): question -> bucket, per-bucket member lists in draw order;
* ``pool.writer`` (:class:`CollectionRules`): the collection rules, the retired set and the counters.

The pool answers queries (candidates, entries, stats) and hands mutations to the writer. Its state is the sum of
the parts' ``state_dict`` s; :meth:`ExperiencePool.dump` / :meth:`ExperiencePool.load` write and read the files
the parts own (``exgrpo.experience.persistence`` adds the header, checksums and the atomic directory swap).
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo.experience import masks
from exgrpo.experience.arena import ArenaStorage
from exgrpo.experience.buckets import BucketIndex
from exgrpo.experience.collection import CollectionRules
from exgrpo.experience.entries import EntryTable
from exgrpo.experience.records import Candidate, CollectStats, Group, GroupMember, QuestionId, is_success
from exgrpo.experience.storage import DEFAULT_CHUNK_TOKENS, PerEntryStorage, TokenStorage

if TYPE_CHECKING:
    from exgrpo.config import ExGRPOConfig

# The records the pool takes and returns (GroupMember, Candidate ...) are importable from here as well.
__all__ = [
    "DATA_FILES",
    "ENTRIES_FILE",
    "TOKENS_FILE",
    "Candidate",
    "CollectStats",
    "ExperiencePool",
    "Group",
    "GroupMember",
    "QuestionId",
    "is_success",
]

ENTRIES_FILE = "entries.arrow"
TOKENS_FILE = "tokens.arrow"
DATA_FILES = (ENTRIES_FILE, TOKENS_FILE)


class ExperiencePool:
    """Experience pool with the collection rules of docs/algorithm.md §3.

    Typical use per training step (the trainer's order)::

        qids = sampler.draw(pool, n, exclude=fresh_qids).question_ids          # §4
        groups = pool.candidates(qids, max_per_question=cap)                    # for selection, §5
        ...rollout, reward, update...
        stats = pool.collect(step, groups_of_this_step, mixed=schedule.mixed)   # §3
        schedule.update(step, batch_pass_rate)                                  # §9
    """

    def __init__(self, k: int, *, storage: str = "arena", chunk_tokens: int = DEFAULT_CHUNK_TOKENS, **rules: Any):
        """``k``: the group size K. ``storage``: the token storage layout, ``arena`` (chunks of ``chunk_tokens``
        tokens) or ``per_entry``. ``rules``: the settings of :class:`CollectionRules` (``lbound``, ``rbound``,
        ``count_replayed_in_k``, ``zero_success``, ``collect_from``, ``max_entries_per_question``,
        ``max_total_tokens``, ``mode``: the reward mode whose rules plan each group, ``exgrpo.modes``; default
        binary). The values are a validated config's (``exgrpo.k`` >= 2, ``pool_storage``, the collection keys) or,
        for a saved pool, its header's, checked where the header is read: they are not checked again here."""
        self.k = k
        self.storage = storage  # the layout name (``pool_storage``)
        self.table = EntryTable()
        self.token_storage: TokenStorage = ArenaStorage(chunk_tokens) if storage == "arena" else PerEntryStorage()
        self.buckets = BucketIndex(k)
        self.writer = CollectionRules(self.table, self.token_storage, self.buckets, **rules)

    @classmethod
    def from_config(cls, cfg: ExGRPOConfig, **kwargs: Any) -> ExperiencePool:
        assert cfg.k is not None, "ExGRPOConfig.k must be set (validate the config first)"
        if "mode" not in kwargs:
            kwargs["mode"] = cfg.mode.from_config(cfg)
        return cls(
            cfg.k,
            lbound=cfg.bucket_lbound,
            rbound=cfg.bucket_rbound,
            count_replayed_in_k=cfg.count_replayed_in_k,
            zero_success=cfg.zero_success,
            collect_from=cfg.collect_from,
            max_entries_per_question=cfg.max_entries_per_question,
            max_total_tokens=cfg.max_total_tokens,
            storage=cfg.pool_storage,
            **kwargs,
        )

    def clear(self) -> None:
        """Empty the pool (entries, buckets, retired set, counters); the settings stay."""
        self.table.clear()
        self.token_storage.clear()
        self.buckets.clear()
        self.writer.clear()

    def settings(self) -> dict[str, Any]:
        return {**self.writer.settings(), "storage": self.storage}

    @property
    def reward_mode(self) -> str:
        """The name of the reward mode whose rules collect into this pool (``exgrpo.modes``)."""
        return self.writer.reward_mode

    @property
    def mode(self) -> Any:
        """The reward mode (``RewardMode``) whose rules collect into this pool."""
        return self.writer.mode

    # ------------------------------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return self.table.num_entries

    @property
    def total_tokens(self) -> int:
        return self.table.total_tokens

    @property
    def num_questions(self) -> int:
        """Questions with at least one stored trajectory."""
        return len(self.buckets)

    @property
    def retired(self) -> Any:
        """Retired question ids (a read-only set-like view: ``q in pool.retired``, iteration, len)."""
        return self.writer.retired.keys()

    @property
    def counters(self) -> dict[str, int]:
        """Running totals: collected, duplicates, evicted, retired, unretired, collect_calls."""
        return self.writer.counters

    def is_retired(self, qid: QuestionId) -> bool:
        return qid in self.writer.retired

    def bucket_of(self, qid: QuestionId) -> int | None:
        return self.buckets.bucket_of(qid)

    def num_entries(self, qid: QuestionId) -> int:
        return len(self.table.slots_of(qid))

    def entry_ids(self, qid: QuestionId) -> list[int]:
        return self.table.columns["entry_id"][self.table.slots_of(qid)].tolist()

    def question_ids(self) -> list[QuestionId]:
        """Questions with at least one stored trajectory (bucket order)."""
        return [q for b in range(self.k) for q in self.buckets.members(b)]

    def _candidate(self, qid: QuestionId, slot: int, copy: bool) -> Candidate:
        ids, lps = self.token_storage.view(slot)
        mask = None
        if self.table.masked(slot):  # the mask leaves the pool as a bool array, the log-probs as clean values
            lps, mask = masks.decode(lps)
            mask.flags.writeable = copy
            if not copy:
                lps.flags.writeable = False
        elif copy:
            lps = lps.copy()
        else:
            lps = lps.view()
            lps.flags.writeable = False
        if copy:
            ids = ids.copy()
        else:
            ids = ids.view()
            ids.flags.writeable = False
        c = self.table.columns
        return Candidate(
            qid, int(c["entry_id"][slot]), ids, lps, float(c["reward"][slot]), int(c["step"][slot]), loss_mask=mask
        )

    def entries(self, qid: QuestionId, *, copy: bool = True) -> list[Candidate]:
        """All stored trajectories of a question, oldest first (empty list when none)."""
        return [self._candidate(qid, s, copy) for s in self.table.slots_of(qid)]

    def lengths(self, qid: QuestionId) -> np.ndarray:
        """Response lengths (tokens) of a question's stored trajectories, oldest first (empty when none)."""
        return self.table.columns["length"][np.asarray(self.table.slots_of(qid), dtype=np.int64)]

    def candidates(
        self,
        question_ids: Iterable[QuestionId],
        *,
        max_per_question: int | None = None,
        max_length: int | None = None,
        copy: bool = True,
    ) -> list[list[Candidate]]:
        """Per drawn question, its stored trajectories, oldest first.

        ``max_length``: leave out trajectories longer than this many tokens (e.g. a run resumed with a lower
        response limit); a question may then get an empty list. ``max_per_question``: keep the newest ones
        (after the length filter). Raises KeyError for a question without stored trajectories (the sampler
        never draws one).
        """
        out = []
        lengths = self.table.columns["length"]
        for qid in question_ids:
            slots = self.table.slots_of(qid)
            if not slots:
                raise KeyError(f"question {qid!r} has no stored trajectories in the experience pool")
            if max_length is not None:
                slots = [s for s in slots if lengths[s] <= max_length]
            if max_per_question is not None:
                slots = slots[-max_per_question:]
            out.append([self._candidate(qid, s, copy) for s in slots])
        return out

    def get(self, qid: QuestionId, entry_id: int, *, copy: bool = True) -> Candidate:
        for s in self.table.slots_of(qid):
            if self.table.columns["entry_id"][s] == entry_id:
                return self._candidate(qid, s, copy)
        raise KeyError(f"entry {entry_id} of question {qid!r} is not in the experience pool")

    # ------------------------------------------------------------------------------------------ memory/stats
    def memory_bytes(self) -> int:
        """Bytes held: token storage (capacity, not only live tokens) + entry table + index estimate."""
        # Python-side index: question table, per-question slot lists, bucket lists, retired set (estimate).
        index = 120 * self.table.num_question_ids + 8 * len(self) + 100 * (len(self.buckets) + len(self.writer.retired))
        return self.token_storage.nbytes() + self.table.nbytes() + index

    def stats(self, prefix: str = "pool/") -> dict[str, float]:
        """Flat float metrics for logging (the trainer adds its ``exgrpo/`` prefix)."""
        mem = self.memory_bytes()
        sizes = self.buckets.sizes()
        n, tokens, questions = len(self), self.total_tokens, len(self.buckets)
        out = {
            f"{prefix}entries": float(n),
            f"{prefix}questions": float(questions),
            f"{prefix}tokens": float(tokens),
            f"{prefix}tool_tokens": float(self.table.total_masked),  # stored, not trained: the loss mask's zeros
            f"{prefix}bytes": float(mem),
            f"{prefix}bytes_per_token": float(mem / tokens) if tokens else 0.0,
            f"{prefix}retired": float(len(self.writer.retired)),
            f"{prefix}sampleable_questions": float(sum(sizes[1:])),
            f"{prefix}mean_entries_per_question": float(n / questions) if questions else 0.0,
        }
        for b, size in enumerate(sizes):
            out[f"{prefix}bucket_{b}"] = float(size)
        for name, v in self.counters.items():
            out[f"{prefix}{name}_total"] = float(v)
        return out

    # ------------------------------------------------------------------------------------------ mutation
    def collect(self, step: int, groups: Iterable[Group], *, mixed: bool = True) -> CollectStats:
        """Apply the collection rules of docs/algorithm.md §3 to this step's groups (after rewards are known).

        Per group, k = successes among the counted members (all K, or the fresh ones only when
        ``count_replayed_in_k`` is off):

        * every counted member correct (k = K by default) -> retire the question;
        * k = 0 -> ``zero_success='bucket0'``: a stored question moves to bucket 0 (kept, never sampled);
          ``'keep'``: nothing changes (released behaviour);
        * lbound < k <= rbound -> bucket_of = k and every correct fresh member not already stored is added;
        * otherwise nothing changes. Retired questions are ignored.

        ``mixed`` is the delayed-start flag *of this step*. With ``collect_from='mixed'`` (the released code)
        only retirement happens before mixed mode: K/K questions are retired from step 1, while storing
        trajectories, bucket updates and the 0/K rule wait for the switch (``stats.skipped`` is then True).
        The caps evict the oldest entries after the groups are processed.
        """
        return self.writer.collect(step, groups, mixed=mixed)

    def add(
        self,
        qid: QuestionId,
        token_ids: Any,
        behaviour_log_probs: Any,
        *,
        reward: float = 1.0,
        step: int = 0,
        loss_mask: Any = None,
    ) -> int | None:
        """Store one trajectory (dedup by token ids and loss mask within the question). Returns its entry id, None
        if a dup. ``loss_mask``: 0 on the tokens the model did not generate (None: every token is the model's).

        Low-level: it neither updates buckets nor applies the caps; :meth:`collect` does both.
        """
        return self.writer.add(qid, token_ids, behaviour_log_probs, reward=reward, step=step, loss_mask=loss_mask)

    def remove_entry(self, qid: QuestionId, entry_id: int) -> None:
        """Evict one stored trajectory (the question leaves its bucket if it has none left)."""
        self.writer.remove_entry(qid, entry_id)

    def retire(self, qid: QuestionId, step: int | None = None) -> None:
        """Retire for good (§3, k = K): drop its trajectories and bucket; never stored or replayed again."""
        self.writer.retire(qid, step)

    def unretire(self, question_ids: Iterable[QuestionId]) -> int:
        """Un-retire questions (the "retired questions re-added" ablation): they may be drawn as fresh prompts
        and collected again. Their trajectories were dropped at retirement. Returns how many were retired."""
        return self.writer.unretire(question_ids)

    # ------------------------------------------------------------------------------------------ state
    def _meta(self, table: dict[str, Any]) -> dict[str, Any]:
        """The JSON part of the state (the header's ``pool`` section), from the parts' state_dicts."""
        writer = self.writer.state_dict()
        return {
            "k": self.k,
            "settings": self.settings(),
            "questions": table["questions"],
            "bucket_members": self.buckets.state_dict()["members"],
            "retired": writer["retired"],
            "next_entry_id": table["next_entry_id"],
            "last_step": writer["last_step"],
            "counters": writer["counters"],
            "num_entries": table["num_entries"],
            "total_tokens": table["total_tokens"],
        }

    def _restore(
        self,
        meta: dict[str, Any],
        load_table: Callable[[dict[str, Any]], None],
        load_tokens: Callable[[np.ndarray, np.ndarray], np.ndarray],
    ) -> None:
        """Rebuild every part from ``meta`` and the two loaders (table, then tokens into slots 0..n-1; the token
        loader returns each entry's masked-token count)."""
        if int(meta["k"]) != self.k:
            raise ValueError(f"the saved pool has K={meta['k']} but this pool has K={self.k}")
        self.clear()
        load_table({key: meta[key] for key in ("questions", "next_entry_id", "num_entries", "total_tokens")})
        n = len(self)
        self.token_storage.resize(self.table.capacity)
        slots = np.arange(n, dtype=np.int64)
        self.table.set_masked(slots, load_tokens(slots, self.table.columns["length"][:n].astype(np.int64)))
        self.token_storage.resize(self.table.capacity)  # an in-memory load sizes the storage to the entries
        self.writer.load_state_dict({key: meta[key] for key in ("retired", "counters", "last_step")})
        self.buckets.load_state_dict({"members": meta["bucket_members"]})
        for members in meta["bucket_members"]:
            for q in members:
                if not self.table.slots_of(q):
                    raise ValueError(f"question {q!r} is in a bucket but has no stored trajectory")

    def state_dict(self) -> dict[str, Any]:
        """Everything, in memory: ``meta`` (JSON-able), ``entries`` (columns, entry-id order), the tokens of all
        entries concatenated in that order. For large pools use :meth:`dump` (through ``save_experience``)."""
        table = self.table.state_dict()
        ids, lps = self.token_storage.gather(self.table.slots_in_entry_order())
        return {"meta": self._meta(table), "entries": table["columns"], "token_ids": ids, "behaviour_log_probs": lps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        entries = state["entries"]

        def tokens(slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
            return self.token_storage.load_state_dict(
                {
                    "slots": slots,
                    "lengths": lengths,
                    "token_ids": state["token_ids"],
                    "behaviour_log_probs": state["behaviour_log_probs"],
                }
            )

        self._restore(state["meta"], lambda table: self.table.load_state_dict({**table, "columns": entries}), tokens)

    def dump(self, directory: str | pathlib.Path, *, batch_tokens: int = DEFAULT_CHUNK_TOKENS) -> tuple[dict, dict]:
        """Write ``entries.arrow`` and ``tokens.arrow`` into ``directory`` (streamed, <= ``batch_tokens`` tokens
        per record batch); returns (the JSON part of the state, per file its record) for the header."""
        d = pathlib.Path(directory)
        table, entries_record = self.table.dump(d / ENTRIES_FILE)
        order = self.table.slots_in_entry_order()
        tokens_record = self.token_storage.dump(d / TOKENS_FILE, order, batch_tokens=batch_tokens)
        return self._meta(table), {ENTRIES_FILE: entries_record, TOKENS_FILE: tokens_record}

    def load(
        self, directory: str | pathlib.Path, meta: dict[str, Any], records: dict[str, Any], *, tokens: bool = True
    ) -> None:
        """Restore from what :meth:`dump` wrote into ``directory`` and returned (``meta``, ``records``).

        ``tokens=False`` restores the index only (entry table, buckets, retired set, counters, with every check of
        a full load) and leaves ``tokens.arrow`` unread and the token storage empty: for tools that read the tokens
        themselves by streaming (:func:`~exgrpo.experience.storage.read_token_batches`); such a pool answers the
        table's and the buckets' queries, not ``entries`` / ``candidates``, and must not collect.

        Raises ``PoolCheckpointError`` naming the file for a damaged file, ValueError when the files and ``meta``
        do not fit together. After an error the pool is in an undefined state: build a fresh one.
        """
        d = pathlib.Path(directory)

        def load_tokens(slots: np.ndarray, lengths: np.ndarray) -> np.ndarray:
            if not tokens:  # the index only: the masked-token counts live in the unread token file
                return np.zeros(len(slots), dtype=np.int64)
            return self.token_storage.load(d / TOKENS_FILE, records.get(TOKENS_FILE), slots, lengths)

        self._restore(
            meta, lambda table: self.table.load(d / ENTRIES_FILE, table, records.get(ENTRIES_FILE)), load_tokens
        )
