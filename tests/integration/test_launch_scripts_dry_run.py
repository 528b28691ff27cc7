"""Every launch script under scripts/train and scripts/reproduce composes to a valid config, without GPUs or models.

Each script is run in ``DRY_RUN=print`` mode (pure bash: it prints the hydra overrides it would launch with); every
printed launch is then composed and validated in this process with ``recipe.exgrpo.launch_checks.dry_run`` (the checks
of ``python -m recipe.exgrpo.dry_run``: hydra's struct mode, ``main_exgrpo.prepare_config``, verl's ``validate_config``
and the worker-side checks). A few runs go through the real ``DRY_RUN=1`` path (bash -> python -m
recipe.exgrpo.launch_checks.dry_run) end to end. Nothing starts Ray, loads a model or downloads anything.
"""

from __future__ import annotations

import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from recipe.exgrpo.launch_checks.dry_run import DryRunError, DryRunReport, dry_run
from recipe.exgrpo.launch_checks.dry_run import main as dry_run_main
from tests.helpers.launch_scripts import (
    REPO,
    TRAIN_DIR,
    clear_dry_run_env,
    differing_paths,
    eval_data,
    printed_launches,
    prompt_file,
    run_script,
    script_env,
    script_id,
)

ABLATION_DIR = TRAIN_DIR / "ablations"
ONE_GPU_DIR = TRAIN_DIR / "one_gpu"
REPRODUCE_DIR = REPO / "scripts" / "reproduce"

pytestmark = pytest.mark.usefixtures("gpu_dry_run_env")

BACKBONES = (
    "qwen2.5_math_7b",
    "qwen2.5_math_1.5b",
    "qwen2.5_7b_instruct",
    "llama3.1_8b",
    "llama3.1_8b_instruct",
    "luffy_continual",
)
#: The paper's Table 6, one preset per row: the exgrpo keys each preset changes, relative to the 7B run.
ABLATIONS: dict[str, dict[str, Any]] = {
    "on_policy": {"enable": False},
    "wo_question_selection": {"weighting": "uniform"},
    "wo_trajectory_selection": {"trajectory_metric": "random"},
    "wo_both_selections": {"weighting": "uniform", "trajectory_metric": "random"},
    "wo_policy_shaping": {"shaping": "none"},
    "wo_is_correction": {"is_correction": False},
    "highest_entropy_trajectory": {"trajectory_mode": "max"},
    "replay_ratio_0.25": {"replay_ratio": 0.25},
    "replay_ratio_0.75": {"replay_ratio": 0.75},
    "sigma_1.5": {"sigma": 1.5 / 8},  # count units -> accuracy units: sigma / K with K = 8
    "sigma_0.5": {"sigma": 0.5 / 8},
    "mu_0.25": {"mu": 0.25},
    "readd_retired": {"readd_retired_fraction": 0.1},
}


def all_scripts() -> list[Path]:
    train = [p for p in sorted(TRAIN_DIR.glob("*.sh")) if p.name != "common.sh"]
    return (
        train
        + sorted(ABLATION_DIR.glob("*.sh"))
        + sorted(ONE_GPU_DIR.glob("*.sh"))
        + sorted(REPRODUCE_DIR.glob("*.sh"))
    )


_COMPOSED: dict[tuple[str, ...], DryRunReport] = {}


def compose(overrides: list[str]) -> DryRunReport:
    """``dry_run`` of one launch, memoised: each script's launch is composed once for all the tests that read it
    (a failing launch raises every time)."""
    key = tuple(overrides)
    if key not in _COMPOSED:
        _COMPOSED[key] = dry_run(overrides)
    return _COMPOSED[key]


@pytest.fixture(scope="module")
def launches() -> dict[str, list[list[str]]]:
    return {script_id(p): printed_launches(p) for p in all_scripts()}


@pytest.fixture(scope="module")
def reports(launches) -> dict[str, DryRunReport]:
    """The composed and validated config of every single-launch script (the train scripts)."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        clear_dry_run_env(mp)
        for name, runs in launches.items():
            if len(runs) == 1:
                out[name] = compose(runs[0])
    return out


# ------------------------------------------------------------------------------------------------ coverage
def test_the_expected_scripts_exist():
    names = {script_id(p) for p in all_scripts()}
    expected = {f"train/{kind}_{b}.sh" for kind in ("exgrpo", "onpolicy") for b in BACKBONES}
    expected |= {f"train/ablations/{a}.sh" for a in ABLATIONS}
    expected |= {"reproduce/reproduce_1.5b.sh", "reproduce/reproduce_7b.sh"}
    expected |= {f"train/{kind}_qwen2.5_7b_instruct_tir.sh" for kind in ("exgrpo", "onpolicy")}
    expected |= {f"train/one_gpu/{name}.sh" for name in ONE_GPU}
    assert expected <= names, f"missing: {sorted(expected - names)}"
    # a new ablation preset must get its row in ABLATIONS (and so its check below)
    assert {p.stem for p in ABLATION_DIR.glob("*.sh")} == set(ABLATIONS)


@pytest.mark.parametrize("script", all_scripts(), ids=script_id)
def test_every_script_dry_runs(script, launches):
    runs = launches[script_id(script)]
    expected = 2 if script.parent == REPRODUCE_DIR else 1  # a reproduction trains ExGRPO and on-policy
    assert len(runs) == expected
    for overrides in runs:
        report = compose(overrides)  # raises DryRunError naming the bad key
        assert report.config.actor_rollout_ref.rollout.name == "vllm"


def v1_scripts() -> list[Path]:
    """The scripts whose launches differ in more than ``exgrpo.*`` keys: the training scripts and the one-GPU ones.
    An ablation preset is the 7B run with one ``exgrpo.*`` switch (test_ablation_preset_is_one_switch_on_the_7b_run)
    and a reproduction launches two training scripts' runs: on v1 they add no trainer setting to check."""
    return [p for p in all_scripts() if p.parent in (TRAIN_DIR, ONE_GPU_DIR)]


@pytest.mark.parametrize("script", v1_scripts(), ids=script_id)
def test_every_script_dry_runs_on_the_v1_trainer(script):
    """TRAINER=v1: the same launch on verl's v1 trainer (sync mode) composes and validates; only the trainer differs."""
    runs = printed_launches(script, TRAINER="v1")
    legacy = printed_launches(script)
    assert len(runs) == len(legacy)
    with pytest.MonkeyPatch.context() as mp:
        clear_dry_run_env(mp)
        for overrides, legacy_overrides in zip(runs, legacy):
            assert overrides[: len(legacy_overrides)] == legacy_overrides or set(legacy_overrides) <= set(overrides)
            report = compose(overrides)
            assert report.config.trainer.use_v1 is True and report.config.trainer.v1.trainer_mode == "sync"


def test_the_trainer_is_one_setting_and_a_bad_one_is_named():
    script = TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh"
    (v1,) = printed_launches(script, TRAINER="v1")
    (legacy,) = printed_launches(script)
    assert [o for o in v1 if o not in legacy] == ["trainer.use_v1=true", "trainer.v1.trainer_mode=sync"]
    proc = run_script(script, env=script_env(DRY_RUN="print", TRAINER="v2"))
    assert proc.returncode != 0 and "TRAINER=v2: use legacy" in proc.stderr
    with pytest.raises(DryRunError) as err:
        compose([*v1, "trainer.v1.trainer_mode=fully_async"])
    assert "trainer.v1.trainer_mode='fully_async' is not supported" in str(err.value)


def test_mode_picks_the_v1_trainers_async_mode_and_the_dry_run_states_the_staleness_bound():
    """MODE=colocate_async: the v1 trainer in verl's colocate_async mode (TRAINER=v1 implied), and the dry run's summary
    gives the staleness bound and what it implies. MODE=separate_async: the node's GPUs split between the trainer and
    the standalone rollout, a checkpoint engine between them, PARAMETER_SYNC_STEP local updates of one mini-batch each;
    the dry run passes and says so; a launch that breaks what the mode requires is refused naming the key.
    TRAINER=legacy with an async MODE, an unknown MODE and impossible splits stop the script."""
    script = TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh"
    (legacy,) = printed_launches(script)
    (colocate,) = printed_launches(script, MODE="colocate_async")
    assert [o for o in colocate if o not in legacy] == ["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"]
    assert printed_launches(script, MODE="colocate_async", TRAINER="v1") == [colocate]
    (separate,) = printed_launches(script, MODE="separate_async", PARAMETER_SYNC_STEP="4")
    assert [o for o in separate if o not in legacy] == [
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=separate_async",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=4",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
        "trainer.v1.separate_async.parameter_sync_step=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    ]
    with pytest.MonkeyPatch.context() as mp:
        clear_dry_run_env(mp)
        summary = compose(colocate).summary()
        assert "trainer=v1(colocate_async)" in summary
        assert "async: mode=colocate_async max_off_policy_threshold=8 (drop) warmup=1x128 prompts ahead" in summary
        assert "a group issued at step s trains by step s+7 or is evicted and refilled with fresh prompts" in summary
        report = compose(separate)
        assert report.config.trainer.v1.trainer_mode == "separate_async"
        summary = report.summary()
        assert "trainer=v1(separate_async)" in summary and "parameter_sync_step=4" in summary
        assert "each step 4 local updates of 32 groups" in summary
        assert "standalone rollout (1x4 GPUs) through nccl" in summary
        with pytest.raises(DryRunError) as err:
            compose([*separate, "actor_rollout_ref.actor.ppo_mini_batch_size=64"])
        assert "set actor_rollout_ref.actor.ppo_mini_batch_size=32" in str(err.value)
        with pytest.raises(DryRunError) as err:
            compose([*separate, "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"])
        assert "actor_rollout_ref.rollout.checkpoint_engine.backend=naive with" in str(err.value)
    for env, message in [
        ({"MODE": "colocate_async", "TRAINER": "legacy"}, "MODE=colocate_async needs verl's v1 trainer"),
        ({"MODE": "async"}, "MODE=async: use sync (the default), colocate_async or separate_async"),
        ({"MODE": "separate_async", "PARAMETER_SYNC_STEP": "3"}, "PARAMETER_SYNC_STEP=3 must divide the 128"),
        ({"MODE": "separate_async", "ROLLOUT_GPUS_PER_NODE": "8"}, "ROLLOUT_GPUS_PER_NODE=8 leaves no GPU"),
        ({"MODE": "separate_async", "ROLLOUT_GPUS_PER_NODE": "3"}, "must divide ROLLOUT_GPUS_PER_NODE=3"),
    ]:
        proc = run_script(script, env=script_env(DRY_RUN="print", **env))
        assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------ released settings
def test_released_hyperparameters_of_the_7b_run(reports):
    """docs/algorithm.md §11, key by key, in the composed config of scripts/train/exgrpo_qwen2.5_math_7b.sh."""
    r = reports["train/exgrpo_qwen2.5_math_7b.sh"]
    c, x = r.config, r.exgrpo
    actor, rollout = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    assert c.data.train_batch_size == 128 and rollout.n == 8 and rollout.temperature == 1.0
    assert (c.data.max_prompt_length, c.data.max_response_length) == (1024, 8192)
    assert actor.optim.lr == pytest.approx(1e-6) and actor.ppo_mini_batch_size == 64
    assert actor.entropy_coeff == pytest.approx(0.001)
    assert (x.replay_ratio, x.mode_options.delayed_start_threshold, x.shaping_beta) == (0.5, 0.35, 0.1)
    assert x.enable and x.is_correction and x.shaping == "policy_shaping"
    assert (x.trajectory_metric, x.trajectory_mode, x.weighting) == ("entropy", "min", "normal")
    assert (x.bucket_lbound, x.resolved_rbound, x.resolved_sigma) == (0, 7, pytest.approx(1 / 8))
    assert c.trainer.total_training_steps == 700
    assert (c.trainer.test_freq, c.trainer.save_freq) == (10, 50)
    assert rollout.val_kwargs.temperature == pytest.approx(0.6) and rollout.val_kwargs.do_sample
    assert c.trainer.n_gpus_per_node * c.trainer.nnodes == 8
    assert rollout.tensor_model_parallel_size == 2 and rollout.gpu_memory_utilization == pytest.approx(0.7)
    assert c.actor_rollout_ref.model.enable_gradient_checkpointing and c.actor_rollout_ref.model.use_remove_padding
    assert actor.use_dynamic_bsz and actor.ppo_max_token_len_per_gpu == 32768
    assert rollout.log_prob_use_dynamic_bsz and rollout.log_prob_max_token_len_per_gpu == 32768
    assert not actor.use_kl_loss and not c.algorithm.use_kl_in_reward  # no KL, no reference model
    assert c.algorithm.adv_estimator == "grpo" and not c.algorithm.norm_adv_by_std_in_grpo
    assert actor.loss_agg_mode == "seq-mean-token-sum-norm" and actor.loss_scale_factor == 8192
    assert c.reward.custom_reward_function.reward_kwargs.think_gate is True


@pytest.mark.parametrize("backbone", BACKBONES)
def test_backbone_settings(backbone, reports):
    r = reports[f"train/exgrpo_{backbone}.sh"]
    assert r.config.trainer.total_training_steps == (700 if backbone == "qwen2.5_math_7b" else 500)
    llama_base = backbone == "llama3.1_8b"
    # Llama-3.1-8B base: no delayed start (mixed from step 1) and no think gate (docs/algorithm.md §9-10)
    assert r.exgrpo.mode_options.delayed_start_threshold == (-1 if llama_base else 0.35)
    assert r.config.reward.custom_reward_function.reward_kwargs.think_gate is (not llama_base)
    assert str(r.config.trainer.experiment_name) == f"exgrpo_{backbone}"


@pytest.mark.parametrize("backbone", BACKBONES)
def test_onpolicy_script_is_the_exgrpo_script_with_replay_off(backbone, reports):
    exgrpo, onpolicy = reports[f"train/exgrpo_{backbone}.sh"], reports[f"train/onpolicy_{backbone}.sh"]
    assert differing_paths(exgrpo, onpolicy) == {"exgrpo.enable"}
    assert not onpolicy.exgrpo.enable
    assert str(onpolicy.config.trainer.experiment_name) == f"onpolicy_{backbone}"


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_ablation_preset_is_one_switch_on_the_7b_run(name, reports):
    base, preset = reports["train/exgrpo_qwen2.5_math_7b.sh"], reports[f"train/ablations/{name}.sh"]
    expected = ABLATIONS[name]
    assert differing_paths(base, preset) == {f"exgrpo.{k}" for k in expected}
    for key, value in expected.items():
        assert getattr(preset.exgrpo, key) == pytest.approx(value), key
    if name.startswith("sigma_"):  # the paper's count units: sigma (accuracy) x K = the row's value
        assert preset.exgrpo.sigma * preset.config.actor_rollout_ref.rollout.n == pytest.approx(float(name[6:]))


#: The one-GPU scripts: the 8-GPU run each starts from, and every setting it changes (resolved config paths).
_LORA = {
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.lora_alpha",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.fsdp_config.model_dtype",
    "actor_rollout_ref.rollout.load_format",
    "actor_rollout_ref.rollout.layered_summon",
}
_ONE_CARD = {
    "trainer.n_gpus_per_node",
    "actor_rollout_ref.rollout.n_gpus_per_node",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    # the watchdog's deadlines of the GPU-bound stages: one card does the 8-GPU run's work
    "stage_deadlines.generate_s",
    "stage_deadlines.old_log_prob_s",
    "stage_deadlines.update_s",
    "stage_deadlines.validate_s",
}
_TOKENS = {
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
}
ONE_GPU: dict[str, tuple[str, set[str]]] = {
    "exgrpo_qwen2.5_math_1.5b_80gb": ("exgrpo_qwen2.5_math_1.5b", _ONE_CARD),
    "exgrpo_qwen2.5_math_7b_lora_80gb": (
        "exgrpo_qwen2.5_math_7b",
        _ONE_CARD | _LORA | {"actor_rollout_ref.rollout.tensor_model_parallel_size"},
    ),
    "exgrpo_qwen2.5_math_1.5b_lora_24gb": ("exgrpo_qwen2.5_math_1.5b", _ONE_CARD | _LORA | _TOKENS),
}


@pytest.mark.parametrize("name", sorted(ONE_GPU))
def test_a_one_gpu_script_is_its_8_gpu_run_with_what_one_gpu_needs(name, reports):
    """Batch, K, lengths, steps and every ExGRPO setting are the paper run's; only the listed settings differ."""
    base, changed = ONE_GPU[name]
    one, paper = reports[f"train/one_gpu/{name}.sh"], reports[f"train/{base}.sh"]
    assert differing_paths(one, paper) == changed
    c = one.config
    assert c.trainer.n_gpus_per_node == 1 and c.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert (c.data.train_batch_size, c.actor_rollout_ref.rollout.n) == (128, 8)
    assert (c.data.max_prompt_length, c.data.max_response_length) == (1024, 8192)
    if "lora" in name:  # the FSDP actor's keys (the model.lora block's rank is Megatron's)
        assert c.actor_rollout_ref.model.lora_rank > 0 and c.actor_rollout_ref.model.lora.rank == 0
        assert c.actor_rollout_ref.model.target_modules == "all-linear"
        # vLLM serves the adapter, loading the base itself (lora.py refuses layered_summon on dummy weights)
        assert c.actor_rollout_ref.model.lora.merge is False
        assert c.actor_rollout_ref.rollout.load_format == "safetensors" and c.actor_rollout_ref.rollout.layered_summon


def test_reproduction_scripts_train_both_arms(launches):
    for name, backbone in (
        ("reproduce/reproduce_7b.sh", "qwen2.5_math_7b"),
        ("reproduce/reproduce_1.5b.sh", "qwen2.5_math_1.5b"),
    ):
        runs = launches[name]
        enables = sorted("exgrpo.enable=false" in run for run in runs)
        assert enables == [False, True], name
        assert {f"trainer.experiment_name='{k}_{backbone}'" for k in ("exgrpo", "onpolicy")} <= {
            o for run in runs for o in run
        }


def test_reproduction_passes_extra_arguments_to_every_run():
    runs = printed_launches(REPRODUCE_DIR / "reproduce_1.5b.sh", "trainer.logger=[console]")
    assert all(run[-1] == "trainer.logger=[console]" for run in runs) and len(runs) == 2


# ----------------------------------------------------------------------------------- caught mistakes
BAD_EXTRA_ARGUMENTS = [
    # (extra argument, substrings the error must contain)
    ("exgrpo.replay_ratoi=0.25", ["exgrpo.replay_ratoi", "did you mean exgrpo.replay_ratio"]),
    ("+exgrpo.sigmaa=0.1", ["exgrpo.sigmaa", "did you mean exgrpo.sigma"]),
    ("exgrpo.replay_ratio=1.5", ["exgrpo.replay_ratio", "[0.0, 1.0)", "1.5"]),
    ("exgrpo.weighting=gaussian", ["exgrpo.weighting", "must be one of"]),
    ("exgrpo.shaping_beta=0", ["exgrpo.shaping_beta", "(0.0, inf)"]),
    ("exgrpo.is_correction=maybe", ["exgrpo.is_correction", "true or false"]),
    (
        "actor_rollout_ref.rollout.tensor_model_paralel_size=4",
        ["actor_rollout_ref.rollout.tensor_model_paralel_size", "did you mean actor_rollout_ref.rollout.tensor_model"],
    ),
    ("actor_rollout_ref.actor.gpu_memory_utilization=0.9", ["did you mean actor_rollout_ref.rollout.gpu_memory_util"]),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=1.5", ["gpu_memory_utilization must be in (0, 1]", "1.5"]),
    ("trainer.n_gpus_per_node=eight", ["trainer.n_gpus_per_node must be an integer", "eight"]),
    ("actor_rollout_ref.model.use_remove_padding=yes", ["use_remove_padding must be true or false"]),
    (
        "+actor_rollout_ref.actor.ppo_max_token_len=65536",
        ["+actor_rollout_ref.actor.ppo_max_token_len", "did you mean"],
    ),
    (
        "++reward.custom_reward_function.reward_kwargs.think_gat=false",
        ["reward_kwargs.think_gat", "did you mean reward_kwargs.think_gate"],
    ),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=3", ["8 GPUs do not split into rollout replicas of 3"]),
    (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
        ["ppo_max_token_len_per_gpu = 8192 cannot hold", "9216"],
    ),
    ("actor_rollout_ref.rollout.n=1", ["exgrpo.k", "[2, inf)"]),
    # verl settings the recipe's trainer would accept and ignore (recipe/exgrpo/config_bridge.py)
    ("algorithm.adv_estimator=gae", ["algorithm.adv_estimator='gae' is not supported", "algorithm.adv_estimator=grpo"]),
    ("actor_rollout_ref.actor.use_kl_loss=true", ["actor_rollout_ref.actor.use_kl_loss=True is not supported"]),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo", ["policy_loss.loss_mode='gspo' is not supported"]),
    ("actor_rollout_ref.actor.clip_ratio_c=10", ["clip_ratio_c=10 is not supported", "exgrpo.dual_clip=true"]),
    (
        "actor_rollout_ref.actor.use_prefix_grouper=true",
        ["use_prefix_grouper=True is not supported", "actor_rollout_ref.actor.use_prefix_grouper=false"],
    ),
    ("exgrpo.replay_ratio", ["bad override syntax"]),
]


@pytest.mark.parametrize(("extra", "expected"), BAD_EXTRA_ARGUMENTS, ids=[a for a, _ in BAD_EXTRA_ARGUMENTS])
def test_a_bad_extra_argument_is_caught(extra, expected):
    (overrides,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", extra)
    assert overrides[-1] == extra  # "$@" is passed through last, so it wins over the script's settings
    with pytest.raises(DryRunError) as err:
        compose(overrides)
    for text in expected:
        assert text in str(err.value), f"{text!r} not in: {err.value}"


def test_a_good_extra_argument_wins(reports):
    (overrides,) = printed_launches(
        TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", "exgrpo.replay_ratio=0.25", "exgrpo.pool_storage=per_entry"
    )
    report = compose(overrides)
    assert report.exgrpo.replay_ratio == 0.25 and report.exgrpo.pool_storage == "per_entry"
    assert differing_paths(reports["train/exgrpo_qwen2.5_math_7b.sh"], report) == {
        "exgrpo.replay_ratio",
        "exgrpo.pool_storage",
    }


GOOD_EXTRA_ARGUMENTS = [
    # (extra argument, resolved key, expected value): legitimate settings the checks must not reject
    ("actor_rollout_ref.rollout.top_p=0.95", "actor_rollout_ref.rollout.top_p", 0.95),  # verl's default is int 1
    ("trainer.logger=[console,wandb]", "trainer.logger", ["console", "wandb"]),
    ("+actor_rollout_ref.model.override_config.attn_implementation=sdpa", None, None),
    ("++ray_kwargs.ray_init.num_cpus=64", "ray_kwargs.ray_init.num_cpus", 64),
    ("exgrpo.sigma=0.2", "exgrpo.sigma", 0.2),
    ("exgrpo.delayed_start_threshold=-1", "exgrpo.delayed_start_threshold", -1),
    ("++reward.custom_reward_function.reward_kwargs.timeout_s=5", None, None),
]


@pytest.mark.parametrize(("extra", "key", "value"), GOOD_EXTRA_ARGUMENTS, ids=[a for a, _, _ in GOOD_EXTRA_ARGUMENTS])
def test_a_legitimate_extra_argument_passes(extra, key, value, launches):
    report = compose(launches["train/exgrpo_qwen2.5_math_7b.sh"][0] + [extra])
    if key is not None:
        assert OmegaConf.to_container(OmegaConf.create({"v": OmegaConf.select(report.config, key)}))["v"] == value


def test_check_paths_reports_missing_model_and_data(launches):
    with pytest.raises(DryRunError) as err:
        dry_run(launches["train/exgrpo_qwen2.5_math_7b.sh"][0], check_files=True)
    assert "actor_rollout_ref.model.path=/dry-run-placeholder/MODEL_PATH is not a directory" in str(err.value)
    assert "data.train_files: /dry-run-placeholder/TRAIN_FILE is not a file" in str(err.value)


# --------------------------------------------------------------------------- the real DRY_RUN=1 path
def test_dry_run_mode_end_to_end(tmp_path):
    """bash -> python -m recipe.exgrpo.dry_run: exit 0 and the resolved config on stdout."""
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", env=script_env(tmp_path, DRY_RUN="1"))
    assert proc.returncode == 0, proc.stderr
    cfg = OmegaConf.create(proc.stdout)
    assert cfg.exgrpo.replay_ratio == 0.5 and cfg.trainer.total_training_steps == 700
    assert cfg.trainer.default_local_dir == str(tmp_path / "ckpt" / "exgrpo" / "exgrpo_qwen2.5_math_7b")
    assert "[dry-run] OK" in proc.stderr


def test_dry_run_mode_fails_on_a_bad_extra_argument(tmp_path):
    # (the in-process tests above cover each kind of mistake; this one covers the exit status of the real path)
    extra = "exgrpo.replay_ratoi=0.25"
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", extra, env=script_env(tmp_path, DRY_RUN="1"))
    assert proc.returncode == 1
    assert "[dry-run] FAILED" in proc.stderr and "did you mean exgrpo.replay_ratio" in proc.stderr
    assert proc.stdout == ""


def test_dry_run_cli(tmp_path, launches, capsys):
    overrides = launches["train/exgrpo_llama3.1_8b.sh"][0]
    out = tmp_path / "resolved.yaml"
    assert dry_run_main(["--quiet", "--output", str(out), "--", *overrides]) == 0
    cfg = OmegaConf.load(out)
    assert cfg.exgrpo.delayed_start_threshold == -1
    assert cfg.reward.custom_reward_function.reward_kwargs.think_gate is False
    assert capsys.readouterr().out == ""  # --quiet: no config on stdout
    assert dry_run_main(["--quiet", "--", *overrides, "exgrpo.mu=2"]) == 1
    assert "exgrpo.mu must be a number in [0.0, 1.0]" in capsys.readouterr().err


def test_dry_run_lists_each_unsupported_verl_setting_on_its_own_line(launches, capsys):
    overrides = launches["train/exgrpo_qwen2.5_math_7b.sh"][0]
    bad = ["actor_rollout_ref.actor.use_prefix_grouper=true", "algorithm.use_pf_ppo=true"]
    assert dry_run_main(["--quiet", "--", *overrides, *bad]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 2, err
    assert any(x.startswith("  - actor_rollout_ref.actor.use_prefix_grouper=True is not supported") for x in lines), err
    assert any(x.startswith("  - algorithm.use_pf_ppo=True is not supported") for x in lines), err


# --------------------------------------------------------------------- launch mode without launching
def _recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for $PYTHON that records each call's arguments (one call per line, NUL-separated)."""
    log = tmp_path / "calls.log"
    shim = tmp_path / "python"
    shim.write_text(f'#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> {log}\necho >> {log}\n', encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return shim, log


def test_launch_mode_runs_the_preflight_then_the_entry_point(tmp_path):
    shim, log = _recording_python(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    train.touch()
    val.touch()
    env = script_env(tmp_path, MODEL_PATH=str(model), TRAIN_FILE=str(train), VAL_FILE=str(val))
    env["PYTHON"] = str(shim)
    proc = run_script(TRAIN_DIR / "onpolicy_qwen2.5_math_1.5b.sh", "trainer.logger=[console]", env=env)
    assert proc.returncode == 0, proc.stderr
    calls = [line.split("\0")[:-1] for line in log.read_text(encoding="utf-8").splitlines()]
    assert [c[:2] for c in calls] == [["-m", "recipe.exgrpo.dry_run"], ["-m", "recipe.exgrpo.main_exgrpo"]]
    assert calls[0][2:5] == ["--quiet", "--check-paths", "--"]
    assert calls[0][5:] == calls[1][2:]  # the pre-flight checks exactly what is launched
    assert f"actor_rollout_ref.model.path='{model}'" in calls[1] and calls[1][-1] == "trainer.logger=[console]"
    assert "exgrpo.enable=false" in calls[1]
    assert (tmp_path / "ckpt" / "exgrpo" / "onpolicy_qwen2.5_math_1.5b").is_dir()


def test_launch_mode_without_model_path_stops_with_the_reason(tmp_path):
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", env=script_env(tmp_path))
    assert proc.returncode == 2
    assert "MODEL_PATH is not set" in proc.stderr and "9216" in proc.stderr


def test_launch_mode_refuses_a_short_context_model(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 4096}', encoding="utf-8")
    (tmp_path / "t.parquet").touch()
    env = script_env(
        tmp_path, MODEL_PATH=str(model), TRAIN_FILE=str(tmp_path / "t.parquet"), VAL_FILE=str(tmp_path / "t.parquet")
    )
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", env=env)
    assert proc.returncode == 2 and "max_position_embeddings=4096 < 9216" in proc.stderr


# -------------------------------------------------------------------------------------- several nodes
def test_several_nodes_need_a_ray_cluster(tmp_path):
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", env=script_env(tmp_path, NNODES="2", MODEL_PATH="/m"))
    assert proc.returncode == 2
    assert "NNODES=2 needs a running Ray cluster" in proc.stderr and "ray-head" in proc.stderr


def test_several_nodes_join_the_ray_cluster():
    (overrides,) = printed_launches(
        TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", NNODES="2", N_GPUS_PER_NODE="4", RAY_ADDRESS="10.0.0.1:6379"
    )
    report = compose(overrides)
    assert report.config.ray_kwargs.ray_init.address == "10.0.0.1:6379"
    assert (report.config.trainer.nnodes, report.config.trainer.n_gpus_per_node) == (2, 4)


def test_ray_helpers_print_their_commands():
    env = script_env(DRY_RUN="print", N_GPUS_PER_NODE="4")
    proc = run_script(TRAIN_DIR / "common.sh", "ray-worker", "10.0.0.1:6379", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ray.scripts.scripts start --address=10.0.0.1:6379 --num-gpus=4" in proc.stderr
    proc = run_script(TRAIN_DIR / "common.sh", "ray-head", env=env)
    assert "start --head --port=6379 --num-gpus=4" in proc.stderr and "ray-worker" in proc.stderr
    assert run_script(TRAIN_DIR / "common.sh", "ray-worker", env=env).returncode == 2  # no address


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_scripts_are_shellcheck_clean():
    scripts = [str(p) for p in all_scripts()] + [str(TRAIN_DIR / "common.sh")]
    scripts += [str(p) for p in sorted((REPO / "scripts").glob("*.sh"))]  # prepare_data.sh, install_gpu.sh, ...
    scripts += [str(p) for p in sorted((REPO / "scripts" / "eval").glob("*.sh"))]
    proc = subprocess.run(["shellcheck", "-x", *scripts], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout


# -------------------------------------------------------------------- checkpoints kept
def test_every_training_launch_keeps_the_last_two_checkpoints(launches):
    for name, runs in launches.items():
        for overrides in runs:
            assert compose(overrides).config.trainer.max_actor_ckpt_to_keep == 2, name  # the release keeps 2


@pytest.mark.parametrize(("keep", "expected"), [("5", 5), ("all", None)])
def test_ckpt_keep_overrides_the_number_kept(keep, expected):
    (overrides,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", CKPT_KEEP=keep)
    assert compose(overrides).config.trainer.max_actor_ckpt_to_keep == expected
    (overrides,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", "trainer.max_actor_ckpt_to_keep=null")
    assert compose(overrides).config.trainer.max_actor_ckpt_to_keep is None  # a hydra override wins as well


def test_a_bad_ckpt_keep_is_refused(tmp_path):
    env = script_env(tmp_path, DRY_RUN="print", CKPT_KEEP="0")
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", env=env)
    assert proc.returncode == 2 and "CKPT_KEEP must be a positive integer" in proc.stderr


# ---------------------------------------------------------------- Table 6 RePO row
def test_every_table_6_row_has_a_preset_or_says_why_not():
    """docs/launch_scripts.md's Table 6 list: each row names an existing preset, or says why it cannot be one."""
    doc = (REPO / "docs" / "launch_scripts.md").read_text(encoding="utf-8")
    section = doc.split("### Table 6 ablation presets")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| Table 6 row")]
    presets = [ln.split("|")[2].strip().strip("`") for ln in rows]
    assert len(rows) == len(ABLATIONS) + 2  # the 13 presets, the ExGRPO run itself and the RePO-setting row
    for preset in presets:
        if preset.startswith("no preset"):
            continue
        assert (ABLATION_DIR / preset).resolve().is_file(), preset
    repo_row = next(ln for ln in rows if "RePO" in ln)
    assert "no preset" in repo_row and "#the-repo-setting-row" in repo_row
    assert "### The RePO-setting row" in doc


# ------------------------------------------------------------ batch split over the GPUs
def test_a_gpu_count_that_does_not_split_the_batch_fails_the_dry_run():
    (overrides,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", N_GPUS_PER_NODE="6")
    with pytest.raises(DryRunError) as err:
        compose(overrides)  # 6 is a multiple of the vLLM TP 2, so only the batch split catches it
    text = str(err.value)
    assert "128 x 8 = 1024 responses do not split evenly over 6 data-parallel ranks" in text
    assert "64 x 8 = 512 responses" in text and "use_dynamic_bsz=true" in text
    for gpus in ("4", "2"):  # these divide both
        (overrides,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", N_GPUS_PER_NODE=gpus)
        assert compose(overrides).config.trainer.n_gpus_per_node == int(gpus)
    (overrides,) = printed_launches(TRAIN_DIR / "exgrpo_qwen2.5_math_1.5b.sh", N_GPUS_PER_NODE="3", NNODES="1")
    with pytest.raises(DryRunError, match="over 3 data-parallel ranks"):
        compose(overrides)


# --------------------------------------------------------------------------- prompts
def test_the_llama_base_run_renders_the_base_prompt_verbatim(reports):
    from exgrpo.prompts import RAW_CHAT_TEMPLATE

    base = reports["train/exgrpo_llama3.1_8b.sh"].config
    assert base.actor_rollout_ref.model.custom_chat_template == RAW_CHAT_TEMPLATE  # the same string in bash
    assert reports["train/onpolicy_llama3.1_8b.sh"].config.actor_rollout_ref.model.custom_chat_template == (
        RAW_CHAT_TEMPLATE
    )
    for backbone in BACKBONES:
        if backbone != "llama3.1_8b":  # every other backbone: its own chat template
            assert reports[f"train/exgrpo_{backbone}.sh"].config.actor_rollout_ref.model.custom_chat_template is None


def test_the_think_gate_is_on_for_the_instruct_models_and_says_why():
    for backbone in ("qwen2.5_7b_instruct", "llama3.1_8b_instruct"):
        text = (TRAIN_DIR / f"exgrpo_{backbone}.sh").read_text(encoding="utf-8")
        assert "--think-gate true" in text and "the think gate stays on" in text
    common = (TRAIN_DIR / "common.sh").read_text(encoding="utf-8")
    assert "(instruct models included); off only for Llama-3.1-8B base" in common


def test_the_llama_base_run_defaults_to_its_own_data_files(tmp_path):
    proc = run_script(TRAIN_DIR / "exgrpo_llama3.1_8b.sh", env=script_env(tmp_path, MODEL_PATH=str(tmp_path)))
    assert proc.returncode == 2  # no data written: the launch stops and says which file and how to make it
    assert "data/openr1/train_llama_base.parquet" in proc.stderr and "PROMPT_STYLE=llama_base" in proc.stderr


def test_the_preflight_refuses_data_of_the_other_prompt_style(tmp_path):
    from exgrpo.prompts import llama_base_prompt

    model = tmp_path / "model"
    model.mkdir()
    chat_messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    chat = prompt_file(tmp_path / "chat.parquet", chat_messages)
    base = prompt_file(tmp_path / "base.parquet", [{"role": "user", "content": llama_base_prompt("Q")}])
    llama, qwen = TRAIN_DIR / "exgrpo_llama3.1_8b.sh", TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh"
    (overrides,) = printed_launches(llama, MODEL_PATH=str(model), TRAIN_FILE=str(chat), VAL_FILE=str(base))
    with pytest.raises(DryRunError) as err:
        dry_run(overrides, check_files=True)
    assert f"data.train_files: {chat} holds chat prompts" in str(err.value) and "val_files" not in str(err.value)
    (overrides,) = printed_launches(llama, MODEL_PATH=str(model), TRAIN_FILE=str(base), VAL_FILE=str(base))
    dry_run(overrides, check_files=True)  # the right files pass
    (overrides,) = printed_launches(qwen, MODEL_PATH=str(model), TRAIN_FILE=str(base), VAL_FILE=str(chat))
    with pytest.raises(DryRunError, match="holds Llama-3.1-8B base prompts"):
        dry_run(overrides, check_files=True)


def test_a_launch_warns_when_the_think_template_is_missing(tmp_path):
    shim, _ = _recording_python(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text('{"chat_template": "<|im_start|>assistant\\n"}', encoding="utf-8")
    (tmp_path / "t.parquet").touch()
    data = str(tmp_path / "t.parquet")
    # (the context check reads config.json with the real Python; the shim only records)
    env = script_env(tmp_path, MODEL_PATH=str(model), TRAIN_FILE=data, VAL_FILE=data, PYTHON=str(shim))
    env["CHECK_CONTEXT"] = "0"
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", env=env)
    assert proc.returncode == 0 and "does not open a <think> block" in proc.stderr
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_7b_instruct.sh", env=env)  # instruct templates have none
    assert proc.returncode == 0 and "<think> block" not in proc.stderr
    (model / "tokenizer_config.json").write_text('{"chat_template": "assistant\\n<think>\\n"}', encoding="utf-8")
    proc = run_script(TRAIN_DIR / "exgrpo_qwen2.5_math_7b.sh", env=env)
    assert proc.returncode == 0 and "<think> block" not in proc.stderr


# ------------------------------------------------------------------- data paths
def test_the_default_data_paths_are_the_ones_prepare_data_writes(tmp_path):
    proc = run_script(REPO / "scripts" / "prepare_data.sh", env=script_env(tmp_path, DRY_RUN="1"))
    assert proc.returncode == 0, proc.stderr
    commands = proc.stderr
    for path in ("data/openr1/train.parquet", "--output-dir data/valid", "--combined valid_id.parquet"):
        assert path in commands
    assert "--output-dir data/benchmarks" in commands and "--combined test_id.parquet" in commands
    assert "arc_c,gpqa_diamond,mmlu_pro" in commands
    common = (TRAIN_DIR / "common.sh").read_text(encoding="utf-8")
    assert "val_default=data/valid/valid_id.parquet" in common and "train_default=data/openr1/train.parquet" in common
    assert "DATA_DIR:-$REPO_ROOT/data/benchmarks" in (REPO / "scripts" / "eval" / "common.sh").read_text()
    env = script_env(tmp_path, DRY_RUN="1", PROMPT_STYLE="llama_base")
    base = run_script(REPO / "scripts" / "prepare_data.sh", env=env)
    assert "data/openr1/train_llama_base.parquet --prompt-style llama_base" in base.stderr
    assert "--output-dir data/valid_llama_base" in base.stderr


def test_a_reproduction_checks_the_evaluation_data_before_training(tmp_path):
    shim, log = _recording_python(tmp_path)
    model = tmp_path / "model"
    model.mkdir()
    (tmp_path / "t.parquet").touch()
    env = script_env(tmp_path, MODEL_PATH=str(model), TRAIN_FILE=str(tmp_path / "t.parquet"))
    env.update(VAL_FILE=str(tmp_path / "t.parquet"), PYTHON=str(shim), DATA_DIR=str(tmp_path / "no_data"))
    proc = run_script(REPRODUCE_DIR / "reproduce_1.5b.sh", env=env)
    assert proc.returncode == 2 and "the evaluation data is missing" in proc.stderr
    assert "test_id.parquet not found" in proc.stderr and "prepare_data.sh" in proc.stderr
    assert not log.exists()  # nothing was launched

    env["DATA_DIR"] = str(eval_data(tmp_path / "partial", ood=("arc_c", "gpqa_diamond")))
    proc = run_script(REPRODUCE_DIR / "reproduce_1.5b.sh", env=env)
    assert proc.returncode == 2 and "mmlu_pro.parquet not found" in proc.stderr and not log.exists()
    proc = run_script(REPRODUCE_DIR / "reproduce_1.5b.sh", env={**env, "ALLOW_PARTIAL_EVAL": "1"})
    assert "evaluation data is missing" not in proc.stderr and log.exists()  # training started

    log.unlink()
    env["DATA_DIR"] = str(eval_data(tmp_path / "full"))
    proc = run_script(REPRODUCE_DIR / "reproduce_1.5b.sh", env=env)
    assert "evaluation data is missing" not in proc.stderr
    calls = [line.split("\0")[:-1] for line in log.read_text(encoding="utf-8").splitlines()]
    assert calls[1][:2] == ["-m", "recipe.exgrpo.main_exgrpo"]  # training started (the shim trains nothing, so the
    assert "no checkpoint in" in proc.stderr  # eval stage then stops at the missing checkpoint, after training)


def test_eval_scripts_refuse_a_checkpoint_folder_without_weights(tmp_path):
    hf = tmp_path / "global_step_700" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    env = script_env(tmp_path, MODEL_PATH=str(hf), DATA_DIR=str(eval_data(tmp_path / "d")))
    proc = run_script(REPO / "scripts" / "eval" / "eval_id.sh", env=env)
    assert proc.returncode == 2 and "holds no weights" in proc.stderr
    assert "python -m verl.model_merger merge --backend fsdp" in proc.stderr


def test_eval_scripts_take_data_paths_and_print_without_the_data(tmp_path):
    """An absolute ID_FILE was looked up under DATA_DIR; DRY_RUN=print stopped at a missing data file."""
    own = tmp_path / "mine" / "my_id.parquet"
    own.parent.mkdir()
    own.touch()
    env = script_env(tmp_path, DRY_RUN="print", DATA_DIR=str(tmp_path / "empty"), ID_FILE=str(own))
    proc = run_script(REPO / "scripts" / "eval" / "eval_id.sh", env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    printed = shlex.split(proc.stdout)
    assert printed[printed.index("--data") + 1] == str(own)
    # nothing there: the command is printed all the same, with a note per missing file
    env = script_env(tmp_path, DRY_RUN="print", DATA_DIR=str(tmp_path / "empty"))
    for script, names in (("eval_id.sh", ["test_id.parquet"]), ("eval_ood.sh", ["arc_c", "gpqa_diamond", "mmlu_pro"])):
        proc = run_script(REPO / "scripts" / "eval" / script, env=env)
        assert proc.returncode == 0, proc.stderr
        paths = [str(tmp_path / "empty" / (n if n.endswith(".parquet") else f"{n}.parquet")) for n in names]
        printed = shlex.split(proc.stdout)
        assert printed[printed.index("--data") + 1 : printed.index("--data") + 1 + len(paths)] == paths
        assert [line.split(" not found")[0].split("note: ")[1] for line in proc.stderr.splitlines()] == paths
    # without DRY_RUN the missing file still stops the script, naming it
    env = script_env(tmp_path, DATA_DIR=str(tmp_path / "empty"), MODEL_PATH=str(own.parent))
    (own.parent / "model.safetensors").touch()
    proc = run_script(REPO / "scripts" / "eval" / "eval_id.sh", env=env)
    assert proc.returncode == 2 and f"error: {tmp_path / 'empty' / 'test_id.parquet'} not found" in proc.stderr


# ------------------------------------------------------------------- tool-integrated reasoning
TIR = TRAIN_DIR / "exgrpo_qwen2.5_7b_instruct_tir.sh"
PYTHON_TOOL = REPO / "recipe" / "exgrpo" / "agent_tools" / "python_tool.py"
MT = "actor_rollout_ref.rollout.multi_turn"
WORKER_ENV = "ray_kwargs.ray_init.runtime_env.env_vars"
#: the sandbox limits the TIR scripts set by default, as the agent-loop workers get them (strings, as Ray wants)
TIR_SANDBOX_ENV = {
    "EXGRPO_SANDBOX_TIMEOUT_S": "10",
    "EXGRPO_SANDBOX_MEMORY_MB": "512",
    "EXGRPO_SANDBOX_MAX_OUTPUT_BYTES": "512",
    "EXGRPO_SANDBOX_REQUIRE_ISOLATION": "1",
    "EXGRPO_SANDBOX_SITE_PACKAGES": "1",
}


def test_the_tir_run_is_the_instruct_run_with_tools(reports):
    """Every setting of the TIR run is the instruct run's except the tool loop, its sandbox and the reward's."""
    base, tir = reports["train/exgrpo_qwen2.5_7b_instruct.sh"], reports["train/exgrpo_qwen2.5_7b_instruct_tir.sh"]
    assert differing_paths(base, tir) == {
        f"{MT}.enable",
        f"{MT}.function_tool_path",
        "data.function_tool_path",  # verl's length filter counts the tool schema in the prompt (an interpolation)
        f"{MT}.max_assistant_turns",
        f"{MT}.max_user_turns",
        f"{MT}.max_tool_response_length",
        "reward.custom_reward_function.reward_kwargs.think_gate",
        "reward.custom_reward_function.reward_kwargs.strip_tool_responses",
        *(f"{WORKER_ENV}.{name}" for name in TIR_SANDBOX_ENV),
    }
    c = tir.config
    mt = c.actor_rollout_ref.rollout.multi_turn
    assert mt.enable and mt.format == "hermes" and mt.function_tool_path == str(PYTHON_TOOL)  # absolute
    assert (mt.max_assistant_turns, mt.max_user_turns, mt.max_parallel_calls) == (5, 4, 1)
    assert (mt.max_tool_response_length, mt.tool_response_truncate_side) == (512, "middle")
    reward_kwargs = c.reward.custom_reward_function.reward_kwargs
    assert reward_kwargs.strip_tool_responses is True and reward_kwargs.think_gate is False
    env = OmegaConf.to_container(OmegaConf.select(c, WORKER_ENV))
    assert env == TIR_SANDBOX_ENV  # the strings every Ray worker of the job gets, on any node
    # the sandbox's limits must fit what verl lets through: its output cap is the tool-response cap
    assert int(env["EXGRPO_SANDBOX_MAX_OUTPUT_BYTES"]) <= mt.max_tool_response_length
    assert (c.data.max_prompt_length, c.data.max_response_length) == (1024, 8192)
    assert str(c.trainer.experiment_name) == "exgrpo_qwen2.5_7b_instruct_tir" and tir.exgrpo.enable


def test_the_onpolicy_tir_script_is_the_tir_script_with_replay_off(reports):
    exgrpo, onpolicy = (
        reports["train/exgrpo_qwen2.5_7b_instruct_tir.sh"],
        reports["train/onpolicy_qwen2.5_7b_instruct_tir.sh"],
    )
    assert differing_paths(exgrpo, onpolicy) == {"exgrpo.enable"}
    assert str(onpolicy.config.trainer.experiment_name) == "onpolicy_qwen2.5_7b_instruct_tir"


def test_the_sandbox_limits_reach_the_workers_through_the_jobs_runtime_env():
    """The user's values win over the defaults, any other EXGRPO_SANDBOX_* variable set goes along, and they travel
    in ray_kwargs.ray_init.runtime_env (a cluster joined through RAY_ADDRESS never sees the driver's environment)."""
    extra = {"EXGRPO_SANDBOX_TIMEOUT_S": "30", "EXGRPO_SANDBOX_CPU_S": "8", "RAY_ADDRESS": "10.0.0.1:6379"}
    (overrides,) = printed_launches(TIR, **extra)
    report = compose(overrides)
    env = OmegaConf.to_container(OmegaConf.select(report.config, WORKER_ENV))
    assert env == {**TIR_SANDBOX_ENV, "EXGRPO_SANDBOX_TIMEOUT_S": "30", "EXGRPO_SANDBOX_CPU_S": "8"}
    assert report.config.ray_kwargs.ray_init.address == "10.0.0.1:6379"


def test_a_value_hydra_cannot_carry_stops_the_script(tmp_path):
    proc = run_script(TIR, env=script_env(tmp_path, DRY_RUN="print", EXGRPO_SANDBOX_MEMORY_MB="1'024"))
    assert proc.returncode == 2 and "EXGRPO_SANDBOX_MEMORY_MB holds a single quote" in proc.stderr


def test_a_bad_sandbox_limit_fails_the_dry_run_naming_it():
    pytest.importorskip("exgrpo.sandbox")
    (overrides,) = printed_launches(TIR, EXGRPO_SANDBOX_MEMORY_MB="lots")
    with pytest.raises(DryRunError) as err:
        compose(overrides)
    assert "EXGRPO_SANDBOX_MEMORY_MB='lots'" in str(err.value) and "memory_mb must be an integer" in str(err.value)


def test_the_preflight_names_a_kernel_without_the_sandbox_isolation(monkeypatch):
    sandbox = pytest.importorskip("exgrpo.sandbox")
    from recipe.exgrpo.launch_checks.dry_run.multi_turn import sandbox_problems

    monkeypatch.setattr(sandbox, "isolation_available", lambda: {"landlock_abi": 0, "seccomp": False})
    (overrides,) = printed_launches(TIR)
    config = compose(overrides).config
    (problem,) = sandbox_problems(config, check_files=True)  # the pre-flight, on the launch machine
    assert "EXGRPO_SANDBOX_REQUIRE_ISOLATION is on" in problem and "landlock_abi=0 seccomp=False" in problem
    assert sandbox_problems(config, check_files=False) == []  # a dry run may run elsewhere than the launch
    (overrides,) = printed_launches(TIR, EXGRPO_SANDBOX_REQUIRE_ISOLATION="0")
    assert sandbox_problems(compose(overrides).config, check_files=True) == []


def test_a_bad_value_of_strip_tool_responses_fails_the_dry_run():
    (overrides,) = printed_launches(TIR, "++reward.custom_reward_function.reward_kwargs.strip_tool_responses=maybe")
    with pytest.raises(DryRunError, match="reward_kwargs.strip_tool_responses must be true or false, got 'maybe'"):
        compose(overrides)


def test_the_tir_run_without_the_rollouts_log_probs_fails_the_dry_run():
    """The trainer checks each tool-calling exchange against the rollout's log-probs before storing it; without
    calculate_log_probs (verl's default: true) there are none, and start-up (so the dry run) refuses, naming the key;
    the on-policy twin stores nothing and runs."""
    (overrides,) = printed_launches(TIR, "actor_rollout_ref.rollout.calculate_log_probs=false")
    with pytest.raises(DryRunError, match=r"set actor_rollout_ref.rollout.calculate_log_probs=true"):
        compose(overrides)
    (overrides,) = printed_launches(TIR, "actor_rollout_ref.rollout.calculate_log_probs=false", "exgrpo.enable=false")
    assert not compose(overrides).exgrpo.enable


def _tir_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A model directory and TIR training / validation files written by the preprocessing command itself."""
    from data_preprocess import benchmarks, openr1_math

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 32768}', encoding="utf-8")  # Qwen2.5-7B-Instruct's
    src = tmp_path / "in.jsonl"
    src.write_text('{"problem": "What is $6 \\times 7$?", "answer": "42"}\n', encoding="utf-8")
    train = tmp_path / "openr1_tir" / "train.parquet"
    args = ["--input", str(src), "--output", str(train), "--prompt-style", "tir", "--no-progress", "--skip-gt-check"]
    openr1_math.run(openr1_math.build_parser().parse_args(args))
    args = ["--output-dir", str(tmp_path / "valid_tir"), "--benchmarks", "aime24", "--input", f"aime24={src}"]
    args += ["--prompt-style", "tir", "--combined", "valid_id.parquet", "--no-progress", "--skip-gt-check"]
    benchmarks.run(benchmarks.build_parser().parse_args(args))
    return model, train, tmp_path / "valid_tir" / "valid_id.parquet"


def _tool_override(tmp_path: Path) -> list[str]:
    """Nothing when the recipe's Python tool is there; else a stand-in in the test's own directory (the tool file is
    another change's), so the dry run still loads a function tool."""
    if PYTHON_TOOL.is_file():
        return []
    stand_in = tmp_path / "python_tool.py"
    stand_in.write_text(
        "from verl.tools.function_tool import function_tool\n\n\n@function_tool\ndef python(code: str) -> str:\n"
        '    """Run Python code.\n\n    Args:\n        code: the code.\n    """\n    return ""\n',
        encoding="utf-8",
    )
    return [f"{MT}.function_tool_path={stand_in}"]


def test_the_tir_dry_run_with_every_path_loads_the_tool(tmp_path):
    """DRY_RUN=1 with the model and both data files given: the real pre-flight (--check-paths), which loads the
    tool file as verl's agent-loop workers do, and with the recipe's tool tries its sandbox settings here."""
    from exgrpo.sandbox import isolation_available

    model, train, val = _tir_files(tmp_path)
    env = script_env(tmp_path, DRY_RUN="1", DRY_RUN_QUIET="1", MODEL_PATH=str(model), TRAIN_FILE=str(train))
    env["VAL_FILE"] = str(val)
    extra = _tool_override(tmp_path)
    proc = run_script(TIR, *extra, env=env, timeout=300)
    isolated = all(isolation_available().values())
    if PYTHON_TOOL.is_file() and not isolated:  # a kernel without Landlock or seccomp: named, then allowed knowingly
        assert proc.returncode == 1 and "EXGRPO_SANDBOX_REQUIRE_ISOLATION is on" in proc.stderr
        proc = run_script(TIR, env={**env, "EXGRPO_SANDBOX_REQUIRE_ISOLATION": "0"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = proc.stderr.strip().splitlines()[-1]
    assert ok.startswith("[dry-run] OK") and "not checked" not in proc.stderr
    tool = PYTHON_TOOL if not extra else tmp_path / "python_tool.py"
    assert f"multi-turn: format=hermes tools=[function={tool}] max_assistant_turns=5 max_user_turns=4" in ok
    assert "think_gate=False" in ok and "strip_tool_responses=True" in ok


def test_the_tir_preflight_refuses_data_whose_rows_reach_no_tool(tmp_path):
    model, train, val = _tir_files(tmp_path)
    chat = prompt_file(
        tmp_path / "chat.parquet", [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    )
    extra = _tool_override(tmp_path)
    (overrides,) = printed_launches(TIR, *extra, MODEL_PATH=str(model), TRAIN_FILE=str(chat), VAL_FILE=str(val))
    with pytest.raises(DryRunError) as err:
        dry_run([*overrides, "++" + WORKER_ENV + ".EXGRPO_SANDBOX_REQUIRE_ISOLATION='0'"], check_files=True)
    text = str(err.value)
    assert f"data.train_files: {chat} has no agent_name column" in text and "--prompt-style tir" in text
    assert "data.val_files" not in text  # the tir validation rows carry it
    # a run without tools never asks for the column
    (overrides,) = printed_launches(
        TRAIN_DIR / "exgrpo_qwen2.5_7b_instruct.sh", MODEL_PATH=str(model), TRAIN_FILE=str(chat), VAL_FILE=str(chat)
    )
    dry_run(overrides, check_files=True)


def test_the_tir_run_defaults_to_its_own_data_files(tmp_path):
    proc = run_script(TIR, env=script_env(tmp_path, MODEL_PATH=str(tmp_path)))
    assert proc.returncode == 2  # no data written: the launch stops and says which file and how to make it
    assert "data/openr1_tir/train.parquet" in proc.stderr and "PROMPT_STYLE=tir" in proc.stderr


def test_prepare_data_writes_the_tir_files_only_when_asked(tmp_path):
    default = run_script(REPO / "scripts" / "prepare_data.sh", env=script_env(tmp_path, DRY_RUN="1"))
    assert default.returncode == 0 and "tir" not in default.stderr
    env = script_env(tmp_path, DRY_RUN="1", PROMPT_STYLE="tir", PARTS="train,valid")
    tir = run_script(REPO / "scripts" / "prepare_data.sh", env=env)
    assert tir.returncode == 0, tir.stderr
    assert "--output data/openr1_tir/train.parquet --prompt-style tir" in tir.stderr
    assert (
        "--output-dir data/valid_tir" in tir.stderr and "--combined valid_id.parquet --prompt-style tir" in tir.stderr
    )
    common = (TRAIN_DIR / "common.sh").read_text(encoding="utf-8")
    assert "train_default=data/openr1_tir/train.parquet val_default=data/valid_tir/valid_id.parquet" in common
