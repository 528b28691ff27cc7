"""The Python sandbox (exgrpo/sandbox/runner.py): every protection shown by injecting its violation.

Each fault test has a control that runs the same violation with the protection left out (``sandbox._LEFT_OUT``,
set by the ``left_out`` fixture of tests/unit/conftest.py) and sees it succeed, so the test's check can fail. Its
docstring also says what failed when the protection itself was taken out of the code. These run real violations on
this machine: safe ones (files under /tmp and the checkout, removed afterwards; a loopback connection to the test's
own socket; signal 0). What an attacker tried that these did not cover (reads, metadata, state beside the process,
other processes, the cleanup): tests/unit/test_sandbox_leaks.py.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
import tracemalloc
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exgrpo.sandbox import SandboxLimits, SandboxResult, run_python
from exgrpo.sandbox import child as _sandbox_child
from exgrpo.sandbox import runner as sandbox
from tests.helpers.sandbox import AVAILABLE, needs_isolation, run, wait_gone

REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------------------- the basics


@needs_isolation
def test_prints_come_back_confined_in_a_private_dir_with_a_minimal_env():
    code = "import os, json\nprint('hello', 6 * 7)\nprint(json.dumps([os.getcwd(), dict(os.environ)]))"
    result = run(code)
    assert (result.exit_code, result.error, result.timed_out, result.truncated) == (0, None, False, False)
    first, second = result.stdout.splitlines()
    assert first == "hello 42" and result.as_tool_text().startswith("hello 42\n")
    cwd, env = json.loads(second)
    assert Path(cwd).name.startswith("exgrpo-sandbox-") and env["HOME"] == env["TMPDIR"] == cwd
    threads = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LC_CTYPE"} | threads  # LC_CTYPE: Python's own C-locale coercion
    assert all(env[name] == "1" for name in threads)
    assert not Path(cwd).exists(), "the temp dir outlived the call"
    p = result.protections
    assert p["landlock_abi"] == AVAILABLE["landlock_abi"] and p["seccomp"] and p["no_new_privs"]
    assert p["rlimits"] and p["capabilities_dropped"] and p["reads_confined"] and not p["subprocess_allowed"]


@needs_isolation
def test_a_syntax_error_and_an_exception_come_back_as_text():
    bad = run("print('before')\ndef f(:\n    pass")
    assert bad.exit_code == 1 and bad.error is None and "before" not in bad.stdout  # compiled before running
    assert "SyntaxError" in bad.as_tool_text() and 'File "<tool>", line 2' in bad.as_tool_text()
    raised = run("print('partial')\nx = {}\nx['missing']")
    text = raised.as_tool_text()
    assert raised.exit_code == 1 and text.startswith("partial\n")
    assert "x['missing']" in text and text.rstrip().endswith("KeyError: 'missing'")  # source line, last line
    assert "child.py" not in text and str(sandbox.CHILD) not in text  # the bootstrap's frame is left out
    assert run("raise SystemExit(3)").exit_code == 3
    assert run("import sys; sys.exit('bye')").stderr.strip() == "bye"
    assert run("print(input())").stderr.rstrip().endswith("EOFError: EOF when reading a line")  # no hang on stdin


@needs_isolation
def test_site_packages_are_importable_only_when_allowed():
    """The trainer's installed libraries (numpy here; sympy on a GPU install) are there for ``site_packages=True``
    only; a library that starts a thread pool per core would not fit in the address-space limit without the
    one-thread settings."""
    code = "import numpy as np\nprint(int(np.linalg.det(np.diag([2.0, 3.0, 7.0])).round()))"
    assert "ModuleNotFoundError: No module named 'numpy'" in run(code).stderr
    allowed = run(code, site_packages=True, memory_mb=512, timeout_s=30, cpu_s=30)
    assert (allowed.exit_code, allowed.stdout) == (0, "42\n"), allowed.stderr
    # the confinement is the same with them: still no write outside the temp dir
    assert "PermissionError" in run("open('/tmp/site-escape', 'w')", site_packages=True).stderr


@needs_isolation
def test_no_state_survives_a_call_and_parallel_calls_stay_apart():
    assert run("open('state', 'w').write('1'); x = 1").exit_code == 0
    assert "NameError" in run("print(x)").stderr and "FileNotFoundError" in run("open('state')").stderr
    with ThreadPoolExecutor(4) as pool:  # the caller is a threaded actor: calls run side by side
        results = list(pool.map(lambda i: run(f"import time; time.sleep(0.2); print({i})"), range(8)))
    assert [r.stdout.strip() for r in results] == [str(i) for i in range(8)]


# -------------------------------------------------------------------------------------------------- time limits


@needs_isolation
def test_the_wall_clock_kills_the_whole_process_group():
    """Without the killpg on timeout (only the child killed, ``proc.kill()``), the sleepers stayed alive in the
    group and ``live_in_group`` listed them: this test failed."""
    code = (
        "import os, subprocess\n"
        "kids = [subprocess.Popen(['sleep', '60']).pid for _ in range(3)]\n"
        "print(os.getpid(), os.getpgrp(), *kids, flush=True)\n"
        "while True: pass\n"
    )
    start = time.monotonic()
    result = run(code, timeout_s=1.0, allow_subprocess=True)
    took = time.monotonic() - start
    pid, pgid, *kids = map(int, result.stdout.split())
    assert result.timed_out and result.exit_code == -9 and "timed out" in result.as_tool_text()
    assert pgid == pid and 1.0 <= took < 5.0
    assert wait_gone(pgid) == [], "a process of the sandbox outlived the call"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped too, not a zombie


@needs_isolation
def test_a_process_left_in_the_background_does_not_outlive_a_finished_call():
    """Without the killpg when the child exits (only the child killed), the sleeper lived on (``wait_gone`` listed
    it; the call returned after the 1 s drain, as the sleeper held the output pipe): this test failed. With the
    ``setsid`` rule taken out of the seccomp program, the escape started and outlived the call."""
    code = "import os, subprocess\nprint(os.getpgrp(), subprocess.Popen(['sleep', '60']).pid, flush=True)"
    start = time.monotonic()
    result = run(code, timeout_s=20.0, allow_subprocess=True)
    pgid, kid = map(int, result.stdout.split())
    assert result.exit_code == 0 and not result.timed_out and time.monotonic() - start < 5.0
    assert wait_gone(pgid) == []
    # and a descendant cannot leave the group the kill reaches (seccomp: setsid/setpgid fail)
    escape = run("import subprocess; subprocess.Popen(['sleep', '60'], start_new_session=True)", allow_subprocess=True)
    assert escape.stderr.rstrip().endswith("PermissionError: [Errno 1] Operation not permitted")


@needs_isolation
def test_a_cpu_loop_stops_at_the_cpu_limit_before_the_wall_clock(left_out):
    """With RLIMIT_CPU taken out of ``_set_rlimits``, the loop ran to the 30 s wall clock: timed_out, and the
    time check failed."""
    start = time.monotonic()
    result = run("while True: pass", cpu_s=1, timeout_s=30.0)
    assert not result.timed_out and time.monotonic() - start < 15.0
    assert result.exit_code == -24 and "CPU time limit of 1 s" in result.error  # SIGXCPU
    ignored = run(
        "import signal; signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass", cpu_s=1, timeout_s=30
    )
    assert ignored.exit_code == -9 and "CPU time limit" in ignored.error  # the hard limit, a second later
    left_out("rlimits")
    assert run("while True: pass", cpu_s=1, timeout_s=1.5).timed_out  # control: only the wall clock stops it


# --------------------------------------------------------------------------------------------------- memory, output


@needs_isolation
def test_allocating_4_gb_fails_under_a_256_mb_limit(left_out):
    """With RLIMIT_AS taken out of ``_set_rlimits``, ``bytearray(4 GB)`` was allocated and zeroed until the CPU limit
    killed it (exit -24): this test failed. The control maps 4 GB without touching it, which costs no memory."""
    result = run("x = bytearray(4 * 10**9)", memory_mb=256)
    assert result.exit_code == 1 and result.stderr.rstrip().endswith("MemoryError")
    assert "memory limit of 256 MB" in result.error
    # an untouched mapping costs no memory, so the control can run it without the limit
    mapping = "import mmap; m = mmap.mmap(-1, 4 << 30); print('mapped')"
    assert "OSError: [Errno 12] Cannot allocate memory" in run(mapping, memory_mb=256).stderr
    left_out("rlimits")
    assert run(mapping, memory_mb=256).stdout == "mapped\n"


@needs_isolation
def test_a_huge_print_comes_back_cut_and_the_parent_reads_only_the_cap():
    """With the capture keeping every chunk (``self.data += chunk``), the parent's traced peak was 309 MB."""
    tracemalloc.start()
    try:
        result = run("print('x' * 10**8)\nprint('done')", max_output_bytes=1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"the parent held {peak} bytes"
    assert result.exit_code == 0 and result.truncated
    text = result.as_tool_text()
    assert len(text.encode()) <= 1000 and text.startswith("xxx") and "bytes cut ...]" in text
    wrote = run("open('big', 'wb').write(b'x' * (2 << 20))", max_file_mb=1)  # RLIMIT_FSIZE: EFBIG, not a kill
    assert wrote.stderr.rstrip().endswith("OSError: [Errno 27] File too large")


def test_the_tool_text_keeps_the_head_of_stdout_the_tail_of_stderr_and_the_note():
    ok = SandboxResult("out\n", "a warning\n", 0, False, False, None)
    assert ok.as_tool_text() == "out"  # stderr only after a failure
    failed = SandboxResult("o" * 3000, "Traceback\n" + "e" * 3000 + "\nValueError: bad", 1, False, False, None)
    text = failed.as_tool_text()
    assert len(text.encode()) <= 4096 and text.startswith("ooo") and text.endswith("ValueError: bad")
    assert "[... " in text
    stopped = SandboxResult("é" * 5000, "", -9, True, True, "timed out: stopped after 5 s", max_output_bytes=200)
    text = stopped.as_tool_text()
    assert len(text.encode()) <= 200 and text.endswith("[timed out: stopped after 5 s]")


# ------------------------------------------------------------------------------------------------------ filesystem


@needs_isolation
def test_writes_outside_the_temp_dir_fail_and_inside_work(left_out, tmp_path):
    """With ``_landlock`` not applied (the control, and a mutated child file), both files were written and this test
    failed. (The checkout, or the test's tmp_path for a caller that may not write there.)"""
    mine = REPO if os.access(REPO, os.W_OK) else tmp_path
    outside = [Path("/tmp") / f"exgrpo-sandbox-probe-{uuid.uuid4().hex}", mine / f".sandbox-probe-{uuid.uuid4().hex}"]
    code = (
        "import sys\n"
        "open('inside.txt', 'w').write('kept'); print(open('inside.txt').read())\n"
        f"for path in {[str(p) for p in outside]!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('escaped')\n"
        "        print('WROTE', path)\n"
        "    except PermissionError as e:\n"
        "        print('denied', e.errno)\n"
        "open('/dev/null', 'w').write('fine')\n"
    )
    try:
        result = run(code)
        assert result.stdout.split("\n")[:3] == ["kept", "denied 13", "denied 13"], result.as_tool_text()
        assert result.exit_code == 0 and not any(p.exists() for p in outside)
        left_out("landlock")
        assert run(code).stdout.count("WROTE") == 2 and all(p.exists() for p in outside)
    finally:
        for p in outside:
            p.unlink(missing_ok=True)


@needs_isolation
def test_a_subprocess_inherits_the_confinement(left_out):
    """With ``_landlock`` not applied, the shell wrote the file outside and this test failed; with the fork rules
    taken out of the seccomp program, the shell started without ``allow_subprocess``."""
    target = Path("/tmp") / f"exgrpo-sandbox-probe-{uuid.uuid4().hex}"
    code = (
        "import subprocess\n"
        f"r = subprocess.run(['/bin/sh', '-c', 'echo hi > {target}; echo in > inside; cat inside'],"
        " capture_output=True, text=True)\n"
        "print(r.stdout.strip(), r.stderr.strip(), sep='|')\n"
    )
    try:
        result = run(code, allow_subprocess=True)
        assert result.stdout.startswith("in|") and "Permission denied" in result.stdout, result.as_tool_text()
        assert not target.exists()
        # without allow_subprocess no process can be started at all
        assert "PermissionError: [Errno 1]" in run(code).stderr and not target.exists()
        left_out("landlock")
        assert run(code, allow_subprocess=True).stdout.strip() == "in|" and target.exists()
    finally:
        target.unlink(missing_ok=True)


@needs_isolation
def test_the_temp_dir_is_removed_even_when_the_code_locks_it():
    """With ``_remove_tree`` taken out, the dirs stayed and this test failed. The code cannot chmod (seccomp), so it
    creates what it locks with the modes it wants: a directory it can fill but not list (0o300), an empty one with
    no permission at all; a caller that is not root needs to give them back their rights to remove them."""
    code = (
        "import os\nos.mkdir('a', 0o300)\nos.makedirs('a/b/c')\nopen('a/b/f', 'w').close()\nos.mkdir('a/b/c/d', 0)\n"
        "os.mkdir('e', 0)\nos.symlink('/usr', 'a/link')\n"
    )
    result = run(code + "print(os.getcwd())")
    assert result.exit_code == 0 and not Path(result.stdout.strip()).exists()
    timed = run(code + "print(os.getcwd(), flush=True)\nwhile True: pass", timeout_s=0.5)
    assert timed.timed_out and not Path(timed.stdout.strip()).exists()


# ------------------------------------------------------------------------------------------ network, limits, forks


@needs_isolation
def test_no_network(left_out):
    """With the ``socket`` rule taken out of the seccomp program, socket() worked and the first assertion failed
    (the connect was still refused by Landlock's TCP rule, errno 13); with Landlock's TCP rights taken out of the
    ruleset, the second assertion failed; with both layers left out, the connect succeeded (the control)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = server.getsockname()[1]
        attempts = (
            "socket.socket(socket.AF_INET)",
            "socket.socket(socket.AF_INET6)",
            "socket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
            "socket.socket(socket.AF_UNIX)",
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2)",
        )
        code = "import socket\n" + "".join(
            f"try:\n    {a}\n    print('OPEN')\nexcept OSError as e:\n    print(e.errno)\n" for a in attempts
        )
        code += "a, b = socket.socketpair(); a.sendall(b'pair'); print(b.recv(4).decode())\n"  # in-process: fine
        assert run(code).stdout.split() == ["1"] * 5 + ["pair"]
        left_out("seccomp")
        assert run(code).stdout.split() == ["OPEN"] * 4 + ["13", "pair"]  # Landlock (ABI >= 4) still denies TCP
        left_out("seccomp", "landlock")
        assert run(code).stdout.split() == ["OPEN"] * 5 + ["pair"]


@needs_isolation
def test_the_limits_cannot_be_raised_back(left_out):
    """Two layers: seccomp refuses every new limit, and the dropped capabilities (no CAP_SYS_RESOURCE) refuse a
    higher hard limit. With the ``prlimit64`` rule taken out of the program, the soft CPU limit went up to its hard
    one (no capability needed) and this test failed; the ``setrlimit`` rule is seen only by the direct syscall
    (glibc's setrlimit calls prlimit64): without it, that call raised. With both layers left out and
    CAP_SYS_RESOURCE in the caller's set, uid 0 can raise the hard limit and allocate 512 MB under memory_mb=256
    (this container lacks CAP_SYS_RESOURCE, so that last part skips here)."""
    nr = _sandbox_child.SYSCALLS[platform.machine()]["setrlimit"]
    code = (
        "import resource\n"
        "print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)\n"
        "import ctypes\n"
        "def direct():  # the setrlimit syscall itself, RLIMIT_CPU (0) to (2, 2)\n"
        f"    if ctypes.CDLL(None).syscall({nr}, 0, ctypes.byref((ctypes.c_uint64 * 2)(2, 2))) != 0:\n"
        "        raise OSError('refused')\n"
        "for call in (lambda: resource.setrlimit(resource.RLIMIT_AS, (-1, -1)),\n"
        "             lambda: resource.prlimit(0, resource.RLIMIT_AS, (-1, -1)),\n"
        "             lambda: resource.setrlimit(resource.RLIMIT_CPU, (2, 2)),  # soft (1) up to hard (2)\n"
        "             direct):\n"
        "    try:\n"
        "        call(); print('RAISED')\n"
        "    except (ValueError, OSError):  # EPERM: ValueError from setrlimit, PermissionError from prlimit\n"
        "        print('denied')\n"
        "try:\n"
        "    x = bytearray(512 << 20); print('ALLOCATED')\n"
        "except MemoryError:\n"
        "    print('MemoryError')\n"
    )
    assert run(code, memory_mb=256, cpu_s=1).stdout.split() == ["256"] + ["denied"] * 4 + ["MemoryError"]
    left_out("seccomp")
    assert run(code, memory_mb=256, cpu_s=1).stdout.split()[1:] == [
        "denied",
        "denied",
        "RAISED",
        "RAISED",
        "MemoryError",
    ]
    status = Path("/proc/self/status").read_text()
    cap_eff = int(status.split("CapEff:")[1].split()[0], 16)
    if not cap_eff >> 24 & 1:
        pytest.skip("no CAP_SYS_RESOURCE here: the hard limit cannot be raised even without the sandbox")
    left_out("seccomp", "capabilities")
    assert run(code, memory_mb=256, cpu_s=1).stdout.split()[1:] == ["RAISED"] * 4 + ["ALLOCATED"]


@needs_isolation
def test_a_fork_bomb_stops_at_the_first_fork(left_out):
    """Bounded by seccomp: without ``allow_subprocess`` no process can be created (fork, vfork, clone without
    CLONE_THREAD), so the bomb's first fork fails. (RLIMIT_NPROC would not bound it: uid 0 is exempt.) With the
    fork rules taken out of the program, the bomb ran to the 5 s wall clock (its group then killed): this test
    failed."""
    bomb = "import os\nwhile True:\n    os.fork()\n"
    result = run(bomb)
    assert result.exit_code == 1 and result.stderr.rstrip().endswith(
        "PermissionError: [Errno 1] Operation not permitted"
    )
    threads = "import threading\nt = threading.Thread(target=print, args=('thread',)); t.start(); t.join()"
    assert run(threads).stdout == "thread\n"  # threads still work
    left_out("seccomp")
    once = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint('forked', os.waitpid(pid, 0)[1])"
    assert run(once).stdout == "forked 0\n"


@needs_isolation
def test_no_signal_leaves_the_sandbox(left_out):
    """Landlock's signal scope (ABI >= 6): with the scope left out of the ruleset, kill(parent, 0) succeeded."""
    if AVAILABLE["landlock_abi"] < 6:
        pytest.skip("Landlock ABI < 6 has no signal scope")
    code = (
        f"import os\ntry:\n    os.kill({os.getpid()}, 0); print('SENT')\nexcept PermissionError:\n    print('denied')"
    )
    assert run(code).stdout == "denied\n"
    left_out("landlock")
    assert run(code).stdout == "SENT\n"


@needs_isolation
@pytest.mark.skipif(platform.machine() != "x86_64", reason="an i386 syscall through int 0x80: x86_64 only")
def test_a_syscall_of_another_architecture_kills_the_process(left_out):
    """The filter's first check: seccomp_data.arch. With that check taken out, the i386 getpid went through."""
    code = (
        "import ctypes, mmap\n"
        "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "m.write(b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3')  # mov eax, 20 (i386 getpid); int 0x80; ret\n"
        "addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n"
        "print('pid' if ctypes.CFUNCTYPE(ctypes.c_int)(addr)() > 0 else 'no')\n"
    )
    result = run(code)
    assert result.exit_code == -31 and result.error == "killed by SIGSYS", result.as_tool_text()
    left_out("seccomp")
    unconfined = run(code)
    if unconfined.exit_code == -11:
        pytest.skip("this kernel has no i386 emulation: int 0x80 faults with or without the filter")
    assert unconfined.stdout == "pid\n"


def test_the_filter_checks_the_architecture_first():
    for arch, table in _sandbox_child.SYSCALLS.items():
        for allow in (False, True):
            prog = _sandbox_child.seccomp_program(table, allow)
            assert prog[:3] == [(0x20, 0, 0, 4), (0x15, 1, 0, table["audit_arch"]), (0x06, 0, 0, 0x80000000)], arch
            assert prog[-1] == (0x06, 0, 0, _sandbox_child.RET_ALLOW)
            for i, (code, jt, jf, _) in enumerate(prog):  # every jump lands inside the program
                assert code & 0x07 != 0x05 or i + 1 + max(jt, jf) < len(prog)


# ------------------------------------------------------------------------------------- refusal and configuration


def test_require_isolation_refuses_without_landlock_or_seccomp(monkeypatch, tmp_path):
    marker = tmp_path / "ran"
    monkeypatch.setattr(sandbox, "isolation_available", lambda: {"landlock_abi": 0, "seccomp": False})
    result = run(f"open({str(marker)!r}, 'w').write('ran'); print('ran')")
    assert result.exit_code is None and result.stdout == "" and not marker.exists()
    for named in ("Landlock", "seccomp", "require_isolation=False", "EXGRPO_SANDBOX_REQUIRE_ISOLATION=0"):
        assert named in result.error and named in result.as_tool_text()
    monkeypatch.setattr(sandbox, "isolation_available", lambda: {"landlock_abi": 3, "seccomp": False})
    assert "Landlock" not in run("print('ran')").error
    # require_isolation=False runs it (here the kernel does confine it: the probe is faked)
    assert run("print('ran')", require_isolation=False).stdout == "ran\n"


@pytest.mark.parametrize(
    "name, value",
    [
        ("timeout_s", 0),
        ("timeout_s", "5"),
        ("cpu_s", 0),
        ("cpu_s", 1.5),
        ("memory_mb", 10),
        ("memory_mb", True),
        ("max_output_bytes", 1),
        ("max_file_mb", -1),
        ("max_open_files", 3),
        ("require_isolation", "yes"),
        ("allow_subprocess", 1),
        ("site_packages", "yes"),
    ],
)
def test_bad_limits_name_the_field(name, value):
    with pytest.raises(ValueError, match=rf"SandboxLimits: {name} must be"):
        SandboxLimits(**{name: value})


def test_from_env_reads_the_variables_and_names_a_bad_one():
    env = {
        "EXGRPO_SANDBOX_TIMEOUT_S": "2.5",
        "EXGRPO_SANDBOX_MEMORY_MB": "512",
        "EXGRPO_SANDBOX_REQUIRE_ISOLATION": "0",
        "EXGRPO_SANDBOX_ALLOW_SUBPROCESS": "yes",
        "EXGRPO_SANDBOX_SITE_PACKAGES": "1",
        "OTHER": "x",
    }
    limits = SandboxLimits.from_env(environ=env)
    got = (limits.timeout_s, limits.memory_mb, limits.require_isolation, limits.allow_subprocess, limits.site_packages)
    assert got == (2.5, 512, False, True, True)
    assert SandboxLimits.from_env(environ={}) == SandboxLimits()
    for var, raw in (("MEMORY_MB", "lots"), ("MEMORY_MB", "8"), ("REQUIRE_ISOLATION", "maybe"), ("CPU_S", "1.5")):
        with pytest.raises(ValueError, match=f"EXGRPO_SANDBOX_{var}='{raw}'"):
            SandboxLimits.from_env(environ={f"EXGRPO_SANDBOX_{var}": raw})
    with pytest.raises(ValueError, match="MY_TIMEOUT_S"):
        SandboxLimits.from_env(prefix="MY_", environ={"MY_TIMEOUT_S": "-1"})


def test_run_python_wants_a_string():
    with pytest.raises(TypeError, match="code must be a str"):
        run_python(42)  # type: ignore[arg-type]
