"""One small registry for every pluggable piece of the recipe (bucket weightings, trajectory metrics, shaping
functions), in the style of verl's ``register_policy_loss``: adding a variant is one decorated function.

    SHAPINGS = Registry("shaping function", key="exgrpo.shaping")

    @SHAPINGS.register("policy_shaping")
    def policy_shaping(log_ratio, *, beta): ...

    fn = SHAPINGS[cfg.shaping]              # unknown name: UnknownNameError with the registered names, a did-you-mean
    fn = SHAPINGS.get(name)                 # unknown name: None (or the default given), as for any Mapping

Rules, the same everywhere: a name is registered once (a second registration is an error, even of the same
function, so two modules cannot silently fight over a name); ``REGISTRY[name]`` of an unknown name raises
:class:`UnknownNameError` (a ``KeyError``, and a ``ValueError`` since the name is usually a config value) naming
the registered names and the closest match; per-entry facts (e.g. "this weighting is per question") are keyword
tags stored with the entry, not side tables. A registry is a read-only ``Mapping`` of name → object, so
``name in REGISTRY``, ``sorted(REGISTRY)`` and ``REGISTRY.get(name, default)`` work as for a dict.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "UnknownNameError"]

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name no entry of a registry has: a ``KeyError`` for the ``Mapping`` (``get``, ``in``), a ``ValueError`` for
    the caller whose name came from a setting. Its text names the registered names and the closest match."""

    def __str__(self) -> str:
        # KeyError would print the repr of the message (quoted); this is a sentence
        return str(self.args[0]) if self.args else ""


class Registry(Mapping[str, T], Generic[T]):
    """Named objects of one kind. ``kind`` names them in errors; ``key`` is the config key that selects one."""

    def __init__(self, kind: str, *, key: str | None = None):
        self.kind = kind
        self.key = key
        self._entries: dict[str, T] = {}
        self._tags: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ registration
    def register(self, name: str, **tags: Any) -> Callable[[T], T]:
        """Decorator registering its argument under ``name``; ``tags`` are facts about the entry (:meth:`tag`)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty string name, got {name!r}")

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = obj
            self._tags[name] = dict(tags)
            return obj

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name`` (for tests that register a temporary entry)."""
        self._entries.pop(name, None)
        self._tags.pop(name, None)

    # ------------------------------------------------------------------ lookup
    def __getitem__(self, name: str) -> T:
        """The object registered under ``name``; an unknown name (or one that is no name at all, e.g. a list) is an
        :class:`UnknownNameError` naming the registered ones and the closest match. ``get`` is the ``Mapping``'s:
        ``default`` (None) for an unknown name."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.unknown_message(name)) from None

    def tag(self, name: str, tag: str, default: Any = None) -> Any:
        """A fact registered with the entry (``register(name, tag=value)``); an unknown ``name`` raises as ``[]``."""
        self[name]
        return self._tags[name].get(tag, default)

    def names_with(self, tag: str) -> list[str]:
        """Names whose entry carries a truthy ``tag``."""
        return [n for n in self._entries if self._tags[n].get(tag)]

    def unknown_message(self, name: Any) -> str:
        """The error text for an unknown name: what is registered, and the closest match."""
        close = difflib.get_close_matches(str(name), list(self._entries), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        where = f" ({self.key})" if self.key else ""
        return f"unknown {self.kind} {name!r}{where}; registered: {sorted(self._entries)}{hint}"

    # ------------------------------------------------------------------ Mapping
    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"
