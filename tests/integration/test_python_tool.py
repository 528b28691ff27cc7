"""The tool-integrated-reasoning Python tool (recipe/exgrpo/agent_tools/python_tool.py) through verl's own function
tool loader, as the TIR launch scripts wire it: it loads by path, its schema names the one ``code`` argument, a call
runs in the sandbox (exgrpo/sandbox/runner.py, whose protections tests/unit/test_sandbox.py checks one by one) and every
failure is an answer, never an exception out of the tool.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from exgrpo.sandbox import isolation_available

REPO = Path(__file__).resolve().parents[2]
TOOL_FILE = REPO / "recipe" / "exgrpo" / "agent_tools" / "python_tool.py"
_AVAILABLE = isolation_available()


@pytest.fixture(scope="module")
def tool():
    from verl.tools.function_tool import load_function_tools_from_path

    (loaded,) = load_function_tools_from_path(str(TOOL_FILE))
    return loaded


def call(tool, arguments: dict) -> str:
    return asyncio.run(tool.call(arguments))


def test_verl_loads_the_tool_with_its_schema(tool):
    assert tool.name == "python"
    assert list(tool.tool_schema.function.parameters.properties) == ["code"]
    assert "sandbox" in tool.tool_schema.function.description


@pytest.mark.skipif(not (_AVAILABLE["landlock_abi"] and _AVAILABLE["seccomp"]), reason=f"no isolation: {_AVAILABLE}")
def test_a_call_runs_confined_and_failures_are_answers(tool, monkeypatch, tmp_path):
    monkeypatch.setenv("EXGRPO_SANDBOX_TIMEOUT_S", "2")
    assert call(tool, {"code": "print(sum(range(101)))"}) == "5050"
    # an exception: the traceback's end comes back
    assert "ZeroDivisionError" in call(tool, {"code": "1 / 0"})
    # a write outside the sandbox's temp dir fails (tests/unit/test_sandbox.py shows the control)
    target = tmp_path / "escaped.txt"
    answer = call(tool, {"code": f"open({str(target)!r}, 'w').write('x')"})
    assert "PermissionError" in answer and not target.exists()
    # a loop past the wall clock is stopped and says so
    assert "timed out" in call(tool, {"code": "while True:\n    pass"})
    # the model sent a number, not source
    assert call(tool, {"code": 42}).startswith("error: code must be a string")


def test_a_bad_limit_in_the_environment_is_an_answer_naming_the_variable(tool, monkeypatch):
    monkeypatch.setenv("EXGRPO_SANDBOX_MEMORY_MB", "lots")
    answer = call(tool, {"code": "print(1)"})
    assert answer.startswith("error: the sandbox could not run the code") and "EXGRPO_SANDBOX_MEMORY_MB" in answer
