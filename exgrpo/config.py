"""Typed, validated configuration for everything ExGRPO adds (the ``exgrpo:`` block of the hydra config).

The trainer builds it with :meth:`ExGRPOConfig.from_dict`, passing the rollout group size ``k`` (K, from
``actor_rollout_ref.rollout.n``). Every error names the offending key as ``exgrpo.<path>`` and the allowed range,
and unknown keys are rejected with a did-you-mean suggestion, so a typo stops the run at start-up instead of
silently falling back to a default. All problems are reported together: one :class:`ConfigError` lists every
unknown key and every bad value (``ConfigError.problems``), so one run shows all there is to fix.

Defaults follow docs/algorithm.md: the released code's behaviour where the paper and the release
disagree, and the decisions marked OUR CHOICE there (each one has a switch here).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exgrpo.checks import ConfigError, check_bool, check_choice, check_float, check_int, collecting, fail

__all__ = ["ConfigError", "ExGRPOConfig"]

#: Allowed values of the string switches that no registry defines (the registries of bucket weightings,
#: trajectory metrics and shapings are consulted at validation time, so a newly registered one is accepted
#: automatically).
ZERO_SUCCESS_CHOICES = ("bucket0", "keep")
COLLECT_FROM_CHOICES = ("start", "mixed")
POOL_STORAGE_CHOICES = ("arena", "per_entry")
RESUME_POOL_CHOICES = ("required", "empty")
TRAJECTORY_MODE_CHOICES = ("min", "max")
#: exgrpo.fresh_clip: the PPO clip on fresh tokens before the delayed start only (released), always, or never.
FRESH_CLIP_CHOICES = ("released", "always", "never")
#: exgrpo.loss_scale: verl's global normaliser (ours) or each data-parallel rank's token sum / L_max (released).
LOSS_SCALE_CHOICES = ("global", "per_rank")
#: exgrpo.replay_reward: the replayed member is re-scored by the reward function / model (as every member) or
#: keeps the reward stored with it at collection.
REPLAY_REWARD_CHOICES = ("rescore", "stored")
#: Keys of earlier versions that no longer exist, with what replaced them (a clearer error than "unknown key").
REMOVED_KEYS = {
    "entropy_token_budget": "the candidates are now scored inside verl's old-log-prob pass, which batches by "
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu (dynamic batch size) or "
    "log_prob_micro_batch_size_per_gpu; remove the key",
}


@dataclass
class ExGRPOConfig:
    """The whole ``exgrpo:`` block (flat, same key names as ``recipe/exgrpo/config/exgrpo_trainer.yaml``).

    ``k`` is filled by the trainer from the rollout config (``actor_rollout_ref.rollout.n``).
    """

    # --- switch and schedule (§6, §9)
    #: False = plain on-policy Dr.GRPO through the same trainer (the baseline).
    enable: bool = True
    #: Rollout group size K (filled by the trainer; validated >= 2).
    k: int | None = None
    #: Seed of every random choice the experience manager makes (the question draw, the 'random' trajectory
    #: choice, the re-added retired questions). Default 0; verl's own seeds (data.seed, rollout seeds) are separate.
    seed: int = 0
    #: rho: share of the B questions of a mixed step that are replayed (n = floor(rho*B)), in [0, 1).
    replay_ratio: float = 0.5
    #: Linear ramp of rho from 0 to replay_ratio over this many steps after the switch (0 = constant rho).
    replay_ratio_ramp_steps: int = 0

    # --- pool and collection (§2, §3)
    #: A group with bucket_lbound < k <= bucket_rbound successes enters the pool.
    bucket_lbound: int = 0
    #: Upper collection bound; None means K-1 (partially solved questions).
    bucket_rbound: int | None = None
    #: Count the replayed member in k (released code, paper Algorithm 1) or only the fresh members.
    count_replayed_in_k: bool = True
    #: A later 0/K result: 'bucket0' (OUR CHOICE: move to bucket 0, never sampled) or 'keep' (released).
    zero_success: str = "bucket0"
    #: 'start' (paper, OUR CHOICE: collect from step 1) or 'mixed' (released: only once mixed mode is on).
    collect_from: str = "start"
    #: Stop drawing retired (K/K) questions as fresh prompts at once (OUR CHOICE); false = released: they leave
    #: the fresh prompt stream at the next epoch boundary, and only when the data set has > B + 20 questions.
    retire_fresh_prompts: bool = True
    #: Table 6 ablation "retired questions re-added": every `readd_retired_every` steps, this fraction of the
    #: retired questions (drawn at random) is un-retired and can be drawn as a fresh prompt again (0 = off).
    readd_retired_fraction: float = 0.0
    #: Period in steps of the re-adding above (the paper's ablation: 10% every 25 steps).
    readd_retired_every: int = 25
    #: Optional cap on stored trajectories per question, oldest evicted first (OUR CHOICE; None = off).
    max_entries_per_question: int | None = None
    #: Optional cap on stored response tokens in the whole pool, oldest evicted first (None = off).
    max_total_tokens: int | None = None
    #: Token storage layout: 'arena' (chunked columnar arrays) or 'per_entry' (one array pair per trajectory).
    pool_storage: str = "arena"
    #: On resume: 'required' (a missing saved pool is an error) or 'empty' (a missing one starts empty).
    resume_pool: str = "required"

    # --- question sampling (§4)
    #: Bucket weighting: normal | linear | sqrt | linear_clip | uniform (uniform over questions, not buckets).
    weighting: str = "normal"
    #: Centre of the Gaussian weight, in accuracy units (k/K).
    mu: float = 0.5
    #: Width of the Gaussian weight in accuracy units; None means 1/K (the released code's 1 success).
    sigma: float | None = None

    # --- trajectory selection (§5)
    #: entropy | nll | random | diversity (registry in exgrpo.experience.trajectory_metrics).
    trajectory_metric: str = "entropy"
    #: 'min' (default: lowest-entropy trajectory) or 'max' (the highest-entropy ablation).
    trajectory_mode: str = "min"
    #: Optional cap on candidates scored per question (the newest ones are kept); None = all.
    max_candidates_per_question: int | None = None
    #: n of the token n-grams the 'diversity' metric compares.
    diversity_ngram: int = 4

    # --- objective (§8); consumed by the objective and the actor wiring
    #: 'policy_shaping' (f(w) = w/(w+beta) on replayed tokens) or 'none' (plain ratio, the ablation).
    shaping: str = "policy_shaping"
    #: beta of the policy shaping f(w) = w/(w+beta); > 0.
    shaping_beta: float = 0.1
    #: Importance ratio of replayed tokens against the stored behaviour log-probs (True) or the recomputed ones.
    is_correction: bool = True
    #: Fresh tokens: 'released' (unclipped in the mixed phase, PPO clip before; the on-policy baseline never
    #: switches, so it keeps the clip), 'always' (paper Eq. 4 clip) or 'never' (unclipped -A*w for the whole
    #: run, the baseline included).
    fresh_clip: str = "released"
    #: verl's dual clip (actor.clip_ratio_c, for A < 0) on PPO-clipped fresh tokens; the release has none.
    dual_clip: bool = False
    #: Weight the on-policy and experience terms by (1-rho) and rho (paper Eq. 4); the release does not.
    #: The experience term is every row of a replayed question's group (stored member + K-1 fresh siblings).
    weight_terms_by_ratio: bool = False
    #: Loss scale: 'global' (verl's seq-mean-token-sum-norm: token sums / (L_max x rows of the global
    #: mini-batch); OUR CHOICE) or 'per_rank' (released: each data-parallel rank's token sum / L_max, gradients
    #: averaged over ranks, so the scale grows with the rows per rank). See docs/objective.md.
    loss_scale: str = "global"
    #: Skip the optimiser update when the gradient norm (before clipping) exceeds this; null = off (verl: only
    #: non-finite norms are skipped). The release uses 500 (at its loss scale, see loss_scale).
    skip_grad_norm_above: float | None = None

    # --- reward mode (§3, §9, §13): a registered strategy (exgrpo.modes) that owns its own keys
    #: 'binary' (0/1 rewards, buckets = success counts: the paper's main method) or 'continuous' (real-valued
    #: rewards, e.g. a reward model: buckets = round(σ̃·K) of the normalised within-group reward spread); any mode
    #: registered in exgrpo.modes.
    reward_mode: str = "binary"
    #: The replayed member's reward: 'rescore' (scored again by the reward function/model, as every member) or
    #: 'stored' (the reward recorded with it at collection).
    replay_reward: str = "rescore"
    #: The values of the keys the reward modes own (exgrpo.modes: the binary mode's delayed_start_threshold, the
    #: continuous mode's spread_epsilon, ...), by key, every registered mode's key present. They are keys of the
    #: same flat ``exgrpo:`` block and read as attributes (``cfg.delayed_start_threshold``).
    options: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        defaults = _option_defaults()
        unknown = sorted(set(self.options) - set(defaults))
        if unknown:
            raise ConfigError(f"unknown reward-mode key(s) {unknown}; the registered modes read {sorted(defaults)}")
        object.__setattr__(self, "options", {**defaults, **self.options})

    def __getattr__(self, name: str) -> Any:
        # only called when the normal lookup fails: a reward mode's key
        if name.startswith("__") or name == "options":
            raise AttributeError(name)
        options = self.__dict__.get("options")
        if options is not None and name in options:
            return options[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        options = self.__dict__.get("options")
        if options is not None and name in options and name not in _FIELD_NAMES:
            options[name] = value
        else:
            object.__setattr__(self, name, value)

    @property
    def mode(self) -> Any:
        """The registered class of ``reward_mode`` (``exgrpo.modes``)."""
        from exgrpo.modes import get_reward_mode

        return get_reward_mode(self.reward_mode)

    @classmethod
    def key_names(cls) -> list[str]:
        """Every key of the ``exgrpo:`` block: this class's fields and the registered reward modes' keys."""
        own = [f.name for f in dataclasses.fields(cls) if f.name != "options"]
        return own + [key for key in _option_defaults() if key not in own]

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
        own = {f.name for f in dataclasses.fields(cls)} - {"options"}
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
            options = {key: value for key, value in d.items() if key in names and key not in own}
            cfg = cls(**{key: value for key, value in d.items() if key in own}, options=options)
            if k is not None:
                cfg.k = k
            cfg.validate()  # the known keys' values are checked too, and reported with the unknown keys
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """Plain flat dict of every key (JSON/YAML-serialisable); ``from_dict(to_dict())`` round-trips."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "options"}
        out.update(self.options)
        return out

    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> ExGRPOConfig:
        """Check every range; raises one :class:`ConfigError` listing every problem, each naming ``exgrpo.<key>``.
        Returns self."""
        with collecting():
            self._validate()
        return self

    def _validate(self) -> None:
        check_bool(self.enable, "enable")
        if self.k is None:
            k_ok = fail(
                "exgrpo.k (the rollout group size K, actor_rollout_ref.rollout.n) must be set; "
                "pass it as ExGRPOConfig.from_dict(d, k=K)"
            )
        else:
            k_ok = check_int(self.k, "k", lo=2, hint="K >= 2: a group needs two rollouts for a relative advantage")
        check_int(self.seed, "seed", lo=0)
        check_float(self.replay_ratio, "replay_ratio", lo=0.0, hi=1.0, hi_open=True)
        check_int(self.replay_ratio_ramp_steps, "replay_ratio_ramp_steps", lo=0, hint="0 = constant rho")
        check_float(self.readd_retired_fraction, "readd_retired_fraction", lo=0.0, hi=1.0, hint="0 = off")
        check_int(self.readd_retired_every, "readd_retired_every", lo=1)
        if k_ok:  # the bucket bounds are checked against K
            k = self.k
            assert k is not None
            bounds_ok = check_int(self.bucket_lbound, "bucket_lbound", lo=0, hi=k - 2)
            if self.bucket_rbound is not None:
                bounds_ok &= check_int(
                    self.bucket_rbound,
                    "bucket_rbound",
                    lo=1,
                    hi=k - 1,
                    hint="k = K retires the question, so at most K-1; null means K-1",
                )
            if bounds_ok and self.bucket_lbound >= self.resolved_rbound:
                fail(
                    f"exgrpo.bucket_lbound ({self.bucket_lbound}) must be < exgrpo.bucket_rbound "
                    f"({self.resolved_rbound}): a group enters the pool when lbound < k <= rbound"
                )
        check_bool(self.count_replayed_in_k, "count_replayed_in_k")
        check_choice(self.zero_success, "zero_success", ZERO_SUCCESS_CHOICES)
        check_choice(self.collect_from, "collect_from", COLLECT_FROM_CHOICES)
        check_bool(self.retire_fresh_prompts, "retire_fresh_prompts")
        if self.max_entries_per_question is not None:
            check_int(self.max_entries_per_question, "max_entries_per_question", lo=1, hint="null = no cap")
        if self.max_total_tokens is not None:
            check_int(self.max_total_tokens, "max_total_tokens", lo=1, hint="null = no cap")
        check_choice(self.pool_storage, "pool_storage", POOL_STORAGE_CHOICES)
        check_choice(self.resume_pool, "resume_pool", RESUME_POOL_CHOICES)

        # The registries are consulted here, at validation time, so that a newly registered weighting/metric is
        # accepted. Their modules import nothing of the config (no import cycle); importing them here rather than at
        # the top keeps ``import exgrpo.config`` light (the experience package brings torch and pyarrow).
        from exgrpo.experience.trajectory_metrics import TRAJECTORY_METRICS
        from exgrpo.experience.weightings import BUCKET_WEIGHTINGS

        check_choice(self.weighting, "weighting", tuple(BUCKET_WEIGHTINGS))
        check_float(self.mu, "mu", lo=0.0, hi=1.0, hint="accuracy units k/K")
        if self.sigma is not None:
            check_float(
                self.sigma,
                "sigma",
                lo=0.0,
                lo_open=True,
                hint="accuracy units; null means 1/K (the released code's 1 success)",
            )

        check_choice(self.trajectory_metric, "trajectory_metric", tuple(TRAJECTORY_METRICS))
        check_choice(self.trajectory_mode, "trajectory_mode", TRAJECTORY_MODE_CHOICES)
        if self.max_candidates_per_question is not None:
            check_int(
                self.max_candidates_per_question,
                "max_candidates_per_question",
                lo=1,
                hint="null = score every stored trajectory",
            )
        check_int(self.diversity_ngram, "diversity_ngram", lo=1)

        from exgrpo.objective.shaping import SHAPING_REGISTRY

        check_choice(self.shaping, "shaping", tuple(SHAPING_REGISTRY))
        check_float(self.shaping_beta, "shaping_beta", lo=0.0, lo_open=True)
        check_bool(self.is_correction, "is_correction")
        check_choice(self.fresh_clip, "fresh_clip", FRESH_CLIP_CHOICES)
        check_bool(self.dual_clip, "dual_clip")
        check_bool(self.weight_terms_by_ratio, "weight_terms_by_ratio")
        check_choice(self.loss_scale, "loss_scale", LOSS_SCALE_CHOICES)
        self._validate_reward_mode()
        if self.skip_grad_norm_above is not None:
            check_float(
                self.skip_grad_norm_above,
                "skip_grad_norm_above",
                lo=0.0,
                lo_open=True,
                hint="null = off; the release skips updates whose gradient norm exceeds 500",
            )

    def _validate_reward_mode(self) -> None:
        """The reward mode (a registered one) and its keys; a key only other modes read must keep its default."""
        from exgrpo.modes import REWARD_MODES, option_owners

        check_choice(self.replay_reward, "replay_reward", REPLAY_REWARD_CHOICES)
        if not check_choice(self.reward_mode, "reward_mode", tuple(REWARD_MODES)):
            return
        mode = REWARD_MODES[self.reward_mode]
        defaults = _option_defaults()
        for key, value in self.options.items():
            if key in mode.options or value == defaults[key]:
                continue
            owners = option_owners(key)
            fail(
                mode.foreign_option_problem(key, value)
                or f"exgrpo.{key}={value!r} applies only with exgrpo.reward_mode={' or '.join(owners)} (this run is "
                f"{self.reward_mode}); set exgrpo.reward_mode={owners[0]} or remove exgrpo.{key}"
            )
        mode.validate(self)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(ExGRPOConfig))


def _option_defaults() -> dict[str, Any]:
    """Every registered reward mode's keys and defaults (the modes import nothing of this module)."""
    from exgrpo.modes import option_defaults

    return option_defaults()
