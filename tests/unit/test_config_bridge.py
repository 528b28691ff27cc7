"""recipe/exgrpo/config_bridge.py: every verl setting the recipe would silently ignore stops the launch before Ray
starts, naming the key, the value and what to set; the recipe's own defaults pass."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from exgrpo.config import ConfigError
from recipe.exgrpo.config_bridge import (
    UNSUPPORTED_VERL_SETTINGS,
    StartupConfigError,
    async_mode_problems,
    check_startup_config,
    exgrpo_config_from_hydra,
    multi_turn_problems,
    reward_model_problems,
    separate_async_problems,
    verl_setting_problems,
)

#: The keys as verl's ppo_trainer + config/exgrpo_trainer.yaml set them (the values the recipe honours).
SUPPORTED = {
    "trainer": {"use_v1": False, "v1": {"trainer_mode": "sync"}, "critic_warmup": 0, "rollout_data_dir": None},
    "algorithm": {
        "adv_estimator": "grpo",
        "norm_adv_by_std_in_grpo": False,
        "use_kl_in_reward": False,
        "use_pf_ppo": False,
        "rollout_correction": {"rollout_is": None, "rollout_rs": None, "bypass_mode": False},
    },
    "actor_rollout_ref": {
        "actor": {
            "use_kl_loss": False,
            "clip_ratio_c": 3.0,
            "policy_loss": {"loss_mode": "vanilla"},
            "loss_agg_mode": "seq-mean-token-sum-norm",
            "loss_scale_factor": 8192,
            "use_prefix_grouper": False,
        },
        "rollout": {"n": 8, "multi_turn": {"enable": False, "tool_config_path": None}},
    },
    "critic": {"enable": None},
    "reward": {"reward_model": {"enable": False}},
    "distillation": {"enabled": False},
    "global_profiler": {"steps": None},
    "exgrpo": {},
}

#: (key, a value the recipe would ignore, the fix the message must name)
IGNORED = [
    ("trainer.v1.trainer_mode", "fully_async", "trainer.v1.trainer_mode to one of them"),
    ("algorithm.adv_estimator", "gae", "algorithm.adv_estimator=grpo"),
    ("algorithm.adv_estimator", "rloo", "algorithm.adv_estimator=grpo"),
    ("algorithm.use_kl_in_reward", True, "algorithm.use_kl_in_reward=false"),
    ("actor_rollout_ref.actor.use_kl_loss", True, "actor_rollout_ref.actor.use_kl_loss=false"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "gspo", "policy_loss.loss_mode=vanilla"),
    ("actor_rollout_ref.actor.clip_ratio_c", 10.0, "exgrpo.dual_clip=true"),
    ("algorithm.rollout_correction.rollout_is", "token", "rollout_is=null"),
    ("algorithm.rollout_correction.rollout_rs", "token", "rollout_rs=null"),
    ("algorithm.rollout_correction.bypass_mode", True, "bypass_mode=false"),
    ("algorithm.use_pf_ppo", True, "algorithm.use_pf_ppo=false"),
    ("critic.enable", True, "critic.enable=false"),
    ("trainer.critic_warmup", 5, "trainer.critic_warmup=0"),
    ("reward.reward_model.enable", True, "reward.reward_model.enable=false"),
    ("distillation.enabled", True, "distillation.enabled=false"),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path", "tools.yaml", "exgrpo.replay_reward=stored"),
    ("actor_rollout_ref.actor.use_prefix_grouper", True, "actor_rollout_ref.actor.use_prefix_grouper=false"),
    ("trainer.rollout_data_dir", "/tmp/rollouts", "remove trainer.rollout_data_dir"),
    ("global_profiler.steps", [1, 2], "global_profiler.steps=null"),
]


#: the settings under which a key of IGNORED applies (a v1 trainer mode matters on the v1 trainer only)
CONTEXT = {"trainer.v1.trainer_mode": {"trainer.use_v1": True}}


def _config(**changes):
    d = copy.deepcopy(SUPPORTED)
    cfg = OmegaConf.create(d)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def test_the_recipe_defaults_pass():
    cfg = _config()
    assert verl_setting_problems(cfg) == []
    assert check_startup_config(cfg).k == 8


def test_every_unsupported_setting_has_a_test_case():
    assert {s.key for s in UNSUPPORTED_VERL_SETTINGS} == {key for key, _, _ in IGNORED}


@pytest.mark.parametrize(("key", "value", "fix"), IGNORED, ids=[f"{k}={v}" for k, v, _ in IGNORED])
def test_an_ignored_verl_setting_is_rejected_naming_key_value_and_fix(key, value, fix):
    cfg = _config(**CONTEXT.get(key, {}), **{key: value})
    problems = verl_setting_problems(cfg)
    assert len(problems) == 1, problems
    (problem,) = problems
    assert problem.startswith(f"{key}={value!r} is not supported by the ExGRPO recipe: "), problem
    assert fix in problem, problem
    with pytest.raises(StartupConfigError) as err:
        check_startup_config(cfg)
    assert err.value.problems == problems
    assert isinstance(err.value, ConfigError)  # callers that catch ConfigError keep working


def test_the_v1_trainer_runs_exgrpo_in_its_three_modes():
    """trainer.use_v1=true is accepted with the sync, colocate_async and separate_async modes; another mode is refused,
    and a mode only on the v1 trainer counts."""
    assert verl_setting_problems(_config(**{"trainer.use_v1": True})) == []
    for mode in ("colocate_async", "separate_async"):
        assert verl_setting_problems(_config(**{"trainer.use_v1": True, "trainer.v1.trainer_mode": mode})) == []
    assert verl_setting_problems(_config(**{"trainer.v1.trainer_mode": "fully_async"})) == []  # legacy: unread
    (problem,) = verl_setting_problems(_config(**{"trainer.use_v1": True, "trainer.v1.trainer_mode": "fully_async"}))
    assert "sync, colocate_async and separate_async modes" in problem


#: a separate_async launch as the GPU scripts compose it (MODE=separate_async PARAMETER_SYNC_STEP=4)
SEPARATE = {
    "trainer.use_v1": True,
    "trainer.v1.trainer_mode": "separate_async",
    "trainer.v1.separate_async.parameter_sync_step": 4,
    "data.train_batch_size": 128,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.rollout.nnodes": 1,
    "actor_rollout_ref.rollout.n_gpus_per_node": 4,
    "actor_rollout_ref.rollout.checkpoint_engine.backend": "nccl",
}


def test_separate_async_names_what_verl_requires_of_it_at_start_up():
    """separate_async: a step is parameter_sync_step local updates of one mini-batch each, the rollout has devices of
    its own and a checkpoint engine between the pools; each broken requirement is named with its key (verl would
    assert it only once Ray is up); the other modes are not checked for it."""
    assert separate_async_problems(_config(**SEPARATE)) == []
    (problem,) = separate_async_problems(_config(**{**SEPARATE, "actor_rollout_ref.actor.ppo_mini_batch_size": 64}))
    assert problem.startswith("data.train_batch_size=128 with trainer.v1.separate_async.parameter_sync_step=4 and ")
    assert "set actor_rollout_ref.actor.ppo_mini_batch_size=32" in problem
    (problem,) = separate_async_problems(_config(**{**SEPARATE, "trainer.v1.separate_async.parameter_sync_step": 0}))
    assert "parameter_sync_step=0" in problem
    (problem,) = separate_async_problems(_config(**{**SEPARATE, "actor_rollout_ref.rollout.n_gpus_per_node": 0}))
    assert problem.startswith("actor_rollout_ref.rollout.n_gpus_per_node=0 with trainer.v1.trainer_mode=separate_async")
    (problem,) = separate_async_problems(
        _config(**{**SEPARATE, "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive"})
    )
    assert problem.startswith("actor_rollout_ref.rollout.checkpoint_engine.backend=naive with") and "nccl" in problem
    with pytest.raises(StartupConfigError, match="checkpoint_engine.backend=naive"):
        check_startup_config(_config(**{**SEPARATE, "actor_rollout_ref.rollout.checkpoint_engine.backend": "naive"}))
    colocate = {
        **SEPARATE,
        "trainer.v1.trainer_mode": "colocate_async",
        "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
    }
    assert separate_async_problems(_config(**colocate)) == []
    assert (
        separate_async_problems(_config(**{**SEPARATE, "trainer.use_v1": False, "actor_rollout_ref.rollout.nnodes": 0}))
        == []
    )


def test_an_async_mode_needs_the_rollouts_log_probs():
    """The pool stores the rollout's log-probs in the asynchronous modes (docs/algorithm.md §15): without them the
    start-up stops naming the key; the sync mode, the legacy trainer and the on-policy baseline do not need them."""
    v1_async = {"trainer.use_v1": True, "trainer.v1.trainer_mode": "colocate_async"}
    off = {"actor_rollout_ref.rollout.calculate_log_probs": False}
    (problem,) = async_mode_problems(_config(**v1_async, **off))
    assert problem.startswith("actor_rollout_ref.rollout.calculate_log_probs=False with trainer.v1.trainer_mode=")
    assert "set actor_rollout_ref.rollout.calculate_log_probs=true" in problem
    with pytest.raises(StartupConfigError, match="calculate_log_probs"):
        check_startup_config(_config(**v1_async, **off))
    assert async_mode_problems(_config(**v1_async)) == []
    assert async_mode_problems(_config(**{"trainer.use_v1": True}, **off)) == []
    assert async_mode_problems(_config(**{"trainer.v1.trainer_mode": "colocate_async"}, **off)) == []
    assert async_mode_problems(_config(**v1_async, **off, **{"exgrpo.enable": False})) == []


def test_clip_ratio_c_counts_once_the_dual_clip_is_on():
    assert (
        verl_setting_problems(_config(**{"actor_rollout_ref.actor.clip_ratio_c": 10.0, "exgrpo.dual_clip": True})) == []
    )


def test_a_value_of_the_wrong_type_is_rejected_not_crashed_on():
    (problem,) = verl_setting_problems(_config(**{"actor_rollout_ref.actor.clip_ratio_c": "three"}))
    assert problem.startswith("actor_rollout_ref.actor.clip_ratio_c='three' is not supported")


def test_absent_keys_are_not_problems():
    """An older or trimmed config without the key: nothing to ignore."""
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": 4}, "actor": {}}, "exgrpo": {}})
    assert verl_setting_problems(cfg) == []


def test_all_problems_are_listed_together_with_those_of_the_exgrpo_block():
    cfg = _config(
        **{
            "algorithm.adv_estimator": "gae",
            "trainer.use_v1": True,
            "trainer.v1.trainer_mode": "fully_async",
            "exgrpo.replay_ratio": 1.5,
        }
    )
    with pytest.raises(StartupConfigError) as err:
        check_startup_config(cfg)
    text = str(err.value)
    assert text.startswith("3 problems in the config:")
    assert "trainer.v1.trainer_mode='fully_async'" in text and "algorithm.adv_estimator='gae'" in text
    assert "exgrpo.replay_ratio must be a number in [0.0, 1.0)" in text


def test_exgrpo_k_must_agree_with_rollout_n():
    with pytest.raises(ConfigError, match=r"exgrpo.k=4 disagrees with actor_rollout_ref.rollout.n=8"):
        exgrpo_config_from_hydra(_config(**{"exgrpo.k": 4}))
    assert exgrpo_config_from_hydra(_config(**{"exgrpo.k": 8})).k == 8  # saying the same thing is fine


def test_a_reward_model_is_accepted_in_the_continuous_mode_only():
    rm = {"reward.reward_model.enable": True}
    (problem,) = verl_setting_problems(_config(**rm))
    assert "exgrpo.reward_mode=continuous" in problem  # the message names the mode that takes it
    cfg = _config(**rm, **{"exgrpo.reward_mode": "continuous"})
    assert verl_setting_problems(cfg) == [] and check_startup_config(cfg).reward_mode == "continuous"


def test_a_reward_model_in_its_own_pool_needs_a_reward_function_in_verl_0_9_1():
    own_pool = {
        "reward.reward_model.enable": True,
        "reward.reward_model.enable_resource_pool": True,
        "exgrpo.reward_mode": "continuous",
    }
    awake = {"reward.reward_model.rollout.free_cache_engine": False}
    (problem,) = reward_model_problems(_config(**own_pool, **awake))
    assert problem.startswith("reward.reward_model.enable_resource_pool=true with no reward.custom_reward_function")
    assert "pkg://recipe.exgrpo.reward_model_client" in problem  # the recipe ships one
    with pytest.raises(StartupConfigError, match="lacks reward_extra_info"):
        check_startup_config(_config(**own_pool, **awake))
    function = {"reward.custom_reward_function": {"path": "pkg://recipe.exgrpo.reward_model_client"}}
    assert reward_model_problems(_config(**own_pool, **function, **awake)) == []
    colocated = {**own_pool, "reward.reward_model.enable_resource_pool": False}
    assert reward_model_problems(_config(**colocated)) == []


def test_a_reward_model_in_its_own_pool_must_be_kept_awake():
    """verl's RewardModelManager puts the model to sleep after start-up (free_cache_engine, default true) and wakes
    it only inside compute_rm_score; in its own pool the agent loop sends it every response while generating, which
    would wait on a sleeping engine. Start-up (and so the dry run) requires the setting that keeps it awake."""
    own_pool = {
        "reward.reward_model.enable": True,
        "reward.reward_model.enable_resource_pool": True,
        "exgrpo.reward_mode": "continuous",
        "reward.custom_reward_function": {"path": "pkg://recipe.exgrpo.reward_model_client"},
    }
    for free in (True, None):  # verl's default is true
        asleep = _config(**own_pool, **{"reward.reward_model.rollout.free_cache_engine": free})
        (problem,) = reward_model_problems(asleep)
        assert "reward.reward_model.rollout.free_cache_engine=false" in problem and "sleep" in problem
        with pytest.raises(StartupConfigError, match="free_cache_engine=false"):
            check_startup_config(asleep)
    awake = _config(**own_pool, **{"reward.reward_model.rollout.free_cache_engine": False})
    assert reward_model_problems(awake) == [] and check_startup_config(awake).reward_mode == "continuous"
    # colocated, verl wakes it for each scoring call (compute_rm_score) and puts it to sleep for the actor: required
    colocated = _config(**{**own_pool, "reward.reward_model.enable_resource_pool": False})
    assert reward_model_problems(colocated) == []


def test_multi_turn_with_function_tools_is_accepted_and_stateful_tools_need_stored_replay_rewards():
    multi_turn = {
        "actor_rollout_ref.rollout.multi_turn.enable": True,
        "actor_rollout_ref.rollout.multi_turn.format": "hermes",
        "actor_rollout_ref.rollout.multi_turn.function_tool_path": "tools.py",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": 2,
    }
    assert verl_setting_problems(_config(**multi_turn)) == [] and check_startup_config(_config(**multi_turn)).enable
    stateful = {**multi_turn, "actor_rollout_ref.rollout.multi_turn.tool_config_path": "tools.yaml"}
    (problem,) = verl_setting_problems(_config(**stateful))
    assert "BaseTool" in problem and "re-scored" in problem and "exgrpo.replay_reward=stored" in problem
    # a replayed member that keeps its stored reward, or no replay at all (the on-policy baseline): accepted
    assert verl_setting_problems(_config(**stateful, **{"exgrpo.replay_reward": "stored"})) == []
    assert verl_setting_problems(_config(**stateful, **{"exgrpo.enable": False})) == []


def test_a_replaying_run_with_tools_needs_the_rollouts_log_probs():
    """Without ``calculate_log_probs`` the rollout hands over no log-probs, and the check that no tool token carries
    one (collection's ``inconsistent`` rejection) would be skipped without a word: start-up refuses, naming the
    key; with it (verl's default) or without tools or replay, nothing is said."""
    tools = {
        "actor_rollout_ref.rollout.multi_turn.enable": True,
        "actor_rollout_ref.rollout.multi_turn.function_tool_path": "tools.py",
    }
    off = {"actor_rollout_ref.rollout.calculate_log_probs": False}
    (problem,) = multi_turn_problems(_config(**tools, **off))
    assert problem.startswith("actor_rollout_ref.rollout.calculate_log_probs=False in a run whose rollouts call tools")
    assert "set actor_rollout_ref.rollout.calculate_log_probs=true" in problem
    with pytest.raises(StartupConfigError, match="calculate_log_probs=true"):
        check_startup_config(_config(**tools, **off))
    # the tool file alone makes a run's rollouts call tools (verl loads it whatever multi_turn.enable says)
    only_file = {"actor_rollout_ref.rollout.multi_turn.function_tool_path": "tools.py", **off}
    assert len(multi_turn_problems(_config(**only_file))) == 1
    on = {"actor_rollout_ref.rollout.calculate_log_probs": True}
    assert multi_turn_problems(_config(**tools, **on)) == [] and check_startup_config(_config(**tools, **on)).enable
    assert multi_turn_problems(_config(**tools)) == []  # absent: verl's default, true
    assert multi_turn_problems(_config(**off)) == []  # no tools: every token is the model's
    assert multi_turn_problems(_config(**tools, **off, **{"exgrpo.enable": False})) == []  # on-policy: no pool
