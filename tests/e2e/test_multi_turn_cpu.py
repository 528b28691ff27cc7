"""ExGRPO through verl's tool agent loop on CPU (slow), on the hf stand-in and on verl's vLLM rollout.

Every row runs ``tool_agent`` with a function tool (tests/e2e/lookup_tool.py, through verl's ``@function_tool``
loader and its hermes parser), on the tiny model made to call it in about a third of its turns
(tests/e2e/tool_assets.py); the reward is 1 when the exchange holds the tool's answer, so every stored trajectory is a
multi-turn one: model turn, tool output (loss mask 0), model turn. Checked on each rollout:

- the pool stores the exchanges with their tool tokens; a step replays them, with one actor forward call;
- each replayed row carries exactly the stored tokens and mask (the step's trace holds their digests, the checkpoint
  of the step before holds the pool they were drawn from), and the loss trains exactly their model tokens;
- exchanges that ended on an unanswered tool call (the second call of an exchange is never run:
  ``max_user_turns=1``) are counted and not stored; no mask disagrees with the rollout's log-probs;
- (hf) a resume restores the pool, masks included, and draws, selects and replays at the next step what the
  uninterrupted run did; (vllm) the rollout's log-probs of the model's tokens match the actor's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.experience.manager import ExperienceManager
from recipe.exgrpo.harness.demo import ExGRPOCpuRun, read_metrics
from tests.e2e.helpers import launch_ok, read_trace
from tests.e2e.tool_assets import TOOL_REWARD, build_tool_assets, multi_turn_overrides

pytestmark = [pytest.mark.slow]

K = 4
STEPS = 3
#: prompt ~70 tokens; an exchange: turn (~20) + tool answer with the turn boundaries (~30) + turn (~20)
MAX_RESPONSE = 96
WALL_LIMIT_S = 1500


def _run(tmp: Path, name: str, assets, ray_temp_dir: str, **kw) -> tuple[Path, list[dict]]:
    out = tmp / name
    run = ExGRPOCpuRun(
        output_dir=out,
        steps=kw.pop("steps", STEPS),
        rollout_n=K,
        train_batch_size=8,
        ppo_mini_batch_size=8,
        max_response_length=MAX_RESPONSE,
        delayed_start_threshold=-1.0,  # mixed from step 1: the pool collected at step 1 is replayed from step 2
        save_freq=1,  # the pool every replayed trajectory was drawn from: the checkpoint of the step before
        wall_limit_s=WALL_LIMIT_S,
        ray_temp_dir=ray_temp_dir,
        reward_fn_path=str(TOOL_REWARD),
        extra_overrides=multi_turn_overrides(),
        **kw,
    )
    launch_ok(run, assets, name)
    return out, read_metrics(out)


def _steps(metrics: list[dict]) -> list[dict]:
    return [m for m in metrics if "exgrpo/batch_pass_rate" in m]


def _manager(checkpoint: Path) -> tuple[ExperienceManager, dict]:
    header = json.loads((checkpoint / "exgrpo" / "pool" / "header.json").read_text())
    mgr = ExperienceManager(ExGRPOConfig.from_dict(header["extra"]["config"]))
    return mgr, mgr.load(checkpoint / "exgrpo")


def _sha(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def check_multi_turn_run(out: Path, metrics: list[dict]) -> None:
    steps = _steps(metrics)
    assert [int(m["step"]) for m in steps] == list(range(1, STEPS + 1))
    assert [m["exgrpo/actor_log_prob_calls"] for m in steps] == [1] * STEPS
    assert max(m["num_turns/max"] for m in steps) >= 4, "no exchange held a tool turn"
    assert max(m["exgrpo/pool/tool_tokens"] for m in steps) > 0, "the pool holds no tool tokens"
    assert sum(m["exgrpo/collect/rejected_truncated"] for m in steps) > 0, "no unanswered tool call was refused"
    assert all(m["exgrpo/collect/rejected_inconsistent"] == 0 for m in steps)
    trace = {r["step"]: r for r in read_trace(out) if r["event"] == "step"}
    replayed = 0
    for m in steps:
        step = int(m["step"])
        rec = trace[step]
        if not rec["replay_question_ids"]:
            assert m.get("actor/exgrpo/replayed_tokens", 0) == 0
            continue
        mgr, _ = _manager(out / "checkpoints" / f"global_step_{step - 1}")  # the pool this step drew from
        digests = rec["replayed_members"]
        assert len(digests) == len(rec["selected_entry_ids"]) == len(rec["replay_question_ids"])
        for qid, eid, digest in zip(rec["replay_question_ids"], rec["selected_entry_ids"], digests):
            stored = mgr.pool.get(qid, eid)
            assert stored.num_model_tokens < stored.length, "every stored exchange holds a tool output"
            assert digest == {
                "length": stored.length,
                "model_tokens": stored.num_model_tokens,
                "tokens_sha": _sha(stored.token_ids.astype(np.int32)),
                "mask_sha": _sha(stored.mask.astype(np.uint8)),
                "mask_beyond": 0,
            }, f"step {step}: the replayed row of entry {eid} is not the stored exchange"
        # the loss trained the replayed rows' model tokens, and only those
        assert m["actor/exgrpo/replayed_tokens"] == sum(d["model_tokens"] for d in digests)
        assert m["exgrpo/replay_group_size_min"] == K and m["exgrpo/replay_group_size_max"] == K
        replayed += len(digests)
    assert replayed > 0, f"no step replayed anything: pool entries {[m['exgrpo/pool/entries'] for m in steps]}"


@pytest.fixture(scope="module")
def hf_tool_assets(cpu_assets, tmp_path_factory):
    return build_tool_assets(cpu_assets, tmp_path_factory.mktemp("tool_assets_hf"))


@pytest.fixture(scope="module")
def hf_uninterrupted(hf_tool_assets, tmp_path_factory, new_ray_temp_dir):
    tmp = tmp_path_factory.mktemp("multi_turn_hf")
    return _run(tmp, "uninterrupted", hf_tool_assets, new_ray_temp_dir())


@pytest.mark.timeout(1800)
def test_multi_turn_exchanges_are_stored_and_replayed_with_their_masks_on_hf(hf_uninterrupted):
    check_multi_turn_run(*hf_uninterrupted)


@pytest.mark.timeout(1800)
def test_a_resume_restores_the_masks_and_replays_what_the_uninterrupted_run_replays(
    hf_uninterrupted, hf_tool_assets, tmp_path_factory, new_ray_temp_dir
):
    out_u, _ = hf_uninterrupted
    saved = out_u / "checkpoints" / "global_step_2"
    tmp = tmp_path_factory.mktemp("multi_turn_hf_resume")
    out_r, metrics_r = _run(
        tmp,
        "resumed",
        hf_tool_assets,
        new_ray_temp_dir(),
        resume_mode="resume_path",
        resume_from_path=str(saved),
    )
    (resume,) = [r for r in read_trace(out_r) if r["event"] == "resume"]
    reference, trainer_state = _manager(saved)
    assert reference.pool.table.total_masked > 0  # the checkpoint holds masked tokens
    assert resume["global_steps"] == 2 and resume["state_digest"] == reference.state_digest()
    assert resume["leftover_rows"] == trainer_state["leftover_rows"]
    step3_u = next(r for r in read_trace(out_u) if r["event"] == "step" and r["step"] == 3)
    step3_r = next(r for r in read_trace(out_r) if r["event"] == "step" and r["step"] == 3)
    for key in ("replay_question_ids", "fresh_rows", "selected_entry_ids", "replayed_members"):
        assert step3_r[key] == step3_u[key], key
    assert step3_r["replayed_members"], "the resumed step replayed nothing"
    assert [int(m["step"]) for m in _steps(metrics_r)] == [3]


@pytest.mark.timeout(1800)
def test_multi_turn_exchanges_are_stored_and_replayed_with_their_masks_on_vllm(
    vllm_python, vllm_assets, tmp_path_factory, new_ray_temp_dir
):
    assets = build_tool_assets(vllm_assets, tmp_path_factory.mktemp("tool_assets_vllm"))
    tmp = tmp_path_factory.mktemp("multi_turn_vllm")
    # on verl's v1 trainer: its tool agent loop's exchanges in TransferQueue, replayed with their masks
    out, metrics = _run(tmp, "vllm", assets, new_ray_temp_dir(), rollout="vllm", python=vllm_python, trainer="v1")
    check_multi_turn_run(out, metrics)
    assert [m["exgrpo/v1/leaked_rows"] for m in _steps(metrics)] == [0] * STEPS
    # the rollout's log-probs of the model's tokens are the actor's (the mask lines up with what vLLM sampled)
    gaps = [m["exgrpo/rollout_actor_log_prob_diff_max"] for m in _steps(metrics)]
    assert all(g < 1e-3 for g in gaps), gaps
