"""The sandbox tests' shared pieces (tests/unit/test_sandbox*.py): a call with limits given as keywords, the mark of
a test that needs Landlock and seccomp, the processes of a group. The fault injection (``left_out``) is a fixture of
tests/unit/conftest.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from exgrpo.sandbox import SandboxLimits, SandboxResult, isolation_available, run_python

AVAILABLE = isolation_available()
needs_isolation = pytest.mark.skipif(
    not (AVAILABLE["landlock_abi"] and AVAILABLE["seccomp"]), reason=f"no Landlock or seccomp here: {AVAILABLE}"
)


def run(code: str, **limits) -> SandboxResult:
    return run_python(code, SandboxLimits(**limits))


def live_in_group(pgid: int) -> list[int]:
    """The processes of a process group that are still alive (zombies waiting for a parent do not count)."""
    live = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                live.append(int(entry))
    return live


def wait_gone(pgid: int, within_s: float = 3.0) -> list[int]:
    end = time.monotonic() + within_s
    while (live := live_in_group(pgid)) and time.monotonic() < end:
        time.sleep(0.05)
    return live


def wait_for(condition, within_s: float = 30.0) -> bool:
    """Poll ``condition()`` until it holds or ``within_s`` passed (a deadline against a hang, never a measurement);
    its last value."""
    end = time.monotonic() + within_s
    while not (held := condition()) and time.monotonic() < end:
        time.sleep(0.02)
    return bool(held)
