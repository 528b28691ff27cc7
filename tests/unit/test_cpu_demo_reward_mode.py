"""The CPU demo's reward modes (recipe/exgrpo/harness/demo.py): the binary overrides are what they were (plus the
default mode named explicitly), the continuous mode sets the mode and the partial-credit reward, a given reward
function wins, and the step line shows the reward."""

from __future__ import annotations

from recipe.exgrpo.harness.demo import PARTIAL_CREDIT_REWARD, ExGRPOCpuRun, build_overrides, step_line


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


def test_the_tool_demo_runs_the_calculator_through_verls_tool_agent_loop():
    from recipe.exgrpo.harness.demo import TOOL_REWARD, tool_run
    from recipe.exgrpo.harness.tool_task import CALCULATOR_FILE

    run = tool_run(ExGRPOCpuRun(output_dir="/tmp/x", extra_overrides=["exgrpo.replay_ratio=0.25"]))
    out = build_overrides(run, "/m", "/t.parquet", "/v.parquet")
    mt = "actor_rollout_ref.rollout.multi_turn"
    for expected in (
        f"{mt}.enable=True",
        f"{mt}.format=hermes",
        f"{mt}.function_tool_path={CALCULATOR_FILE}",
        f"{mt}.max_assistant_turns=2",
        f"reward.custom_reward_function.path={TOOL_REWARD}",
        "actor_rollout_ref.actor.loss_scale_factor=128",  # L_max = the response budget of an exchange with a call
    ):
        assert expected in out, expected
    assert out[-1] == "exgrpo.replay_ratio=0.25"  # the user's overrides last, so they win
    assert CALCULATOR_FILE.is_file()


def test_the_tool_demo_refuses_another_reward_mode(capsys):
    import pytest

    from recipe.exgrpo.harness.demo import main

    with pytest.raises(SystemExit) as exc:
        main(["--tools", "--reward", "continuous"])
    assert exc.value.code == 2
    assert "--tools runs the binary reward" in capsys.readouterr().err


def test_the_step_line_shows_the_tool_calls():
    row = {"step": 3, "exgrpo/batch_pass_rate": 0.5, "exgrpo/multi_turn/tool_turn_share": 0.375}
    assert "tool calls 0.38" in step_line(row, 10)
    val = {
        "step": 10,
        "val-core/toy_arithmetic_easy/acc/mean@1": 0.8,
        "val-core/toy_arithmetic_hard/acc/mean@1": 0.4,
        "val-aux/toy_arithmetic_easy/tool_call/mean@1": 0.25,
        "val-aux/toy_arithmetic_hard/tool_call/mean@1": 0.75,
    }
    line = step_line(val, 10)
    assert "validation accuracy 0.600" in line and "validation tool calls 0.500  (easy 0.250  hard 0.750)" in line
