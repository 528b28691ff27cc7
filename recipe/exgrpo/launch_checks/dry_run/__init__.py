"""Dry run of an ExGRPO launch: compose the full hydra config of a launch and validate it, launching nothing.

    python -m recipe.exgrpo.dry_run [options] [hydra overrides ...]

It composes ``config/exgrpo_trainer.yaml`` (verl's ``ppo_trainer`` plus the ``exgrpo:`` block) with the given
overrides through hydra's compose API, exactly as ``python -m recipe.exgrpo.main_exgrpo OVERRIDES`` would, then runs
every check that needs neither GPUs, Ray, a model nor the data:

1. hydra itself: override syntax, unknown keys (hydra's struct mode), with a did-you-mean found here;
2. keys added with ``+``/``++`` outside the maps that take free keys (a typo there is silently ignored by verl);
3. value types against the defaults (``trainer.n_gpus_per_node=eight``) and ranges of launch-critical verl keys;
4. the entry point's own start-up: ``main_exgrpo.prepare_config`` (recipe defaults, the ``exgrpo`` block through
   ``ExGRPOConfig``, the verl settings the recipe would ignore) and verl's ``validate_config``, as
   ``main_exgrpo.main`` runs them;
5. what verl only checks after Ray has started: the rollout and algorithm dataclasses, the custom reward function
   and dataset class can be loaded, ``reward_kwargs`` are parameters of the recipe's reward, the GPUs split into
   whole vLLM replicas, the dynamic-batch token budgets hold one full sequence, every interpolation resolves;
6. what verl skips with dynamic batch size on: a step's B x K responses and a mini-batch's responses split evenly
   over the data-parallel ranks;
7. the launch's file checks: the model directory and the data files exist (required with ``--check-paths``; without
   it, each one missing here is listed as "not checked"), the model's context holds prompt + response
   (``CHECK_CONTEXT``), and the data's prompts suit the chat template (the Llama-3.1-8B base prompt with the verbatim
   template, chat rows otherwise);
8. the GPU memory of generation: the FSDP actor's resident state per GPU plus vLLM's ``gpu_memory_utilization``
   share of the card (``recipe/exgrpo/launch_checks/memory_estimate.py``; ``--gpu-memory-gib``, ``--model-params``),
   and of the update (weights, gradients, optimizer state, one micro-batch's activations; LoRA-aware): a warning
   naming the setting and a value that fits when a sum nears the card's memory;
9. a run whose rollouts call tools: ``multi_turn.format`` is a tool-call format verl registers, and with
   ``--check-paths`` the tool files exist and the function-tool file defines a tool (verl's loader only warns);
   the data files here have an ``agent_name`` column (else no row reaches a loop with tools); with the recipe's
   Python tool, its ``EXGRPO_SANDBOX_*`` limits parse and (``--check-paths``) the kernel has the isolation they
   require.

All problems found are reported together, each naming its key. Exit status: 0 valid, 1 invalid, 2 bad usage.
The launch scripts under ``scripts/train`` call this with ``DRY_RUN=1`` (see docs/launch_scripts.md).

One module per checker: ``compose`` (1), ``overrides`` (2, 3), ``startup`` (4), ``workers`` (5, 6), ``paths`` (7),
``memory`` (8), ``multi_turn`` (9), ``reward_model`` (the reward model's GPUs and context, and the reward summary);
``report`` holds what a dry run returns and ``driver`` runs them in order (``dry_run``) behind the command line
(``main``).
"""

from __future__ import annotations

from recipe.exgrpo.launch_checks.dry_run.compose import (
    CONFIG_DIR,
    DEFAULT_CONFIG_NAME,
    RECIPE_REWARD_FILE,
    base_config,
    compose_config,
    suggest_key,
)
from recipe.exgrpo.launch_checks.dry_run.driver import build_parser, dry_run, main
from recipe.exgrpo.launch_checks.dry_run.memory import generation_memory, update_memory
from recipe.exgrpo.launch_checks.dry_run.multi_turn import data_agent_problems, multi_turn_problems, sandbox_problems
from recipe.exgrpo.launch_checks.dry_run.overrides import OPEN_MAPS, VERL_RANGES, check_overrides
from recipe.exgrpo.launch_checks.dry_run.paths import check_context, check_paths, check_prompt_style, launch_path_checks
from recipe.exgrpo.launch_checks.dry_run.report import DryRunError, DryRunReport
from recipe.exgrpo.launch_checks.dry_run.reward_model import (
    NODE_GPUS_ENV,
    REWARD_MODEL_BACKENDS,
    reward_model_problems,
    reward_summary,
)
from recipe.exgrpo.launch_checks.dry_run.startup import run_entry_point_checks
from recipe.exgrpo.launch_checks.dry_run.workers import check_batch_split, check_reward_kwargs, run_worker_checks

__all__ = [
    "CONFIG_DIR",
    "DEFAULT_CONFIG_NAME",
    "NODE_GPUS_ENV",
    "OPEN_MAPS",
    "RECIPE_REWARD_FILE",
    "REWARD_MODEL_BACKENDS",
    "VERL_RANGES",
    "DryRunError",
    "DryRunReport",
    "base_config",
    "build_parser",
    "check_batch_split",
    "check_overrides",
    "check_context",
    "check_paths",
    "check_prompt_style",
    "check_reward_kwargs",
    "compose_config",
    "data_agent_problems",
    "dry_run",
    "generation_memory",
    "launch_path_checks",
    "main",
    "multi_turn_problems",
    "reward_model_problems",
    "reward_summary",
    "run_entry_point_checks",
    "run_worker_checks",
    "update_memory",
    "sandbox_problems",
    "suggest_key",
]
