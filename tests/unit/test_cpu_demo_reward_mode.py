"""The CPU demo's reward modes (recipe/exgrpo/cpu/demo.py): the binary overrides are what they were (plus the
default mode named explicitly), the continuous mode sets the mode and the partial-credit reward, a given reward
function wins, and the step line shows the reward."""

from __future__ import annotations

from recipe.exgrpo.cpu.demo import PARTIAL_CREDIT_REWARD, ExGRPOCpuRun, build_overrides, step_line


def _overrides(**kw) -> list[str]:
    return build_overrides(ExGRPOCpuRun(output_dir="/tmp/x", **kw), "/m", "/t.parquet", "/v.parquet")


def test_binary_overrides_keep_the_pass_rates_tau_and_the_recipes_reward():
    out = _overrides(delayed_start_threshold=0.2)
    assert "exgrpo.delayed_start_threshold=0.2" in out
    assert [o for o in out if o.startswith("exgrpo.reward_mode")] == ["exgrpo.reward_mode=binary"]
    assert not any(o.startswith("reward.custom_reward_function.path") for o in out)


def test_continuous_overrides_set_the_mode_and_the_partial_credit_reward():
    out = _overrides(reward_mode="continuous", delayed_start_threshold=0.2)
    assert "exgrpo.reward_mode=continuous" in out
    assert f"reward.custom_reward_function.path={PARTIAL_CREDIT_REWARD}" in out
    # the binary τ is not passed (it would be an error in continuous mode)
    assert not any(o.startswith("exgrpo.delayed_start_threshold") for o in out)
    own = _overrides(reward_mode="continuous", reward_fn_path="/r.py")
    assert [o for o in own if o.startswith("reward.custom_reward_function.path")] == [
        "reward.custom_reward_function.path=/r.py"
    ]


def test_the_step_line_shows_the_mean_reward_in_continuous_mode():
    row = {"step": 3, "exgrpo/batch_pass_rate": 0.25, "exgrpo/sampled_pass_rate": 0.2, "exgrpo/reward/mean": 0.731}
    assert "reward 0.731" in step_line(row, 10) and "pass rate" not in step_line(row, 10)
    del row["exgrpo/reward/mean"]
    assert "pass rate 0.200" in step_line(row, 10)
