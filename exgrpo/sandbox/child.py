"""The child side of :mod:`exgrpo.sandbox.runner`: run by path as ``python -I -S child.py CONFIG_JSON``.

It confines its own process, in this order, before it runs a line of the model's code: resource limits,
capabilities dropped, ``no_new_privs``, Landlock (writes, and reads outside ``readable_paths()``), seccomp-BPF (the
rule groups of ``SECCOMP_GROUPS``). Then it writes what it applied as one JSON object to
the status pipe the parent passed (closed before the code runs, so the code cannot forge it) and runs the code from
stdin. Doing this here rather than in a ``preexec_fn`` keeps Python code out of the window between fork and exec of
the parent, a threaded Ray actor.

Stdlib only, and importing it runs nothing: the parent imports it for the syscall tables and the probe, and ``-I``
keeps the checkout off this interpreter's ``sys.path`` anyway.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import sys

#: per architecture: the seccomp audit arch and the syscall numbers the filter and the probes use
SYSCALLS = {
    "x86_64": {
        "audit_arch": 0xC000003E,
        "socket": 41,
        "setrlimit": 160,
        "prlimit64": 302,
        "ptrace": 101,
        "setsid": 112,
        "setpgid": 109,
        "unshare": 272,
        "setns": 308,
        "clone": 56,
        "clone3": 435,
        "fork": 57,
        "vfork": 58,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "capset": 126,
        "seccomp": 317,
        # metadata
        "chmod": 90,
        "fchmod": 91,
        "fchmodat": 268,
        "fchmodat2": 452,
        "chown": 92,
        "fchown": 93,
        "lchown": 94,
        "fchownat": 260,
        "utime": 132,
        "utimes": 235,
        "futimesat": 261,
        "utimensat": 280,
        "setxattr": 188,
        "lsetxattr": 189,
        "fsetxattr": 190,
        "removexattr": 197,
        "lremovexattr": 198,
        "fremovexattr": 199,
        "setxattrat": 463,
        "removexattrat": 466,
        "file_setattr": 469,
        "ioctl": 16,
        # state beside the process: System V IPC, POSIX message queues, keyrings, memory files
        "shmget": 29,
        "shmat": 30,
        "shmctl": 31,
        "shmdt": 67,
        "semget": 64,
        "semop": 65,
        "semctl": 66,
        "semtimedop": 220,
        "msgget": 68,
        "msgsnd": 69,
        "msgrcv": 70,
        "msgctl": 71,
        "mq_open": 240,
        "mq_unlink": 241,
        "mq_timedsend": 242,
        "mq_timedreceive": 243,
        "mq_notify": 244,
        "mq_getsetattr": 245,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "memfd_create": 319,
        "memfd_secret": 447,
        # other processes' scheduling; leases
        "setpriority": 141,
        "sched_setparam": 142,
        "sched_setscheduler": 144,
        "sched_setaffinity": 203,
        "sched_setattr": 314,
        "ioprio_set": 251,
        "fcntl": 72,
    },
    "aarch64": {  # the generic table: no fork/vfork, chmod, chown, lchown, utime(s), futimesat (the *at forms only)
        "audit_arch": 0xC00000B7,
        "socket": 198,
        "setrlimit": 164,
        "prlimit64": 261,
        "ptrace": 117,
        "setsid": 157,
        "setpgid": 154,
        "unshare": 97,
        "setns": 268,
        "clone": 220,
        "clone3": 435,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "capset": 91,
        "seccomp": 277,
        "fchmod": 52,
        "fchmodat": 53,
        "fchmodat2": 452,
        "fchown": 55,
        "fchownat": 54,
        "utimensat": 88,
        "setxattr": 5,
        "lsetxattr": 6,
        "fsetxattr": 7,
        "removexattr": 14,
        "lremovexattr": 15,
        "fremovexattr": 16,
        "setxattrat": 463,
        "removexattrat": 466,
        "file_setattr": 469,
        "ioctl": 29,
        "shmget": 194,
        "shmat": 196,
        "shmctl": 195,
        "shmdt": 197,
        "semget": 190,
        "semop": 193,
        "semctl": 191,
        "semtimedop": 192,
        "msgget": 186,
        "msgsnd": 189,
        "msgrcv": 188,
        "msgctl": 187,
        "mq_open": 180,
        "mq_unlink": 181,
        "mq_timedsend": 182,
        "mq_timedreceive": 183,
        "mq_notify": 184,
        "mq_getsetattr": 185,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "memfd_create": 279,
        "memfd_secret": 447,
        "setpriority": 140,
        "sched_setparam": 118,
        "sched_setscheduler": 119,
        "sched_setaffinity": 122,
        "sched_setattr": 274,
        "ioprio_set": 30,
        "fcntl": 25,
    },
}
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # the same on both

# Landlock filesystem rights that change the filesystem, by the ABI that introduced them, and those that read it
_FS_WRITE = {1: 1 << 1 | 0b1111111110000, 2: 1 << 13, 3: 1 << 14}  # v1: WRITE_FILE, REMOVE_*, MAKE_*; REFER; TRUNCATE
_FS_WRITE_FILE, _FS_TRUNCATE = 1 << 1, 1 << 14
_FS_EXECUTE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 2, 1 << 3  # ABI 1
_FS_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
#: what the code may read besides its temp dir: the system's programs and shared libraries (the interpreter's
#: extension modules load them), the files of /etc the C library reads (the loader's cache, the time zone, users
#: and groups), the devices that hold no data. Not /etc, /home, /root, /proc, /sys, /tmp, the checkout, the data.
READABLE_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin")
READABLE_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
READABLE_DEVICES = ("/dev/zero", "/dev/urandom", "/dev/random", "/dev/full")
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI >= 4
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI >= 6

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 38, 22, 24, 47
SECCOMP_MODE_FILTER, SECCOMP_GET_ACTION_AVAIL = 2, 2
RET_KILL_PROCESS, RET_ALLOW, RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
CLONE_THREAD = 0x00010000
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (NEWTIME is a clone3/unshare flag only)
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _prctl(libc: ctypes.CDLL, option: int, *args: int) -> int:
    padded = [ctypes.c_ulong(a) for a in (*args, 0, 0, 0, 0)[:4]]
    return _check(libc.prctl(ctypes.c_int(option), *padded), f"prctl({option})")


def arch() -> str | None:
    machine = os.uname().machine
    return machine if machine in SYSCALLS else None


def landlock_abi(libc: ctypes.CDLL | None = None) -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is absent (not built, not in ``lsm=``, or blocked)."""
    if arch() is None:
        return 0
    libc = libc or _libc()
    version = libc.syscall(ctypes.c_long(LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(version), 0)


def seccomp_available(libc: ctypes.CDLL | None = None) -> bool:
    """Whether the kernel runs seccomp filters that return an errno (asked with SECCOMP_GET_ACTION_AVAIL)."""
    table = SYSCALLS.get(arch() or "")
    if table is None:
        return False
    libc = libc or _libc()
    action = ctypes.c_uint32(RET_ERRNO)
    nr = ctypes.c_long(table["seccomp"])
    return libc.syscall(nr, ctypes.c_uint(SECCOMP_GET_ACTION_AVAIL), ctypes.c_uint(0), ctypes.byref(action)) == 0


def _set_rlimits(cfg: dict) -> None:
    mb = 1 << 20
    wanted = {
        resource.RLIMIT_CORE: (0, 0),
        # SIGXCPU at the soft limit; the hard one, a second later, is SIGKILL for code that ignores SIGXCPU
        resource.RLIMIT_CPU: (cfg["cpu_s"], cfg["cpu_s"] + 1),
        resource.RLIMIT_FSIZE: (cfg["max_file_mb"] * mb,) * 2,
        resource.RLIMIT_NOFILE: (cfg["max_open_files"],) * 2,
        resource.RLIMIT_AS: (cfg["memory_mb"] * mb,) * 2,
    }
    for res, (soft, hard) in wanted.items():
        _, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:  # never ask for more than we have (a non-root caller may not)
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(res, (soft, hard))
    # a write past RLIMIT_FSIZE then fails with EFBIG (an OSError the code sees) instead of killing the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _drop_capabilities(libc: ctypes.CDLL, table: dict) -> None:
    """Empty every capability set, so that uid 0 here is a plain user: no module loading, reboot, raw I/O, DAC
    override, raising hard limits..., and an exec'd program does not get them back (empty bounding set)."""
    for cap in range(64):
        if libc.prctl(ctypes.c_int(PR_CAPBSET_DROP), ctypes.c_ulong(cap), *[ctypes.c_ulong(0)] * 3) != 0:
            break  # EINVAL: past the kernel's last capability; EPERM: no CAP_SETPCAP (not root), nothing to drop
    libc.prctl(ctypes.c_int(PR_CAP_AMBIENT), ctypes.c_ulong(4), *[ctypes.c_ulong(0)] * 3)  # CLEAR_ALL; may be absent
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all zero
    _check(libc.syscall(ctypes.c_long(table["capset"]), ctypes.byref(header), ctypes.byref(data)), "capset")


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # struct landlock_path_beneath_attr is packed
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def readable_paths() -> tuple[list[str], list[str]]:
    """The directories and the files this interpreter's code may read (beside its temp dir and /dev/null): the
    system's (``READABLE_*``), the interpreter's standard library and shared library (a Python subprocess loads it),
    its executable and its venv's ``pyvenv.cfg``, and its site-packages when it started with them (no ``-S``)."""
    dirs = [*READABLE_DIRS, os.path.dirname(os.__file__)]
    if os.path.dirname(os.__file__).startswith(os.path.join(sys.base_prefix, "lib") + os.sep):
        dirs.append(os.path.join(sys.base_prefix, "lib"))  # an install's lib (libpython), never "/lib" of a prefix "/"
    site = sys.modules.get("site")  # imported at start-up unless -S
    if site is not None:
        dirs += site.getsitepackages()
    files = [*READABLE_FILES, *READABLE_DEVICES, os.path.realpath(sys.executable)]
    files.append(os.path.join(sys.prefix, "pyvenv.cfg"))
    return dirs, files


def _landlock(libc: ctypes.CDLL, abi: int, workdir: str, confine_reads: bool) -> None:
    """Writes allowed beneath ``workdir`` (and to /dev/null) only; with ``confine_reads``, reads too, beneath
    ``workdir`` and the :func:`readable_paths`; on ABI >= 4 no TCP bind/connect at all; on ABI >= 6 no signal to a
    process outside this sandbox and no abstract unix socket outside it."""
    fs = sum(bits for version, bits in _FS_WRITE.items() if version <= abi) | (_FS_READ if confine_reads else 0)
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(fs, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct grew with the ABI
    nr = ctypes.c_long
    ruleset = _check(
        libc.syscall(nr(LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)),
        "landlock_create_ruleset",
    )
    # subprocess.DEVNULL and open(os.devnull, "w") are common; /dev/null takes file rights only
    rules = [(workdir, fs, True), (os.devnull, fs & (_FS_WRITE_FILE | _FS_TRUNCATE | _FS_READ_FILE), True)]
    if confine_reads:
        dirs, files = readable_paths()
        rules += [(d, _FS_READ, False) for d in dirs] + [(f, _FS_EXECUTE | _FS_READ_FILE, False) for f in files]
    try:
        for path, allowed, required in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                if required:
                    raise
                continue  # a system path this machine does not have
            try:
                if not required and os.path.isdir(path) != (allowed == _FS_READ):
                    continue  # a file where a directory was expected, or the other way round
                rule = ctypes.byref(_PathBeneath(allowed, fd))
                beneath, flags = ctypes.c_int(1), ctypes.c_uint32(0)  # LANDLOCK_RULE_PATH_BENEATH
                ret = libc.syscall(nr(LANDLOCK_ADD_RULE), ctypes.c_int(ruleset), beneath, rule, flags)
                _check(ret, f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        _check(libc.syscall(nr(LANDLOCK_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)), "restrict_self")
    finally:
        os.close(ruleset)


#: the seccomp filter's rule groups (each can be left out on its own: ``_LEFT_OUT`` "seccomp:<group>", the tests'
#: fault injection); the syscalls each group denies outright (EPERM unless said otherwise). The groups ``limits``,
#: ``namespaces``, ``fork``, ``clone_parent``, ``metadata``, ``other_processes`` and ``leases`` also check arguments
#: (``seccomp_program``).
SECCOMP_GROUPS: dict[str, tuple[str, ...]] = {
    # no network: every address family, AF_UNIX too (a root process could reach docker.sock, Ray's and other
    # daemons' sockets; Landlock does not confine connect() to a named socket). socketpair() stays. io_uring performs
    # socket/connect/open without the syscalls of this filter being seen.
    "network": ("socket", "io_uring_setup", "io_uring_enter", "io_uring_register"),
    "limits": ("setrlimit",),  # the limits stay (for uid 0 too; prlimit64 below)
    "ptrace": ("ptrace",),  # no reading or steering another process (Landlock denies outside ones already)
    "process_group": ("setsid", "setpgid"),  # every descendant stays in the process group the parent kills
    "namespaces": ("unshare", "setns"),  # the widest kernel attack surface open to an unprivileged process
    "fork": ("fork", "vfork"),  # unless allow_subprocess
    # Landlock has no right for a file's metadata, and the code owns the caller's files (as uid 0: root's): no mode
    # (setuid bits), owner, times or extended attributes change anywhere, the temp dir included
    "metadata": (
        *("chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat"),
        *("utime", "utimes", "futimesat", "utimensat"),
        *("setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr"),
        *("setxattrat", "removexattrat", "file_setattr"),
    ),
    # state that outlives the process and that no limit of it counts: System V shared memory, semaphores and
    # message queues, POSIX message queues, keys in the user's and the session's keyrings
    "ipc": (
        *("shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop"),
        *("msgget", "msgsnd", "msgrcv", "msgctl"),
        *("mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"),
        *("add_key", "request_key", "keyctl"),
    ),
    "memfd": ("memfd_create", "memfd_secret"),  # memory in files: outside RLIMIT_AS
    "other_processes": (),  # setpriority, sched_set*, ioprio_set on another process: arguments, below
    "leases": (),  # fcntl(F_SETLEASE): arguments, below
    "clone_parent": (),  # clone(CLONE_PARENT): arguments, below
}
CLONE_PARENT = 0x00008000
F_SETLEASE = 1024
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
#: ioctl types whose commands change a file's flags or attributes (chattr: FS_IOC_SETFLAGS 'f' 2, FS_IOC_FSSETXATTR
#: 'X' 32, FS_IOC_SETVERSION 'v' 2, the fscrypt policy and key commands 'f' 19-26); their read-only commands stay
_FILE_IOCTL_TYPES = (ord("f"), ord("X"), ord("v"))
_FILE_IOCTL_READS = (0x80086601, 0x80046601, 0x801C581F)  # FS_IOC_GETFLAGS, FS_IOC32_GETFLAGS, FS_IOC_FSGETXATTR


def seccomp_program(
    table: dict, allow_subprocess: bool, skip: frozenset[str] | set[str] = frozenset()
) -> list[tuple[int, int, int, int]]:
    """The BPF program, as (code, jt, jf, k). Everything not named is allowed; each rule says why it is there.
    ``skip``: rule groups left out (``SECCOMP_GROUPS``; only the tests' fault injection)."""
    ld_nr, ld_arch = (0x20, 0, 0, 0), (0x20, 0, 0, 4)  # BPF_LD|W|ABS of seccomp_data.nr / .arch
    allow, deny = "allow", "deny"

    def ld_arg(i: int, high: bool = False) -> tuple[int, int, int, int]:
        return (0x20, 0, 0, 16 + 8 * i + (4 if high else 0))  # the argument's low (or high) 32 bits

    def jeq(k: int, jt: int | str, jf: int | str) -> tuple:
        return (0x15, jt, jf, k)

    def jset(k: int, jt: int | str, jf: int | str) -> tuple:
        return (0x45, jt, jf, k)

    def ret(k: int) -> tuple[int, int, int, int]:
        return (0x06, 0, 0, k)

    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    # a syscall made with another ABI (i386 int 0x80, x32) would be looked up in another table: kill
    prog = [ld_arch, jeq(table["audit_arch"], 1, 0), ret(RET_KILL_PROCESS), ld_nr]
    if "fork" in table:  # x86_64: the x32 ABI sets bit 30 of the number
        prog += [(0x35, 0, 1, 0x40000000), ret(RET_KILL_PROCESS)]  # BPF_JGE
    denied = {name: eperm for group, names in SECCOMP_GROUPS.items() if group not in skip for name in names}
    if allow_subprocess:
        denied = {name: action for name, action in denied.items() if name not in SECCOMP_GROUPS["fork"]}
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes glibc fall back to clone()
    denied["clone3"] = enosys
    for name, action in denied.items():
        if name in table:
            prog += [jeq(table[name], 0, 1), ret(action)]

    def block(name: str, body: list[tuple]) -> list[tuple]:
        """``body`` runs for syscall ``name`` only and ends in an allow or a deny (jumps to "allow"/"deny"); the
        number is reloaded first, as a body overwrites the accumulator."""
        body = [*body, ret(RET_ALLOW), ret(eperm)]
        at = {allow: len(body) - 2, deny: len(body) - 1}
        resolved = []
        for i, (code, jt, jf, k) in enumerate(body):
            jt, jf = (at[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
            resolved.append((code, jt, jf, k))
        return [ld_nr, jeq(table[name], 0, len(resolved)), *resolved]

    if "limits" not in skip:
        # prlimit64(pid, res, new, old): reading a limit (new == NULL, how glibc's getrlimit works) is fine
        prog += block("prlimit64", [ld_arg(2), jeq(0, 0, deny), ld_arg(2, high=True), jeq(0, allow, deny)])
    # clone(flags, ...): threads always; new namespaces never; CLONE_PARENT never (the new process would be the
    # caller's child, a zombie there when it exits); new processes only with allow_subprocess
    refused_flags = (CLONE_NEW_MASK if "namespaces" not in skip else 0) | (
        CLONE_PARENT if "clone_parent" not in skip else 0
    )
    clone = [ld_arg(0)] + ([jset(refused_flags, deny, 0)] if refused_flags else [])
    if not allow_subprocess and "fork" not in skip:
        clone += [jset(CLONE_THREAD, allow, deny)]
    prog += block("clone", clone)
    if "metadata" not in skip:
        ioctl = [ld_arg(1)] + [jeq(cmd, allow, 0) for cmd in _FILE_IOCTL_READS] + [(0x54, 0, 0, 0xFF00)]  # A &= ..
        ioctl += [jeq(kind << 8, deny, 0) for kind in _FILE_IOCTL_TYPES]
        prog += block("ioctl", ioctl)
    if "other_processes" not in skip:
        # the calling process's own scheduling only (pid 0): not the trainer's, not a sibling sandbox's (same uid)
        prog += block("setpriority", [ld_arg(0), jeq(PRIO_PROCESS, 0, deny), ld_arg(1), jeq(0, allow, deny)])
        prog += block("ioprio_set", [ld_arg(0), jeq(IOPRIO_WHO_PROCESS, 0, deny), ld_arg(1), jeq(0, allow, deny)])
        for name in ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr"):
            prog += block(name, [ld_arg(0), jeq(0, allow, deny)])
    if "leases" not in skip:
        # a lease on a file it can read would hold back the caller's open for writing until the call ends
        prog += block("fcntl", [ld_arg(1), jeq(F_SETLEASE, deny, allow)])
    return prog + [ret(RET_ALLOW)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp(libc: ctypes.CDLL, table: dict, allow_subprocess: bool, skip: frozenset[str]) -> None:
    prog = seccomp_program(table, allow_subprocess, skip)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*insn) for insn in prog])
    fprog = _SockFprog(len(prog), filters)
    _prctl(libc, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


def confine(cfg: dict) -> tuple[dict[str, bool | int], list[str]]:
    """Apply every protection this kernel offers; return what was applied and what failed."""
    # layers left out on purpose: only the tests' fault injection sets this ("landlock", "seccomp", ..., or a part
    # of one: "landlock:reads", "seccomp:<group>" of SECCOMP_GROUPS)
    skip = set(cfg.get("skip", ()))
    libc, table = _libc(), SYSCALLS.get(arch() or "")
    applied: dict[str, bool | int] = {
        "rlimits": False,
        "capabilities_dropped": False,
        "no_new_privs": False,
        "landlock_abi": 0,
        "signals_scoped": False,
        "reads_confined": False,
        "seccomp": False,
        "subprocess_allowed": bool(cfg["allow_subprocess"]),
    }
    failed: list[str] = []

    def attempt(name: str, step, *args) -> bool:
        if name in skip:
            return False
        try:
            step(*args)
            return True
        except (OSError, ValueError) as e:
            failed.append(f"{name}: {e}")
            return False

    applied["rlimits"] = attempt("rlimits", _set_rlimits, cfg)
    if table is None:
        failed.append(f"architecture: no syscall table for {os.uname().machine} (x86_64 and aarch64 only)")
        return applied, failed
    applied["capabilities_dropped"] = attempt("capabilities", _drop_capabilities, libc, table)
    applied["no_new_privs"] = attempt("no_new_privs", _prctl, libc, PR_SET_NO_NEW_PRIVS, 1)
    abi = landlock_abi(libc)
    if abi == 0 and "landlock" not in skip:
        failed.append("landlock: not available in this kernel")
    elif abi and attempt("landlock", _landlock, libc, abi, cfg["workdir"], "landlock:reads" not in skip):
        applied["landlock_abi"], applied["signals_scoped"] = abi, abi >= 6
        applied["reads_confined"] = "landlock:reads" not in skip
    groups = frozenset(name.split(":", 1)[1] for name in skip if name.startswith("seccomp:"))
    applied["seccomp"] = attempt("seccomp", _seccomp, libc, table, bool(cfg["allow_subprocess"]), groups)
    return applied, failed


def _run(code: str) -> None:
    import linecache
    import traceback
    import types

    for stream in (sys.stdout, sys.stderr):
        # line buffering: what was printed before a timeout still reaches the parent
        stream.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=True)
    linecache.cache["<tool>"] = (len(code), None, code.splitlines(True), "<tool>")  # source lines in tracebacks
    module = types.ModuleType("__main__")  # a fresh __main__: pickle and multiprocessing look classes up there
    sys.modules["__main__"], sys.argv = module, ["<tool>"]
    try:
        exec(compile(code, "<tool>", "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None  # leave this frame out
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    code = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # input() in the code sees end of file, not its own source
    os.close(null)
    applied, failed = confine(cfg)
    missing = [f for f in failed if f.split(":")[0] in ("landlock", "seccomp", "architecture")]
    status = {"protections": applied, "failed": failed}
    if cfg["require_isolation"] and missing:
        status["error"] = "isolation failed in the sandbox: " + "; ".join(missing)
    os.write(cfg["status_fd"], json.dumps(status).encode())
    os.close(cfg["status_fd"])
    if "error" in status:
        os._exit(125)
    del cfg, applied, failed, status
    _run(code)


if __name__ == "__main__":
    main()
