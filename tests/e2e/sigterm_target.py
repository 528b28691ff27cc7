"""The pytest run that tests/e2e/test_sigterm_cpu.py terminates: one verl run (main_ppo, 1000 steps, on the
``hf`` rollout) with Ray's temp dir taken from ``EXGRPO_SIGTERM_RAY_DIR``, so that the outer test can find its
processes. Not collected by a plain ``pytest`` (its name does not start with ``test_``); run only by that test."""

from __future__ import annotations

import os

import pytest

from recipe.exgrpo.cpu.run_config import cpu_env, cpu_overrides
from tests.e2e.helpers import cpu_run_spec

RAY_DIR_ENV = "EXGRPO_SIGTERM_RAY_DIR"
# far longer than the outer test waits: only the SIGTERM can end this run in time
RUN_LIMIT_S = 600


@pytest.mark.timeout(RUN_LIMIT_S + 60)
def test_a_run_that_only_a_signal_ends(cpu_assets, toy_reward_path, run_cpu_job, tmp_path):
    ray_dir = os.environ[RAY_DIR_ENV]
    spec = cpu_run_spec(
        cpu_assets, tmp_path, reward_fn_path=str(toy_reward_path), total_training_steps=1000, ray_temp_dir=ray_dir
    )
    env = cpu_env(output_dir=tmp_path, wall_limit_s=RUN_LIMIT_S)
    run_cpu_job(["-m", "verl.trainer.main_ppo", *cpu_overrides(spec)], env, RUN_LIMIT_S, tmp_path / "run.log")
    pytest.fail("the run ended by itself: the signal never came")
