"""Typed, validated configuration for everything ExGRPO adds (the ``exgrpo:`` block of the hydra config).

Each key is declared once, as a field of :class:`ExGRPOConfig` made by :func:`exgrpo.settings.setting`: its type,
default, allowed range or choices, the hint its error gives and one line of help. A reward mode's own keys are
declared the same way in the mode's options dataclass (``exgrpo/modes/``); they are keys of the same flat block
(``exgrpo.delayed_start_threshold``) and the config holds those of its run's mode as :attr:`ExGRPOConfig.mode_options`.
:func:`settings_reference` lists them all.

The trainer builds the config with :meth:`ExGRPOConfig.from_dict`, passing the rollout group size ``k`` (K, from
``actor_rollout_ref.rollout.n``). Every error names the offending key as ``exgrpo.<path>`` and the allowed range,
and unknown keys are rejected with a did-you-mean suggestion, so a typo stops the run at start-up instead of
silently falling back to a default. All problems are reported together: one :class:`ConfigError` lists every
unknown key and every bad value (``ConfigError.problems``), so one run shows all there is to fix. This is the one
place the values are checked: the objects built from a validated config trust it.

Defaults follow docs/algorithm.md: the released code's behaviour where the paper and the release
disagree, and the decisions marked OUR CHOICE there (each one has a switch here).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exgrpo.checks import ConfigError, collecting, fail
from exgrpo.settings import Declared, K, ModeOptions, check_settings, declared, setting

__all__ = ["ConfigError", "ExGRPOConfig", "SettingRow", "settings_reference"]

#: Allowed values of the string switches that no registry defines (the registries of bucket weightings,
#: trajectory metrics, shapings and reward modes are read at validation time, so a newly registered one is
#: accepted automatically).
ZERO_SUCCESS_CHOICES = ("bucket0", "keep")
COLLECT_FROM_CHOICES = ("start", "mixed")
POOL_STORAGE_CHOICES = ("arena", "per_entry")
RESUME_POOL_CHOICES = ("required", "empty")
TRAJECTORY_MODE_CHOICES = ("min", "max")
FRESH_CLIP_CHOICES = ("released", "always", "never")
LOSS_SCALE_CHOICES = ("global", "per_rank")
REPLAY_REWARD_CHOICES = ("rescore", "stored")
#: Keys of earlier versions that no longer exist, with what replaced them (a clearer error than "unknown key").
REMOVED_KEYS = {
    "entropy_token_budget": "the candidates are now scored inside verl's old-log-prob pass, which batches by "
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu (dynamic batch size) or "
    "log_prob_micro_batch_size_per_gpu; remove the key",
}


# The registries are read when a value is checked (so that a newly registered entry is accepted). Their modules
# import nothing of the config (no import cycle); importing them here rather than at the top keeps
# ``import exgrpo.config`` light (the experience package brings torch and pyarrow).
def _bucket_weightings() -> Any:
    from exgrpo.experience.weightings import BUCKET_WEIGHTINGS

    return BUCKET_WEIGHTINGS


def _trajectory_metrics() -> Any:
    from exgrpo.experience.trajectory_metrics import TRAJECTORY_METRICS

    return TRAJECTORY_METRICS


def _shapings() -> Any:
    from exgrpo.objective.shaping import SHAPING_REGISTRY

    return SHAPING_REGISTRY


def _reward_modes() -> Any:
    from exgrpo.modes import REWARD_MODES

    return REWARD_MODES


@dataclass
class ExGRPOConfig:
    """The whole ``exgrpo:`` block (flat, same key names as ``recipe/exgrpo/config/exgrpo_trainer.yaml``).

    ``k`` is filled by the trainer from the rollout config (``actor_rollout_ref.rollout.n``). The reward mode's own
    keys are in :attr:`mode_options` (the mode's options dataclass; ``to_dict``/``from_dict`` keep them flat).
    """

    # --- switch and schedule (§6, §9)
    enable: bool = setting(True, help="false = plain on-policy Dr.GRPO through the same trainer (the baseline)")
    k: int | None = setting(
        None,
        lo=2,
        hint="K >= 2: a group needs two rollouts for a relative advantage",
        help="rollout group size K; filled by the trainer from actor_rollout_ref.rollout.n",
        filled_from="actor_rollout_ref.rollout.n",
    )
    seed: int = setting(
        0,
        lo=0,
        help="seed of the question draw, the 'random' trajectory choice and the re-added retired questions "
        "(verl's data and rollout seeds are separate keys)",
    )
    replay_ratio: float = setting(
        0.5,
        lo=0.0,
        hi=1.0,
        hi_open=True,
        help="rho: share of the B questions of a mixed step that are replayed from the pool (n = floor(rho*B))",
    )
    replay_ratio_ramp_steps: int = setting(
        0,
        lo=0,
        hint="0 = constant rho",
        help="ramp rho linearly from 0 to replay_ratio over this many steps after the delayed start (0 = constant)",
    )

    # --- pool and collection (§2, §3)
    bucket_lbound: int = setting(
        0, lo=0, hi=K - 2, help="a group with bucket_lbound < k <= bucket_rbound successes enters the pool"
    )
    bucket_rbound: int | None = setting(
        None,
        lo=1,
        hi=K - 1,
        hint="k = K retires the question, so at most K-1; null means K-1",
        help="upper collection bound (null = K-1: every partially solved question)",
    )
    count_replayed_in_k: bool = setting(
        True, help="count the replayed member in the success count k (released, paper Algorithm 1) or only the fresh"
    )
    zero_success: str = setting(
        "bucket0",
        choices=ZERO_SUCCESS_CHOICES,
        help="a later 0/K result: bucket0 (OUR CHOICE: move to bucket 0, never sampled) or keep (released)",
    )
    collect_from: str = setting(
        "start",
        choices=COLLECT_FROM_CHOICES,
        help="collect from step 1 (start: paper, OUR CHOICE) or only once mixed mode is on (mixed: released)",
    )
    retire_fresh_prompts: bool = setting(
        True,
        help="retired (K/K) questions leave the fresh prompts at once (OUR CHOICE); false = released: at the next "
        "epoch boundary, and only when the data set has more than B + 20 questions",
    )
    readd_retired_fraction: float = setting(
        0.0,
        lo=0.0,
        hi=1.0,
        hint="0 = off",
        help="Table 6 ablation: un-retire this fraction of the retired questions every readd_retired_every steps "
        "(0 = off; the paper's ablation: 0.1 every 25)",
    )
    readd_retired_every: int = setting(25, lo=1, help="period in steps of the re-adding of retired questions")
    max_entries_per_question: int | None = setting(
        None,
        lo=1,
        hint="null = no cap",
        help="cap on stored trajectories per question, oldest evicted first (null = no cap, released)",
    )
    max_total_tokens: int | None = setting(
        None,
        lo=1,
        hint="null = no cap",
        help="cap on stored response tokens in the whole pool, oldest evicted first (null = no cap, released)",
    )
    pool_storage: str = setting(
        "arena",
        choices=POOL_STORAGE_CHOICES,
        help="token storage layout: arena (chunked columnar arrays) or per_entry (one array pair per trajectory)",
    )
    resume_pool: str = setting(
        "required",
        choices=RESUME_POOL_CHOICES,
        help="on resume: the pool must be in the checkpoint (required) or a missing one starts empty (empty)",
    )
    trace_rows: bool = setting(
        False,
        help="also write every row of each step into exgrpo_trace.jsonl (question, response digest, reward, "
        "advantage): an audit trail of what was trained on, about 100 bytes per row",
    )

    # --- question sampling (§4)
    weighting: str = setting(
        "normal",
        choices=_bucket_weightings,
        help="bucket weighting of the question draw (uniform: over questions, not buckets); any registered one",
    )
    mu: float = setting(
        0.5, lo=0.0, hi=1.0, hint="accuracy units k/K", help="centre of the Gaussian weight, in accuracy units (k/K)"
    )
    sigma: float | None = setting(
        None,
        lo=0.0,
        lo_open=True,
        hint="accuracy units; null means 1/K (the released code's 1 success)",
        help="width of the Gaussian weight in accuracy units (null = 1/K: the released code's 1 success)",
    )

    # --- trajectory selection (§5)
    trajectory_metric: str = setting(
        "entropy",
        choices=_trajectory_metrics,
        help="the metric choosing a replayed question's trajectory; any registered one",
    )
    trajectory_mode: str = setting(
        "min",
        choices=TRAJECTORY_MODE_CHOICES,
        help="min (the lowest-entropy trajectory, default) or max (the highest-entropy ablation)",
    )
    max_candidates_per_question: int | None = setting(
        None,
        lo=1,
        hint="null = score every stored trajectory",
        help="cap on candidates per replayed question scored in the old-log-prob pass (the newest kept; null = all)",
    )
    diversity_ngram: int = setting(4, lo=1, help="n of the token n-grams the diversity metric compares")

    # --- objective (§8); consumed by the objective and the actor wiring
    shaping: str = setting(
        "policy_shaping",
        choices=_shapings,
        help="replayed tokens: policy_shaping (f(w) = w/(w+beta)) or none (plain ratio, the ablation); any registered",
    )
    shaping_beta: float = setting(0.1, lo=0.0, lo_open=True, help="beta of the policy shaping f(w) = w/(w+beta)")
    is_correction: bool = setting(
        True,
        help="replayed tokens' importance ratio against the stored behaviour log-probs (true) or recomputed ones",
    )
    fresh_clip: str = setting(
        "released",
        choices=FRESH_CLIP_CHOICES,
        help="fresh tokens: released (PPO clip before the delayed start, unclipped after; the baseline keeps it), "
        "always (clip, paper Eq. 4) or never (unclipped all run, the baseline too)",
    )
    dual_clip: bool = setting(
        False,
        help="verl's dual clip (actor.clip_ratio_c, A < 0) on PPO-clipped fresh tokens (false = released: none)",
    )
    weight_terms_by_ratio: bool = setting(
        False,
        help="weight the on-policy and experience terms by (1-rho) and rho (paper Eq. 4; released: false)",
    )
    loss_scale: str = setting(
        "global",
        choices=LOSS_SCALE_CHOICES,
        help="global (OUR CHOICE: token sums / (L_max x rows of the global mini-batch)) or per_rank (released: each "
        "data-parallel rank's token sum / L_max); docs/objective.md",
    )
    skip_grad_norm_above: float | None = setting(
        None,
        lo=0.0,
        lo_open=True,
        hint="null = off; the release skips updates whose gradient norm exceeds 500",
        help="skip the optimiser update when the gradient norm (before clipping) exceeds this (null = off; "
        "released: 500 at its loss scale)",
    )

    # --- reward mode (§3, §9, §13): a registered strategy (exgrpo.modes) that declares its own keys
    reward_mode: str = setting(
        "binary",
        choices=_reward_modes,
        help="binary (0/1 rewards, buckets = success counts: the paper's main method), continuous (real-valued "
        "rewards, buckets from the normalised reward spread) or any registered mode",
    )
    replay_reward: str = setting(
        "rescore",
        choices=REPLAY_REWARD_CHOICES,
        help="the replayed member's reward: rescore (scored again, as every member) or stored (recorded with it)",
    )
    #: The keys of the reward mode (``reward_mode``): an instance of the mode's options dataclass (the binary
    #: mode's ``delayed_start_threshold``, the continuous mode's ``spread_epsilon``, ...). None builds the mode's
    #: defaults. Typed access: ``BinaryOptions.of(cfg).delayed_start_threshold``.
    mode_options: ModeOptions = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.mode_options is None:
            mode = _reward_modes().get(self.reward_mode)  # an unknown mode holds no keys (validate reports it)
            self.mode_options = ModeOptions() if mode is None else mode.options_class()

    @property
    def mode(self) -> Any:
        """The registered class of ``reward_mode`` (``exgrpo.modes``)."""
        from exgrpo.modes import get_reward_mode

        return get_reward_mode(self.reward_mode)

    @classmethod
    def declarations(cls) -> dict[str, Declared]:
        """The config's own keys as declared (the reward modes' keys are each mode's: :func:`mode_declarations`)."""
        return declared(cls)

    @classmethod
    def key_names(cls) -> list[str]:
        """Every key of the ``exgrpo:`` block: the config's own and the registered reward modes' keys."""
        own = list(declared(cls))
        return own + [key for key in mode_declarations() if key not in own]

    # ----------------------------------------------------------------------------------------------- derived
    @property
    def resolved_rbound(self) -> int:
        """Upper collection bound with None resolved to K-1."""
        assert self.k is not None, "exgrpo.k is not set"
        return self.k - 1 if self.bucket_rbound is None else self.bucket_rbound

    @property
    def resolved_sigma(self) -> float:
        """Gaussian width in accuracy units with None resolved to 1/K."""
        assert self.k is not None, "exgrpo.k is not set"
        return 1.0 / self.k if self.sigma is None else float(self.sigma)

    # ------------------------------------------------------------------------------------------- conversion
    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *, k: int | None = None) -> ExGRPOConfig:
        """Build and validate from a mapping, e.g. ``OmegaConf.to_container(cfg.exgrpo, resolve=True)``.

        ``k`` (the rollout group size) overrides any ``k`` key in ``d``. Raises :class:`ConfigError`.
        """
        d = {} if d is None else d
        if not isinstance(d, Mapping):
            raise ConfigError(f"exgrpo must be a mapping of keys to values, got {type(d).__name__}")
        names = cls.key_names()
        own = declared(cls)
        with collecting():
            for key in d:
                if key in REMOVED_KEYS:
                    fail(f"exgrpo.{key} was removed: {REMOVED_KEYS[key]}")
            unknown = [str(key) for key in d if key not in names and key not in REMOVED_KEYS]
            if unknown:
                msgs = []
                for key in unknown:
                    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
                    msgs.append(f"exgrpo.{key}" + (f" (did you mean exgrpo.{close[0]}?)" if close else ""))
                fail(f"unknown key(s) {', '.join(msgs)}; allowed keys: {', '.join(names)}")
            cfg = cls(**{key: value for key, value in d.items() if key in own})
            if k is not None:
                cfg.k = k
            cfg._take_mode_keys({key: value for key, value in d.items() if key in names and key not in own})
            cfg.validate()  # the known keys' values are checked too, and reported with the unknown keys
        return cfg

    def _take_mode_keys(self, given: Mapping[str, Any]) -> None:
        """The reward modes' keys of the flat block: the run's mode's go into :attr:`mode_options`; a key only
        other modes read must keep its default (it would do nothing in this run), and the error names the mode
        that reads it. With an unknown mode nothing is taken (validation reports the mode)."""
        from exgrpo.modes import option_owners

        mode = _reward_modes().get(self.reward_mode)
        if mode is None:
            return
        self.mode_options = mode.options_class(**{key: v for key, v in given.items() if key in mode.options})
        everyone = mode_declarations()
        for key, value in given.items():
            if key in mode.options or value == everyone[key].default:
                continue
            owners = option_owners(key)
            fail(
                mode.foreign_option_problem(key, value)
                or f"exgrpo.{key}={value!r} applies only with exgrpo.reward_mode={' or '.join(owners)} (this run is "
                f"{self.reward_mode}); set exgrpo.reward_mode={owners[0]} or remove exgrpo.{key}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain flat dict of every key (JSON/YAML-serialisable): the config's own, then every registered mode's
        (this run's mode's values, the others' defaults); ``from_dict(to_dict())`` round-trips."""
        out = {key: getattr(self, key) for key in declared(type(self))}
        out.update({key: d.default for key, d in mode_declarations().items()})
        out.update({key: getattr(self.mode_options, key) for key in declared(type(self.mode_options))})
        return out

    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> ExGRPOConfig:
        """Check every key; raises one :class:`ConfigError` listing every problem, each naming ``exgrpo.<key>``.
        Returns self."""
        with collecting():
            self._validate()
        return self

    def _validate(self) -> None:
        # K first: the bucket bounds are declared relative to it, and left unchecked while it is unknown or invalid
        if self.k is None:
            k_ok = fail(
                "exgrpo.k (the rollout group size K, actor_rollout_ref.rollout.n) must be set; "
                "pass it as ExGRPOConfig.from_dict(d, k=K)"
            )
        else:
            k_ok = declared(ExGRPOConfig)["k"].check(self.k)
        k = self.k if k_ok else None
        # every declared type, range and choice; the checks across keys right after the last key they read
        valid = check_settings(self, k=k, skip=("k",), then={"bucket_rbound": self._check_bucket_order})
        if valid["reward_mode"]:
            mode = self.mode
            if type(self.mode_options) is not mode.options_class:
                fail(
                    f"exgrpo.reward_mode={self.reward_mode} reads {mode.options_class.__name__}, but the config holds "
                    f"{type(self.mode_options).__name__}: build the config with ExGRPOConfig.from_dict, or pass "
                    "mode_options of the mode"
                )
                return
            check_settings(self.mode_options, k=k)  # the mode's keys, as declared in its options dataclass
            mode.validate(self)  # the mode's own checks across its keys

    def _check_bucket_order(self, valid: Mapping[str, bool]) -> None:
        if valid.get("bucket_lbound") and valid.get("bucket_rbound") and self.bucket_lbound >= self.resolved_rbound:
            fail(
                f"exgrpo.bucket_lbound ({self.bucket_lbound}) must be < exgrpo.bucket_rbound "
                f"({self.resolved_rbound}): a group enters the pool when lbound < k <= rbound"
            )


def mode_declarations() -> dict[str, Declared]:
    """Every registered reward mode's keys as declared (``exgrpo.modes.option_declarations``)."""
    from exgrpo.modes import option_declarations

    return option_declarations()


# ------------------------------------------------------------------------------------------ settings reference
@dataclass(frozen=True)
class SettingRow:
    """One key of the ``exgrpo:`` block as the settings reference shows it."""

    key: str
    #: ``float``, ``int | None``, ...
    type: str
    default: Any
    #: the allowed values: ``[0.0, 1.0)``, ``one of: a | b``, ``true | false`` (``| null`` when null is allowed)
    allowed: str
    help: str
    #: the reward modes that read the key; empty for a key of every run
    modes: tuple[str, ...] = ()
    #: where the trainer takes the value from, for a key users do not write (K)
    filled_from: str | None = None


def settings_reference() -> list[SettingRow]:
    """Every key of the ``exgrpo:`` block with its type, default, allowed values and help: the config's own keys in
    declaration order, then each registered reward mode's (the source of a generated settings reference)."""
    from exgrpo.modes import option_owners

    rows = [
        SettingRow(d.key, d.type_name(), d.default, d.allowed(), d.help, filled_from=d.setting.filled_from)
        for d in declared(ExGRPOConfig).values()
    ]
    for key, d in mode_declarations().items():
        rows.append(SettingRow(key, d.type_name(), d.default, d.allowed(), d.help, tuple(option_owners(key))))
    return rows
