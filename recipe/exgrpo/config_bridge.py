"""The hydra config → the core's validated ``ExGRPOConfig`` (K from ``rollout.n``), and the verl settings the
recipe does not honour, rejected before Ray starts (``main_exgrpo.prepare_config`` and the dry run call both)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from exgrpo.config import ConfigError, ExGRPOConfig
from exgrpo.modes import DEFAULT_REWARD_MODE, REWARD_MODES

__all__ = [
    "REWARD_MODEL_CLIENT",
    "UNSUPPORTED_VERL_SETTINGS",
    "V1_TRAINER_MODES",
    "multi_turn_problems",
    "reward_model_problems",
    "separate_async_problems",
    "stage_deadline_problems",
    "StartupConfigError",
    "check_startup_config",
    "exgrpo_config_from_hydra",
    "replay_response_width",
    "reward_model_colocated",
    "verl_setting_problems",
]


class StartupConfigError(ConfigError):
    """Problems of the launch config found before Ray starts: verl settings the recipe does not honour and the
    ``exgrpo`` block's own problems, all listed together (``problems``: one line each, naming the key)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems)
        if len(self.problems) > 1:
            self.args = (
                f"{len(self.problems)} problems in the config:\n"
                + "\n".join(f"  {i}. {p}" for i, p in enumerate(self.problems, 1)),
            )


def exgrpo_config_from_hydra(config) -> ExGRPOConfig:
    """Validate and return the ``exgrpo`` block; errors name the key as ``exgrpo.<key>`` with its allowed range."""
    block = config.get("exgrpo")
    if block is None:
        raise ValueError("the config has no `exgrpo:` block: use recipe/exgrpo/config/exgrpo_trainer.yaml")
    k = int(config.actor_rollout_ref.rollout.n)
    d = OmegaConf.to_container(block, resolve=True)
    if isinstance(d, dict) and d.get("k") is not None and d["k"] != k:
        raise ConfigError(
            f"exgrpo.k={d['k']!r} disagrees with actor_rollout_ref.rollout.n={k}: K is the rollout group size and "
            "is taken from actor_rollout_ref.rollout.n; set that and remove exgrpo.k"
        )
    cfg = ExGRPOConfig.from_dict(d, k=k)
    check_against_actor_config(cfg, config.actor_rollout_ref.actor)
    return cfg


def check_against_actor_config(cfg: ExGRPOConfig, actor) -> None:
    """Checks of ``exgrpo`` keys that depend on verl's actor settings (``actor_rollout_ref.actor``)."""
    if cfg.loss_scale == "per_rank":
        mode = actor.get("loss_agg_mode")
        if mode != "seq-mean-token-sum-norm":
            raise ConfigError(
                "exgrpo.loss_scale=per_rank is the released code's form of seq-mean-token-sum-norm (token sums / "
                f"L_max); set actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm (got {mode!r}) or "
                "exgrpo.loss_scale=global"
            )
        scale = actor.get("loss_scale_factor")
        if scale is None or not float(scale) > 0:
            raise ConfigError(
                "exgrpo.loss_scale=per_rank divides by the constant L_max: set actor_rollout_ref.actor."
                f"loss_scale_factor to the maximum response length, e.g. 8192 (got {scale!r})"
            )


# ------------------------------------------------------------------------------------------------ verl settings
@dataclass(frozen=True)
class UnsupportedSetting:
    """A verl key whose other values the recipe would silently ignore: ``allowed(value)`` says which it honours."""

    key: str
    allowed: Callable[[Any], bool]
    #: what the recipe does instead, and what to set
    why: str
    #: (optional) the recipe only ignores the value under this condition on the whole config
    applies: Callable[[Any], bool] = lambda config: True


def _off(value: Any) -> bool:
    return value is None or value is False


def _zero(value: Any) -> bool:
    return value is None or value == 0


#: the modes of verl's v1 trainer (``trainer.v1.trainer_mode``) the recipe runs ExGRPO in (``trainer.use_v1=true``)
V1_TRAINER_MODES = ("sync", "colocate_async", "separate_async")
#: the v1 modes whose rollouts run while the trainer updates (docs/algorithm.md §15)
V1_ASYNC_MODES = ("colocate_async", "separate_async")

#: the registered reward modes that a reward model may feed (``RewardMode.accepts_reward_model``)
_REWARD_MODEL_MODES = tuple(name for name, mode in REWARD_MODES.items() if mode.accepts_reward_model)


def _replays_with_rescored_rewards(config) -> bool:
    """ExGRPO replays (not the on-policy baseline) and re-scores the replayed members (``exgrpo.replay_reward``)."""
    enable = OmegaConf.select(config, "exgrpo.enable", default=True)
    return bool(enable) and OmegaConf.select(config, "exgrpo.replay_reward", default="rescore") == "rescore"


def _mode_takes_reward_model(config) -> bool:
    """The config's reward mode takes a reward model's scores (an unknown mode is the exgrpo block's problem)."""
    name = OmegaConf.select(config, "exgrpo.reward_mode", default=DEFAULT_REWARD_MODE)
    return name not in REWARD_MODES or REWARD_MODES[name].accepts_reward_model


#: Every verl setting that RayExGRPOTrainer does not honour beyond the values listed (docs/trainer.md, "verl
#: settings the recipe does not use"). The trainer computes advantages and runs its step itself, so verl's code
#: paths that read these keys never run: a different value would be accepted and do nothing.
UNSUPPORTED_VERL_SETTINGS: tuple[UnsupportedSetting, ...] = (
    UnsupportedSetting(
        "trainer.v1.trainer_mode",
        lambda v: str(v) in V1_TRAINER_MODES,
        "the recipe runs ExGRPO on verl's v1 trainer in its sync, colocate_async and separate_async modes "
        "(recipe/exgrpo/v1/, docs/algorithm.md §15); set trainer.v1.trainer_mode to one of them, or "
        "trainer.use_v1=false for the legacy trainer",
        applies=lambda config: bool(OmegaConf.select(config, "trainer.use_v1", default=False)),
    ),
    UnsupportedSetting(
        "algorithm.adv_estimator",
        lambda v: str(v) == "grpo",
        "the trainer always computes group-relative advantages itself on the mixed groups (docs/algorithm.md §7, "
        "exgrpo.advantage) and never calls verl's estimators; set algorithm.adv_estimator=grpo (std division: "
        "algorithm.norm_adv_by_std_in_grpo, honoured)",
    ),
    UnsupportedSetting(
        "algorithm.use_kl_in_reward",
        _off,
        "there is no reference model and the reward gets no KL penalty (docs/algorithm.md §8); set "
        "algorithm.use_kl_in_reward=false",
    ),
    UnsupportedSetting(
        "actor_rollout_ref.actor.use_kl_loss",
        _off,
        "the mixed objective (exgrpo.objective) has no KL term and no reference log-probs are computed; set "
        "actor_rollout_ref.actor.use_kl_loss=false",
    ),
    UnsupportedSetting(
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        lambda v: v is None or str(v) == "vanilla",
        "the recipe installs its own actor loss (recipe/exgrpo/actor_loss.py: the fresh term is vanilla's PPO clip, "
        "switched by exgrpo.fresh_clip / exgrpo.dual_clip), so verl's policy losses never run; set "
        "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
    ),
    UnsupportedSetting(
        "actor_rollout_ref.actor.clip_ratio_c",
        lambda v: v is None or float(v) == 3.0,
        "the dual clip is off unless exgrpo.dual_clip=true (the released code has none), so clip_ratio_c does "
        "nothing; set exgrpo.dual_clip=true to use it, or leave actor_rollout_ref.actor.clip_ratio_c at 3.0",
        applies=lambda config: not bool(OmegaConf.select(config, "exgrpo.dual_clip", default=False)),
    ),
    UnsupportedSetting(
        "algorithm.rollout_correction.rollout_is",
        lambda v: v is None,
        "the trainer applies no rollout-correction weights (replayed tokens are corrected by exgrpo.is_correction); "
        "set algorithm.rollout_correction.rollout_is=null",
    ),
    UnsupportedSetting(
        "algorithm.rollout_correction.rollout_rs",
        lambda v: v is None,
        "the trainer applies no rollout rejection sampling; set algorithm.rollout_correction.rollout_rs=null",
    ),
    UnsupportedSetting(
        "algorithm.rollout_correction.bypass_mode",
        _off,
        "the trainer always recomputes the old log-probs (its one pass also selects the replayed trajectories); set "
        "algorithm.rollout_correction.bypass_mode=false",
    ),
    UnsupportedSetting(
        "algorithm.use_pf_ppo",
        _off,
        "the trainer does not reweight the batch (PF-PPO); set algorithm.use_pf_ppo=false",
    ),
    UnsupportedSetting(
        "critic.enable",
        _off,
        "ExGRPO trains no critic (group-relative advantages); set critic.enable=false or leave it null",
    ),
    UnsupportedSetting(
        "trainer.critic_warmup",
        _zero,
        "there is no critic to warm up and the trainer updates the actor from step 1; set trainer.critic_warmup=0",
    ),
    UnsupportedSetting(
        "reward.reward_model.enable",
        _off,
        "a reward model gives real-valued rewards, which this reward mode's buckets cannot hold (binary: success "
        "counts): set a reward mode that takes them ("
        + ", ".join(f"exgrpo.reward_mode={m}" for m in _REWARD_MODEL_MODES)
        + "; docs/algorithm.md §13), or reward.reward_model.enable=false for the verifiable math-verify reward (§10)",
        applies=lambda config: not _mode_takes_reward_model(config),
    ),
    UnsupportedSetting(
        "distillation.enabled",
        _off,
        "the trainer runs no teacher model; set distillation.enabled=false",
    ),
    UnsupportedSetting(
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
        lambda v: v is None,
        "stateful tools (verl's BaseTool: per-trajectory state through create / execute / release) give every call "
        "a reward that verl hands the reward function with the sampled exchange (extra_info tool_rewards); replay "
        "re-trains a stored exchange without calling its tools again, so a replayed member re-scored "
        "(exgrpo.replay_reward=rescore) would be scored without them (docs/algorithm.md, Multi-turn). Set "
        "exgrpo.replay_reward=stored (a replayed member keeps the reward it earned when it was sampled), or serve the "
        "tools as stateless function tools (actor_rollout_ref.rollout.multi_turn.function_tool_path)",
        applies=lambda config: _replays_with_rescored_rewards(config),
    ),
    UnsupportedSetting(
        "actor_rollout_ref.actor.use_prefix_grouper",
        _off,
        "verl's prefix grouper shares each group's prompt and balances whole groups across the data-parallel ranks, "
        "assuming a group's rows are adjacent; the recipe's old-log-prob pass appends the candidate trajectories "
        "after the generated rows and the update keeps each replayed member after its group, so groups would be "
        "split across ranks; set actor_rollout_ref.actor.use_prefix_grouper=false",
    ),
    UnsupportedSetting(
        "trainer.rollout_data_dir",
        lambda v: v is None,
        "the trainer does not dump generations (exgrpo_trace.jsonl records each step's replayed and fresh "
        "questions); remove trainer.rollout_data_dir",
    ),
    UnsupportedSetting(
        "global_profiler.steps",
        lambda v: v is None or len(v) == 0,
        "the trainer does not drive verl's step profiler; set global_profiler.steps=null",
    ),
)

_ABSENT = object()


def verl_setting_problems(config) -> list[str]:
    """One line per verl setting in ``config`` that the recipe would silently ignore: key, value, what to do."""
    problems = []
    for setting in UNSUPPORTED_VERL_SETTINGS:
        value = OmegaConf.select(config, setting.key, default=_ABSENT)
        if value is _ABSENT or not setting.applies(config):
            continue
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        try:
            allowed = setting.allowed(value)
        except (TypeError, ValueError):  # a value of the wrong type is not an allowed one either
            allowed = False
        if not allowed:
            problems.append(f"{setting.key}={value!r} is not supported by the ExGRPO recipe: {setting.why}")
    return problems


#: The reward function the recipe ships for a reward model in its own pool (it calls the model's router).
REWARD_MODEL_CLIENT = "pkg://recipe.exgrpo.reward_model_client"


def reward_model_problems(config) -> list[str]:
    """verl 0.9.1 settings of a reward model that cannot score (docs/algorithm.md §13).

    In its own resource pool (``reward.reward_model.enable_resource_pool=true``) verl's agent loop sends the model
    every response while it is generated:

    - scored by verl's reward loop itself (no ``reward.custom_reward_function``), it fails every step: the agent
      loop reads the scoring result's ``reward_extra_info``, which verl's reward-model path does not return; a reward
      function (``recipe/exgrpo/reward_model_client.py``, which verl hands the model's ``reward_router_address``)
      returns it. Colocated, verl reads it defensively, so both work;
    - verl's ``RewardModelManager`` puts the model to sleep once started (``reward.reward_model.rollout.
      free_cache_engine``, default true) and wakes it only inside ``compute_rm_score``, the trainer's own scoring
      call: the agent loop's requests would wait on a sleeping engine. With ``free_cache_engine=false`` its sleep is a
      no-op and the model stays awake on its own GPUs. Colocated, the trainer's scoring call wakes it and puts it to
      sleep again for the actor, which needs the GPUs.
    """
    enable = OmegaConf.select(config, "reward.reward_model.enable", default=False)
    own_pool = OmegaConf.select(config, "reward.reward_model.enable_resource_pool", default=False)
    function = OmegaConf.select(config, "reward.custom_reward_function.path", default=None)
    free_cache = OmegaConf.select(config, "reward.reward_model.rollout.free_cache_engine", default=None)
    if not (enable and own_pool):
        return []
    problems = []
    if not function:
        problems.append(
            "reward.reward_model.enable_resource_pool=true with no reward.custom_reward_function: verl 0.9.1's agent "
            "loop fails on every response a discriminative reward model in its own pool scores (the result lacks "
            "reward_extra_info); score with the recipe's reward function that calls the model through the "
            f"reward_router_address verl passes it (reward.custom_reward_function.path={REWARD_MODEL_CLIENT}), or "
            "colocate the model (reward.reward_model.enable_resource_pool=false)"
        )
    if free_cache is not False:
        problems.append(
            f"reward.reward_model.enable_resource_pool=true with reward.reward_model.rollout.free_cache_engine="
            f"{'true' if free_cache is None else str(free_cache).lower()}: verl puts the reward model to sleep once "
            "it has started and wakes it only for the trainer's own scoring calls, so the responses the agent loop "
            "sends it while generating would wait on a sleeping engine; set "
            "reward.reward_model.rollout.free_cache_engine=false (in its own pool the model keeps its GPUs awake)"
        )
    return problems


def multi_turn_problems(config) -> list[str]:
    """A replaying run whose rollouts may call tools needs the rollout's own log-probs.

    Before the pool stores a tool-calling exchange, the trainer checks that no token its loss mask calls the tool's
    carries a log-prob the rollout sampled (``replay_step.batch.member_defect``: the mask is what the rollout did, or
    the exchange is not stored). The rollout hands those log-probs over (``rollout_log_probs``) only with
    ``actor_rollout_ref.rollout.calculate_log_probs`` (verl 0.9.1's default: true); without them the check could not
    run, and would be skipped without a word. The on-policy baseline stores nothing and needs no check."""
    from recipe.exgrpo.tool_turns import runs_tools

    if not OmegaConf.select(config, "exgrpo.enable", default=True) or not runs_tools(config):
        return []
    value = _rollout_log_probs_off(config)
    if value is None:
        return []
    return [
        f"actor_rollout_ref.rollout.calculate_log_probs={value!r} in a run whose rollouts call tools (actor_rollout_"
        "ref.rollout.multi_turn): the trainer checks every tool-calling exchange against the rollout's log-probs "
        "before storing it (no sampled log-prob on a tool token: the loss mask is what the rollout did), and the "
        "rollout returns them only with this setting; set actor_rollout_ref.rollout.calculate_log_probs=true "
        "(docs/algorithm.md §14)"
    ]


def _rollout_log_probs_off(config) -> Any:
    """``actor_rollout_ref.rollout.calculate_log_probs`` when it is not true (the rollout then returns no sampled
    log-probs), else None."""
    value = OmegaConf.select(config, "actor_rollout_ref.rollout.calculate_log_probs", default=True)
    return None if value is True or (isinstance(value, str) and value.lower() == "true") else value


def _v1_mode(config) -> str | None:
    """The v1 trainer's mode (``trainer.v1.trainer_mode``) when the run is on the v1 trainer, else None."""
    if not OmegaConf.select(config, "trainer.use_v1", default=False):
        return None
    return str(OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync"))


def async_mode_problems(config) -> list[str]:
    """An asynchronous v1 mode stores each generated trajectory with the log-probs of the policy versions that sampled
    it, which only the rollout knows (docs/algorithm.md §15): the step's old log-probs are the trained policy's. The
    rollout returns them only with ``actor_rollout_ref.rollout.calculate_log_probs``. The on-policy baseline stores
    nothing and needs none."""
    mode = _v1_mode(config)
    if mode not in V1_ASYNC_MODES or not OmegaConf.select(config, "exgrpo.enable", default=True):
        return []
    value = _rollout_log_probs_off(config)
    if value is None:
        return []
    return [
        f"actor_rollout_ref.rollout.calculate_log_probs={value!r} with trainer.v1.trainer_mode={mode}: the pool "
        "stores each generated trajectory with the log-probs of the policy versions that sampled it, which only the "
        "rollout returns (the step's recomputed old log-probs are the trained policy's, possibly versions later); "
        "set actor_rollout_ref.rollout.calculate_log_probs=true (docs/algorithm.md §15)"
    ]


def separate_async_problems(config) -> list[str]:
    """What verl's ``separate_async`` trainer requires of its settings (it asserts them once the Ray cluster is up;
    here they are named at start-up, with the reason): each step is ``parameter_sync_step`` local updates of one
    mini-batch each, so ``data.train_batch_size`` must equal ``parameter_sync_step × actor.ppo_mini_batch_size``; the
    standalone rollout has devices of its own (``rollout.nnodes``, ``rollout.n_gpus_per_node``) and gets the weights
    through a checkpoint engine between the two pools, which the colocated ``naive`` one is not."""
    if _v1_mode(config) != "separate_async":
        return []
    problems = []
    p = OmegaConf.select(config, "trainer.v1.separate_async.parameter_sync_step", default=1)
    batch = OmegaConf.select(config, "data.train_batch_size", default=None)
    mini = OmegaConf.select(config, "actor_rollout_ref.actor.ppo_mini_batch_size", default=None)
    if p is None or int(p) < 1:
        problems.append(
            f"trainer.v1.separate_async.parameter_sync_step={p!r}: the local updates per weight sync, at least 1"
        )
    elif batch is not None and mini is not None and int(batch) != int(p) * int(mini):
        problems.append(
            f"data.train_batch_size={batch} with trainer.v1.separate_async.parameter_sync_step={p} and "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}: in separate_async a step is parameter_sync_step "
            "local updates of one mini-batch each (the step's prompts issued once, replay drawn with them), so "
            f"train_batch_size must equal their product; set actor_rollout_ref.actor.ppo_mini_batch_size="
            f"{int(batch) // int(p) if int(batch) % int(p) == 0 else '<train_batch_size / parameter_sync_step>'}"
        )
    for key in ("actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node"):
        value = OmegaConf.select(config, key, default=0)
        if value is None or int(value) <= 0:
            problems.append(
                f"{key}={value!r} with trainer.v1.trainer_mode=separate_async: the standalone rollout runs on devices "
                "of its own; give it at least one node with at least one GPU"
            )
    backend = OmegaConf.select(config, "actor_rollout_ref.rollout.checkpoint_engine.backend", default="naive")
    if str(backend) == "naive":
        problems.append(
            "actor_rollout_ref.rollout.checkpoint_engine.backend=naive with trainer.v1.trainer_mode=separate_async: "
            "the naive engine hands the weights over inside one process (trainer and rollout colocated); the "
            "standalone rollout needs one between the pools: set nccl (GPUs), nixl or mooncake"
        )
    return problems


def stage_deadline_problems(config) -> list[str]:
    """The problems of the ``stage_deadlines`` block (recipe/exgrpo/runtime/stage_deadlines.py), each naming its key."""
    from recipe.exgrpo.runtime.stage_deadlines import BLOCK, deadline_problems

    raw = OmegaConf.select(config, BLOCK, default=None)
    return deadline_problems(OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw)


def check_startup_config(config) -> ExGRPOConfig:
    """The validated ``exgrpo`` block of a launch config; raises one :class:`StartupConfigError` listing every
    unsupported verl setting, every problem of the reward model, of the multi-turn settings, of the asynchronous
    mode, of the stage deadlines and of the LoRA settings (``recipe/exgrpo/lora.py``), and every problem of
    the block."""
    from recipe.exgrpo.lora import lora_problems, target_module_problems

    problems = verl_setting_problems(config) + reward_model_problems(config) + multi_turn_problems(config)
    problems += async_mode_problems(config) + separate_async_problems(config) + stage_deadline_problems(config)
    problems += lora_problems(config) + target_module_problems(config)
    try:
        exgrpo = exgrpo_config_from_hydra(config)
    except ConfigError as e:
        raise StartupConfigError(problems + e.problems) from None
    if problems:
        raise StartupConfigError(problems)
    return exgrpo


# ------------------------------------------------------------------------------------ what the replay step reads
def reward_model_colocated(config: Any) -> bool:
    """A reward model is on and shares the actor's GPUs (so verl's agent loop does not score the responses)."""
    enable = OmegaConf.select(config, "reward.reward_model.enable", default=False)
    own_pool = OmegaConf.select(config, "reward.reward_model.enable_resource_pool", default=False)
    return bool(enable) and not bool(own_pool)


def replay_response_width(config: Any) -> int:
    """The response width of a step's rows: stored trajectories longer than this cannot join them.

    verl's agent loop pads every generated response to ``actor_rollout_ref.rollout.response_length`` (which
    defaults to ``data.max_response_length`` but may be set lower), and the candidate rows copy that width; the
    smaller of the two settings is the bound, so a long stored trajectory is left out of the plan (and counted in
    ``exgrpo/selection/too_long_candidates``, a question with none left in ``exgrpo/replay/dropped_too_long``)
    instead of failing the step when it is appended.
    """
    widths = [int(config.data.max_response_length)]
    rollout_width = OmegaConf.select(config, "actor_rollout_ref.rollout.response_length", default=None)
    if rollout_width is not None:
        widths.append(int(rollout_width))
    return min(widths)
