"""The problem-collecting checks behind every ``exgrpo.*`` validation: the config's own keys and those a reward mode
owns (``exgrpo.modes``) report through the same functions, so one :class:`ConfigError` lists every problem of the
block at once.

Inside ``with collecting():`` each ``check_*`` / ``fail`` appends its message (naming the key as ``exgrpo.<key>``
and the allowed range) instead of raising; at the end of the block one ``ConfigError`` lists them all. Outside
such a block the first problem raises at once. Every check returns whether the value is valid, so a check that
depends on another can be skipped after it failed.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import math
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["ConfigError", "check_bool", "check_choice", "check_float", "check_int", "collecting", "fail", "range_text"]


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
def collecting() -> Iterator[list[str]]:
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


def fail(message: str) -> bool:
    """Report one problem: collected inside ``_collecting``, raised outside it. Returns False (check failed)."""
    problems = _PROBLEMS.get()
    if problems is None:
        raise ConfigError(message)
    problems.append(message)
    return False


# Each check reports through ``_fail`` (collected during validation) and returns whether the value is valid.
def check_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        return fail(f"exgrpo.{key} must be true or false, got {value!r}")
    return True


def range_text(lo: object, hi: object, lo_open: bool, hi_open: bool) -> str:
    """The interval as the messages write it, ``[0.0, 1.0)``; None is unbounded, a bound may be symbolic (``K-2``)."""
    left = "-inf" if lo is None else f"{lo}"
    right = "inf" if hi is None else f"{hi}"
    return f"{'(' if lo_open or lo is None else '['}{left}, {right}{')' if hi_open or hi is None else ']'}"


def check_int(value: Any, key: str, lo: int | None = None, hi: int | None = None, hint: str = "") -> bool:
    rng = range_text(lo, hi, False, False)
    extra = f" ({hint})" if hint else ""
    if isinstance(value, bool) or not isinstance(value, int):
        return fail(f"exgrpo.{key} must be an integer in {rng}{extra}, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return fail(f"exgrpo.{key} must be an integer in {rng}{extra}, got {value!r}")
    return True


def check_float(
    value: Any,
    key: str,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    hint: str = "",
) -> bool:
    rng = range_text(lo, hi, lo_open, hi_open)
    extra = f" ({hint})" if hint else ""
    msg = f"exgrpo.{key} must be a number in {rng}{extra}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return fail(msg)
    if lo is not None and (value < lo or (lo_open and value == lo)):
        return fail(msg)
    if hi is not None and (value > hi or (hi_open and value == hi)):
        return fail(msg)
    return True


def check_choice(value: Any, key: str, choices: tuple[str, ...]) -> bool:
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return fail(f"exgrpo.{key} must be one of {list(choices)}, got {value!r}{hint}")
    return True
