"""``python -m exgrpo.pool`` / ``exgrpo-pool``: look inside a saved experience pool (docs/pool_inspector.md).

  inspect CHECKPOINT_DIR [--json] [--plot OUT.png] [--no-tokens]
                         the summary table of one saved pool
  inspect RUN_DIR --across [--json] [--plot OUT.png]
                         every checkpoint of a run in step order (buckets, retired, pool size)
  export CHECKPOINT_DIR OUT.parquet [--tokenizer DIR] [--log-probs] [--no-retired]
                         one row per stored trajectory (then one per retired question)
  show CHECKPOINT_DIR QUESTION_ID [--tokenizer DIR]
                         one question's stored trajectories, as text with a tokenizer

CHECKPOINT_DIR is the pool directory (``global_step_N/exgrpo/pool``) or ``global_step_N`` / ``global_step_N/exgrpo``
above it. Pools are read with the loader's checks (checksums included). Exit status: 0 done, 1 a damaged pool (the
loader's PoolCheckpointError, naming the file), 2 a bad input (a path, a question id, a tokenizer: one line naming
it).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from exgrpo.experience.files import PoolCheckpointError
from exgrpo.experience.persistence import open_experience
from exgrpo.pool.source import InputError, find_checkpoints, load_tokenizer, resolve_pool_dir

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m exgrpo.pool",
        description="Look inside a saved ExGRPO experience pool: summary table, plots, a run's evolution, export.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("inspect", help="the summary table of a saved pool (or, with --across, of a whole run)")
    p.add_argument("path", help="the pool directory or a checkpoint above it; with --across the run's directory")
    p.add_argument("--across", action="store_true", help="every global_step_N checkpoint of the run, in step order")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    p.add_argument("--plot", metavar="OUT.png", help="also draw the figure into OUT.png")
    p.add_argument(
        "--no-tokens",
        action="store_true",
        help="skip the pass over tokens.arrow (no behaviour log-probs; the token file is then not verified)",
    )
    p = sub.add_parser("export", help="one Parquet row per stored trajectory (token ids; text with a tokenizer)")
    p.add_argument("path", help="the pool directory or a checkpoint above it")
    p.add_argument("out", help="the Parquet file to write")
    p.add_argument("--tokenizer", metavar="DIR", help="a local Hugging Face tokenizer directory: adds a text column")
    p.add_argument("--log-probs", action="store_true", help="add the stored behaviour log-probs (one list per row)")
    p.add_argument("--no-retired", action="store_true", help="leave out the rows of the retired questions")
    p = sub.add_parser("show", help="one question's stored trajectories")
    p.add_argument("path", help="the pool directory or a checkpoint above it")
    p.add_argument("question_id", help="the question id (as in the training data's uid / index)")
    p.add_argument("--tokenizer", metavar="DIR", help="a local Hugging Face tokenizer directory (else token ids)")
    return parser


def _draw(plot: Callable[[], Any], out: str) -> None:
    try:
        path = plot()
    except OSError as e:
        raise InputError(f"{out}: cannot be written ({e.strerror or e})") from e
    print(f"figure: {path}", file=sys.stderr)


def _inspect(args: argparse.Namespace) -> None:
    from exgrpo.pool.summary import format_summary, summarize

    try:
        pool_dir = resolve_pool_dir(args.path)
    except InputError as e:  # a run's folder: say so, and what to type
        try:
            checkpoints = find_checkpoints(args.path)
        except InputError:
            raise e from None
        last = checkpoints[-1].directory
        raise InputError(
            f"{args.path}: a run's folder, with {len(checkpoints)} checkpoint(s) (steps "
            f"{', '.join(str(c.step) for c in checkpoints)}): add --across for the whole run, or give one "
            f"checkpoint, e.g. {last}"
        ) from None
    saved = open_experience(pool_dir)
    summary = summarize(saved, tokens=not args.no_tokens)
    print(json.dumps(summary.to_json(), indent=2) if args.json else format_summary(summary))
    if args.plot:
        from exgrpo.pool.plot import plot_summary

        _draw(lambda: plot_summary(summary, args.plot), args.plot)


def _across(args: argparse.Namespace) -> None:
    from exgrpo.pool.summary import across_row, format_across

    checkpoints = find_checkpoints(args.path)
    with_pool = [c for c in checkpoints if c.pool_dir is not None]
    skipped = [c.step for c in checkpoints if c.pool_dir is None]
    if not with_pool:
        raise InputError(f"{args.path}: none of its {len(checkpoints)} global_step_N checkpoints holds a pool")
    rows = [across_row(c.step, open_experience(c.pool_dir)) for c in with_pool]  # type: ignore[arg-type]
    if args.json:
        print(json.dumps({"run": str(args.path), "checkpoints": rows, "skipped_steps": skipped}, indent=2))
    else:
        print(format_across(rows, skipped))
    if args.plot:
        from exgrpo.pool.plot import plot_across

        _draw(lambda: plot_across(rows, args.plot), args.plot)


def _export(args: argparse.Namespace) -> None:
    from exgrpo.pool.export import export_parquet

    saved = open_experience(resolve_pool_dir(args.path))
    folder = pathlib.Path(args.out).parent
    if not folder.exists():  # a typo in the folder must not become a new folder
        raise InputError(f"{args.out}: its folder {folder} does not exist (create it first)")
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    try:
        written = export_parquet(
            saved, args.out, tokenizer=tokenizer, log_probs=args.log_probs, retired=not args.no_retired
        )
    except OSError as e:
        raise InputError(f"{args.out}: cannot be written ({e.strerror or e})") from e
    print(
        f"{args.out}: {written['trajectories']:,} trajectories and {written['retired']:,} retired questions "
        f"from {saved.directory}"
    )


def _show(args: argparse.Namespace) -> None:
    from exgrpo.pool.export import find_question, show_question

    saved = open_experience(resolve_pool_dir(args.path))
    qid = find_question(saved, args.question_id)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    print(show_question(saved, qid, tokenizer))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "inspect":
            (_across if args.across else _inspect)(args)
        elif args.command == "export":
            _export(args)
        else:
            _show(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PoolCheckpointError as e:
        print(f"error: damaged pool: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. piped into head
        return 0
    return 0
