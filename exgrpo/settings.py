"""How an ``exgrpo.*`` key is declared: once, as a dataclass field made by :func:`setting`, with its type (the
annotation), its default, its allowed range or choices, a hint for the error message and one line of help.

    @dataclass
    class ExGRPOConfig:
        replay_ratio: float = setting(0.5, lo=0.0, hi=1.0, hi_open=True, help="rho: share of ... replayed")

The declarations drive everything generic about a key: validation of its type, range and choices
(:func:`check_settings`, one loop, problems reported through ``exgrpo.checks`` so they join every other problem of
the block), the list of keys, the defaults the recipe's yaml must show, and the settings reference
(:meth:`Declared.allowed`, ``exgrpo.config.settings_reference``). What depends on several keys (the bucket bounds
against each other, a reward mode's "this choice needs that key", verl's settings) stays explicit code next to the
loop.

A bound may be relative to the group size K (``hi=K - 2``): it is resolved with the config's K, and the key is not
checked while K is unknown or invalid. ``choices`` is a tuple, any iterable of names read at validation time (a
:class:`~exgrpo.registry.Registry`, so a newly registered entry is accepted), or a function returning one (to import
a registry lazily).

A reward mode's own keys are declared the same way, in a dataclass subclassing :class:`ModeOptions`, in the mode's
module (``exgrpo/modes/``). This module imports nothing of the project but ``exgrpo.checks``.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from exgrpo.checks import check_bool, check_choice, check_float, check_int, fail, range_text

__all__ = [
    "K",
    "Declared",
    "KRelative",
    "ModeOptions",
    "Setting",
    "check_settings",
    "declared",
    "setting",
]

#: the dataclass field metadata key under which a :class:`Setting` is stored
METADATA_KEY = "exgrpo_setting"
#: the types a key may have (optionally ``| None``)
SCALAR_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class KRelative:
    """A bound relative to the group size K: ``K - 2`` is ``KRelative(-2)``."""

    offset: int = 0

    def __add__(self, n: int) -> KRelative:
        return KRelative(self.offset + n)

    def __sub__(self, n: int) -> KRelative:
        return KRelative(self.offset - n)

    def resolve(self, k: int) -> int:
        return k + self.offset

    def __str__(self) -> str:
        return "K" if self.offset == 0 else f"K{self.offset:+d}"


#: the group size K, for bounds relative to it (``hi=K - 1``)
K = KRelative()

Bound = int | float | KRelative | None
Choices = tuple[str, ...] | Iterable[str] | Callable[[], Iterable[str]] | None


@dataclass(frozen=True)
class Setting:
    """What :func:`setting` records about a key (the field's metadata); its type is the field's annotation."""

    default: Any
    help: str
    lo: Bound = None
    hi: Bound = None
    lo_open: bool = False
    hi_open: bool = False
    choices: Choices = None
    #: added to the error message, in parentheses (what a special value means, why the range)
    hint: str = ""
    #: where the trainer takes the value from when it is not a key users write (e.g. K from the rollout config)
    filled_from: str | None = None


def setting(
    default: Any,
    *,
    help: str,
    lo: Bound = None,
    hi: Bound = None,
    lo_open: bool = False,
    hi_open: bool = False,
    choices: Choices = None,
    hint: str = "",
    filled_from: str | None = None,
) -> Any:
    """A dataclass field declaring one ``exgrpo.*`` key: its default, allowed range (``lo``/``hi``, closed unless
    ``lo_open``/``hi_open``) or ``choices``, the error's ``hint`` and one line of ``help`` (the settings reference).
    The key's type is the field's annotation (bool, int, float or str, optionally ``| None``: null is then allowed
    and never range-checked)."""
    if not isinstance(help, str) or not help.strip() or "\n" in help:
        raise ValueError(f"a setting needs one line of help, got {help!r}")
    if choices is not None and (lo is not None or hi is not None):
        raise ValueError("a setting has a range or choices, not both")
    meta = Setting(default, help.strip(), lo, hi, lo_open, hi_open, choices, hint, filled_from)
    return dataclasses.field(default=default, metadata={METADATA_KEY: meta})


@dataclass(frozen=True)
class Declared:
    """One declared key: the :class:`Setting` with its name and its type resolved from the annotation."""

    key: str
    type: type
    nullable: bool
    setting: Setting

    @property
    def default(self) -> Any:
        return self.setting.default

    @property
    def help(self) -> str:
        return self.setting.help

    @property
    def relative_to_k(self) -> bool:
        return isinstance(self.setting.lo, KRelative) or isinstance(self.setting.hi, KRelative)

    def choices(self) -> tuple[str, ...] | None:
        """The allowed values now (a registry's names as registered at this moment), or None for a range."""
        c = self.setting.choices
        if c is None:
            return None
        if callable(c):
            c = c()
        return tuple(c)

    def type_name(self) -> str:
        return self.type.__name__ + (" | None" if self.nullable else "")

    def allowed(self) -> str:
        """What values are allowed, as the reference shows it: ``[0.0, 1.0)``, ``one of: a | b``, ``true | false``;
        ``| null`` when null is allowed."""
        s = self.setting
        if self.type is bool:
            text = "true | false"
        elif (choices := self.choices()) is not None:
            text = "one of: " + " | ".join(choices)
        elif self.type in (int, float):
            text = range_text(s.lo, s.hi, s.lo_open, s.hi_open)
        else:
            text = "any string"
        return text + (" | null" if self.nullable else "")

    def check(self, value: Any, k: int | None = None) -> bool:
        """Check ``value`` against this declaration (through ``exgrpo.checks``: collected while validating);
        ``k`` resolves bounds relative to K. Returns whether it is valid."""
        if value is None and self.nullable:
            return True
        s = self.setting
        if self.type is bool:
            return check_bool(value, self.key)
        choices = self.choices()
        if choices is not None:
            return check_choice(value, self.key, choices)
        lo, hi = (b.resolve(k) if isinstance(b, KRelative) and k is not None else b for b in (s.lo, s.hi))
        if self.type is int:
            return check_int(value, self.key, lo=lo, hi=hi, hint=s.hint)  # type: ignore[arg-type]
        if self.type is float:
            return check_float(value, self.key, lo=lo, hi=hi, lo_open=s.lo_open, hi_open=s.hi_open, hint=s.hint)
        if not isinstance(value, str):
            return fail(f"exgrpo.{self.key} must be a string, got {value!r}")
        return True


def _resolve_type(owner: type, key: str, annotation: Any) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of a field's resolved annotation."""
    args: tuple[Any, ...] = (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
    nullable = type(None) in args
    rest = [a for a in args if a is not type(None)]
    if len(rest) != 1 or rest[0] not in SCALAR_TYPES:
        raise TypeError(
            f"{owner.__name__}.{key}: a setting's type must be one of bool, int, float, str (optionally | None), "
            f"got {annotation!r}"
        )
    return rest[0], nullable


@functools.cache
def declared(cls: type) -> dict[str, Declared]:
    """The keys ``cls`` (a dataclass) declares with :func:`setting`, in declaration order (inherited ones first)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Declared] = {}
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(METADATA_KEY)
        if meta is None:
            continue
        kind, nullable = _resolve_type(cls, f.name, hints[f.name])
        if kind is int and (meta.lo_open or meta.hi_open):
            raise TypeError(f"{cls.__name__}.{f.name}: an integer setting's range is closed (use lo=1, not lo=0 open)")
        out[f.name] = Declared(f.name, kind, nullable, meta)
    return out


def check_settings(
    obj: Any,
    *,
    k: int | None = None,
    skip: Iterable[str] = (),
    then: Mapping[str, Callable[[Mapping[str, bool]], Any]] | None = None,
) -> dict[str, bool]:
    """Check every declared key of ``obj`` (a dataclass instance) against its declaration, in declaration order;
    problems go through ``exgrpo.checks`` (inside ``collecting()`` they are all reported together). ``k``: the
    validated group size, or None when it is unknown or invalid: the keys with bounds relative to K are then left
    unchecked. ``then[key]``: a check across keys, called with the validity of the keys checked so far right after
    ``key``'s own check (so the problems stay in the order of the keys). Returns, per checked key, whether its
    value is valid."""
    skipped = set(skip)
    after = then or {}
    valid: dict[str, bool] = {}
    for d in declared(type(obj)).values():
        if d.key not in skipped and not (d.relative_to_k and k is None):
            valid[d.key] = d.check(getattr(obj, d.key), k)
        if d.key in after:
            after[d.key](valid)
    return valid


OptionsT = TypeVar("OptionsT", bound="ModeOptions")


@dataclass
class ModeOptions:
    """Base of a reward mode's options: a dataclass whose fields are the ``exgrpo.*`` keys the mode reads, each
    declared with :func:`setting` (``exgrpo/modes/``). The config holds the options of its run's mode as
    ``ExGRPOConfig.mode_options``; :meth:`of` returns them typed."""

    @classmethod
    def of(cls: type[OptionsT], cfg: Any) -> OptionsT:
        """``cfg.mode_options`` as this class (the options of ``cfg``'s reward mode, or of a mode extending it)."""
        options = cfg.mode_options
        if not isinstance(options, cls):
            raise TypeError(
                f"exgrpo.reward_mode={cfg.reward_mode}: the config holds {type(options).__name__}, not {cls.__name__}"
            )
        return options
