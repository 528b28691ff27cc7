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

import contextlib
import contextvars
import dataclasses
import difflib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
#: exgrpo.reward_mode: 0/1 rewards bucketed by success count (the paper's main method) or real-valued rewards
#: bucketed by their normalised within-group spread (the paper's reward-model extension, docs/algorithm.md §13).
REWARD_MODE_CHOICES = ("binary", "continuous")
#: exgrpo.continuous_start: what replaces the binary pass rate of the delayed start in continuous mode.
CONTINUOUS_START_CHOICES = ("steps", "mean_reward")
#: exgrpo.replay_reward: the replayed member is re-scored by the reward function / model (as every member) or
#: keeps the reward stored with it at collection.
REPLAY_REWARD_CHOICES = ("rescore", "stored")
#: Keys that only the continuous mode reads: a value other than the default in binary mode is an error (it would
#: do nothing).
CONTINUOUS_ONLY_KEYS = (
    "spread_epsilon",
    "equal_spread",
    "flat_std",
    "retire_mean_reward",
    "continuous_members",
    "member_threshold",
    "continuous_start",
    "continuous_start_steps",
    "continuous_start_reward",
)

#: Keys of earlier versions that no longer exist, with what replaced them (a clearer error than "unknown key").
REMOVED_KEYS = {
    "entropy_token_budget": "the candidates are now scored inside verl's old-log-prob pass, which batches by "
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu (dynamic batch size) or "
    "log_prob_micro_batch_size_per_gpu; remove the key",
}


class ConfigError(ValueError):
    """Wrong ``exgrpo.*`` values or keys; each problem names its key and the allowed range.

    ``problems``: one line per problem. The message is that line when there is one, else a numbered list.
    """

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems in the exgrpo config:\n" + "\n".join(
                f"  {i}. {p}" for i, p in enumerate(self.problems, 1)
            )
        super().__init__(message)


# While validating, the checks append their problems here instead of raising at the first one.
_PROBLEMS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("exgrpo_config_problems", default=None)


@contextlib.contextmanager
def _collecting() -> Iterator[list[str]]:
    """Collect every problem found in the block and raise one ConfigError listing them all at its end. A
    ConfigError raised directly in the block (a check that cannot go on) joins the problems found before it.
    Nested blocks share the outermost list."""
    outer = _PROBLEMS.get()
    if outer is not None:
        yield outer
        return
    problems: list[str] = []
    token = _PROBLEMS.set(problems)
    try:
        yield problems
    except ConfigError as e:
        problems.extend(p for p in e.problems if p not in problems)
    finally:
        _PROBLEMS.reset(token)
    if problems:
        raise ConfigError(problems)


def _fail(message: str) -> bool:
    """Report one problem: collected inside ``_collecting``, raised outside it. Returns False (check failed)."""
    problems = _PROBLEMS.get()
    if problems is None:
        raise ConfigError(message)
    problems.append(message)
    return False


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
    #: tau: mixed mode starts after the first step whose batch pass rate is > tau; negative = mixed from step 1.
    delayed_start_threshold: float = 0.35

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

    # --- reward mode (§13): continuous rewards, buckets from the normalised within-group reward spread
    #: 'binary' (0/1 rewards, buckets = success counts: the paper's main method) or 'continuous' (real-valued
    #: rewards, e.g. a reward model: buckets = round(σ̃·K) of the normalised within-group reward spread).
    reward_mode: str = "binary"
    #: ε of σ̃ = max((σ − σ_min)/(σ_max − σ_min), ε), in (0, 1]; None means 1/K, where the formula lands on bucket 1.
    spread_epsilon: float | None = None
    #: σ̃ of every group when all the step's groups have the same σ (a single group too): max (1) | mid (½) | min (0).
    equal_spread: str = "max"
    #: A group whose reward std is <= this (reward units) is flat: no spread, all advantages 0 (the binary 0/K, K/K).
    flat_std: float = 0.0
    #: A flat group whose mean reward is >= this retires (the binary K/K); None = never retire (OUR CHOICE).
    retire_mean_reward: float | None = None
    #: Fresh members stored from a non-flat group: above_mean | top_1 | above_threshold (registry in
    #: exgrpo.experience.continuous).
    continuous_members: str = "above_mean"
    #: Reward a member needs under continuous_members=above_threshold (reward units).
    member_threshold: float | None = None
    #: Delayed start in continuous mode: 'steps' (mixed after continuous_start_steps steps; OUR CHOICE) or
    #: 'mean_reward' (after the first step whose mean reward is > continuous_start_reward).
    continuous_start: str = "steps"
    #: Steps before mixed mode under continuous_start=steps (0 = mixed from step 1).
    continuous_start_steps: int = 0
    #: tau in reward units under continuous_start=mean_reward (required there).
    continuous_start_reward: float | None = None
    #: The replayed member's reward: 'rescore' (scored again by the reward function/model, as every member) or
    #: 'stored' (the reward recorded with it at collection).
    replay_reward: str = "rescore"

    # ----------------------------------------------------------------------------------------------- derived
    @property
    def resolved_rbound(self) -> int:
        """Upper collection bound with None resolved to K-1."""
        assert self.k is not None, "exgrpo.k is not set"
        return self.k - 1 if self.bucket_rbound is None else self.bucket_rbound

    @property
    def resolved_spread_epsilon(self) -> float:
        """ε of the normalised spread with None resolved to 1/K."""
        assert self.k is not None, "exgrpo.k is not set"
        return 1.0 / self.k if self.spread_epsilon is None else float(self.spread_epsilon)

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
        names = [f.name for f in dataclasses.fields(cls)]
        with _collecting():
            for key in d:
                if key in REMOVED_KEYS:
                    _fail(f"exgrpo.{key} was removed: {REMOVED_KEYS[key]}")
            unknown = [str(key) for key in d if key not in names and key not in REMOVED_KEYS]
            if unknown:
                msgs = []
                for key in unknown:
                    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
                    msgs.append(f"exgrpo.{key}" + (f" (did you mean exgrpo.{close[0]}?)" if close else ""))
                _fail(f"unknown key(s) {', '.join(msgs)}; allowed keys: {', '.join(names)}")
            cfg = cls(**{key: value for key, value in d.items() if key in names})
            if k is not None:
                cfg.k = k
            cfg.validate()  # the known keys' values are checked too, and reported with the unknown keys
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON/YAML-serialisable); ``from_dict(to_dict())`` round-trips."""
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------------------------------- validation
    def validate(self) -> ExGRPOConfig:
        """Check every range; raises one :class:`ConfigError` listing every problem, each naming ``exgrpo.<key>``.
        Returns self."""
        with _collecting():
            self._validate()
        return self

    def _validate(self) -> None:
        _check_bool(self.enable, "enable")
        if self.k is None:
            k_ok = _fail(
                "exgrpo.k (the rollout group size K, actor_rollout_ref.rollout.n) must be set; "
                "pass it as ExGRPOConfig.from_dict(d, k=K)"
            )
        else:
            k_ok = _check_int(self.k, "k", lo=2, hint="K >= 2: a group needs two rollouts for a relative advantage")
        _check_int(self.seed, "seed", lo=0)
        _check_float(self.replay_ratio, "replay_ratio", lo=0.0, hi=1.0, hi_open=True)
        _check_int(self.replay_ratio_ramp_steps, "replay_ratio_ramp_steps", lo=0, hint="0 = constant rho")
        _check_float(self.readd_retired_fraction, "readd_retired_fraction", lo=0.0, hi=1.0, hint="0 = off")
        _check_int(self.readd_retired_every, "readd_retired_every", lo=1)
        _check_float(
            self.delayed_start_threshold,
            "delayed_start_threshold",
            hi=1.0,
            hi_open=True,
            hint="a pass rate never exceeds 1, so tau >= 1 would never start mixed mode; "
            "negative means mixed from step 1; use exgrpo.enable=false for plain GRPO",
        )

        if k_ok:  # the bucket bounds are checked against K
            k = self.k
            assert k is not None
            bounds_ok = _check_int(self.bucket_lbound, "bucket_lbound", lo=0, hi=k - 2)
            if self.bucket_rbound is not None:
                bounds_ok &= _check_int(
                    self.bucket_rbound,
                    "bucket_rbound",
                    lo=1,
                    hi=k - 1,
                    hint="k = K retires the question, so at most K-1; null means K-1",
                )
            if bounds_ok and self.bucket_lbound >= self.resolved_rbound:
                _fail(
                    f"exgrpo.bucket_lbound ({self.bucket_lbound}) must be < exgrpo.bucket_rbound "
                    f"({self.resolved_rbound}): a group enters the pool when lbound < k <= rbound"
                )
        _check_bool(self.count_replayed_in_k, "count_replayed_in_k")
        _check_choice(self.zero_success, "zero_success", ZERO_SUCCESS_CHOICES)
        _check_choice(self.collect_from, "collect_from", COLLECT_FROM_CHOICES)
        _check_bool(self.retire_fresh_prompts, "retire_fresh_prompts")
        if self.max_entries_per_question is not None:
            _check_int(self.max_entries_per_question, "max_entries_per_question", lo=1, hint="null = no cap")
        if self.max_total_tokens is not None:
            _check_int(self.max_total_tokens, "max_total_tokens", lo=1, hint="null = no cap")
        _check_choice(self.pool_storage, "pool_storage", POOL_STORAGE_CHOICES)
        _check_choice(self.resume_pool, "resume_pool", RESUME_POOL_CHOICES)

        # The registries are consulted here, at validation time, so that a newly registered weighting/metric is
        # accepted. Their modules import nothing of the config (no import cycle); importing them here rather than at
        # the top keeps ``import exgrpo.config`` light (the experience package brings torch and pyarrow).
        from exgrpo.experience.trajectory_metrics import TRAJECTORY_METRICS
        from exgrpo.experience.weightings import BUCKET_WEIGHTINGS

        _check_choice(self.weighting, "weighting", tuple(BUCKET_WEIGHTINGS))
        _check_float(self.mu, "mu", lo=0.0, hi=1.0, hint="accuracy units k/K")
        if self.sigma is not None:
            _check_float(
                self.sigma,
                "sigma",
                lo=0.0,
                lo_open=True,
                hint="accuracy units; null means 1/K (the released code's 1 success)",
            )

        _check_choice(self.trajectory_metric, "trajectory_metric", tuple(TRAJECTORY_METRICS))
        _check_choice(self.trajectory_mode, "trajectory_mode", TRAJECTORY_MODE_CHOICES)
        if self.max_candidates_per_question is not None:
            _check_int(
                self.max_candidates_per_question,
                "max_candidates_per_question",
                lo=1,
                hint="null = score every stored trajectory",
            )
        _check_int(self.diversity_ngram, "diversity_ngram", lo=1)

        from exgrpo.objective.shaping import SHAPING_REGISTRY

        _check_choice(self.shaping, "shaping", tuple(SHAPING_REGISTRY))
        _check_float(self.shaping_beta, "shaping_beta", lo=0.0, lo_open=True)
        _check_bool(self.is_correction, "is_correction")
        _check_choice(self.fresh_clip, "fresh_clip", FRESH_CLIP_CHOICES)
        _check_bool(self.dual_clip, "dual_clip")
        _check_bool(self.weight_terms_by_ratio, "weight_terms_by_ratio")
        _check_choice(self.loss_scale, "loss_scale", LOSS_SCALE_CHOICES)
        self._validate_reward_mode()
        if self.skip_grad_norm_above is not None:
            _check_float(
                self.skip_grad_norm_above,
                "skip_grad_norm_above",
                lo=0.0,
                lo_open=True,
                hint="null = off; the release skips updates whose gradient norm exceeds 500",
            )

    def _validate_reward_mode(self) -> None:
        """The continuous mode's keys (docs/algorithm.md §13); in binary mode they must keep their defaults."""
        _check_choice(self.replay_reward, "replay_reward", REPLAY_REWARD_CHOICES)
        if not _check_choice(self.reward_mode, "reward_mode", REWARD_MODE_CHOICES):
            return
        if self.reward_mode == "binary":
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            for key in CONTINUOUS_ONLY_KEYS:
                if getattr(self, key) != defaults[key]:
                    _fail(
                        f"exgrpo.{key}={getattr(self, key)!r} applies only with exgrpo.reward_mode=continuous "
                        f"(this run is binary); set exgrpo.reward_mode=continuous or remove exgrpo.{key}"
                    )
            return
        if self.delayed_start_threshold != ExGRPOConfig.delayed_start_threshold:
            _fail(
                f"exgrpo.delayed_start_threshold={self.delayed_start_threshold!r} is the binary pass rate's tau and "
                "does nothing with exgrpo.reward_mode=continuous: use exgrpo.continuous_start=mean_reward with "
                "exgrpo.continuous_start_reward (reward units), or exgrpo.continuous_start=steps with "
                "exgrpo.continuous_start_steps"
            )
        if self.spread_epsilon is not None:
            _check_float(self.spread_epsilon, "spread_epsilon", lo=0.0, hi=1.0, lo_open=True, hint="null means 1/K")
        from exgrpo.experience.continuous import CONTINUOUS_MEMBER_RULES, EQUAL_SPREAD_CHOICES

        _check_choice(self.equal_spread, "equal_spread", tuple(EQUAL_SPREAD_CHOICES))
        _check_float(self.flat_std, "flat_std", lo=0.0, hint="reward units; 0 = only exactly equal rewards are flat")
        if self.retire_mean_reward is not None:
            _check_float(self.retire_mean_reward, "retire_mean_reward", hint="reward units; null = never retire")
        if _check_choice(self.continuous_members, "continuous_members", tuple(CONTINUOUS_MEMBER_RULES)):
            needs = CONTINUOUS_MEMBER_RULES.tag(self.continuous_members, "needs_threshold", False)
            if self.member_threshold is not None:
                _check_float(self.member_threshold, "member_threshold", hint="reward units")
            elif needs:
                _fail(
                    f"exgrpo.continuous_members={self.continuous_members} needs exgrpo.member_threshold (the reward "
                    "a stored member must reach, in reward units)"
                )
        if _check_choice(self.continuous_start, "continuous_start", CONTINUOUS_START_CHOICES):
            _check_int(self.continuous_start_steps, "continuous_start_steps", lo=0, hint="0 = mixed from step 1")
            if self.continuous_start_reward is not None:
                _check_float(self.continuous_start_reward, "continuous_start_reward", hint="reward units")
            elif self.continuous_start == "mean_reward":
                _fail(
                    "exgrpo.continuous_start=mean_reward needs exgrpo.continuous_start_reward: mixed mode starts "
                    "after the first step whose mean reward exceeds it (reward units)"
                )


# ------------------------------------------------------------------------------------------------- helpers
# Each check reports through ``_fail`` (collected during validation) and returns whether the value is valid.
def _check_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        return _fail(f"exgrpo.{key} must be true or false, got {value!r}")
    return True


def _range_text(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    left = "-inf" if lo is None else f"{lo}"
    right = "inf" if hi is None else f"{hi}"
    return f"{'(' if lo_open or lo is None else '['}{left}, {right}{')' if hi_open or hi is None else ']'}"


def _check_int(value: Any, key: str, lo: int | None = None, hi: int | None = None, hint: str = "") -> bool:
    rng = _range_text(lo, hi, False, False)
    extra = f" ({hint})" if hint else ""
    if isinstance(value, bool) or not isinstance(value, int):
        return _fail(f"exgrpo.{key} must be an integer in {rng}{extra}, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return _fail(f"exgrpo.{key} must be an integer in {rng}{extra}, got {value!r}")
    return True


def _check_float(
    value: Any,
    key: str,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    hint: str = "",
) -> bool:
    rng = _range_text(lo, hi, lo_open, hi_open)
    extra = f" ({hint})" if hint else ""
    msg = f"exgrpo.{key} must be a number in {rng}{extra}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return _fail(msg)
    if lo is not None and (value < lo or (lo_open and value == lo)):
        return _fail(msg)
    if hi is not None and (value > hi or (hi_open and value == hi)):
        return _fail(msg)
    return True


def _check_choice(value: Any, key: str, choices: tuple[str, ...]) -> bool:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return _fail(f"exgrpo.{key} must be one of {list(choices)}, got {value!r}{hint}")
    return True
