"""The released code's training semantics through the real verl trainer on CPU (slow, one ~1-minute run).

All switches of docs/objective.md "Release vs ours" at once, plus whole-group Eq. 4 weights, dual clip and
fresh_clip=never: the run must finish, and the grad-norm bound (set absurdly low) must reach every Ray worker
through the runtime_env and skip every optimiser update (a worker without the hook stops the run instead).
"""

from __future__ import annotations

import pytest

from recipe.exgrpo.harness.demo import ExGRPOCpuRun, read_metrics
from tests.e2e.helpers import launch_ok

pytestmark = [pytest.mark.slow]

STEPS = 3


@pytest.mark.timeout(900)
def test_released_switches_run_and_the_skip_bound_reaches_the_workers(tmp_path, cpu_assets, ray_temp_dir):
    run = ExGRPOCpuRun(
        output_dir=tmp_path / "released",
        steps=STEPS,
        rollout_n=4,
        train_batch_size=8,
        ppo_mini_batch_size=4,  # two optimiser updates per step
        delayed_start_threshold=-1.0,
        wall_limit_s=720,
        ray_temp_dir=ray_temp_dir,
        extra_overrides=[
            "exgrpo.skip_grad_norm_above=1e-9",
            "exgrpo.loss_scale=per_rank",
            "exgrpo.collect_from=mixed",
            "exgrpo.retire_fresh_prompts=false",
            "exgrpo.weight_terms_by_ratio=true",
            "exgrpo.dual_clip=true",
            "exgrpo.fresh_clip=never",
        ],
    )
    launch_ok(run)
    steps = [m for m in read_metrics(run.output_dir) if "exgrpo/batch_pass_rate" in m]
    assert len(steps) == STEPS
    for m in steps:
        assert m["actor/exgrpo/update_skipped"] == 1.0  # every update skipped: every norm is > 1e-9
        assert m["actor/grad_norm"] > 1e-9
    assert any(m.get("actor/exgrpo/replayed_tokens", 0) > 0 for m in steps), "replay never reached the loss"
