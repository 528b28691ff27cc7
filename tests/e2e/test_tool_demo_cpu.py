"""The CPU demo's calculator task end to end (slow): ``python -m recipe.exgrpo.cpu_demo --tools``, as a user runs
it, through verl's real trainer and tool agent loop with the calculator function tool
(recipe/exgrpo/agent_tools/calculator.py) on the tiny model whose warm-up taught the call
(recipe/exgrpo/harness/tool_task.py).

A short run (4 steps, validation before training and after the last step) must: print the warmed-up model's call
rate per level, a "tool calls" figure on every step line and the validation's call rate per level; log
``exgrpo/multi_turn/tool_turn_share`` on every step, with some exchanges that did call the tool (the warm-up calls on
about a quarter of its answers: 0 of 64 at every step would mean the tool loop never ran; injected once with
``multi_turn.max_assistant_turns=1``, which stops every exchange before its call runs: the run went through and this
check failed on shares of 0.0 at all 4 steps); log the validation's per-level accuracy and call rate; and draw the
curve. What the task does to learning over 40 steps and 3 seeds is
benchmarks/tool_learning_cpu.py's (docs/tools.md).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recipe.exgrpo.harness.assets import asset_spec, ensure_assets
from recipe.exgrpo.harness.demo import read_metrics
from recipe.exgrpo.harness.learning_curves import validation_by_source

# built_late: the test command builds the calculator model in the background once the other two are built
pytestmark = [pytest.mark.slow, pytest.mark.built_late]

STEPS = 4


@pytest.mark.timeout(2700)  # the warm-up: ~4 min alone, 3x that with the other sessions on the cores
def test_the_tool_demo_prints_and_logs_the_call_rates(tmp_path, run_cpu_job, ray_temp_dir):
    ensure_assets(asset_spec("hf", tools=True))  # the tools model's warm-up (minutes), outside the run's deadline
    out = tmp_path / "tools"
    args = ["-m", "recipe.exgrpo.cpu_demo", "--tools", "--steps", str(STEPS), "--test-freq", str(STEPS)]
    result = run_cpu_job(
        [*args, "--out", str(out), "--wall-limit", "1200"],
        env={"RAY_TMPDIR": ray_temp_dir},
        timeout_s=1260,  # ~200 s on a quiet 2-core machine; CI shares its cores with three other sessions
        log_path=tmp_path / "demo.log",
    )
    printed = (tmp_path / "demo.log").read_text(errors="replace")
    assert result.returncode == 0 and not result.timed_out, printed[-4000:]
    warm = re.search(r"share of answers that call the calculator: (.*)", printed)
    assert warm and re.fullmatch(r"easy [\d.]+  medium [\d.]+  hard [\d.]+", warm.group(1).strip()), printed[-3000:]
    step_lines = re.findall(r"step +\d+/\d+ +pass rate [\d.]+  tool calls ([\d.]+)", printed)
    assert len(step_lines) == STEPS, printed[-3000:]
    assert len(re.findall(r"validation tool calls [\d.]+ +\(easy [\d.]+  medium [\d.]+  hard [\d.]+\)", printed)) == 2

    rows = read_metrics(out)
    steps = [r for r in rows if "exgrpo/batch_pass_rate" in r]
    shares = [r["exgrpo/multi_turn/tool_turn_share"] for r in steps]
    assert len(shares) == STEPS and all(0.0 <= s <= 1.0 for s in shares), shares
    assert max(shares) > 0, f"no sampled exchange got a tool answer in {STEPS} steps: {shares}"
    # the validation's call rate per level, as the tool task's reward logs it (before training and at the end)
    val_calls = [calls for r in rows if (calls := validation_by_source(r, "tool_call"))]
    assert len(val_calls) == 2 and all(len(v) == 3 for v in val_calls), val_calls
    assert Path(out / "learning_curve.png").stat().st_size > 10_000
