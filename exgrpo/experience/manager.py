"""The experience manager: pool + bucket sampler + trajectory selector + delayed-start schedule as one object.

This is what a trainer adapter talks to each step (ALGORITHM.md §2–6, §9), framework-free:

1. ``draw_replay(B, step)``: replayed question ids (none before the delayed start).
2. ``select(qids, score_fn)``: one stored trajectory per replayed question; ``score_fn`` is the adapter's model
   pass, ``score_fn(prompt_ids, response_ids) -> {"entropy": [...], "log_prob": [...]}`` with one per-token
   array per candidate (the current policy at temperature 1).
3. ``collect(step, groups)`` after the rewards and old log-probs are known, then
   ``observe_pass_rate(rate, step)`` (the delayed-start check; collection uses the flag of *this* step).

The prompt token ids of every question in the pool are kept too (the entropy pass scores prompt + stored
response), and everything is saved/loaded together: ``save(dir, trainer_state)`` / ``load(dir)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from exgrpo.config import ExGRPOConfig
from exgrpo.experience.persistence import PoolCheckpointError, load_experience, save_experience
from exgrpo.experience.pool import Candidate, ExperiencePool, Group, GroupMember, QuestionId
from exgrpo.experience.sampler import BucketSampler
from exgrpo.experience.selection import SelectedTrajectory, TrajectorySelector, selection_metrics
from exgrpo.schedule import ExperienceSchedule

ScoreFn = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], Mapping[str, Sequence[np.ndarray]]]

POOL_SUBDIR = "pool"
PROMPTS_FILE = "prompts.arrow"
PROMPTS_SCHEMA = pa.schema([("question_id", pa.string()), ("prompt_ids", pa.list_(pa.int32()))])


class ExperienceManager:
    """Everything ExGRPO keeps across steps, behind the five calls a trainer makes."""

    def __init__(self, cfg: ExGRPOConfig):
        if cfg.k is None:
            raise ValueError("ExGRPOConfig.k (the group size, rollout.n) must be set before building the manager")
        self.cfg = cfg
        self.pool = ExperiencePool.from_config(cfg)
        self.sampler = BucketSampler.from_config(cfg)
        self.selector = TrajectorySelector.from_config(cfg)
        self.schedule = ExperienceSchedule.from_config(cfg)
        self.prompts: dict[QuestionId, np.ndarray] = {}
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

    def candidates(self, question_ids: Sequence[QuestionId]) -> list[list[Candidate]]:
        return self.pool.candidates(question_ids, max_per_question=self.cfg.max_candidates_per_question)

    def select(self, question_ids: Sequence[QuestionId], score_fn: ScoreFn | None) -> list[SelectedTrajectory]:
        """One stored trajectory per question (§5), scored by ``score_fn`` when the metric needs the model."""
        if not question_ids:
            return []
        groups = self.candidates(question_ids)

        def provider(flat: Sequence[Candidate], quantity: str) -> np.ndarray:
            if score_fn is None:
                raise ValueError(f"trajectory metric {self.cfg.trajectory_metric!r} needs the model's score pass")
            missing = [c.question_id for c in flat if c.question_id not in self.prompts]
            if missing:
                raise KeyError(f"no stored prompt token ids for replayed question(s) {sorted(set(missing))[:5]}")
            out = score_fn([self.prompts[c.question_id] for c in flat], [c.token_ids for c in flat])
            if quantity == "entropy":
                return np.asarray([_mean(e) for e in out["entropy"]], dtype=np.float64)
            if quantity == "nll":
                return np.asarray([-_mean(lp) for lp in out["log_prob"]], dtype=np.float64)
            raise ValueError(f"unknown score quantity {quantity!r}")

        selected = self.selector.select(groups, provider if self.selector.needs_scores else None)
        self._last.update(selection_metrics(selected, prefix="exgrpo/selection/"))
        return selected

    def collect(
        self,
        step: int,
        groups: Mapping[QuestionId, tuple[np.ndarray, Sequence[GroupMember]]],
    ) -> dict[str, float]:
        """Collection (§3) of this step's groups: ``{question_id: (prompt_ids, members)}``."""
        if not self.cfg.enable:
            return {}
        stats = self.pool.collect(
            step, (Group(qid, list(members)) for qid, (_, members) in groups.items()), mixed=self.schedule.mixed
        )
        for qid, (prompt_ids, _) in groups.items():
            if self.pool.num_entries(qid) and qid not in self.prompts:
                self.prompts[qid] = np.asarray(prompt_ids, dtype=np.int32).copy()
        metrics = stats.as_metrics("exgrpo/collect/")
        self._last.update(metrics)
        return metrics

    def observe_pass_rate(self, pass_rate: float, step: int) -> bool:
        """Delayed-start check (§9) with this step's batch pass rate; True when mixed mode switched on now."""
        switched = self.schedule.update(step, pass_rate)
        if switched:
            print(f"[exgrpo] step {step}: batch pass rate {pass_rate:.3f} > {self.schedule.threshold}: mixed mode on")
        return switched

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
        out["exgrpo/pool/prompt_store_questions"] = float(len(self.prompts))
        return out

    def state_digest(self) -> dict[str, str]:
        """SHA-256 of each part of the state (pool, sampler, selector, schedule, prompts): equal digests mean an
        equal state, so a resumed run can prove it restored exactly what was saved."""
        pool_state = self.pool.state_dict()
        h = hashlib.sha256(json.dumps(pool_state["meta"], sort_keys=True, default=str).encode())
        for name in sorted(pool_state["entries"]):
            h.update(name.encode() + np.ascontiguousarray(pool_state["entries"][name]).tobytes())
        h.update(np.ascontiguousarray(pool_state["token_ids"]).tobytes())
        h.update(np.ascontiguousarray(pool_state["behaviour_log_probs"]).tobytes())
        prompts = hashlib.sha256()
        for q in sorted(self.prompts, key=str):
            prompts.update(str(q).encode() + b"\0" + self.prompts[q].tobytes())

        def js(obj: Any) -> str:
            return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()

        return {
            "pool": h.hexdigest(),
            "sampler": js(self.sampler.state_dict()),
            "selector": js(self.selector.state_dict()),
            "schedule": js(self.schedule.state_dict()),
            "prompts": prompts.hexdigest(),
        }

    # ------------------------------------------------------------------ persistence
    def _prune_prompts(self) -> None:
        self.prompts = {q: p for q, p in self.prompts.items() if self.pool.num_entries(q)}

    def save(self, directory: str | os.PathLike[str], trainer_state: dict[str, Any] | None = None) -> pathlib.Path:
        """Save pool, sampler, selector, schedule, stored prompts and ``trainer_state`` to ``directory``.

        The pool goes through :func:`save_experience` (atomic); the prompt file is written to a temporary name
        and renamed. The caller writes its own "checkpoint complete" marker after this returns.
        """
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._prune_prompts()
        save_experience(
            directory / POOL_SUBDIR,
            pool=self.pool,
            sampler=self.sampler,
            selector=self.selector,
            schedule=self.schedule,
            extra={"trainer_state": trainer_state or {}, "config": self.cfg.to_dict()},
        )
        qids = list(self.prompts)
        table = pa.table(
            {"question_id": [str(q) for q in qids], "prompt_ids": [self.prompts[q].tolist() for q in qids]},
            schema=PROMPTS_SCHEMA,
        )
        tmp = directory / (PROMPTS_FILE + ".tmp")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, PROMPTS_SCHEMA) as writer:
            writer.write_table(table)
        os.replace(tmp, directory / PROMPTS_FILE)
        with open(directory / "manifest.json.tmp", "w", encoding="utf-8") as f:
            json.dump({"format": "exgrpo-experience", "pool": POOL_SUBDIR, "prompts": PROMPTS_FILE}, f)
        os.replace(directory / "manifest.json.tmp", directory / "manifest.json")
        return directory

    def load(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore everything :meth:`save` wrote; returns the saved ``trainer_state``.

        Raises :class:`PoolCheckpointError` naming the file when anything is missing or damaged.
        """
        directory = pathlib.Path(directory)
        extra = load_experience(
            directory / POOL_SUBDIR,
            pool=self.pool,
            sampler=self.sampler,
            selector=self.selector,
            schedule=self.schedule,
        )
        path = directory / PROMPTS_FILE
        if not path.exists():
            raise PoolCheckpointError(f"{path}: missing (the stored prompt token ids of the pool's questions)")
        try:
            with pa.memory_map(str(path), "r") as source:
                table = pa.ipc.open_file(source).read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise PoolCheckpointError(f"{path}: unreadable or corrupt prompt file ({exc})") from exc
        if table.schema != PROMPTS_SCHEMA:
            raise PoolCheckpointError(f"{path}: unexpected schema {table.schema}")
        qids = table.column("question_id").to_pylist()
        prompts = table.column("prompt_ids").to_pylist()
        by_str = {str(q): q for q in self.pool.question_ids()}
        self.prompts = {by_str.get(q, q): np.asarray(p, dtype=np.int32) for q, p in zip(qids, prompts)}
        missing = [q for q in self.pool.question_ids() if self.pool.num_entries(q) and q not in self.prompts]
        if missing:
            raise PoolCheckpointError(f"{path}: no prompt ids for {len(missing)} pool question(s), e.g. {missing[:3]}")
        return dict(extra.get("trainer_state", {}))


def _mean(values: Any) -> float:
    arr = np.asarray(values, dtype=np.float64)
    return float(arr.mean()) if arr.size else float("nan")
