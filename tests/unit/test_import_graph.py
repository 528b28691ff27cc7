"""The import graph of the project: no circle anywhere, and no import from a lower layer to a higher one.

Every import statement counts (module level, inside ``if TYPE_CHECKING:`` and inside functions; relative imports
resolved). The layers, lowest first (docs/architecture.md):

0. ``exgrpo`` — the algorithm, framework-free;
1. ``data_preprocess`` — dataset commands (they may use the core's prompts and rewards);
2. ``recipe.exgrpo.verl_compat`` — every private name of verl/vLLM the recipe touches;
3. ``recipe.exgrpo.cpu`` — the CPU backend (plugin, rollouts, engines, weight sync, run config), and
   ``recipe.exgrpo.runtime`` — operations (stage deadlines, stacks, Ray job shipping, the gradient-norm guard);
4. the training path — the modules at the top of ``recipe.exgrpo`` (entry point, loss, config bridge, ...) and the
   trainer adapters (``recipe.exgrpo.legacy``);
5. ``recipe.exgrpo.launch_checks`` — launch checking (dry run, env check, memory estimate), and
   ``recipe.exgrpo.harness`` — the CPU demo and the test harness (assets, demo, curves, process sampling);
6. the command names kept at the top of ``recipe.exgrpo`` (``cpu_demo``, ``env_check``, ``dry_run``) and
   ``benchmarks``.

A module may import its own layer (without a circle) and the layers below it.

And no module imports a test file (``test_*.py``): a test file holds tests only, what two of them share lives in
``tests/helpers/`` or a ``conftest.py``. That counts the imports above, and those of the Python code a module runs in a
subprocess (a string that parses as Python, ``python -c CODE``) or names (a dotted name in a string, ``python -m``,
``importlib.import_module``).
"""

from __future__ import annotations

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("exgrpo", "data_preprocess", "recipe", "benchmarks")
#: the top-level modules of recipe.exgrpo that are command names only (each runs another module's main)
COMMANDS = ("recipe.exgrpo.cpu_demo", "recipe.exgrpo.env_check", "recipe.exgrpo.dry_run")


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> int:
    if _in(module, "exgrpo"):
        return 0
    if _in(module, "data_preprocess"):
        return 1
    if module == "recipe.exgrpo.verl_compat":
        return 2
    if _in(module, "recipe.exgrpo.cpu") or _in(module, "recipe.exgrpo.runtime"):
        return 3
    if _in(module, "recipe.exgrpo.launch_checks") or _in(module, "recipe.exgrpo.harness"):
        return 5
    if module in COMMANDS or _in(module, "benchmarks"):
        return 6
    return 4  # recipe, recipe.exgrpo and the training path


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for top in PACKAGES:
        for f in (REPO / top).rglob("*.py"):
            parts = f.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _absolute(node: ast.ImportFrom, module: str, path: pathlib.Path) -> str:
    """The absolute module name of a (possibly relative) ``from ... import``."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def graph_of(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, m, f)
                subs = [f"{source}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in mods] + ([source] if any(s not in mods for s in subs) else [])
            else:
                continue
            graph[m].update(t for t in targets if t in mods and t != m)
    return graph


def _graph() -> dict[str, set[str]]:
    return graph_of(_modules())


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges from a lower layer to a higher one."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer_of(b) > layer_of(a))


def test_the_project_has_no_import_circle():
    assert cycles(_graph()) == []


def test_no_module_imports_a_higher_layer():
    assert upward_imports(_graph()) == []


def test_the_checks_see_a_circle_and_an_upward_import():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert upward_imports({"recipe.exgrpo.cpu.plugin": {"recipe.exgrpo.main_exgrpo"}}) == [
        ("recipe.exgrpo.cpu.plugin", "recipe.exgrpo.main_exgrpo")
    ]
    assert upward_imports({"recipe.exgrpo.runtime.stacks": {"recipe.exgrpo.harness.procs"}}) == [
        ("recipe.exgrpo.runtime.stacks", "recipe.exgrpo.harness.procs")
    ]
    graph = _graph()
    assert "exgrpo.experience.weightings" in graph["exgrpo.config"]  # the lazy import inside validate() counts
    assert "exgrpo.config" in graph["exgrpo.experience.sampler"]  # so does the TYPE_CHECKING one
    assert "recipe.exgrpo.cpu.hf_rollout" in graph["recipe.exgrpo.cpu.plugin"]  # and a relative one
    # every module was classified, and each layer holds some
    assert {layer_of(m) for m in graph} == set(range(7))


#: the trainer-neutral replay step, and what it may never reach: a trainer adapter, the entry point, verl's private
#: names, or verl / Ray / vLLM themselves (at module level or inside a function)
REPLAY_STEP = "recipe.exgrpo.replay_step"
TRAINER_SIDE = ("recipe.exgrpo.legacy", "recipe.exgrpo.main_exgrpo", "recipe.exgrpo.verl_compat", "recipe.exgrpo.cpu")
FRAMEWORKS = ("verl", "ray", "vllm")


def reached_from(graph: dict[str, set[str]], roots: list[str]) -> set[str]:
    """Every project module the ``roots`` import, directly or through others (the roots included)."""
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph.get(m, ()))
    return seen


def framework_imports(path: pathlib.Path) -> list[str]:
    """The imports of ``path`` (any statement, anywhere in it) whose top-level package is one of FRAMEWORKS."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out += [n for n in names if n.split(".")[0] in FRAMEWORKS]
    return out


def replay_step_problems(mods: dict[str, pathlib.Path], graph: dict[str, set[str]]) -> list[str]:
    roots = [m for m in mods if m == REPLAY_STEP or m.startswith(REPLAY_STEP + ".")]
    reached = reached_from(graph, roots)
    problems = [f"reaches {m}" for m in sorted(reached) if any(_in(m, side) for side in TRAINER_SIDE)]
    for m in sorted(reached):
        problems += [f"{m} imports {name}" for name in framework_imports(mods[m])]
    return problems


def test_the_replay_step_imports_no_trainer_and_no_verl():
    mods = _modules()
    assert [m for m in mods if m.startswith(REPLAY_STEP + ".")], "the replay step package is gone"
    assert replay_step_problems(mods, graph_of(mods)) == []


def test_the_replay_step_check_sees_a_trainer_and_a_lazy_verl_import(tmp_path):
    mods = _modules()
    graph = graph_of(mods)
    graph[REPLAY_STEP + ".step"] = graph[REPLAY_STEP + ".step"] | {"recipe.exgrpo.legacy.trainer"}
    assert "reaches recipe.exgrpo.legacy.trainer" in replay_step_problems(mods, graph)
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from verl.protocol import DataProto\n    import ray\n")
    assert framework_imports(lazy) == ["verl.protocol", "ray"]
    with_lazy = {**mods, REPLAY_STEP + ".lazy": lazy}
    assert replay_step_problems(with_lazy, graph_of(with_lazy)) == [
        f"{REPLAY_STEP}.lazy imports verl.protocol",
        f"{REPLAY_STEP}.lazy imports ray",
    ]


# ------------------------------------------------------------------------------------------------ test files
#: where a module that imports a test file could be: every package above and the tests
TEST_FILE_SCAN = (*PACKAGES, "tests")
#: a dotted module name under tests/ whose last part names a test file
_TEST_MODULE_NAME = re.compile(r"(?<![\w.])tests(?:\.\w+)*\.test_\w+")


def is_test_file(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("test_")


def _imports_in(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """The modules the import statements of ``tree`` name (``from a import b``: ``a`` and ``a.b``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """What a module's source imports: its import statements, those of the Python code in its strings, and the
    dotted test-module names its strings hold."""
    tree = ast.parse(source)
    out = _imports_in(tree, module, is_package)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.update(_TEST_MODULE_NAME.findall(node.value))
            try:
                code = ast.parse(node.value)
            except (SyntaxError, ValueError):
                continue  # not Python
            out.update(_imports_in(code, module, is_package))
    return out


def imports_of_test_files(root: pathlib.Path = REPO, tops: tuple[str, ...] = TEST_FILE_SCAN) -> list[tuple[str, str]]:
    """(importing module, imported test file) for every import of a test file under ``root``'s ``tops``."""
    found = []
    for top in tops:
        for f in sorted((root / top).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            imported = imported_modules(f.read_text(encoding="utf-8"), module, f.name == "__init__.py")
            found += [(module, m) for m in sorted(imported) if m.startswith("tests.") and is_test_file(m)]
    return found


def test_no_module_imports_a_test_file():
    assert imports_of_test_files() == []


def test_the_check_sees_every_way_of_importing_a_test_file(tmp_path):
    files = {
        "tests/__init__.py": "",
        "tests/helpers/__init__.py": "",
        "tests/helpers/fine.py": "import json\nfrom tests.helpers import fine\n",  # imports no test file
        "tests/unit/__init__.py": "",
        "tests/unit/TEST_a.py": "from tests.unit.TEST_b import helper\n",
        "tests/unit/TEST_b.py": "def helper():\n    from . import TEST_a\n",  # relative, inside a function
        "tests/unit/TEST_c.py": "import tests.unit.TEST_a as a\nfrom tests.unit import TEST_b, other\n",
        # code run in a subprocess, and a module run by name
        "tests/unit/TEST_d.py": (
            'CODE = """\nfrom tests.unit.TEST_d import x\n"""\nARGS = ["-m", "tests.unit.TEST_a"]\n'
        ),
        "benchmarks/bench.py": 'import importlib\nM = importlib.import_module("tests.unit.TEST_c")\n',
    }
    # (written "TEST_" here, so that this file's own strings import no test file)
    for name, text in files.items():
        path = tmp_path / name.replace("TEST_", "test_")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("TEST_", "test_"), encoding="utf-8")
    expected = [
        ("tests.unit.TEST_a", "tests.unit.TEST_b"),
        ("tests.unit.TEST_b", "tests.unit.TEST_a"),
        ("tests.unit.TEST_c", "tests.unit.TEST_a"),
        ("tests.unit.TEST_c", "tests.unit.TEST_b"),
        ("tests.unit.TEST_d", "tests.unit.TEST_a"),
        ("tests.unit.TEST_d", "tests.unit.TEST_d"),
        ("benchmarks.bench", "tests.unit.TEST_c"),
    ]
    found = imports_of_test_files(tmp_path, ("tests", "benchmarks"))
    assert found == [(a.replace("TEST_", "test_"), b.replace("TEST_", "test_")) for a, b in expected]
