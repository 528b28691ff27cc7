"""The launch scripts (scripts/train, scripts/reproduce, scripts/eval) run the way the tests run them: in a clean
environment, in ``DRY_RUN=print`` mode (pure bash: each training launch printed as its hydra overrides), and the
files their checks read (prompt parquets, evaluation data)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from recipe.exgrpo.launch_checks.dry_run import NODE_GPUS_ENV, DryRunReport

REPO = Path(__file__).resolve().parents[2]
TRAIN_DIR = REPO / "scripts" / "train"
#: the markers around each launch a script prints in DRY_RUN=print mode (scripts/train/common.sh)
PRINT_BEGIN = "# >>> python -m recipe.exgrpo.main_exgrpo"
PRINT_END = "# <<<"
#: Environment a user may have set; removed so every run starts from the scripts' own defaults.
CLEARED_ENV = (
    "MODEL_PATH",
    "TRAIN_FILE",
    "VAL_FILE",
    "CKPT_DIR",
    "PROJECT_NAME",
    "EXPERIMENT_NAME",
    "N_GPUS_PER_NODE",
    "NNODES",
    "ROLLOUT_TP",
    "TRAINER",
    "RAY_ADDRESS",
    "DRY_RUN",
    "DRY_RUN_QUIET",
    "DRY_RUN_ALLOW_NEW_KEYS",
    "PREFLIGHT",
    "STAGES",
    "OUT_DIR",
    "LUFFY_MODEL_PATH",
    "VERL_PLATFORM",
    "CKPT_KEEP",
    "CHECK_CONTEXT",
    "DATA_DIR",
    "ALLOW_PARTIAL_EVAL",
    "PROMPT_STYLE",
    "EVAL_N_GPUS",
    "EVAL_TP",
    "EVAL_GRADING",
    "EVAL_CHECK_ONLY",
)
#: What the dry run reads from this process's environment: the CPU backend's switch (VERL_PLATFORM=cpu, whose
#: checks reject the GPU settings the scripts are for) and the settings a user may have exported (the context
#: check, the memory estimate's card and model size, the node's GPUs for a reward model in its own pool).
DRY_RUN_ENV = ("VERL_PLATFORM", "CHECK_CONTEXT", "GPU_MEMORY_GIB", "MODEL_PARAMS", NODE_GPUS_ENV)


def clear_dry_run_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process dry run of a GPU launch, as on a machine where none of :data:`DRY_RUN_ENV` is set."""
    for name in DRY_RUN_ENV:
        monkeypatch.delenv(name, raising=False)


def script_id(path: Path) -> str:
    return str(path.relative_to(REPO / "scripts"))


def script_env(tmp_path: Path | None = None, **extra: str) -> dict[str, str]:
    # (the TIR scripts pass every EXGRPO_SANDBOX_* variable set on to the workers)
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV and not k.startswith("EXGRPO_SANDBOX_")}
    env["PYTHON"] = sys.executable
    if tmp_path is not None:
        env["CKPT_DIR"] = str(tmp_path / "ckpt")
    env.update(extra)
    return env


def run_script(script: Path, *args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def launch_blocks(stdout: str, script: str) -> list[list[str]]:
    """The override lists of the launches a ``DRY_RUN=print`` run printed (between PRINT_BEGIN and PRINT_END)."""
    launches, current = [], None
    for line in stdout.splitlines():
        if line == PRINT_BEGIN:
            current = []
        elif line == PRINT_END:
            launches.append(current)
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, f"{script}: unterminated launch block"
    return launches


def printed_launches(script: Path, *args: str, **env: str) -> list[list[str]]:
    """The override lists a script would launch with (``DRY_RUN=print``), one per training launch."""
    proc = run_script(script, *args, env=script_env(DRY_RUN="print", **env), timeout=60)
    assert proc.returncode == 0, f"{script_id(script)} failed in DRY_RUN=print mode:\n{proc.stderr}"
    return launch_blocks(proc.stdout, script_id(script))


def flat(report: DryRunReport) -> dict[str, Any]:
    """Leaf path -> value of the resolved config."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else str(k))
        else:
            out[prefix] = node

    walk(OmegaConf.to_container(report.config, resolve=True), "")
    return out


def differing_paths(a: DryRunReport, b: DryRunReport) -> set[str]:
    """Leaf paths whose values differ, ignoring the run's name and directory (and what interpolates them)."""
    fa, fb = flat(a), flat(b)
    names = {
        str(a.config.trainer.experiment_name),
        str(b.config.trainer.experiment_name),
        str(a.config.trainer.default_local_dir),
        str(b.config.trainer.default_local_dir),
    }
    return {
        k
        for k in set(fa) | set(fb)
        if fa.get(k) != fb.get(k) and not (str(fa.get(k)) in names and str(fb.get(k)) in names)
    }


def prompt_file(path: Path, messages: list[dict]) -> Path:
    """A one-row verl parquet whose prompt is ``messages`` (what the pre-flight's prompt-style check reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {"data_source": "x", "prompt": messages, "reward_model": {"ground_truth": "1", "style": "rule"}}
    pq.write_table(pa.Table.from_pylist([row]), path)
    return path


def eval_data(directory: Path, ood: tuple[str, ...] = ("arc_c", "gpqa_diamond", "mmlu_pro")) -> Path:
    """A DATA_DIR with (empty) evaluation files: the in-distribution set and the out-of-distribution ones ``ood``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("test_id", *ood):
        (directory / f"{name}.parquet").touch()
    return directory
