"""The config and the experience package import each other in one direction only.

Every import statement counts (module level, inside ``if TYPE_CHECKING:`` and inside functions): the config
consults the registries of bucket weightings and trajectory metrics, whose modules import nothing of the config;
the components' ``from_config`` refer to the config, which imports none of them.
"""

from __future__ import annotations

import ast
import pathlib

CORE = pathlib.Path(__file__).resolve().parents[2] / "exgrpo"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for f in CORE.rglob("*.py"):
        parts = f.relative_to(CORE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _graph() -> dict[str, set[str]]:
    """module -> the exgrpo modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in mods] + ([node.module] if any(s not in mods for s in subs) else [])
            else:
                continue
            graph[m].update(t for t in targets if t in mods and t != m)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_through_the_config_or_the_experience_package():
    ours = [c for c in _cycles(_graph()) if any(m == "exgrpo.config" or m.startswith("exgrpo.experience") for m in c)]
    assert ours == []


def test_the_cycle_check_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _graph()
    assert "exgrpo.experience.weightings" in graph["exgrpo.config"]  # the lazy import inside validate() counts
    assert "exgrpo.config" in graph["exgrpo.experience.sampler"]  # so does the TYPE_CHECKING one
