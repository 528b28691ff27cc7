"""The dry run itself (every checker in order) and its command line: ``python -m recipe.exgrpo.dry_run``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from recipe.exgrpo.launch_checks.dry_run.compose import CONFIG_DIR, DEFAULT_CONFIG_NAME, compose_config
from recipe.exgrpo.launch_checks.dry_run.memory import generation_memory, update_memory
from recipe.exgrpo.launch_checks.dry_run.multi_turn import data_agent_problems, multi_turn_problems, sandbox_problems
from recipe.exgrpo.launch_checks.dry_run.overrides import check_overrides
from recipe.exgrpo.launch_checks.dry_run.paths import launch_path_checks
from recipe.exgrpo.launch_checks.dry_run.report import DryRunError, DryRunReport
from recipe.exgrpo.launch_checks.dry_run.reward_model import reward_model_problems
from recipe.exgrpo.launch_checks.dry_run.startup import run_entry_point_checks
from recipe.exgrpo.launch_checks.dry_run.workers import run_worker_checks


# ---------------------------------------------------------------------------------------------------- driver
def dry_run(
    overrides: Sequence[str],
    config_name: str = DEFAULT_CONFIG_NAME,
    config_dir: Path = CONFIG_DIR,
    allow_new_keys: Sequence[str] = (),
    check_files: bool = False,
    card_gib: float | None = None,
    model_params: float | None = None,
) -> DryRunReport:
    """Compose and validate one launch; raises ``DryRunError`` listing every problem found.

    ``card_gib`` / ``model_params``: the GPU's memory and the model's parameter count for the memory estimate
    (default: ``GPU_MEMORY_GIB`` or 80; ``MODEL_PARAMS``, else the model's config.json, else the known backbones).
    """
    for o in overrides:
        if "\n" in o:
            raise DryRunError([f"override {o.splitlines()[0]!r}... contains a newline"])
    config = compose_config(overrides, config_name, config_dir)
    problems = check_overrides(overrides, config, config_name, config_dir, allow_new_keys)
    exgrpo, startup = run_entry_point_checks(config)
    problems += startup
    # The worker checks read the values as numbers and need the recipe defaults prepare_config fills in: they run
    # once everything before is clean (a wrong type would only repeat itself as a follow-on error there).
    if exgrpo is not None and not problems:
        problems += run_worker_checks(config)
    # the pre-flight's file checks: every path required to exist with check_files, else those that exist here
    path_problems, not_checked = launch_path_checks(config, strict=check_files)
    problems += path_problems
    problems += reward_model_problems(config, check_files) if exgrpo is not None else []
    problems += multi_turn_problems(config, check_files) if exgrpo is not None else []
    problems += data_agent_problems(config) + sandbox_problems(config, check_files) if exgrpo is not None else []
    if problems:
        raise DryRunError(problems)
    notes, warnings = [], []
    if exgrpo.enable and int(exgrpo.replay_ratio * int(config.data.train_batch_size)) == 0:
        notes.append("exgrpo.replay_ratio x data.train_batch_size < 1: no question will ever be replayed")
    estimate, why_not = generation_memory(config, card_gib, model_params)
    if estimate is not None:
        warning = estimate.warning()
        (warnings if warning else notes).append(warning or estimate.summary())
    elif why_not and str(config.actor_rollout_ref.rollout.name) == "vllm":
        notes.append(f"no GPU memory estimate: {why_not}")
    if estimate is not None:
        update, why_not = update_memory(config, card_gib, model_params)
        if update is not None:
            warning = update.warning()
            (warnings if warning else notes).append(warning or update.summary())
        else:
            notes.append(f"no GPU memory estimate of the update: {why_not}")
    return DryRunReport(
        config=config,
        exgrpo=exgrpo,
        overrides=list(overrides),
        notes=notes,
        warnings=warnings,
        not_checked=not_checked,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m recipe.exgrpo.dry_run",
        description="Compose the full hydra config of an ExGRPO launch and validate it without launching anything.",
    )
    p.add_argument("overrides", nargs="*", help="hydra overrides, as given to recipe.exgrpo.main_exgrpo")
    p.add_argument("--config-name", default=DEFAULT_CONFIG_NAME, help="config in recipe/exgrpo/config")
    p.add_argument("--config-dir", default=str(CONFIG_DIR), help=argparse.SUPPRESS)
    p.add_argument("--quiet", "-q", action="store_true", help="do not print the resolved config (summary only)")
    p.add_argument("--output", "-o", help="also write the resolved config (YAML) to this file")
    p.add_argument(
        "--allow-new-key",
        action="append",
        default=[],
        metavar="PREFIX",
        help="accept +KEY additions under PREFIX (repeatable; also DRY_RUN_ALLOW_NEW_KEYS=a,b)",
    )
    p.add_argument(
        "--check-paths",
        action="store_true",
        help="require the model directory and the data files to exist here (a launch's pre-flight); without it, "
        "what exists is checked and each check that cannot run here is listed as 'not checked'",
    )
    p.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="memory of one GPU for the generation-memory estimate (default: $GPU_MEMORY_GIB, else 80)",
    )
    p.add_argument(
        "--model-params",
        default=None,
        help="parameter count for the estimate, e.g. 7.6e9 or 7.6B (default: $MODEL_PARAMS, else the model's "
        "config.json, else the known backbones)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    allow = list(args.allow_new_key) + [p for p in os.environ.get("DRY_RUN_ALLOW_NEW_KEYS", "").split(",") if p.strip()]
    try:
        from recipe.exgrpo.launch_checks.memory_estimate import parse_count

        report = dry_run(
            args.overrides,
            config_name=args.config_name,
            config_dir=Path(args.config_dir),
            allow_new_keys=allow,
            check_files=args.check_paths,
            card_gib=args.gpu_memory_gib,
            model_params=parse_count(args.model_params) if args.model_params is not None else None,
        )
    except (DryRunError, ValueError) as e:
        print(f"[dry-run] FAILED: {e}", file=sys.stderr)
        return 1
    text = report.resolved_yaml()
    if not args.quiet:
        sys.stdout.write(text)
        sys.stdout.flush()
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    for note in report.notes:
        print(f"[dry-run] note: {note}", file=sys.stderr)
    for warning in report.warnings:
        print(f"[dry-run] warning: {warning}", file=sys.stderr)
    for item in report.not_checked:
        print(f"[dry-run] not checked: {item}", file=sys.stderr)
    n = len(report.not_checked)
    unchecked = f" ({n} check{'s' if n != 1 else ''} could not run here: 'not checked' above)" if n else ""
    print(f"[dry-run] OK{unchecked}  {report.summary()}", file=sys.stderr)
    return 0
