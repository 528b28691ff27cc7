"""What a reward mode is: one registered class that owns everything the trainer, the pool and the tools would
otherwise decide by comparing the mode's name (docs/algorithm.md §13, docs/architecture.md).

A mode owns

* **its config keys**: a dataclass subclassing :class:`~exgrpo.settings.ModeOptions` (:attr:`RewardMode.options_class`)
  whose fields declare them with :func:`~exgrpo.settings.setting` (type, default, range or choices, help), in the
  mode's module; :attr:`RewardMode.options` lists them as declared. The declared ranges are checked with the
  config's; :meth:`RewardMode.validate` adds the checks across keys. ``ExGRPOConfig`` accepts every registered
  mode's keys (flat: ``exgrpo.<key>``) and holds the run's mode's as ``cfg.mode_options``; a key that only other
  modes read must keep its default in a run of this mode (it would do nothing), and the config says which mode
  reads it;
* **its collection rules** (:meth:`RewardMode.planner`): per group of one collect call, a :class:`GroupPlan` —
  retire the question, its bucket (None: the group carries no learning signal, and the ``zero_success`` rule
  applies), the fresh members to store. The writer applies plans the same way for every mode; the mode keeps the
  statistics of the call (:meth:`~RewardMode.new_stats`, :meth:`~RewardMode.count_no_signal`,
  :meth:`~RewardMode.count_bucket`) and turns them into metrics (:meth:`~RewardMode.collect_metrics`);
* **its delayed-start signal** (:meth:`~RewardMode.schedule_settings` for ``ExperienceSchedule``,
  :meth:`~RewardMode.start_signal` of a step's rewards, :meth:`~RewardMode.switch_message`);
* **the reward figures the trainer logs** each step beyond verl's own (:meth:`~RewardMode.reward_metrics`);
* **its pools' header tag** (:meth:`~RewardMode.settings`, read back with :func:`saved_mode_name`);
* **its line in the dry run's summary** (:meth:`~RewardMode.describe`) and whether a reward model may feed it
  (:attr:`~RewardMode.accepts_reward_model`).

Adding a mode is one module with one decorated class (``@register_reward_mode("name")``), imported by
``exgrpo/modes/__init__.py``. The class-level parts (options, validation, schedule settings, description) work on a
config; :meth:`RewardMode.from_config` builds the instance the pool and the manager use. A mode reads its keys typed
through its options class: ``BinaryOptions.of(cfg).delayed_start_threshold``.

This module imports neither the config (which imports the modes to validate) nor the pool (whose writer applies the
plans): a mode sees a config duck-typed, through its attributes.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from exgrpo.registry import Registry
from exgrpo.settings import Declared, ModeOptions, declared

__all__ = [
    "DEFAULT_REWARD_MODE",
    "REWARD_MODES",
    "GroupPlan",
    "ModeOptions",
    "RewardMode",
    "get_reward_mode",
    "option_declarations",
    "option_owners",
    "register_reward_mode",
    "saved_mode_name",
]

#: The mode of a config that names none, and of a saved pool whose header carries no mode (pools of the paper's
#: binary mode predate the tag).
DEFAULT_REWARD_MODE = "binary"


@dataclass(frozen=True)
class GroupPlan:
    """What collection does with one group (docs/algorithm.md §3, §13).

    ``retire``: the question is solved for good (binary K/K); ``bucket``: the question's new bucket (1..K−1 are
    sampled), or None when the group carries no learning signal (binary 0/K, a flat continuous group): then the
    ``zero_success`` rule applies; ``members``: indices into the group's members of the fresh ones to store.
    """

    retire: bool = False
    bucket: int | None = None
    members: tuple[int, ...] = ()


class RewardMode(ABC):
    """Base class of the reward modes: a mode defines at least its collection rules (:meth:`planner`), its start
    signal (:meth:`start_signal`, :meth:`schedule_settings`); the other hooks have defaults."""

    #: the registered name (``exgrpo.reward_mode``), set by :func:`register_reward_mode`
    name: ClassVar[str] = ""
    #: the dataclass declaring the ``exgrpo.*`` keys this mode reads and no mode-independent code does (a mode
    #: extending another extends its options class, so a key they share is one declaration)
    options_class: ClassVar[type[ModeOptions]] = ModeOptions
    #: those keys as declared (derived from :attr:`options_class`, never set by hand)
    options: ClassVar[Mapping[str, Declared]] = {}
    #: a reward model (``reward.reward_model.enable``, real-valued scores) is a valid reward for this mode
    accepts_reward_model: ClassVar[bool] = False
    #: the per-step metric that shows this mode's training signal (the learning curves plot it)
    signal_metric: ClassVar[str] = "exgrpo/sampled_pass_rate"
    #: how that signal is called in plots and tables
    signal_label: ClassVar[str] = "batch pass rate of the sampled responses"
    #: how the buckets of this mode's pools read (the pool inspector): the label of bucket ``{b}`` (``{k}``: K), what
    #: the buckets mean, and an axis title
    bucket_wording: ClassVar[tuple[str, str, str]] = ("{b}", "buckets 0..{k_1}", "bucket")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "options" in cls.__dict__:
            raise TypeError(
                f"reward mode class {cls.__name__}: declare its keys as a ModeOptions dataclass (options_class), "
                "each with exgrpo.settings.setting(...); options is derived from it"
            )
        oc = cls.options_class
        if not (isinstance(oc, type) and issubclass(oc, ModeOptions) and dataclasses.is_dataclass(oc)):
            raise TypeError(f"reward mode class {cls.__name__}: options_class must be a ModeOptions dataclass")
        undeclared = [f.name for f in dataclasses.fields(oc) if f.name not in declared(oc)]
        if undeclared:
            raise TypeError(f"{oc.__name__}: declare every key with exgrpo.settings.setting(...), not {undeclared}")
        cls.options = declared(oc)

    # ------------------------------------------------------------------ config (class level: a config suffices)
    @classmethod
    def validate(cls, cfg: Any) -> None:
        """The checks across this mode's keys (``cfg.mode_options``; each key's own type, range and choices are
        checked from its declaration before), through ``exgrpo.checks`` (collected with the config's problems).
        A check that reads a key whose own check may have failed tests the value first."""
        return None

    @classmethod
    def foreign_option_problem(cls, key: str, value: Any) -> str | None:
        """A message for ``exgrpo.<key>`` (a key of another mode) set in a run of this mode, when the generic one
        would not say what to do instead; None for the generic one."""
        return None

    @classmethod
    @abstractmethod
    def schedule_settings(cls, cfg: Any) -> dict[str, Any]:
        """Keyword arguments of ``ExperienceSchedule`` that say what starts mixed mode (``signal``, ``threshold``,
        ``start_steps``)."""

    @classmethod
    def describe(cls, cfg: Any) -> str:
        """This mode's part of the dry run's one-line summary of a launch."""
        return f"reward_mode={cls.name}"

    @classmethod
    def from_config(cls, cfg: Any) -> RewardMode:
        """The instance the pool and the manager use, with the settings of a validated ``cfg`` resolved."""
        return cls()

    # ------------------------------------------------------------------ the pool's header tag
    def settings(self) -> dict[str, Any]:
        """What the saved pool's header records of the mode (its settings section); :func:`saved_mode_name` reads
        the name back."""
        return {"reward_mode": self.name}

    # ------------------------------------------------------------------ collection
    @abstractmethod
    def planner(
        self,
        groups: Sequence[Any],
        k: int,
        *,
        count_replayed: bool,
        stats: Any,
        check_size: Callable[[Any], None],
    ) -> Callable[[int, Any], GroupPlan]:
        """For one collect call over ``groups`` (``Group`` objects), the function ``(index, group) -> GroupPlan``
        the writer calls in order, once per group of a question that is not retired (nor retired by an earlier plan
        of the call): it asks for every plan of the call before it applies the first (it checks the arrays of all
        the members to store in between), so a plan must depend on the groups only, not on the pool.
        ``check_size(group)`` raises for a group without K members; a mode that plans the whole call up front checks
        every group first, so a malformed group stops the call before anything changes. ``stats`` is the call's
        ``CollectStats``."""

    def new_stats(self) -> dict[str, Any]:
        """The mode's own figures of one collect call (``CollectStats.mode_stats``), empty."""
        return {}

    def count_no_signal(self, stats: Any) -> None:
        """A group without learning signal reached the ``zero_success`` rule."""
        stats.zero_success += 1

    def count_bucket(self, stats: Any, bucket: int) -> None:
        """A group's bucket was computed (before the collection bounds are applied)."""
        return None

    def collect_metrics(self, stats: Any, prefix: str) -> dict[str, float]:
        """The metrics of ``stats.mode_stats`` (beside the figures every mode reports)."""
        return {}

    # ------------------------------------------------------------------ delayed start
    @abstractmethod
    def start_signal(self, rewards: Any) -> float:
        """The value of a step's rewards (every member of every group) that the delayed start watches."""

    def switch_message(self, step: int, value: float, schedule: Any) -> str:
        """The line printed when mixed mode switches on after ``step``, whose signal was ``value``."""
        return f"[exgrpo] step {step}: mixed mode on"

    # ------------------------------------------------------------------ the trainer's reward figures
    def reward_metrics(
        self, scores: Any, replayed: Any, uids: Any, extra: Mapping[str, Any] | None = None
    ) -> dict[str, float]:
        """Figures of one step's rewards (``scores`` per row, ``replayed`` rows, group ``uids``, the reward's extra
        keys) that this mode logs beside verl's own."""
        return {}


REWARD_MODES: Registry[type[RewardMode]] = Registry("reward mode", key="exgrpo.reward_mode")


def register_reward_mode(name: str, **tags: Any) -> Callable[[type[RewardMode]], type[RewardMode]]:
    """Class decorator: register a :class:`RewardMode` subclass under ``name`` (sets its ``name``).

    Its options must not clash with another mode's: a key two modes read is one declaration (a mode extending
    another extends its options class), since a run of a third mode requires its default.
    """

    def decorator(cls: type[RewardMode]) -> type[RewardMode]:
        if not (isinstance(cls, type) and issubclass(cls, RewardMode)):
            raise TypeError(f"reward mode {name!r} must be a RewardMode subclass, got {cls!r}")
        for key, option in cls.options.items():
            for other_name, other in REWARD_MODES.items():
                theirs = other.options.get(key)
                if theirs is None or theirs == option:
                    continue
                if theirs.default != option.default:
                    raise ValueError(
                        f"reward mode {name!r}: option exgrpo.{key} has default {option.default!r}, but reward mode "
                        f"{other_name!r} reads the same key with default {theirs.default!r}"
                    )
                raise ValueError(
                    f"reward mode {name!r}: option exgrpo.{key} is declared differently from reward mode "
                    f"{other_name!r}'s ({option} vs {theirs}): one key, one declaration (extend "
                    f"{other.options_class.__name__} to read it)"
                )
        REWARD_MODES.register(name, **tags)(cls)
        cls.name = name
        return cls

    return decorator


def get_reward_mode(name: str) -> type[RewardMode]:
    """The mode registered under ``name``; an unknown name raises ``UnknownNameError`` (a ValueError and a KeyError)
    listing the registered ones."""
    return REWARD_MODES[name]


def option_declarations() -> dict[str, Declared]:
    """Every registered mode's keys as declared (the keys in registration order; a key two modes read is one
    declaration, :func:`register_reward_mode` sees to it)."""
    out: dict[str, Declared] = {}
    for mode in REWARD_MODES.values():
        for key, option in mode.options.items():
            out.setdefault(key, option)
    return out


def option_owners(key: str) -> list[str]:
    """The registered modes that read ``exgrpo.<key>``."""
    return [name for name, mode in REWARD_MODES.items() if key in mode.options]


def saved_mode_name(settings: Mapping[str, Any]) -> str:
    """The mode a saved pool was collected in, from its header's settings section."""
    return str(settings.get("reward_mode", DEFAULT_REWARD_MODE))
