"""The sandbox against what an attacker tried beyond tests/unit/test_sandbox.py: metadata changes and reads outside
the temp dir, state that outlives a call (System V IPC, keyrings, POSIX message queues, memory files), a directory
tree too deep for the cleanup, a concurrent call's temp dir, other processes' scheduling, a lease on the caller's
file, a process made the caller's child (clone with CLONE_PARENT).

Each test runs the attack, checks its effect from outside the sandbox, and has a control that leaves the protection
out (``left_out``, tests/unit/conftest.py) and sees the attack succeed. Each failed on the code before these
protections (the docstrings say how). The attacks are safe: files under the test's tmp_path, IPC objects and keys
with names of their own (removed afterwards, whatever happened), a ``sleep`` the test starts.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from exgrpo.sandbox import runner as sandbox
from tests.helpers.sandbox import needs_isolation, run, wait_for

pytestmark = [
    needs_isolation,
    pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="x86_64 and aarch64 only"),
]
REPO = Path(__file__).resolve().parents[2]
#: the syscalls the attacks make, by number (the test's own table: it ran against code without them in its table)
TABLE = {
    "x86_64": {"clone": 56, "add_key": 248, "keyctl": 250, "ioprio_set": 251, "ioprio_get": 252},
    "aarch64": {"clone": 220, "add_key": 217, "keyctl": 219, "ioprio_set": 30, "ioprio_get": 31},
}.get(platform.machine(), {})
CLONE_PARENT = 0x00008000
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long


def attempts(*named: tuple[str, str]) -> str:
    """Code that runs each ``(name, statement)`` and prints ``name OK`` or ``name <errno>``."""
    body = "".join(
        f"try:\n    {statement}\n    print({name!r}, 'OK')\nexcept OSError as e:\n    print({name!r}, e.errno)\n"
        for name, statement in named
    )
    return "import os, fcntl, array, ctypes\n" + body


def verdicts(result) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


# --------------------------------------------------------------------------------------- the filesystem, outside


def test_no_metadata_changes_outside_the_temp_dir(left_out, tmp_path):
    """Landlock has no right for metadata, and the code owns the caller's files (as uid 0, root's): seccomp refuses
    chmod, chown, utime and xattr changes, and the ioctls that set a file's flags (chattr), everywhere. Before it, on
    a file the caller owns: the setuid mode, the times, an xattr set and one removed, the nodump flag all went
    through (this test failed at the first assertion; the control still shows it)."""
    target = tmp_path / "owned"
    target.write_text("x")
    target.chmod(0o644)
    try:
        os.setxattr(target, "user.keep", b"1")
        xattrs = True
    except OSError:  # a filesystem without user xattrs (tmpfs before Linux 6.6)
        xattrs = False
    path = str(target)
    code = attempts(
        ("chmod", f"os.chmod({path!r}, 0o4777)"),
        ("utime", f"os.utime({path!r}, (0, 0))"),
        ("setxattr", f"os.setxattr({path!r}, 'user.added', b'1')"),
        ("removexattr", f"os.removexattr({path!r}, 'user.keep')"),
        (
            "chattr",  # FS_IOC_GETFLAGS, then FS_IOC_SETFLAGS with FS_NODUMP_FL added
            f"fd = os.open({path!r}, os.O_RDONLY); a = array.array('l', [0]); fcntl.ioctl(fd, 0x80086601, a)\n"
            "    a[0] |= 0x40; fcntl.ioctl(fd, 0x40086602, a)",
        ),
    )

    def state():
        st = os.stat(target)
        return oct(st.st_mode), st.st_mtime, sorted(os.listxattr(target)) if xattrs else None, _flags(target)

    before = state()
    assert set(verdicts(run(code)).values()) <= {"1", "13"}  # EPERM (seccomp), EACCES (the read of the chattr)
    left_out("landlock:reads")  # seccomp alone refuses all five, the chattr's ioctl on a readable file too
    assert verdicts(run(code)) == dict.fromkeys(("chmod", "utime", "setxattr", "removexattr", "chattr"), "1")
    assert state() == before
    left_out("landlock:reads", "seccomp:metadata")
    got = verdicts(run(code))
    assert got["chmod"] == got["utime"] == "OK" and os.stat(target).st_mode & 0o4777 == 0o4777
    assert os.stat(target).st_mtime == 0
    if xattrs:
        assert got["setxattr"] == got["removexattr"] == "OK" and os.listxattr(target) == ["user.added"]
    if got["chattr"] == "OK":  # a filesystem with file flags (ext4, xfs, btrfs; tmpfs since 6.0)
        assert _flags(target) & 0x40


def _flags(path: Path) -> int | None:
    """The file's flags (FS_IOC_GETFLAGS), None where the filesystem has none."""
    import array

    fd = os.open(path, os.O_RDONLY)
    try:
        out = array.array("l", [0])
        fcntl.ioctl(fd, 0x80086601, out)
        return out[0]
    except OSError:
        return None
    finally:
        os.close(fd)


@pytest.mark.parametrize("site_packages", [False, True])
def test_no_reads_outside_the_interpreter_and_the_temp_dir(left_out, tmp_path, site_packages):
    """Reads confined by Landlock to the temp dir, the interpreter (its stdlib, and site-packages when they are
    allowed), the system's programs and libraries and a few files of /etc: a 0600 secret of the caller's, the
    checkout, the temp dir's parent are out of reach. Before, reading stayed allowed everywhere: the secret came back
    in the answer (this test failed at its first assertion; the control shows it)."""
    secret = tmp_path / "netrc"
    secret.write_text("machine api.wandb.ai login user password SECRET-TOKEN\n")
    secret.chmod(0o600)
    code = attempts(
        ("secret", f"print(open({str(secret)!r}).read())"),
        ("checkout", f"open({str(REPO / 'pyproject.toml')!r}).read()"),
        ("temp_parent", f"os.listdir({tempfile.gettempdir()!r})"),
        ("etc", "os.listdir('/etc')"),
    )
    code += "import json, numbers, fractions\nprint('stdlib', json.dumps(str(fractions.Fraction(6, 4))))\n"
    code += "print('system', len(open('/etc/ld.so.cache', 'rb').read(4)), len(os.listdir('/usr/lib')) > 0)\n"
    code += "open('mine', 'w').write('kept'); print('own', open('mine').read())\n"
    if site_packages:
        code += "import numpy\nprint('numpy', numpy.add(2, 3))\n"
    limits = {"site_packages": site_packages, "memory_mb": 512, "timeout_s": 30, "cpu_s": 30}
    result = run(code, **limits)
    assert "SECRET-TOKEN" not in result.as_tool_text()
    got = verdicts(result)
    assert [got[k] for k in ("secret", "checkout", "temp_parent", "etc")] == ["13"] * 4, result.as_tool_text()
    assert got["stdlib"] == '"3/2"' and got["system"] == "4 True" and got["own"] == "kept"
    assert got.get("numpy") == ("5" if site_packages else None)
    left_out("landlock:reads")
    assert "SECRET-TOKEN" in run(code, **limits).stdout


def test_a_call_cannot_read_a_concurrent_calls_temp_dir(left_out):
    """Two calls at once (the tool runs in a threaded actor): the second knows the first's temp dir and tries to
    list the temp dirs and read the first's file. Landlock's read rules name the call's own temp dir only. Before,
    both reads went through (this test failed; the control shows it)."""
    token = uuid.uuid4().hex
    release = Path(tempfile.gettempdir()) / f"exgrpo-test-release-{token}"
    first = (
        f"import os, time\nopen('secret-{token}', 'w').write('FIRST-CALL-{token}')\n"
        f"end = time.monotonic() + 20\nwhile not os.path.exists({str(release)!r}) and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
    )

    def attack() -> tuple[str, str]:
        results: list = []
        holder = threading.Thread(target=lambda: results.append(run(first, timeout_s=30, cpu_s=30)))
        holder.start()
        try:
            assert wait_for(lambda: list(Path(tempfile.gettempdir()).glob(f"exgrpo-sandbox-*/secret-{token}")))
            (planted,) = Path(tempfile.gettempdir()).glob(f"exgrpo-sandbox-*/secret-{token}")
            second = attempts(  # the temp dirs' parent listed (only the sandboxes' names printed), the file read
                ("list", f"print([n for n in os.listdir({str(planted.parent.parent)!r}) if 'sandbox' in n])"),
                ("read", f"print(open({str(planted)!r}).read())"),
            )
            return run(second, max_output_bytes=1 << 16).stdout, planted.parent.name
        finally:
            release.touch()
            holder.join()
            release.unlink()
            assert results[0].exit_code == 0 and not results[0].timed_out

    out, _ = attack()
    assert f"FIRST-CALL-{token}" not in out and "list 13" in out and "read 13" in out, out
    left_out("landlock:reads")
    out, first_dir = attack()
    assert f"FIRST-CALL-{token}" in out and first_dir in out


# ------------------------------------------------------------------------------------------- the cleanup


def test_a_tree_too_deep_for_shutil_is_removed(left_out):
    """1,100 nested directories of 20-character names: deeper than Python's recursion limit, and its path (23,000
    characters) longer than PATH_MAX (the attack found used 3,000 one-letter names; deep trees are slow to build and
    remove on any filesystem, so the test keeps to what defeats both limits). shutil.rmtree (the cleanup before)
    raised RecursionError out of ``run_python`` and left the tree, readable by a later call: this test failed at the
    first call. The control keeps the tree (``cleanup`` left out) and shows shutil cannot remove it."""
    code = "import os\ntop = os.getcwd()\nfor _ in range(1100):\n    os.mkdir('d' * 20); os.chdir('d' * 20)\n"
    code += "open('bottom', 'w').write('x')\nprint(top)\n"
    result = run(code, timeout_s=60, cpu_s=60)
    assert result.exit_code == 0 and not Path(result.stdout.strip()).exists()
    left_out("cleanup")
    top = run(code, timeout_s=60, cpu_s=60).stdout.strip()
    try:
        assert Path(top, *["d" * 20] * 10).is_dir()
        if sys.version_info < (3, 13):  # shutil.rmtree recurses through the tree on these versions
            with pytest.raises(RecursionError):
                shutil.rmtree(top)
        sandbox._remove_tree(top)
        assert not Path(top).exists()
    finally:
        subprocess.run(["rm", "-rf", top], check=False)


# -------------------------------------------------------------------------------- state beside the process


#: System V segments of 30 MB one call leaves, filled: 90 MB, over its 64 MB of address space
SEGMENTS = 3


@pytest.fixture
def ipc_names():
    """A System V key, a key description and a message-queue name of this test's own; whatever the calls left of
    them is removed afterwards, from outside."""
    key = 0x5EC00000 | (uuid.uuid4().int & 0xFFFF0)
    names = {"key": key, "desc": f"exgrpo-probe-{uuid.uuid4().hex}", "mq": f"/exgrpo-probe-{uuid.uuid4().hex}"}
    yield names
    for k in range(key, key + SEGMENTS):
        if (ident := LIBC.shmget(k, 0, 0)) >= 0:
            LIBC.shmctl(ident, 0, None)  # IPC_RMID
    if (ident := LIBC.msgget(key, 0)) >= 0:
        LIBC.msgctl(ident, 0, None)
    if (ident := LIBC.semget(key, 0, 0)) >= 0:
        LIBC.semctl(ident, 0, 0)
    if (found := _search_key(names["desc"])) >= 0:
        LIBC.syscall(TABLE["keyctl"], 21, found)  # KEYCTL_INVALIDATE
    ctypes.CDLL("librt.so.1", use_errno=True).mq_unlink(names["mq"].encode())


def _search_key(desc: str) -> int:
    """The id of a "user" key with this description in this uid's keyring, -1 when none."""
    return int(LIBC.syscall(TABLE["keyctl"], 10, ctypes.c_long(-4), b"user", desc.encode(), 0))  # KEYCTL_SEARCH


def _sysv(kind: str, key: int) -> list[list[str]]:
    """The rows of /proc/sysvipc/<kind> with this key."""
    rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
    return [r.split() for r in rows if int(r.split()[0]) == key]


def test_no_state_outlives_a_call(left_out, ipc_names):
    """System V shared memory, message queues and semaphores, a key in the user's keyring, a POSIX message queue:
    each created by one call, looked for by the next, and from outside. Three segments of 30 MB, each attached,
    filled and detached in turn, stay resident after a call capped at 64 MB of address space. seccomp refuses these
    syscalls (EPERM). Before, all five outlived the call, the next call found them (the message queue by the EACCES
    that tells an existing queue from a missing one: Landlock refuses to open it, after its creation), and the
    segments held 90 MB beyond the cap (this test failed at its first assertion; the control shows it)."""
    key, desc, mq = ipc_names["key"], ipc_names["desc"], ipc_names["mq"]
    kinds = (("shm", "shmget"), ("msg", "msgget"), ("sem", "semget"))
    create = (
        "import ctypes, mmap\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.shmat.restype = ctypes.c_void_p\n"
        "libc.syscall.restype = ctypes.c_long\nrt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
        "def report(name, ret):\n    print(name, 'OK' if ret >= 0 else ctypes.get_errno())\n"
        f"for i in range({SEGMENTS}):\n    seg = libc.shmget({key} + i, 30 << 20, 0o1600)\n    report('shm', seg)\n"
        "    if seg >= 0:\n        at = libc.shmat(seg, None, 0)\n        ctypes.memset(at, 1, 30 << 20)\n"
        "        libc.shmdt(ctypes.c_void_p(at))\n"
        f"report('msg', libc.msgget({key}, 0o1600))\nreport('sem', libc.semget({key}, 1, 0o1600))\n"
        f"report('key', libc.syscall({TABLE['add_key']}, b'user', {desc.encode()!r}, b'SECRET', 6,"
        " ctypes.c_long(-4)))\n"
        f"report('mq', rt.mq_open({mq.encode()!r}, 0o102, 0o600, None))\n"  # O_CREAT | O_RDWR
    )
    look = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        "rt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
        f"print('shm', libc.shmget({key}, 0, 0) >= 0, 'msg', libc.msgget({key}, 0) >= 0, 'sem',"
        f" libc.semget({key}, 0, 0) >= 0, 'key', libc.syscall({TABLE['keyctl']}, 10, ctypes.c_long(-4), b'user',"
        f" {desc.encode()!r}, 0) >= 0, 'mq', rt.mq_open({mq.encode()!r}, 2) >= 0 or ctypes.get_errno() == 13)\n"
    )

    def outside() -> dict[str, bool]:
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        mq_fd = rt.mq_open(mq.encode(), os.O_RDONLY)
        if mq_fd >= 0:
            rt.mq_close(mq_fd)
        seen = {kind: bool(_sysv(kind, key)) for kind, _ in kinds}
        return {**seen, "key": _search_key(desc) >= 0, "mq": mq_fd >= 0}

    created = run(create, memory_mb=64)
    assert set(verdicts(created).values()) == {"1"}, created.as_tool_text()  # EPERM
    assert run(look).stdout.split() == ["shm", "False", "msg", "False", "sem", "False", "key", "False", "mq", "False"]
    assert outside() == dict.fromkeys(("shm", "msg", "sem", "key", "mq"), False)
    left_out("seccomp:ipc")
    got = verdicts(run(create, memory_mb=64))
    assert [got[k] for k in ("shm", "msg", "sem", "key")] == ["OK"] * 4 and got["mq"] in ("OK", "13")
    assert run(look).stdout.split() == ["shm", "True", "msg", "True", "sem", "True", "key", "True", "mq", "True"]
    assert outside() == dict.fromkeys(("shm", "msg", "sem", "key", "mq"), True)
    resident = sum(int(row[14]) for i in range(SEGMENTS) for row in _sysv("shm", key + i))  # rss, bytes
    assert resident >= 90 << 20 > 64 << 20


def test_memory_files_are_refused(left_out):
    """memfd_create: memory in a file, which RLIMIT_AS does not count (each file is capped by RLIMIT_FSIZE, their
    number by the open-file limit: 64 x 16 MB by default). seccomp refuses it. Before, six files of 16 MB held 96 MB
    under a 64 MB cap (this test failed; the control shows it)."""
    code = (
        "import os\nfiles = [os.memfd_create(f'm{i}') for i in range(6)]\nchunk = b'x' * (1 << 20)\n"
        "print(sum(os.write(fd, chunk) for fd in files for _ in range(16)) >> 20, 'MB')\n"
    )
    refused = run(code, memory_mb=64, max_file_mb=16)
    assert refused.exit_code == 1 and refused.stderr.rstrip().endswith("Operation not permitted")
    left_out("seccomp:memfd")
    assert run(code, memory_mb=64, max_file_mb=16).stdout == "96 MB\n"


# ------------------------------------------------------------------------------------------- other processes


#: a process without capabilities, as a sandbox's interpreter, or a trainer that is not root, is (a process with
#: capabilities the sandbox lacks is out of its reach already: the kernel asks for CAP_SYS_NICE then)
WITHOUT_CAPABILITIES_SLEEP = (
    "import platform, time\nfrom exgrpo.sandbox import child\n"
    "child._drop_capabilities(child._libc(), child.SYSCALLS[platform.machine()])\ntime.sleep(60)\n"
)


def _ioprio(pid: int) -> int:
    return int(LIBC.syscall(TABLE["ioprio_get"], 1, pid))  # IOPRIO_WHO_PROCESS


def test_no_other_process_is_reniced_pinned_or_idled(left_out):
    """A process of the caller's uid outside the sandbox, without capabilities (a trainer that is not root, a
    concurrent call's interpreter; here a sleeping Python of the test's): its nice value, CPU affinity, scheduling
    policy and I/O priority. seccomp lets these calls name the calling process only (pid 0). Before, all four were
    changed (this test failed; the control shows it); the code's own nice value stays its own to change."""
    victim = subprocess.Popen([sys.executable, "-c", WITHOUT_CAPABILITIES_SLEEP], cwd=REPO)
    assert wait_for(lambda: "CapPrm:\t0000000000000000" in Path(f"/proc/{victim.pid}/status").read_text())
    try:
        pid = victim.pid
        ioprio_nr = TABLE["ioprio_set"]
        code = attempts(
            ("nice", f"os.setpriority(os.PRIO_PROCESS, {pid}, 19)"),
            ("affinity", f"os.sched_setaffinity({pid}, {{0}})"),
            ("policy", f"os.sched_setscheduler({pid}, os.SCHED_IDLE, os.sched_param(0))"),
            (
                "ioprio",
                f"libc = ctypes.CDLL(None, use_errno=True)\n    if libc.syscall({ioprio_nr}, 1, {pid}, 3 << 13):\n"
                "        raise OSError(ctypes.get_errno(), 'ioprio_set')",
            ),
            ("own_nice", "os.nice(5)"),
        )

        def state():
            return (
                os.getpriority(os.PRIO_PROCESS, pid),
                os.sched_getaffinity(pid),
                os.sched_getscheduler(pid),
                _ioprio(pid),
            )

        before = state()
        got = verdicts(run(code))
        assert [got[k] for k in ("nice", "affinity", "policy", "ioprio")] == ["1"] * 4 and got["own_nice"] == "OK"
        assert state() == before
        left_out("seccomp:other_processes")
        assert set(verdicts(run(code)).values()) == {"OK"}
        nice, affinity, policy, ioprio = state()
        assert nice == 19 and policy == os.SCHED_IDLE and ioprio >> 13 == 3
        assert affinity == {0} or len(before[1]) == 1
    finally:
        victim.kill()
        victim.wait()


def test_no_lease_holds_back_the_callers_open(left_out, tmp_path):
    """A read lease (fcntl F_SETLEASE) on a file the caller owns makes the caller's open for writing wait for the
    lease's holder (up to lease-break-time, 45 s) or, non-blocking, fail with EWOULDBLOCK. The read rules keep the
    caller's files out of reach, and seccomp refuses the lease on any file. Before, the lease was taken and the
    caller's open failed (this test failed; the control shows it)."""
    target = tmp_path / "leased"
    target.write_text("x")
    ino = os.stat(target).st_ino
    code = (
        "import os, fcntl, time\n"
        f"try:\n    fd = os.open({str(target)!r}, os.O_RDONLY)\n    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n"
        "except OSError as e:\n    print('lease', e.errno)\nelse:\n    print('lease OK', flush=True)\n"
        f"    end = time.monotonic() + 20\n    while os.stat({str(target)!r}).st_size < 2 and time.monotonic() < end:\n"
        "        time.sleep(0.01)\n"
    )

    def attack() -> tuple[str, int | None]:
        """The sandbox's verdict on the lease, and the errno of the caller's non-blocking open for writing."""
        target.write_text("x")  # one byte: the holder waits until the file grows
        results: list = []
        holder = threading.Thread(target=lambda: results.append(run(code, timeout_s=30)))
        holder.start()
        try:
            wait_for(lambda: not holder.is_alive() or f":{ino} " in Path("/proc/locks").read_text())
            try:
                os.close(os.open(target, os.O_WRONLY | os.O_NONBLOCK))
                opened = None
            except OSError as e:
                opened = e.errno
        finally:
            with open(target, "a") as f:  # bigger: the holder lets go (its stat needs no read right)
                f.write("released")
            holder.join()
        return results[0].stdout.split("\n")[0], opened

    assert attack() == ("lease 13", None)  # the read rules: no descriptor to take a lease on
    left_out("landlock:reads")
    assert attack() == ("lease 1", None)  # seccomp: no lease on a file it can read
    left_out("landlock:reads", "seccomp:leases")
    assert attack() == ("lease OK", errno.EWOULDBLOCK)


def test_no_process_is_made_the_callers_child(left_out):
    """clone(CLONE_PARENT) (allowed subprocesses) makes the new process a child of the sandbox's parent, the caller:
    when it exits it waits there as a zombie nobody reaps (one per call of a Ray worker's life). seccomp refuses the
    flag. Before, the zombie was the caller's (this test failed; the control shows it)."""
    nr = TABLE["clone"]
    code = (
        "import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        f"pid = libc.syscall({nr}, {CLONE_PARENT} | signal.SIGCHLD, 0, 0, 0, 0)\n"
        "if pid == 0:\n    os._exit(0)\nprint(pid if pid > 0 else -ctypes.get_errno())\n"
    )

    def parent_and_state(pid: int) -> tuple[int, str] | None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return int(fields[1]), fields[0]

    assert run(code, allow_subprocess=True).stdout == f"{-errno.EPERM}\n"
    left_out("seccomp:clone_parent")
    pid = int(run(code, allow_subprocess=True).stdout)
    assert pid > 0
    try:
        assert wait_for(lambda: parent_and_state(pid) == (os.getpid(), "Z"))
    finally:
        if parent_and_state(pid) is not None and parent_and_state(pid)[0] == os.getpid():
            os.waitpid(pid, 0)  # reap it: the test process is its parent
