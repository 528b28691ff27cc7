"""Delayed start and the replay-ratio schedule (docs/algorithm.md §6, §9).

Mixed mode (replayed questions in the batch) starts after the first step whose batch pass rate, (responses
with reward 1) / (B*K), is strictly greater than tau, and never switches off. A negative tau means mixed from
step 1 (the paper's Llama-3.1-8B base run). Optionally rho ramps linearly from 0 to its target over N steps
after the switch (an extension; default off = constant rho).

Order within a training step ``t``: draw with ``replay_ratio(t)`` (0 before mixed mode), train, collect with
``mixed`` as it was for step ``t``, then ``update(t, pass_rate)``: a switch takes effect from step ``t + 1``.

What the delayed start watches is the reward mode's (``exgrpo.modes``: ``schedule_settings`` and ``start_signal``):
the batch pass rate in the binary mode; in the continuous reward mode (docs/algorithm.md §13), where the pass rate
has no meaning, ``steps`` (mixed mode after a number of steps, 0 = from step 1) or ``mean_reward`` (the first step
whose batch mean reward exceeds a threshold in reward units). ``update`` takes the step's signal value either way
(recorded as ``last_pass_rate``), so the saved state has the same keys in every mode.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

# the modes' start signals, importable from here as well
from exgrpo.modes.binary import batch_pass_rate
from exgrpo.modes.continuous import batch_mean_reward

if TYPE_CHECKING:
    from exgrpo.config import ExGRPOConfig

__all__ = ["START_SIGNALS", "ExperienceSchedule", "batch_mean_reward", "batch_pass_rate", "replay_count"]

#: What the delayed start watches: the batch pass rate (binary mode), the batch mean reward or the step count.
START_SIGNALS = ("pass_rate", "mean_reward", "steps")


def replay_count(batch_size: int, replay_ratio: float) -> int:
    """floor(rho * B), robust to float error (0.29 * 100 must give 29, not 28). ``replay_ratio`` is the schedule's
    rho of a step (validated with the config: in [0, 1))."""
    if batch_size < 0:
        raise ValueError(f"batch size must be >= 0, got {batch_size}")
    return int(math.floor(replay_ratio * batch_size + 1e-9))


class ExperienceSchedule:
    """Delayed-start flag (strict >, one-way) plus the replay ratio per step; state in :meth:`state_dict`."""

    def __init__(
        self,
        replay_ratio: float = 0.5,
        *,
        threshold: float = 0.35,
        ramp_steps: int = 0,
        signal: str = "pass_rate",
        start_steps: int = 0,
    ):
        """``signal``: ``pass_rate`` (binary: mixed after the first step whose pass rate is > ``threshold``;
        negative = from step 1), ``mean_reward`` (after the first step whose mean reward is > ``threshold``, any
        real number) or ``steps`` (mixed once ``start_steps`` steps are done; 0 = from step 1).

        The values are a validated config's (:meth:`from_config`): ``exgrpo.replay_ratio`` in [0, 1), the ramp and
        the start steps >= 0 are checked there, once, and trusted here. ``signal`` comes from the reward mode's code
        (``schedule_settings``), not from a user: an unknown one is a mode's bug, refused here."""
        if signal not in START_SIGNALS:
            raise ValueError(f"start signal must be one of {list(START_SIGNALS)}, got {signal!r}")
        self.target_ratio = float(replay_ratio)
        self.threshold = float(threshold)
        self.ramp_steps = int(ramp_steps)
        self.signal = signal
        self.start_steps = int(start_steps)
        # tau < 0 (pass rate) or 0 start steps: mixed from the first step; the "switch" is then at step 0.
        if signal == "pass_rate":
            self.mixed = self.threshold < 0
        else:
            self.mixed = signal == "steps" and self.start_steps == 0
        self.switch_step: int | None = 0 if self.mixed else None
        self.last_step: int | None = None
        self.last_pass_rate: float | None = None

    @classmethod
    def from_config(cls, cfg: ExGRPOConfig) -> ExperienceSchedule:
        """The schedule of a validated config: its reward mode says what starts mixed mode."""
        return cls(cfg.replay_ratio, ramp_steps=cfg.replay_ratio_ramp_steps, **cfg.mode.schedule_settings(cfg))

    def update(self, step: int, pass_rate: float) -> bool:
        """Record this step's start signal (the batch pass rate; the mean reward in continuous mode); returns True
        when mixed mode switched on just now."""
        self.last_step = int(step)
        self.last_pass_rate = float(pass_rate)
        if self.signal == "steps":
            if not self.mixed and step >= self.start_steps:
                self.mixed = True
                self.switch_step = int(step)
                return True
            return False
        if not self.mixed and pass_rate > self.threshold:
            self.mixed = True
            self.switch_step = int(step)
            return True
        return False

    def replay_ratio(self, step: int) -> float:
        """rho for ``step``: 0 before mixed mode; ramps to the target over ``ramp_steps`` after the switch."""
        if not self.mixed:
            return 0.0
        if self.ramp_steps == 0:
            return self.target_ratio
        since = step - (self.switch_step or 0)
        return self.target_ratio * min(1.0, max(0, since) / self.ramp_steps)

    def num_replay(self, step: int, batch_size: int) -> int:
        """floor(rho_t * B) replayed questions requested at ``step`` (the sampler caps it at |valid|)."""
        return replay_count(batch_size, self.replay_ratio(step))

    def metrics(self, step: int, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}mixed": float(self.mixed), f"{prefix}replay_ratio": self.replay_ratio(step)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "mixed": self.mixed,
            "switch_step": self.switch_step,
            "last_step": self.last_step,
            "last_pass_rate": self.last_pass_rate,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mixed = bool(state["mixed"])
        self.switch_step = None if state["switch_step"] is None else int(state["switch_step"])
        self.last_step = None if state.get("last_step") is None else int(state["last_step"])
        self.last_pass_rate = None if state.get("last_pass_rate") is None else float(state["last_pass_rate"])
