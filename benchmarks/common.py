"""What the benchmarks share: the repository, the command line's boilerplate, the revision and the machine a figure
came from, the child processes a benchmark measures in, and the synthetic experience pool of the pool benchmarks.

A benchmark runs as ``python benchmarks/NAME.py`` (its own folder first on ``sys.path``, not the repository), so each
one opens with the same two lines before it imports anything of the project::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first
    from benchmarks.common import REPO, ...  # noqa: E402
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: the interpreter of the vLLM CPU stack (``bash scripts/setup_env.sh --vllm``)
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

T = TypeVar("T")


# ------------------------------------------------------------------------------------------------ command line
def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """The parser of a benchmark whose module docstring is ``doc``: its first paragraph describes the command."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])


def comma_list(text: str | None, item: Callable[[str], T] = str) -> list[T]:
    """The values of a comma-separated option, each stripped and converted by ``item`` (blanks dropped)."""
    return [item(v.strip()) for v in (text or "").split(",") if v.strip()]


def add_run_folder(parser: argparse.ArgumentParser, name: str) -> None:
    """``--out`` (default ``outputs/NAME``) and ``--fresh``: the folder of a benchmark whose finished runs are reused,
    so that an interrupted one resumes where it stopped."""
    parser.add_argument("--out", default=str(REPO / "outputs" / name))
    parser.add_argument("--fresh", action="store_true", help="re-run runs that already finished in --out")


def run_stoppable(main: Callable[[], int | None], name: str) -> int:
    """A benchmark's ``main()`` as a command: SIGTERM (``timeout``), SIGHUP (the terminal closed) or Ctrl-C stop the
    run in progress (its trainer and Ray cluster) and whatever else it started, with one line ``[name] SIGTERM:
    ...`` and the shell's status for the signal (128 + its number), no traceback. Its finished runs stay in its
    folder (the next call reuses them)."""
    from recipe.exgrpo.harness.procs import main_until_stopped

    return main_until_stopped(main, label=name)


def vllm_python(path: str | Path) -> str:
    """``path``, the interpreter of the vLLM CPU stack; stops the benchmark, saying how to build it, when absent."""
    if not Path(path).exists():
        raise SystemExit(f"no vLLM CPU stack at {path}: run bash scripts/setup_env.sh --vllm")
    return str(path)


# ------------------------------------------------------------------------------------ where a figure came from
def git_revision() -> str:
    """The checkout's commit (short), with ``+dirty`` when it has uncommitted changes; ``unknown`` without git."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def extract_baseline(rev: str, workdir: str | Path, paths: Sequence[str] = ("exgrpo",)) -> str:
    """``git archive`` the ``paths`` of revision ``rev`` into ``workdir`` (the code a ``--baseline REV`` measures as
    "before"); returns the tree's root, to put first on ``sys.path``."""
    root = os.path.join(workdir, f"baseline-{rev[:12]}")
    os.makedirs(root, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, *paths], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
    return root


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def processor() -> str:
    return platform.processor() or platform.machine()


def host() -> str:
    """``node (processor, N cores)``: the machine of a benchmark's table."""
    return f"{platform.node() or 'host'} ({processor()}, {cores()} cores)"


def platform_line(numpy_version: str = np.__version__) -> str:
    """``processor, N cores, Python X, numpy Y``: the stack of an in-process benchmark's table."""
    return f"{processor()}, {cores()} cores, Python {platform.python_version()}, numpy {numpy_version}"


# ------------------------------------------------------------------------------------------------ child processes
def child_arguments(args: argparse.Namespace, names: Sequence[str]) -> list[str]:
    """The options ``--NAME VALUE`` that hand the parsed ``args`` of ``names`` on to a child run of the benchmark."""
    out: list[str] = []
    for name in names:
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out


def last_json_line(stdout: str) -> Any:
    """What a child printed as the last line of its output (its result, as JSON)."""
    return json.loads(stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ synthetic pool
#: trajectories the paper's 7B run's pool holds at its end
PAPER_TRAJECTORIES = 202_011
#: the options of :class:`Synthetic` (``tools``: also the multi-turn ones)
SYNTHETIC_POOL_OPTIONS = ("trajectories", "mean_len", "len_spread", "k", "groups_per_step", "seed")
SYNTHETIC_TOOL_OPTIONS = ("tool_share", "tool_calls", "tool_len")


def add_synthetic_pool_arguments(parser: argparse.ArgumentParser, tools: bool = False) -> None:
    """The options of the synthetic pool (:class:`Synthetic`): its size, response lengths, K, the groups a collect call
    gets and the seed; with ``tools``, the share and shape of its multi-turn trajectories."""
    parser.add_argument("--trajectories", type=int, default=PAPER_TRAJECTORIES)
    parser.add_argument("--mean-len", type=int, default=1500, help="mean response length in tokens")
    parser.add_argument("--len-spread", type=int, default=500, help="lengths uniform in mean +- spread")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--groups-per-step", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    if tools:
        parser.add_argument(
            "--tool-share", type=float, default=0.0, help="share of trajectories with tool outputs (mask 0)"
        )
        parser.add_argument("--tool-calls", type=int, default=2, help="tool outputs per multi-turn trajectory")
        parser.add_argument("--tool-len", type=int, default=200, help="tokens per tool output")


class Synthetic:
    """Groups of K members whose correct responses are views into one random token buffer (no per-call cost).

    ``args``: the options of :func:`add_synthetic_pool_arguments` (the multi-turn ones may be absent: none then);
    ``GroupMember`` and ``Group``: the classes of the ``exgrpo.experience`` measured (this checkout's or a
    baseline's)."""

    def __init__(self, args: argparse.Namespace, GroupMember, Group):
        self.GroupMember, self.Group = GroupMember, Group
        self.rng = np.random.default_rng(args.seed)
        self.k = args.k
        self.lo = max(1, args.mean_len - args.len_spread)
        self.hi = args.mean_len + args.len_spread
        n = 1 << 23
        self.ids = self.rng.integers(0, 151_000, n, dtype=np.int32)
        self.lps = -self.rng.exponential(0.5, n).astype(np.float32)
        self.wrong = GroupMember(np.array([2], dtype=np.int32), np.array([-1.0], dtype=np.float32), 0.0)
        self.tool_share = getattr(args, "tool_share", 0.0)
        self.tool_calls = getattr(args, "tool_calls", 0)
        self.tool_len = getattr(args, "tool_len", 0)
        self.questions = 0  # questions made so far (the next one is openr1-<questions>)

    def member(self):
        n = int(self.rng.integers(self.lo, self.hi + 1))
        off = int(self.rng.integers(0, self.ids.shape[0] - n))
        if self.tool_share and self.rng.random() < self.tool_share:
            return self.GroupMember(self.ids[off : off + n], self.lps[off : off + n], 1.0, loss_mask=self.tool_mask(n))
        return self.GroupMember(self.ids[off : off + n], self.lps[off : off + n], 1.0)

    def tool_mask(self, n: int) -> np.ndarray:
        """Model turns with ``tool_calls`` tool outputs of ``tool_len`` tokens between them (mask 0 there)."""
        mask = np.ones(n, dtype=np.bool_)
        turn = n // (self.tool_calls + 1)
        for c in range(1, self.tool_calls + 1):
            start = c * turn - self.tool_len // 2
            mask[max(1, start) : min(n - 1, start + self.tool_len)] = False
        return mask

    def group(self, qid: str, n_correct: int):
        members = [self.member() for _ in range(n_correct)] + [self.wrong] * (self.k - n_correct)
        return self.Group(qid, members)

    def batches(self, pool, target: int, groups_per_step: int) -> Iterator[list]:
        """The groups of each collect call that fills ``pool`` up to ``target`` trajectories: up to
        ``groups_per_step`` new questions per call, each with 1..K-1 correct members (all stored), never more than
        the trajectories still missing. The caller collects each batch before asking for the next."""
        while len(pool) < target:
            groups = []
            budget = target - len(pool)
            for _ in range(groups_per_step):
                if budget <= 0:
                    break
                n_ok = int(min(self.rng.integers(1, self.k), budget))
                groups.append(self.group(f"openr1-{self.questions:06d}", n_ok))
                budget -= n_ok
                self.questions += 1
            yield groups
