"""What the dry run returns: the report of a valid launch, or the error listing every problem."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from recipe.exgrpo.launch_checks.dry_run.multi_turn import multi_turn_summary
from recipe.exgrpo.launch_checks.dry_run.reward_model import reward_summary


class DryRunError(ValueError):
    """The composed config would not launch; ``problems`` holds one message per problem, each naming its key."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''}:\n" + "\n".join(f"  - {p}" for p in self.problems))


@dataclass
class DryRunReport:
    """A valid launch: the composed config (recipe defaults filled in, interpolations kept) and its ExGRPO block."""

    config: DictConfig
    exgrpo: Any  # exgrpo.config.ExGRPOConfig
    overrides: list[str]
    notes: list[str] = field(default_factory=list)
    #: not errors, but likely to fail on the cluster (the GPU memory estimate)
    warnings: list[str] = field(default_factory=list)
    #: the pre-flight's checks that could not run on this machine, each with the reason (a path not here)
    not_checked: list[str] = field(default_factory=list)

    def resolved_yaml(self) -> str:
        return OmegaConf.to_yaml(self.config, resolve=True)

    def summary(self) -> str:
        c, x = self.config, self.exgrpo
        k = int(c.actor_rollout_ref.rollout.n)
        b = int(c.data.train_batch_size)
        parts = [
            f"experiment={c.trainer.project_name}/{c.trainer.experiment_name}",
            f"model={c.actor_rollout_ref.model.path}",
            f"gpus={c.trainer.nnodes}x{c.trainer.n_gpus_per_node}",
            "trainer=" + (f"v1({c.trainer.v1.trainer_mode})" if c.trainer.get("use_v1", False) else "legacy"),
            f"rollout={c.actor_rollout_ref.rollout.name}(tp={c.actor_rollout_ref.rollout.tensor_model_parallel_size})",
            f"B={b} K={k} steps={c.trainer.total_training_steps or f'{c.trainer.total_epochs} epochs'}",
        ]
        reward_kwargs = c.reward.custom_reward_function.get("reward_kwargs") or {}
        if "think_gate" in reward_kwargs:
            parts.append(f"think_gate={reward_kwargs.think_gate}")
        if "strip_tool_responses" in reward_kwargs:
            parts.append(f"strip_tool_responses={reward_kwargs.strip_tool_responses}")
        if x.enable:
            sigma = f"{x.resolved_sigma:g}" + (" (1/K)" if x.sigma is None else "")
            parts.append(
                f"exgrpo: rho={x.replay_ratio:g} (replay {int(x.replay_ratio * b)} of {b} questions) "
                f"{x.mode.describe(x)} "
                f"weighting={x.weighting}(mu={x.mu:g}, sigma={sigma}) "
                f"trajectory={x.trajectory_metric}/{x.trajectory_mode} shaping={x.shaping}(beta={x.shaping_beta:g}) "
                f"is_correction={x.is_correction}"
            )
        else:
            parts.append("exgrpo: disabled (on-policy Dr.GRPO baseline)")
        parts += reward_summary(c, x)
        from recipe.exgrpo.runtime.stage_deadlines import deadlines_from_config

        parts.append(deadlines_from_config(c).describe())
        parts += multi_turn_summary(c)
        parts += async_summary(c)
        return "  ".join(parts)


def async_summary(c) -> list[str]:
    """verl's asynchronous v1 modes: the staleness bound and what it implies (docs/algorithm.md §15)."""
    if not c.trainer.get("use_v1", False):
        return []
    mode = str(c.trainer.v1.trainer_mode)
    if mode == "sync":
        return []
    sampler = c.trainer.v1.sampler
    bound, strategy = sampler.get("max_off_policy_threshold"), sampler.get("max_off_policy_strategy", "drop")
    warmup = c.trainer.v1.get(mode, {}).get("num_warmup_batches", 0)
    sync_step = c.trainer.v1.get(mode, {}).get("parameter_sync_step", 1)
    b = int(c.data.train_batch_size)
    if bound is None:
        implied = "no bound: a group may be trained any number of policy versions after it was issued"
    else:
        bound = int(bound)
        what = "evicted and refilled with fresh prompts" if strategy == "drop" else "waited for (sampling blocks)"
        implied = (
            f"a group issued at step s trains by step s+{bound - 1} or is {what}; its fresh tokens are at most "
            f"{bound - 1} versions older than the trained policy (ratio to the rollout uncorrected, logged as "
            "exgrpo/staleness/old_vs_rollout_ratio/*); replayed questions drawn when issued"
        )
    if mode == "separate_async":
        rollout = c.actor_rollout_ref.rollout
        implied += (
            f"; each step {int(sync_step)} local updates of {b // max(int(sync_step), 1)} groups (one optimizer step "
            f"each, the old log-probs and the selection under the step's starting weights), the weights sent once a "
            f"step to the standalone rollout ({rollout.nnodes}x{rollout.n_gpus_per_node} GPUs) through "
            f"{rollout.checkpoint_engine.backend}"
        )
    return [
        f"async: mode={mode} max_off_policy_threshold={bound} ({strategy}) warmup={warmup}x{b} prompts ahead "
        f"parameter_sync_step={sync_step}: {implied}"
    ]
