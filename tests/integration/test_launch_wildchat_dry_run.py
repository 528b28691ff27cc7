"""The reward-model launch scripts of the paper's Table 2 (scripts/train/*_qwen2.5_7b_base_wildchat_if.sh) compose to
valid configs with the continuous mode and verl's reward model on, and the dry run checks the reward model's GPUs
against the actor's (recipe/exgrpo/launch_checks/dry_run/: ``reward_model_problems``). No GPU, model or Ray is used."""

from __future__ import annotations

import pytest

from recipe.exgrpo.launch_checks.dry_run import NODE_GPUS_ENV, DryRunError, dry_run
from tests.helpers.launch_scripts import (
    TRAIN_DIR,
    differing_paths,
    flat,
    printed_launches,
    run_script,
    script_env,
)

pytestmark = pytest.mark.usefixtures("gpu_dry_run_env")

EXGRPO = TRAIN_DIR / "exgrpo_qwen2.5_7b_base_wildchat_if.sh"
ONPOLICY = TRAIN_DIR / "onpolicy_qwen2.5_7b_base_wildchat_if.sh"


def _launch(script=EXGRPO, *args: str, **env: str) -> list[str]:
    (launch,) = printed_launches(script, *args, **env)
    return launch


def test_the_paper_settings_with_a_colocated_reward_model():
    overrides = _launch()
    report = dry_run(overrides)
    c, x = flat(report), report.exgrpo
    o = x.mode_options
    assert x.reward_mode == "continuous" and x.enable and o.continuous_members == "above_mean"
    assert o.continuous_start == "steps" and o.continuous_start_steps == 0
    # the reward model through verl's reward loop, scoring itself (no reward function)
    assert c["reward.reward_model.enable"] is True and c["reward.reward_model.rollout.name"] == "vllm"
    assert c["reward.reward_model.model_path"] == "/dry-run-placeholder/RM_PATH"
    assert c["reward.custom_reward_function.path"] is None
    assert c["reward.reward_model.enable_resource_pool"] is False and c["trainer.n_gpus_per_node"] == 8
    # Table 2: 2 epochs over the prompts (verl counts the steps); the released run's batch, K, lr elsewhere
    assert c["trainer.total_epochs"] == 2 and c["trainer.total_training_steps"] is None
    assert (c["data.train_batch_size"], c["actor_rollout_ref.rollout.n"], c["actor_rollout_ref.actor.optim.lr"]) == (
        128,
        8,
        1e-6,
    )
    assert c["algorithm.norm_adv_by_std_in_grpo"] is True  # ours: a reward model's scale is arbitrary
    assert c["data.train_files"] == "/dry-run-placeholder/TRAIN_FILE"
    # neither the math reward's think gate nor the binary pass rate's tau is passed
    assert not any("think_gate" in o or "delayed_start_threshold" in o for o in overrides)
    assert "reward_model=/dry-run-placeholder/RM_PATH (vllm, tp=1, colocated with the actor)" in report.summary()
    assert "tau=" not in report.summary()


def test_the_onpolicy_twin_differs_only_in_replay():
    a, b = dry_run(_launch()), dry_run(_launch(ONPOLICY))
    assert differing_paths(a, b) == {"exgrpo.enable"} and not b.exgrpo.enable


#: the recipe's reward function that calls the model through verl's reward_router_address, and the setting that keeps
#: the model awake: what a reward model in its own pool needs with verl 0.9.1 (the script sets both)
ROUTER_FUNCTION = [
    "reward.custom_reward_function.path=pkg://recipe.exgrpo.reward_model_client",
    "reward.reward_model.rollout.free_cache_engine=false",
]


def test_a_reward_model_in_its_own_pool_takes_its_gpus_from_the_node():
    # the documented example: DRY_RUN=1 RM_GPUS_PER_NODE=4 bash scripts/train/exgrpo_qwen2.5_7b_base_wildchat_if.sh
    report = dry_run(_launch(RM_GPUS_PER_NODE="4", RM_TP="2"))
    c = flat(report)
    assert c["reward.reward_model.enable_resource_pool"] is True
    assert (
        c["trainer.n_gpus_per_node"],
        c["reward.reward_model.n_gpus_per_node"],
        c["reward.reward_model.nnodes"],
    ) == (
        4,
        4,
        1,
    )
    assert "own pool 1x4, actor + reward model = 8 GPUs" in report.summary()
    # scored through the recipe's router client, the model kept awake, the name vLLM serves it under passed on
    assert c["reward.custom_reward_function.path"] == "pkg://recipe.exgrpo.reward_model_client"
    assert c["reward.custom_reward_function.reward_kwargs.model"] == "/dry-run-placeholder/RM_PATH"
    assert c["reward.reward_model.rollout.free_cache_engine"] is False
    # verl's own scoring of the model there would fail every step; a sleeping model would never answer: refused
    with pytest.raises(DryRunError) as err:
        dry_run(_launch(RM_GPUS_PER_NODE="4") + ["reward.custom_reward_function.path=null"])
    assert any("lacks reward_extra_info" in p and "reward_model_client" in p for p in err.value.problems)
    with pytest.raises(DryRunError) as err:
        dry_run(_launch(RM_GPUS_PER_NODE="4") + ["reward.reward_model.rollout.free_cache_engine=true"])
    assert any("reward.reward_model.rollout.free_cache_engine=false" in p for p in err.value.problems)
    # a mistyped keyword of the client is named, as the math reward's are
    with pytest.raises(DryRunError, match="reward_kwargs.timeout: not a parameter of recipe/exgrpo/reward_model_cl"):
        dry_run(_launch(RM_GPUS_PER_NODE="4") + ["+reward.custom_reward_function.reward_kwargs.timeout=5"])


def test_the_dry_run_checks_the_reward_models_gpus(monkeypatch):
    base = _launch()
    monkeypatch.setenv(NODE_GPUS_ENV, "8")
    cases = {
        # 4 + 2 GPUs on nodes of 8
        "add up to 6 GPUs per node, but the nodes have 8": [
            "reward.reward_model.enable_resource_pool=true",
            "reward.reward_model.n_gpus_per_node=2",
            "reward.reward_model.nnodes=1",
            "trainer.n_gpus_per_node=4",
            *ROUTER_FUNCTION,
        ],
        "do not split the actor's 1 x 8 GPUs into whole replicas": [
            "reward.reward_model.rollout.tensor_model_parallel_size=3"
        ],
        "needs reward.reward_model.nnodes >= 1": ["reward.reward_model.enable_resource_pool=true", *ROUTER_FUNCTION],
        "reward.reward_model.rollout.max_model_len = 4096 cannot hold": [
            "reward.reward_model.rollout.max_model_len=4096"
        ],
        "reward.reward_model.model_path is not set": ["reward.reward_model.model_path=null"],
        "reward.reward_model.rollout.name='trtllm'": ["reward.reward_model.rollout.name=trtllm"],
    }
    for needle, extra in cases.items():
        with pytest.raises(DryRunError) as err:
            dry_run(base + extra)
        assert any(needle in p for p in err.value.problems), (needle, err.value.problems)


def test_the_binary_mode_refuses_a_reward_model():
    with pytest.raises(DryRunError) as err:
        dry_run(_launch() + ["exgrpo.reward_mode=binary"])
    assert any(
        "reward.reward_model.enable=True" in p and "exgrpo.reward_mode=continuous" in p for p in err.value.problems
    )


def test_the_script_refuses_a_reward_model_pool_that_leaves_no_actor(tmp_path, monkeypatch):
    proc = run_script(EXGRPO, env=script_env(tmp_path, DRY_RUN="print", RM_GPUS_PER_NODE="8"))
    assert proc.returncode == 2 and "leaves no GPU for the actor" in proc.stderr
    # 8 - 2 = 6 actor GPUs: the step's 1024 responses do not split over them; the dry run says so, naming the
    # script's variable that took the two (it named only trainer.n_gpus_per_node, which the user never set)
    monkeypatch.setenv(NODE_GPUS_ENV, "8")  # as the script exports it for its dry run
    with pytest.raises(DryRunError, match="do not split evenly over 6 data-parallel ranks") as err:
        dry_run(_launch(RM_GPUS_PER_NODE="2") + ROUTER_FUNCTION)
    assert all(
        "the nodes' 8 (N_GPUS_PER_NODE) less the reward model's 2 (RM_GPUS_PER_NODE of the launch script, "
        "reward.reward_model.n_gpus_per_node); RM_GPUS_PER_NODE=4 or 6 or 7 would fit" in p
        for p in err.value.problems
        if "do not split" in p
    ), err.value.problems


def test_dry_run_mode_end_to_end(tmp_path):
    proc = run_script(EXGRPO, env=script_env(tmp_path, DRY_RUN="1", DRY_RUN_QUIET="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[dry-run] OK" in proc.stderr and "reward_mode=continuous(members=above_mean" in proc.stderr
    assert "steps=2 epochs" in proc.stderr
    # verl's warnings about its optional engines (torchtitan, veomni, ...), five on every command that imports it
    assert "engine is not available" not in proc.stderr and "UserWarning: torchtitan" not in proc.stderr
    missing = run_script(EXGRPO, env=script_env(tmp_path, DRY_RUN="0", PREFLIGHT="0"))
    assert missing.returncode == 2 and "RM_PATH is not set" in missing.stderr


def test_the_ifeval_command_of_a_merged_checkpoint(tmp_path):
    script = TRAIN_DIR.parent / "eval" / "eval_ifeval.sh"
    model = "/ckpt/exgrpo_qwen2.5_7b_base_wildchat_if/global_step_116/merged_hf"
    proc = run_script(script, "--limit", "5", env=script_env(tmp_path, DRY_RUN="print", MODEL_PATH=model, N_GPUS="8"))
    assert proc.returncode == 0, proc.stderr
    lm_eval, table = proc.stdout.splitlines()
    assert " -m lm_eval --model vllm --model_args " in lm_eval and "--tasks ifeval --apply_chat_template" in lm_eval
    assert f"pretrained={model}" in lm_eval.replace("\\,", ",") and "data_parallel_size=8" in lm_eval.replace("\\", "")
    assert lm_eval.endswith("--log_samples --limit 5 ")
    assert "-m exgrpo.eval.instruction_following" in table
    assert "--label exgrpo_qwen2.5_7b_base_wildchat_if/global_step_116" in table
    # a folder without weights stops with the merge command, as the other evaluation scripts do
    empty = tmp_path / "merged_hf"
    empty.mkdir()
    proc = run_script(script, env=script_env(tmp_path, MODEL_PATH=str(empty)))
    assert proc.returncode == 2 and "holds no weights" in proc.stderr and "verl.model_merger merge" in proc.stderr
