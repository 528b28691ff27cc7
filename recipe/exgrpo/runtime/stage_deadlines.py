"""A deadline for every stage of a training step, kept by a watchdog outside the code that may hang.

verl's agent loop puts no bound on a generation request (a paused or wedged engine waits for ever), and on GPUs a
stuck NCCL collective blocks a Ray ``get`` in C. So no stage of a step may wait unbounded: the ``stage_deadlines:``
block of ``config/exgrpo_trainer.yaml`` gives each stage a deadline in seconds (docs/trainer.md, "Stage
deadlines"):

==================  ============================================================================  =========
stage               what runs                                                                     default
==================  ============================================================================  =========
``generate``        the rollout of the step's prompts (and the agent loop's streaming rewards),   3600 s
                    then the rollout's sleep
``reward``          the trainer's own reward calls: a colocated reward model over the step's      1800 s
                    rows, the replayed members' re-scoring
``old_log_prob``    the actor's old-log-prob pass (generated rows and candidates)                 1800 s
``update``          the actor update                                                              3600 s
``weight_sync``     the new weights to the rollout (and before the first step)                    1800 s
``save_checkpoint`` the pool, verl's actor checkpoint (~91 GB for 7B with its optimizer state),   7200 s
                    the data-loader state and the tracker file
``validate``        verl's validation pass                                                        7200 s
==================  ============================================================================  =========

The defaults are 20-60 times what a stage takes at the paper's 7B shape on 8 GPUs (a step of ~3 minutes: generation
~1-2 minutes, the pass and the update about a minute, a save ~8 minutes at 200 MB/s), so they fire on a hang, never
on a slow step; ``null`` takes a stage's deadline away, ``stage_deadlines.enable=false`` all of them.

The first step of a process (a start or a resume) pays one-off costs a later step does not: vLLM's CUDA graph
capture and the agent loop's first requests, compilation, lazy imports, the first allocations. So the stages of
that step and those before it (the first weight sync, validation before training) run under
``first_step_factor`` times their deadline (default 2): a deadline set from a steady step's timings then fires on
a hang from the second step on, not on the first step's warm-up.

How (:class:`StageSupervisor`, used by the task runner): the trainer (init, fit) runs in a thread; each stage runs
inside ``StageClock.stage(name, step)``; the task runner's main thread watches the clock. When a stage passes its
deadline it

1. writes the Python stacks of every thread of the task runner (the stage's own stack among them) and of every other
   process of the run that registered for dumps (the driver, every Ray worker: ``recipe/exgrpo/runtime/stacks.py``,
   on every node of the job) to ``<trainer.default_local_dir>/stage_deadline_step<N>_<stage>.txt``;
2. stops every other process of the run on every node of the job (found by the run's token in their environment);
3. removes the checkpoint of that step if it is not complete (``global_step_<N>`` while verl's tracker file, written
   last, does not name N), so the last complete checkpoint is what a resume finds;
4. raises :class:`StageDeadlineError`, naming the stage, the step and the stacks file, which reaches the driver;
   the driver shuts Ray down, stops what is left of the run on its node and exits with that message
   (``main_exgrpo.main``).
"""

from __future__ import annotations

import contextlib
import difflib
import math
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from recipe.exgrpo.runtime import stacks

BLOCK = "stage_deadlines"
#: the stages of a step and their default deadlines in seconds (the module docstring says why these)
DEFAULT_DEADLINES_S: dict[str, float] = {
    "generate": 3600.0,
    "reward": 1800.0,
    "old_log_prob": 1800.0,
    "update": 3600.0,
    "weight_sync": 1800.0,
    "save_checkpoint": 7200.0,
    "validate": 7200.0,
}
STAGES: tuple[str, ...] = tuple(DEFAULT_DEADLINES_S)
DEFAULT_FIRST_STEP_FACTOR = 2.0
KEYS: tuple[str, ...] = ("enable", "first_step_factor", *(f"{s}_s" for s in STAGES))
#: how long the watchdog waits for the dumps of one node, and for the processes of a node to stop
COLLECT_WAIT_S = 10.0
TERMINATE_GRACE_S = 5.0
NODE_TASK_TIMEOUT_S = 60.0
TRACKER_FILE = "latest_checkpointed_iteration.txt"


# --------------------------------------------------------------------------------------------------- the config
@dataclass(frozen=True)
class StageDeadlines:
    """The validated ``stage_deadlines`` block: seconds per stage (None: no deadline), and the factor the first
    step's stages run under (module docstring)."""

    enable: bool = True
    seconds: Mapping[str, float | None] = field(default_factory=lambda: dict(DEFAULT_DEADLINES_S))
    first_step_factor: float = DEFAULT_FIRST_STEP_FACTOR

    def limit(self, stage: str, first_step: bool = False) -> float | None:
        """The deadline of ``stage`` in seconds (``first_step``: a stage of the process's first step or before it)."""
        if stage not in DEFAULT_DEADLINES_S:
            raise KeyError(f"no stage {stage!r} (stages: {', '.join(STAGES)})")
        seconds = self.seconds.get(stage) if self.enable else None
        if seconds is None or not first_step:
            return seconds
        return seconds * self.first_step_factor

    def describe(self) -> str:
        """One line for the dry run's summary."""
        if not self.enable:
            return "stage_deadlines: off"
        stages = " ".join(f"{s}={_seconds(self.seconds.get(s))}" for s in STAGES)
        return f"stage_deadlines: {stages} (first step x{self.first_step_factor:g})"


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g}s"


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


def deadline_problems(block: Any) -> list[str]:
    """One line per problem of a ``stage_deadlines`` block (a mapping), each naming its key."""
    if block is None:
        return []
    if not isinstance(block, Mapping):
        return [f"{BLOCK} must be a mapping of {', '.join(KEYS)}, got {block!r}"]
    problems = []
    for key, value in block.items():
        if key not in KEYS:
            close = difflib.get_close_matches(str(key), KEYS, n=1, cutoff=0.6)
            hint = f" (did you mean {BLOCK}.{close[0]}?)" if close else ""
            problems.append(f"{BLOCK}.{key} is not a key of {BLOCK}{hint}; allowed: {', '.join(KEYS)}")
        elif key == "enable":
            if not isinstance(value, bool):
                problems.append(f"{BLOCK}.enable must be true or false, got {value!r}")
        elif key == "first_step_factor":
            if not _finite_number(value) or float(value) < 1:
                problems.append(
                    f"{BLOCK}.first_step_factor must be a number >= 1 (the first step's deadlines are this many "
                    f"times the others), got {value!r} (default {DEFAULT_FIRST_STEP_FACTOR:g})"
                )
        elif value is not None and (not _finite_number(value) or float(value) <= 0):
            problems.append(
                f"{BLOCK}.{key} must be a number of seconds > 0, or null for no deadline, got {value!r} (default "
                f"{DEFAULT_DEADLINES_S[key[: -len('_s')]]:g})"
            )
    return problems


def deadlines_from_config(config: Any) -> StageDeadlines:
    """The ``stage_deadlines`` block of a hydra config (absent: the defaults); a bad block raises ``ValueError``
    listing every problem (``config_bridge.check_startup_config`` reports them with the rest)."""
    from omegaconf import OmegaConf

    raw = OmegaConf.select(config, BLOCK, default=None)
    block = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw
    problems = deadline_problems(block)
    if problems:
        raise ValueError("; ".join(problems))
    block = dict(block or {})
    seconds = {s: DEFAULT_DEADLINES_S[s] for s in STAGES}
    for stage in STAGES:
        if f"{stage}_s" in block:
            value = block[f"{stage}_s"]
            seconds[stage] = None if value is None else float(value)
    return StageDeadlines(
        enable=bool(block.get("enable", True)),
        seconds=seconds,
        first_step_factor=float(block.get("first_step_factor", DEFAULT_FIRST_STEP_FACTOR)),
    )


# --------------------------------------------------------------------------------------------------- the clock
@dataclass(frozen=True)
class RunningStage:
    name: str
    step: int
    started: float
    limit_s: float | None
    #: a stage of the process's first step or before it: its deadline is ``first_step_factor`` times the stage's
    first_step: bool = False

    def basis(self) -> str:
        """Where the deadline comes from, for the messages."""
        key = f"{BLOCK}.{self.name}_s"
        return f"{key} x {BLOCK}.first_step_factor" if self.first_step else key

    def elapsed(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started


class StageClock:
    """Which stages run now, since when, with which deadline. Thread-safe: the trainer's thread enters stages,
    the watchdog reads them. ``StageClock()`` (no deadlines) only records.

    The step of the first stage entered is where this process started (0, or the step it resumed from: the first
    weight sync comes before any training step); the stages of that step and of the next one, the process's first
    training step, run under the first step's deadlines."""

    def __init__(self, deadlines: StageDeadlines | None = None) -> None:
        self.deadlines = deadlines
        self._running: list[RunningStage] = []
        self._lock = threading.Lock()
        self._start_step: int | None = None

    @contextlib.contextmanager
    def stage(self, name: str, step: int) -> Iterator[RunningStage]:
        with self._lock:
            if self._start_step is None:
                self._start_step = int(step)
            first_step = int(step) <= self._start_step + 1
            limit = self.deadlines.limit(name, first_step) if self.deadlines is not None else None
            entry = RunningStage(name, int(step), time.monotonic(), limit, first_step)
            self._running.append(entry)
        try:
            yield entry
        finally:
            with self._lock:
                self._running.remove(entry)

    def running(self) -> list[RunningStage]:
        with self._lock:
            return list(self._running)

    def overdue(self, now: float | None = None) -> RunningStage | None:
        """The first running stage past its deadline, if any."""
        now = time.monotonic() if now is None else now
        for entry in self.running():
            if entry.limit_s is not None and entry.elapsed(now) > entry.limit_s:
                return entry
        return None


class StageDeadlineError(RuntimeError):
    """A stage of a step ran past its deadline: the run was stopped (stacks file, partial checkpoint removed)."""

    def __init__(
        self,
        stage: str,
        step: int,
        limit_s: float,
        elapsed_s: float,
        stacks_file: str | None,
        checkpoint_dir: str,
        removed: str | None,
        run_token: str | None = None,
        basis: str | None = None,
    ) -> None:
        self.stage, self.step, self.limit_s, self.elapsed_s = stage, int(step), float(limit_s), float(elapsed_s)
        self.stacks_file, self.checkpoint_dir, self.removed, self.run_token = (
            stacks_file,
            checkpoint_dir,
            removed,
            run_token,
        )
        self.basis = basis or f"{BLOCK}.{stage}_s"
        where = stacks_file or "(could not be written)"
        partial = f"; the incomplete checkpoint {removed} was removed" if removed else ""
        super().__init__(
            f"stage {stage!r} of step {step} ran past its deadline of {limit_s:g} s ({self.basis}; stopped "
            f"after {elapsed_s:.0f} s): the run was stopped{partial}. The Python stacks of the driver and every Ray "
            f"worker at that moment: {where}. Re-running the same command resumes from the last complete checkpoint "
            f"in {checkpoint_dir} (trainer.resume_mode=auto). What to do: docs/troubleshooting.md#stagedeadlineerror"
        )

    def __reduce__(self):
        return (
            type(self),
            (
                self.stage,
                self.step,
                self.limit_s,
                self.elapsed_s,
                self.stacks_file,
                self.checkpoint_dir,
                self.removed,
                self.run_token,
                self.basis,
            ),
        )


# ------------------------------------------------------------------------------------------- checkpoints
def remove_partial_checkpoint(checkpoint_dir: str, step: int) -> str | None:
    """Remove ``<checkpoint_dir>/global_step_<step>`` unless verl's tracker file (written after everything else of
    the checkpoint) names that step; returns the removed path. A complete checkpoint is never touched."""
    folder = os.path.join(checkpoint_dir, f"global_step_{int(step)}")
    if not os.path.isdir(folder):
        return None
    try:
        with open(os.path.join(checkpoint_dir, TRACKER_FILE), encoding="utf-8") as f:
            if f.read().strip() == str(int(step)):
                return None
    except OSError:
        pass
    shutil.rmtree(folder, ignore_errors=True)
    return folder if not os.path.exists(folder) else None


# --------------------------------------------------------------------------------------------------- Ray side
def _node_stacks(token: str, exclude: Sequence[int], wait_s: float) -> dict:
    return {"host": socket.gethostname(), "dumps": stacks.collect_local(token, exclude, wait_s)}


def _node_terminate(token: str, exclude: Sequence[int], grace_s: float) -> dict:
    return {"host": socket.gethostname(), "stopped": stacks.terminate_local(token, exclude, grace_s)}


def _on_nodes(fn: Callable, node_ids: Sequence[str], args: tuple, timeout_s: float) -> tuple[list, list[str]]:
    """``fn(*args)`` in one task pinned to each node (no CPU reserved); results, and the nodes that did not answer."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not node_ids:
        return [], []
    task = ray.remote(num_cpus=0, max_retries=0)(fn)
    refs = {
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n, soft=False)).remote(*args): n
        for n in node_ids
    }
    done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    results, silent = [], [refs[r] for r in pending]
    for ref in done:
        try:
            results.append(ray.get(ref))
        except Exception as e:  # that node's task failed: say so, go on
            silent.append(f"{refs[ref]} ({type(e).__name__}: {str(e).strip().splitlines()[-1:]})")
    for ref in pending:
        ray.cancel(ref, force=True)
    return results, silent


def _other_job_nodes(driver_node: str | None) -> list[str]:
    """The job's nodes (``ray_job.job_nodes``) and the driver's, without this process's node."""
    import ray

    from recipe.exgrpo.runtime.ray_job import job_nodes

    if not ray.is_initialized():
        return []
    here = ray.get_runtime_context().get_node_id()
    alive = [n for n in ray.nodes() if n.get("Alive")]
    wanted = {n["NodeID"] for n in job_nodes(alive)[0]}
    if driver_node:
        wanted.add(driver_node)
    return sorted(n for n in wanted if n != here and any(a["NodeID"] == n for a in alive))


class StageSupervisor:
    """Runs the trainer in a thread and stops the run when one of its stages passes its deadline (module docstring).

    ``run_token``: the run's token (``stacks.TOKEN_ENV``), None when the driver set up no dumps; ``driver``: the
    driver's ``{"node_id", "pid"}`` (its stacks are dumped, it is not stopped: it reports the error).
    """

    def __init__(
        self,
        deadlines: StageDeadlines,
        checkpoint_dir: str,
        run_token: str | None = None,
        driver: Mapping[str, Any] | None = None,
        poll_s: float = 1.0,
    ) -> None:
        self.deadlines = deadlines
        self.checkpoint_dir = os.path.abspath(checkpoint_dir)
        self.run_token = run_token
        self.driver = dict(driver or {})
        self.poll_s = poll_s
        self.clock = StageClock(deadlines)

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` under the watchdog (directly when the deadlines are off); its result or its exception."""
        if not self.deadlines.enable:
            return fn()
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = fn()
            except BaseException as e:  # handed to the watching thread, which raises it
                outcome["error"] = e

        thread = threading.Thread(target=target, name="exgrpo-trainer", daemon=True)
        thread.start()
        while True:
            thread.join(self.poll_s)
            if not thread.is_alive():
                break
            late = self.clock.overdue()
            if late is not None:
                raise self.stop(late)
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    # ------------------------------------------------------------------ what happens at a deadline
    def stop(self, late: RunningStage) -> StageDeadlineError:
        """Stacks, stop the run's other processes, remove the step's incomplete checkpoint; the error to raise."""
        elapsed = late.elapsed()
        print(
            f"[exgrpo] stage {late.name!r} of step {late.step} passed its deadline of {late.limit_s:g} s: writing "
            "the stacks of the run's processes, then stopping the run",
            flush=True,
        )
        stacks_file = self._write_stacks(late, elapsed)
        self._terminate_run()
        removed = remove_partial_checkpoint(self.checkpoint_dir, late.step)
        return StageDeadlineError(
            late.name,
            late.step,
            late.limit_s or 0.0,
            elapsed,
            stacks_file,
            self.checkpoint_dir,
            removed,
            self.run_token,
            late.basis(),
        )

    def _exclude(self) -> list[int]:
        return [os.getpid()] + ([int(self.driver["pid"])] if self.driver.get("pid") else [])

    def _write_stacks(self, late: RunningStage, elapsed: float) -> str | None:
        path = os.path.join(self.checkpoint_dir, f"stage_deadline_step{late.step}_{late.name}.txt")
        sections = [
            f"stage {late.name!r} of step {late.step} passed its deadline of {late.limit_s:g} s "
            f"({late.basis()}) after {elapsed:.0f} s; written {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            f"running stages: {[(s.name, s.step, round(s.elapsed(), 1)) for s in self.clock.running()]}",
            f"\n=== task runner (the trainer, this watchdog) pid {os.getpid()} on {socket.gethostname()} ===",
            stacks.own_stacks(),
        ]
        unanswered: list[str] = []
        if self.run_token:
            dumps = stacks.collect_local(self.run_token, [os.getpid()], COLLECT_WAIT_S)
            try:
                results, unanswered = _on_nodes(
                    _node_stacks,
                    _other_job_nodes(self.driver.get("node_id")),
                    (self.run_token, self._exclude()[1:], COLLECT_WAIT_S),
                    NODE_TASK_TIMEOUT_S,
                )
            except Exception as e:  # Ray itself may be what is stuck: keep what this node gave
                results, unanswered = [], [f"the other nodes ({type(e).__name__}: {e})"]
            for result in results:
                dumps += result["dumps"]
            for dump in sorted(dumps, key=lambda d: (d["host"], d["pid"])):
                who = "driver" if dump["pid"] == self.driver.get("pid") else "process"
                sections.append(f"\n=== {who} pid {dump['pid']} on {dump['host']}: {dump['cmdline']} ===")
                sections.append(dump["text"])
        else:
            sections.append("\n(no run token: the other processes of the run were not set up for stack dumps)")
        if unanswered:
            sections.append(f"\nnodes that gave no stacks within {NODE_TASK_TIMEOUT_S:g} s: {unanswered}")
        try:
            os.makedirs(self.checkpoint_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(sections) + "\n")
        except OSError as e:
            print(f"[exgrpo] could not write the stacks to {path}: {e}", flush=True)
            return None
        return path

    def _terminate_run(self) -> None:
        """Stop every process of the run but this one and the driver, on every node of the job."""
        if not self.run_token:
            return
        exclude = self._exclude()
        stopped = stacks.terminate_local(self.run_token, exclude, TERMINATE_GRACE_S)
        try:
            _on_nodes(
                _node_terminate,
                _other_job_nodes(self.driver.get("node_id")),
                (self.run_token, exclude[1:], TERMINATE_GRACE_S),
                NODE_TASK_TIMEOUT_S,
            )
        except Exception as e:
            print(f"[exgrpo] could not reach the other nodes to stop the run there: {e}", flush=True)
        print(f"[exgrpo] stopped {len(stopped)} process(es) of the run on this node", flush=True)
