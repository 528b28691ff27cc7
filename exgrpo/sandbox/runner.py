"""Run model-written Python in a confined, fresh process: the interpreter behind a tool-integrated-reasoning tool.

``run_python(code, SandboxLimits(...))`` returns a :class:`SandboxResult`; ``result.as_tool_text()`` is what the
model reads. Every call starts a new interpreter, ``python -I -S exgrpo/sandbox/child.py`` (no site-packages unless
``site_packages``, no ``PYTHON*`` variables, no user site), in its own session and process group, with only ``PATH``
(and one-thread settings of the math libraries) in its environment and a fresh private temp dir as its cwd, ``HOME``
and ``TMPDIR``, removed afterwards. The child confines itself
before it runs the code (nothing runs between fork and exec of the caller, which is a threaded Ray actor):

- **resources**: RLIMIT_AS (``memory_mb``: a big allocation raises MemoryError), RLIMIT_CPU (``cpu_s``: SIGXCPU,
  SIGKILL a second later), RLIMIT_FSIZE (``max_file_mb``: a bigger write fails with EFBIG), RLIMIT_NOFILE,
  RLIMIT_CORE = 0; the parent's wall clock (``timeout_s``) kills the whole process group;
- **privileges**: every capability dropped, bounding set included (uid 0 in a container becomes a plain user: no
  module loading, raw I/O, DAC override, raising a hard limit), then ``PR_SET_NO_NEW_PRIVS``;
- **filesystem** (Landlock): every right that changes the filesystem is allowed only beneath the temp dir (and
  writing to /dev/null); reading only there and beneath the interpreter (its stdlib, its site-packages when
  ``site_packages``), the system's programs and libraries (/usr, /lib, /bin) and a few files of /etc the C library
  reads (``child.readable_paths``): not a secret in /root or /home, the checkout, another call's temp dir;
- **metadata** (seccomp, EPERM): no chmod, chown, utime or xattr change, nor an ioctl that sets a file's flags,
  anywhere (Landlock has no right for them, and the code owns the caller's files): also not in the temp dir, so
  ``shutil.copy`` (which copies the mode) fails there and ``shutil.copyfile`` works;
- **network**: seccomp makes ``socket()`` fail with EPERM for every address family (AF_UNIX too: a named unix
  socket such as docker.sock or a Ray daemon's is not confined by Landlock), and io_uring, which could open sockets
  without that syscall; on Landlock ABI >= 4 TCP bind/connect are denied as well;
- **state beside the process** (seccomp, EPERM): System V shared memory, semaphores and message queues, POSIX
  message queues, keyrings (each outlives the call, and shared memory is memory no limit of the call counts),
  ``memfd_create`` (memory outside RLIMIT_AS), leases on files (``F_SETLEASE``: the caller's open would wait);
- **other processes** (seccomp, EPERM): nice value, CPU affinity, scheduling policy and I/O priority of the calling
  process only (pid 0), not of the trainer or a concurrent call of the same uid;
- **escape routes** (seccomp, each EPERM): ``setrlimit``/``prlimit64`` with a new value, ``ptrace``,
  ``setsid``/``setpgid`` (every descendant stays in the group the timeout kills), ``unshare``/``setns`` and
  namespace flags of ``clone``, ``CLONE_PARENT`` (a process made the caller's child would be its zombie); and,
  unless ``allow_subprocess``, creating processes (``fork``, ``vfork``, ``clone`` without CLONE_THREAD; threads
  still work), which is what bounds a fork bomb: RLIMIT_NPROC counts every process of the uid and is not enforced
  for uid 0 at all. A syscall of another ABI (i386, x32) kills the process;
- **signals** (Landlock ABI >= 6): no signal to a process outside the sandbox (the trainer, the Ray worker);
- **the cleanup**: the temp dir is removed whatever it holds (any depth, no permissions, links), without recursion.

None of these depends on the caller's uid: they hold the same for a trainer that is root and one that is not.

Not confined: the names, sizes and times of files outside the readable paths (``stat`` is not a read); locks
(``flock``, ``fcntl`` record locks) on the files it may read, which hold back only a process that locks the same
file; CPU time vs wall clock (a sleeping or blocked process uses no CPU: only ``timeout_s`` stops it; threads use CPU
in parallel); disk space in the temp dir (each file is capped, their number is not: bounded by the wall clock times
the disk's speed; where the temp dir is a tmpfs, that is memory); with ``allow_subprocess``, the number of processes
(only the wall clock and the per-process limits bound it); on Landlock ABI < 6, signals to other processes of the
same uid; the host's memory across concurrent calls (each may use ``memory_mb``); syscalls the deny lists do not name
(a new kernel's); and an attacker with a kernel exploit. docs/tools.md says what a fix of each would need.
``isolation_available()`` says what this kernel offers; ``require_isolation`` (the default) refuses to run the code
without Landlock and seccomp, naming what is missing; ``result.protections`` says what was applied.

Why a fresh process per call: no state leaks from one trajectory's code to another's (globals, imports, files,
threads), which is also what makes the tool stateless. The recipe's experience replay re-trains stored trajectories
with their stored tool answers and never calls a tool again, so a tool answer must depend on the call alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import selectors
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from exgrpo.sandbox import child as _child

logger = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("child.py")
#: the child's whole environment besides HOME and TMPDIR: nothing of the trainer's (tokens, paths) leaks in
CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"
#: math libraries start one thread, not one per core (each thread's buffers count against RLIMIT_AS)
_ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
#: after the process exits or is killed, how long to keep reading what it wrote
_DRAIN_S = 1.0
#: protection layers left out on purpose; only the tests' fault injection sets this
_LEFT_OUT: frozenset[str] = frozenset()

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
#: field -> (type, lowest, highest, what it is)
_RANGES = {
    "timeout_s": (float, 0.1, 3600.0, "seconds of wall clock"),
    "cpu_s": (int, 1, 3600, "seconds of CPU time"),
    "memory_mb": (int, 64, 1 << 20, "MB of address space"),
    "max_output_bytes": (int, 64, 1 << 24, "bytes of stdout + stderr kept"),
    "max_file_mb": (int, 0, 1 << 20, "MB per written file"),
    "max_open_files": (int, 16, 1 << 20, "file descriptors"),
}


def _field_problem(name: str, value: object) -> str | None:
    if name not in _RANGES:  # the booleans
        return None if isinstance(value, bool) else f"{name} must be true or false, got {value!r}"
    kind, low, high, what = _RANGES[name]
    ok_type = (int, float) if kind is float else (int,)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not low <= value <= high:
        number = "a number" if kind is float else "an integer"
        return f"{name} must be {number} in [{low}, {high}] ({what}), got {value!r}"
    return None


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. ``require_isolation=False`` runs with what the kernel offers (see ``protections``).
    ``allow_subprocess`` lets the code start processes (Landlock and seccomp are inherited by them; their number is
    then bounded by the wall clock only, see the module docstring). ``site_packages`` lets the code import what is
    installed beside the trainer's interpreter (sympy, numpy: what tool-integrated-reasoning models reach for),
    read-only like the rest of the filesystem; off, the interpreter starts with ``-S`` and has the stdlib only.
    Either way one thread per math library (``OMP/OPENBLAS/MKL_NUM_THREADS=1``): a BLAS pool per core would not fit
    in ``memory_mb`` of address space."""

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 1024
    max_output_bytes: int = 4096
    max_file_mb: int = 16
    max_open_files: int = 64
    require_isolation: bool = True
    allow_subprocess: bool = False
    site_packages: bool = False

    def __post_init__(self) -> None:
        problems = [p for f in dataclasses.fields(self) if (p := _field_problem(f.name, getattr(self, f.name)))]
        if problems:
            raise ValueError("SandboxLimits: " + "; ".join(problems))

    @classmethod
    def from_env(cls, prefix: str = "EXGRPO_SANDBOX_", environ: dict[str, str] | None = None) -> SandboxLimits:
        """The defaults, overridden by ``<prefix><FIELD>`` variables (``EXGRPO_SANDBOX_TIMEOUT_S=10``,
        ``EXGRPO_SANDBOX_REQUIRE_ISOLATION=0``); an error names each bad variable."""
        environ = os.environ if environ is None else environ
        values, problems = {}, []
        for f in dataclasses.fields(cls):
            var = prefix + f.name.upper()
            if var not in environ:
                continue
            raw = environ[var].strip()
            kind = _RANGES[f.name][0] if f.name in _RANGES else bool
            try:
                if kind is bool:
                    if raw.lower() not in _TRUE | _FALSE:
                        raise ValueError
                    value = raw.lower() in _TRUE
                else:
                    value = kind(raw)
            except ValueError:
                value = raw  # reported below, with the allowed range
            problem = _field_problem(f.name, value)
            if problem:
                problems.append(f"{var}={environ[var]!r}: {problem}")
            values[f.name] = value
        if problems:
            raise ValueError("; ".join(problems))
        return cls(**values)


@dataclass
class SandboxResult:
    """What one call did. ``error`` says why the code could not run or was stopped (None: it ran to its end, with
    ``exit_code`` 0 or, after an exception, 1); ``protections`` what confined it."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    error: str | None
    protections: dict[str, bool | int] = field(default_factory=dict)
    max_output_bytes: int = 4096

    def as_tool_text(self) -> str:
        """What the model reads: stdout; then stderr (the traceback's end) unless the code exited 0; then a line on
        a timeout or a kill; at most ``max_output_bytes`` bytes in all (the head of stdout, the tail of stderr, each
        cut part replaced by ``[... N bytes cut ...]``)."""
        note = f"[{self.error}]" if self.error else ""
        out, out_cut = _split_marker(self.stdout)
        err, err_cut = _split_marker(self.stderr) if self.exit_code != 0 and self.stderr.strip() else ("", 0)
        out_b, err_b = out.encode(), err.encode()

        def compose(out_room: int, err_room: int) -> str:
            o_cut, e_cut = out_cut + max(len(out_b) - out_room, 0), err_cut + max(len(err_b) - err_room, 0)
            o = out_b[:out_room].decode("utf-8", "ignore").rstrip("\n") + (f"\n{_marker(o_cut)}" if o_cut else "")
            e = err_b[len(err_b) - err_room :].decode("utf-8", "ignore").rstrip("\n") if err_room else ""
            e = f"{_marker(e_cut)}\n{e}" if e_cut else e
            return "\n".join(p for p in (o, e, note) if p)

        text = compose(len(out_b), len(err_b))
        if len(text.encode()) > self.max_output_bytes:
            room = max(self.max_output_bytes - len(note.encode()) - 2 * len(_marker(10**12)) - 4, 0)
            err_room = min(len(err_b), max(room // 2, room - len(out_b)))
            text = compose(max(room - err_room, 0), err_room)
        return text.encode()[: self.max_output_bytes].decode("utf-8", "ignore")  # a note longer than the cap


def _marker(n_bytes: int) -> str:
    return f"[... {n_bytes} bytes cut ...]"


_MARKER = re.compile(r"\n?\[\.\.\. (\d+) bytes cut \.\.\.\]\n?")


def _split_marker(text: str) -> tuple[str, int]:
    """A captured stream without its cut marker, and the bytes the marker says were cut."""
    match = _MARKER.search(text)
    if match is None:
        return text, 0
    return text[: match.start()] + text[match.end() :], int(match.group(1))


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[int, bool]:
    return _child.landlock_abi(), _child.seccomp_available()


def isolation_available() -> dict[str, bool | int]:
    """What this kernel offers: ``landlock_abi`` (0: no Landlock) and ``seccomp`` (filters that return errors)."""
    abi, seccomp = _probe()
    return {"landlock_abi": abi, "seccomp": seccomp}


def _missing_isolation(available: dict[str, bool | int]) -> list[str]:
    missing = []
    if not available.get("landlock_abi"):
        missing.append("Landlock (Linux >= 5.13 with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= boot list)")
    if not available.get("seccomp"):
        missing.append("seccomp-BPF (CONFIG_SECCOMP_FILTER, on x86_64 or aarch64)")
    return missing


class _Capture:
    """At most ``cap`` bytes of a stream, its head or its tail; the rest is counted and dropped."""

    def __init__(self, cap: int, keep_tail: bool = False) -> None:
        self.cap, self.keep_tail, self.data, self.total = cap, keep_tail, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.keep_tail:
            self.data += chunk
            if len(self.data) > 2 * self.cap:  # trimmed in steps, not on every chunk
                del self.data[: len(self.data) - self.cap]
        elif len(self.data) < self.cap:
            self.data += chunk[: self.cap - len(self.data)]

    def text(self) -> str:
        kept = bytes(self.data[-self.cap :] if self.keep_tail else self.data)
        text = kept.decode("utf-8", "replace")
        cut = self.total - len(kept)
        if not cut:
            return text
        return f"{_marker(cut)}\n{text}" if self.keep_tail else f"{text}\n{_marker(cut)}"


def _exited(pid: int) -> bool:
    """Whether the child has exited, without reaping it: its pid, the process group's id, stays taken until then."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group has exited already
        os.killpg(pgid, signal.SIGKILL)


def _reap(proc: subprocess.Popen) -> float:
    """Kill what is left of the group, reap the child; return its CPU seconds."""
    _kill_group(proc.pid)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except ChildProcessError:  # reaped elsewhere
        proc.returncode = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        return 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _writable(action, fd: int):
    """``action()``, once more after giving the directory ``fd`` back its owner's rights if it was refused (the code
    may leave a directory without read, write or search permission; uid 0 needs none of them)."""
    try:
        return action()
    except PermissionError:
        os.fchmod(fd, stat.S_IRWXU)
        return action()


def _open_dir(name: str, dir_fd: int | None = None) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        os.chmod(name, stat.S_IRWXU, dir_fd=dir_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _clear(fd: int) -> list[str]:
    """Remove every entry of the directory ``fd`` but its subdirectories; return their names (links are removed,
    never followed)."""
    entries = _writable(lambda: [(e.name, e.is_dir(follow_symlinks=False)) for e in os.scandir(fd)], fd)
    for name in (name for name, is_dir in entries if not is_dir):
        _writable(functools.partial(os.unlink, name, dir_fd=fd), fd)
    return [name for name, is_dir in entries if is_dir]


def _remove_tree(path: str) -> None:
    """Remove the sandbox's temp dir, whatever the code left in it: any depth (no recursion and no path longer than
    one name: a tree 3,000 directories deep passes both Python's recursion limit and PATH_MAX, where shutil.rmtree
    raised RecursionError), directories without permissions, links (removed, never followed). Two descriptors open
    at a time; every process of the call is dead by now, and each step back up is checked against the directory it
    came from all the same. A failure is logged, never raised."""
    try:
        fd = _open_dir(path)
    except FileNotFoundError:
        return
    except OSError as e:
        logger.warning("could not remove the sandbox dir %s: %s", path, e)
        return
    try:
        pending, way_up = [_clear(fd)], []  # per level down: the subdirectories left to remove; the way back up
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                sub = _open_dir(name, fd)
                here = os.fstat(fd)
                os.close(fd)
                fd = sub
                way_up.append((name, (here.st_dev, here.st_ino)))
                pending.append(_clear(fd))
                continue
            pending.pop()
            if way_up:
                name, parent = way_up.pop()
                up = os.open("..", _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = up
                if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != parent:
                    raise OSError(f"{name}: the tree moved while it was being removed")
                _writable(functools.partial(os.rmdir, name, dir_fd=fd), fd)
        os.close(fd)
        fd = -1
        os.rmdir(path)
    except OSError as e:
        logger.warning("could not remove the sandbox dir %s: %s", path, e)
    finally:
        if fd >= 0:
            os.close(fd)


def _collect(proc: subprocess.Popen, status_fd: int, limits: SandboxLimits) -> tuple[dict, _Capture, _Capture, bool]:
    """Read the child's status and output until it exits (or the wall clock), then kill its group."""
    out, err, status = _Capture(limits.max_output_bytes), _Capture(limits.max_output_bytes, True), _Capture(1 << 16)
    captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, status_fd: status}
    with selectors.DefaultSelector() as sel:
        for fd in captures:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        try:
            pidfd = os.pidfd_open(proc.pid)  # readable once the child exits: no polling
            sel.register(pidfd, selectors.EVENT_READ)
        except (AttributeError, OSError):
            pidfd = None
        try:
            end, stopped_at, timed_out = time.monotonic() + limits.timeout_s, None, False
            while True:
                now = time.monotonic()
                if stopped_at is None and (_exited(proc.pid) or now >= end):
                    # on exit too: a descendant left running in the background must not outlive the call
                    timed_out = not _exited(proc.pid)
                    _kill_group(proc.pid)
                    stopped_at = now
                reading = any(fd in captures for fd in sel.get_map())
                if stopped_at is not None and (not reading or now >= stopped_at + _DRAIN_S):
                    break
                wait = end - now if stopped_at is None else stopped_at + _DRAIN_S - now
                for key, _ in sel.select(max(wait if pidfd is not None else min(wait, 0.1), 0)):
                    if key.fd == pidfd:
                        sel.unregister(pidfd)  # seen as exited on the next turn
                        continue
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        captures[key.fd].add(chunk)
                    else:
                        sel.unregister(key.fd)
        finally:
            if pidfd is not None:
                os.close(pidfd)
    try:
        parsed = json.loads(bytes(status.data)) if status.data else {}
    except ValueError:
        parsed = {}
    return parsed, out, err, timed_out


def _stop_reason(code: int, cpu_used: float, stderr: str, limits: SandboxLimits) -> str | None:
    if code >= 0:
        last = stderr.rstrip().rsplit("\n", 1)[-1]
        memory = last.startswith("MemoryError")
        return f"memory limit of {limits.memory_mb} MB reached (MemoryError)" if memory else None
    sig = -code
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= limits.cpu_s):
        return f"killed: CPU time limit of {limits.cpu_s} s reached"
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
    return f"killed by {name}"


def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` in a fresh confined interpreter (see the module docstring) and return what it did."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    limits = limits or SandboxLimits()

    def result(out="", err="", code_=None, timed_out=False, truncated=False, error=None, protections=None):
        return SandboxResult(out, err, code_, timed_out, truncated, error, protections or {}, limits.max_output_bytes)

    available = isolation_available()
    missing = _missing_isolation(available)
    if missing and limits.require_isolation:
        error = (
            f"sandbox refused to run the code: this kernel lacks {' and '.join(missing)}. To run without them: "
            "SandboxLimits(require_isolation=False) or EXGRPO_SANDBOX_REQUIRE_ISOLATION=0"
        )
        logger.warning(error)
        return result(error=error, protections=dict(available))

    workdir = tempfile.mkdtemp(prefix="exgrpo-sandbox-")
    config = {
        "workdir": workdir,
        "cpu_s": limits.cpu_s,
        "memory_mb": limits.memory_mb,
        "max_file_mb": limits.max_file_mb,
        "max_open_files": limits.max_open_files,
        "require_isolation": limits.require_isolation,
        "allow_subprocess": limits.allow_subprocess,
        "skip": sorted(_LEFT_OUT),
    }
    env = {"PATH": CHILD_PATH, "HOME": workdir, "TMPDIR": workdir, **_ONE_THREAD}
    proc, status_r = None, None
    try:
        status_r, status_w = os.pipe()
        config["status_fd"] = status_w
        try:
            with tempfile.TemporaryFile() as stdin:  # unnamed: nothing of it in the sandbox's dir
                stdin.write(code.encode("utf-8", "surrogatepass"))
                stdin.seek(0)
                proc = subprocess.Popen(
                    [sys.executable, "-I", *([] if limits.site_packages else ["-S"]), str(CHILD), json.dumps(config)],
                    stdin=stdin,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(status_w,),
                    cwd=workdir,
                    env=env,
                    start_new_session=True,
                )
        except OSError as e:
            return result(error=f"could not start the sandbox: {e}")
        finally:
            os.close(status_w)
        status, out, err, timed_out = _collect(proc, status_r, limits)
        cpu_used = _reap(proc)
        stderr = err.text()
        if timed_out:
            error = f"timed out: stopped after {limits.timeout_s:g} s of wall-clock time"
        elif "error" in status:
            error = status["error"]
        elif "protections" not in status:
            error = f"the sandbox did not start (exit {proc.returncode}): {stderr.strip()[-500:]}"
        else:
            error = _stop_reason(proc.returncode, cpu_used, stderr, limits)
        truncated = out.total > len(out.data) or err.total > limits.max_output_bytes
        return result(out.text(), stderr, proc.returncode, timed_out, truncated, error, status.get("protections"))
    finally:
        if proc is not None:
            if proc.returncode is None:  # an exception above: nothing may be left running
                _reap(proc)
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        if status_r is not None:
            os.close(status_r)
        if "cleanup" not in _LEFT_OUT:
            _remove_tree(workdir)
