"""Every command the README and docs/*.md quote runs, in its dry or ``--help`` form, so that the docs stay true.

The commands are read from the ```bash blocks (continuation lines joined, comments dropped, ``VAR=value`` lines of a
block substituted into the later ones) and from inline code that starts like a command (``python -m ...``,
``bash scripts/...``). Each is checked without training, GPUs or the network:

- ``python -m MODULE ARGS``: the project's parsers parse ARGS in-process (a renamed flag, a bad choice, a missing
  argument fails); other modules run ``--help`` and must list every flag used; ``recipe.exgrpo.dry_run`` commands also
  validate their overrides; ``recipe.exgrpo.verl_compat`` names known packages; ``pytest`` names existing files;
- ``python benchmarks/X.py ARGS``: ``--help``, every flag listed;
- ``bash scripts/train/*.sh`` (and reproduce, ablations): ``DRY_RUN=print``, then each printed launch composed and
  validated by the dry run; ``common.sh ray-*``, ``eval_*.sh``: ``DRY_RUN=print`` (the eval command then parses);
  ``prepare_data.sh``, ``install_gpu.sh``: ``DRY_RUN=1`` (each printed command parses); ``demo_cpu.sh``: its
  arguments parse with the demo's parser; ``lock_gpu.sh`` (it asks the package index): ``bash -n``;
- a block of hydra overrides: composed with the smallest launch the dry run accepts;
- ``pip install``: each requirement parses.
Commands that only make sense on a user's machine (``cp``, ``ssh``, a SLURM ``if``) are listed with the reason; a
command of another kind fails the test until a check is added here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers.launch_scripts import eval_data, launch_blocks, script_env

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PYTHONS = ("python", "python3", ".venv/bin/python", ".venv-vllm/bin/python")
#: commands a test cannot run in any form, and why
NOT_RUN = {
    "cp": "copies a user's output directory",
    "cd": "changes the shell's directory (the commands after it are checked one by one)",
    "ssh": "reaches another machine",
    "scp": "reaches another machine",
    "chmod": "a user's file",
    "export": "sets the user's shell",
    "if": "a SLURM sketch (its commands are checked one by one)",
    "then": "a SLURM sketch",
    "else": "a SLURM sketch",
    "fi": "a SLURM sketch",
    "ray": "needs a running Ray cluster",
    "hf": "logs in to the Hub",
}
#: scripts that build environments or run the suite itself
NOT_RUN_SCRIPTS = {
    "scripts/run_tests.sh": "the test command itself",
    ".ci/run": "CI's entry point: the test command itself",
    "scripts/setup_env.sh": "builds the venvs (the test command runs it before the tests)",
}
#: modules the docs name by their command name; their parsers live elsewhere
PARSER_MODULES = {
    "exgrpo.eval": "exgrpo.eval.cli",
    "recipe.exgrpo.cpu_demo": "recipe.exgrpo.harness.demo",
    "recipe.exgrpo.dry_run": "recipe.exgrpo.launch_checks.dry_run.driver",
}
#: hydra applications: ``--help`` composes the whole config
HYDRA_ENTRY_POINTS = ("recipe.exgrpo.main_exgrpo", "verl.trainer.main_ppo")
#: values for the shell variables the docs' commands use without setting them (a SLURM job's, a head node's address)
SHELL_VARIABLES = {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "HEAD_IP": "10.0.0.1"}
#: the smallest launch the dry run validates, for blocks that list overrides only
BASE_LAUNCH = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
#: documented commands that do not work yet, with the reason; the test fails once they do (strict xfail)
KNOWN_BROKEN: dict[str, str] = {}


@dataclass
class Command:
    where: str  # file:line
    text: str  # as quoted
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    #: quoted inline in a sentence: may name a command without its required arguments ("python -m exgrpo.eval run")
    inline: bool = False

    @property
    def id(self) -> str:
        return f"{self.where}: {self.text[:80]}"


# --------------------------------------------------------------------------------------------------- reading
def _fenced_blocks(text: str):
    fence, lines, start = None, [], 0
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            if fence is None:
                fence, lines, start = line.strip()[3:].strip(), [], i + 1
            else:
                yield fence, start, lines
                fence = None
        elif fence is not None:
            lines.append(line)


def _placeholders(text: str) -> str:
    """``[--tokenizer DIR]`` -> its content; ``[hydra overrides, e.g. ...]`` and ``[extra args]`` dropped."""
    text = re.sub(r"\[(--[^\]]*)\]", r"\1", text)
    return re.sub(r"\[[^\]=]* [^\]]*\]", "", text)


def _split(line: str, variables: dict[str, str]) -> list[list[str]]:
    for name, value in variables.items():
        line = re.sub(rf"\$\{{?{name}\}}?(?![A-Za-z0-9_])", value, line)
    lex = shlex.shlex(_placeholders(line), posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    out, current = [], []
    for token in lex:
        if token in (";", "&&", "||", "|", "&"):
            out.append(current)
            current = []
        else:
            current.append(token)
    return [c for c in out + [current] if c]


def _command(where: str, text: str, tokens: list[str]) -> Command:
    env = {}
    while tokens and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[0]):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    return Command(where, text, env, tokens)


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        rel = path.relative_to(REPO)
        text = path.read_text(encoding="utf-8")
        for fence, start, lines in _fenced_blocks(text):
            if fence not in ("bash", "sh"):
                continue
            joined, numbers, buf, first = [], [], "", None
            for n, line in enumerate(lines, start):
                first = n if first is None else first
                if line.rstrip().endswith("\\"):
                    buf += line.rstrip()[:-1] + " "
                    continue
                joined.append(buf + line)
                numbers.append(first)
                buf, first = "", None
            variables: dict[str, str] = dict(SHELL_VARIABLES)
            overrides = [ln.split("#")[0].strip() for ln in joined if ln.strip() and not ln.strip().startswith("#")]
            if overrides and all(re.match(r"^\+{0,2}[a-z_]+\.[\w.]+=", o) for o in overrides):
                commands.append(Command(f"{rel}:{start}", " ".join(overrides), {}, ["<overrides>", *overrides]))
                continue
            for n, line in zip(numbers, joined):
                for tokens in _split(line, variables):
                    cmd = _command(f"{rel}:{n}", " ".join(tokens), list(tokens))
                    if not cmd.argv:  # VAR=value alone: used by the block's later lines
                        variables.update(cmd.env)
                        continue
                    cmd.text = line.split(" #")[0].strip()
                    commands.append(cmd)
        for n, line in enumerate(text.splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                if not re.match(r"^([A-Z_]+=\S+ )*(python3? |bash |\.venv(-vllm)?/bin/python )", span):
                    continue
                if "<" in span:  # a template such as scripts/train/<script>.sh
                    continue
                alternative = re.sub(r"(\S+?)\|\S+", r"\1", span)  # "--reference table1|table5": the first
                for tokens in _split(alternative, {}):
                    cmd = _command(f"{rel}:{n}", span, list(tokens))
                    cmd.inline = True
                    commands.append(cmd)
    return commands


COMMANDS = documented_commands()


# ---------------------------------------------------------------------------------------------------- checks
@functools.cache
def _help(argv: tuple[str, ...]) -> str:
    proc = subprocess.run([sys.executable, *argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(argv)} --help failed:\n{proc.stderr[-2000:]}"
    return proc.stdout


def _flags_listed(argv: list[str], help_text: str) -> None:
    for token in argv:
        flag = token.split("=")[0]
        if flag.startswith("--") and flag != "--":
            assert re.search(rf"(^|[\s,\[]){re.escape(flag)}([\s,=\]]|$)", help_text, re.M), f"{flag} is not an option"


def _parse(parser, args: list[str]):
    """``parser.parse_args(args)``, with ALL-CAPS placeholders (``--seed S``) given a number where one is needed."""
    typed = {
        s: a.type for a in parser._actions for s in a.option_strings if a.type in (int, float) and a.option_strings
    }
    args = list(args)
    for i, token in enumerate(args[:-1]):
        if token in typed and re.fullmatch(r"[A-Z]+", args[i + 1]):
            args[i + 1] = "1"
    try:
        return parser.parse_args(args)
    except SystemExit as e:
        raise AssertionError(f"the arguments {args} do not parse (exit {e.code}; the error is above)") from None


@functools.cache
def _validated(overrides: tuple[str, ...]) -> str | None:
    """The dry run's problems for one launch, None when it validates (memoised: scripts share launches)."""
    from recipe.exgrpo.launch_checks.dry_run import DryRunError, dry_run

    try:
        dry_run(list(overrides))
    except DryRunError as e:
        return str(e)
    return None


def check_python_module(module: str, args: list[str], inline: bool = False) -> None:
    if module == "pytest":
        for a in args:
            if a.startswith("tests/"):
                assert (REPO / a).exists(), f"{a} does not exist"
        return
    if module in HYDRA_ENTRY_POINTS:  # their --help composes the whole config: the module and any overrides
        assert importlib.util.find_spec(module) is not None
        if args:
            assert _validated(tuple(BASE_LAUNCH + args)) is None
        return
    if module == "recipe.exgrpo.verl_compat":
        from recipe.exgrpo.verl_compat import CHECKED_ON

        assert set(args) <= set(CHECKED_ON), f"unknown packages {set(args) - set(CHECKED_ON)}"
        return
    if module == "verl.model_merger":  # its parser reads sys.argv
        from verl.model_merger.base_model_merger import parse_args

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", ["verl.model_merger", *args])
            try:
                parse_args()
            except SystemExit as e:
                raise AssertionError(f"the arguments {args} do not parse (exit {e.code})") from None
        return
    if module == "nltk.downloader":
        pytest.skip("nltk is installed in the GPU environment with lm-eval, not here")
    parser_module = PARSER_MODULES.get(module, module)
    mod = importlib.import_module(parser_module) if importlib.util.find_spec(parser_module) else None
    if (
        not inline
        and mod is not None
        and hasattr(mod, "build_parser")
        and parser_module.split(".")[0] in ("exgrpo", "recipe", "data_preprocess")
    ):
        parsed = _parse(mod.build_parser(), args)
        if module == "recipe.exgrpo.dry_run":
            problems = _validated(tuple(parsed.overrides))
            assert problems is None, problems
        return
    subcommands = []
    for a in args:
        if a.startswith("-") or "/" in a or "." in a:
            break
        subcommands.append(a)
    if mod is not None and hasattr(mod, "main") and parser_module.split(".")[0] in ("exgrpo", "recipe"):
        _flags_listed(args, _help_in_process(mod, [*subcommands, "--help"]))
    else:
        _flags_listed(args, _help(("-m", module, *subcommands)))


def _help_in_process(mod, argv: list[str]) -> str:
    """What ``main(argv)`` of a project module prints for ``--help`` (no new interpreter: verl is imported once)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        mod.main(argv)
    assert exit_info.value.code in (0, None), f"{mod.__name__} {' '.join(argv)} exited {exit_info.value.code}"
    return out.getvalue()


def check_bash(cmd: Command, tmp_path: Path) -> None:
    script, args = cmd.argv[1], cmd.argv[2:]
    assert (REPO / script).is_file(), f"{script} does not exist"
    if script in NOT_RUN_SCRIPTS:  # not run (NOT_RUN_SCRIPTS says why): its syntax only
        assert subprocess.run(["bash", "-n", script], cwd=REPO, timeout=30).returncode == 0, script
        return
    env = script_env(tmp_path, **cmd.env)
    env.pop("VERL_PLATFORM", None)
    if script == "scripts/lock_gpu.sh":  # it asks the package index: its syntax only
        assert subprocess.run(["bash", "-n", script], cwd=REPO, timeout=30).returncode == 0
        return
    if script == "scripts/demo_cpu.sh":  # sets up the venv, then passes its arguments to the demo
        from recipe.exgrpo.harness.demo import build_parser

        _parse(build_parser(), args)
        return
    if script in ("scripts/prepare_data.sh", "scripts/install_gpu.sh"):
        env.update(DRY_RUN="1", INSTALLER=env.get("INSTALLER", "pip"))
        proc = subprocess.run(["bash", script, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        for line in proc.stderr.splitlines():
            if line.startswith(f"+ {sys.executable} -m data_preprocess."):
                printed = shlex.split(line[2:])
                check_python_module(printed[2], printed[3:])
        return
    env["DRY_RUN"] = "print"
    if script.startswith("scripts/eval/"):
        env.setdefault("DATA_DIR", str(eval_data(tmp_path / "data")))
    proc = subprocess.run(["bash", script, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if script in ("scripts/eval/eval_id.sh", "scripts/eval/eval_ood.sh"):
        printed = shlex.split(proc.stdout.strip())
        assert printed[1:3] == ["-m", "exgrpo.eval"], proc.stdout
        check_python_module("exgrpo.eval", printed[3:])
        return
    if script.startswith(("scripts/train/", "scripts/reproduce/")) and not script.endswith("common.sh"):
        launches = launch_blocks(proc.stdout, script)
        trains = "train" in env.get("STAGES", "train").split(",")
        assert launches or not trains, f"{script} printed no launch"
        for overrides in launches:
            problems = _validated(tuple(overrides))
            assert problems is None, problems


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN_BROKEN[c.text], strict=True))
        if c.text in KNOWN_BROKEN
        else c
        for c in COMMANDS
    ],
    ids=[c.id for c in COMMANDS],
)
def test_a_documented_command_runs_in_its_dry_form(cmd: Command, tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    program = cmd.argv[0]
    if program == "<overrides>":
        problems = _validated(tuple(BASE_LAUNCH + cmd.argv[1:]))
        assert problems is None, problems
    elif program in PYTHONS:
        if cmd.argv[1:2] == ["-m"]:
            check_python_module(cmd.argv[2], cmd.argv[3:], inline=cmd.inline)
        elif cmd.argv[1:2] == ["-c"]:
            pytest.skip("a Python snippet")
        else:
            script = cmd.argv[1]
            assert (REPO / script).is_file(), f"{script} does not exist"
            _flags_listed(cmd.argv[2:], _help((script,)))
    elif program == "bash":
        check_bash(cmd, tmp_path)
    elif program == "pip":
        from packaging.requirements import Requirement

        for a in cmd.argv[2:]:
            if not a.startswith("-"):
                Requirement(a)  # raises on a malformed requirement
    elif program in NOT_RUN:
        pytest.skip(f"{program}: {NOT_RUN[program]}")
    else:
        pytest.fail(f"no check for {cmd.text!r}: add one to tests/integration/test_docs_commands.py")


def test_the_docs_quote_commands():
    """The reader above finds what the docs quote (a change of their layout must not leave this test empty)."""
    texts = {c.text for c in COMMANDS}
    assert len(COMMANDS) > 80
    assert "bash scripts/demo_cpu.sh" in texts and "python -m recipe.exgrpo.env_check" in texts
    assert any(c.argv[:3] == ["python", "-m", "data_preprocess.benchmarks"] for c in COMMANDS)
    assert any(c.argv[0] == "<overrides>" for c in COMMANDS)
    assert os.path.basename(__file__) == "test_docs_commands.py"


def test_the_seed_the_docs_name_is_the_default():
    from exgrpo.config import ExGRPOConfig

    doc = (REPO / "docs" / "launch_scripts.md").read_text(encoding="utf-8")
    (row,) = [line for line in doc.splitlines() if line.startswith("| seeds |")]
    assert f"`exgrpo.seed` {ExGRPOConfig().seed}," in row
