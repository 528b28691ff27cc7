"""The core package must stay framework-free: nothing under exgrpo/ may import verl or ray."""

import ast
import pathlib
import subprocess
import sys

CORE = pathlib.Path(__file__).resolve().parents[2] / "exgrpo"
FORBIDDEN = ("verl", "ray")


def _imported_roots(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                roots.add(node.args[0].value.split(".")[0])
    return roots


def test_core_sources_do_not_import_verl_or_ray():
    files = sorted(CORE.rglob("*.py"))
    assert files, "no sources found under exgrpo/"
    offenders = {str(f.relative_to(CORE.parent)): sorted(_imported_roots(f) & set(FORBIDDEN)) for f in files}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"exgrpo/ must not import verl or ray: {offenders}"


def test_importing_every_core_module_loads_neither_verl_nor_ray():
    modules = [
        ".".join(f.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__")
        for f in sorted(CORE.rglob("*.py"))
        if f.name != "__main__.py"  # importing a __main__ runs its command line
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(CORE.parent))
