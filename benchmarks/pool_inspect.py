"""The pool inspector (``python -m exgrpo.pool``) on a pool at the paper's scale: wall time and peak RSS per command.

Builds the synthetic pool of ``benchmarks/pool_scale.py`` (``Synthetic`` of ``benchmarks/common.py``; 202,011
trajectories by default, response lengths uniform in 1,000-2,000 tokens, K = 8, collected in steps of 128 groups),
saving it as a trainer would at a few checkpoints of the build (``run/global_step_N/exgrpo/pool``, the last one the
full pool), then runs every inspector command as its own process and reports its wall seconds and peak RSS
(``os.wait4``: the child's own maximum resident set, mapped file pages included):

* ``inspect`` (the table: header + entries, then one streamed pass over the token file for the log-probs),
  ``--no-tokens`` (header + entries only), ``--json``, ``--plot``;
* ``inspect RUN --across`` (+ ``--plot``) over the checkpoints;
* ``export`` (token ids), ``export --log-probs``, ``export --tokenizer`` (decoded text, a byte-level tokenizer);
* ``show QUESTION`` with and without a tokenizer;

next to the ways the same answers are had without the inspector's streaming: ``load_experience`` of the whole pool
(the trainer's resume path: every token copied into the pool's arrays from a memory map of the file), and the
interpreter with the inspector's imports (the floor of any command). The token ids are drawn below 256, so that the
byte-level test tokenizer (tests/helpers/tokenizers.py, 256 symbols) decodes every one of them.

    python benchmarks/pool_inspect.py                         # full scale (~3 GB RAM to build, ~13 GB of disk)
    python benchmarks/pool_inspect.py --trajectories 20000    # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository first

from benchmarks.common import (  # noqa: E402
    REPO,
    SYNTHETIC_POOL_OPTIONS,
    Synthetic,
    add_synthetic_pool_arguments,
    argument_parser,
    child_arguments,
    last_json_line,
    platform_line,
    run_stoppable,
)


def build(args: argparse.Namespace) -> dict:
    """Build the pool, saving a checkpoint at each of ``args.checkpoints`` evenly spaced sizes (child process)."""
    import numpy as np

    from exgrpo.experience import ExperiencePool, Group, GroupMember, save_experience

    syn = Synthetic(args, GroupMember, Group)
    syn.ids %= 256  # every id decodable by the byte-level tokenizer
    pool = ExperiencePool(args.k)
    targets = [round(args.trajectories * (i + 1) / args.checkpoints) for i in range(args.checkpoints)]
    run = os.path.join(args.workdir, "run")
    step = 0
    saved = []
    t0 = time.perf_counter()
    save_s = 0.0
    for target in targets:
        for groups in syn.batches(pool, target, args.groups_per_step):
            step += 1
            pool.collect(step, groups)
        t = time.perf_counter()
        directory = os.path.join(run, f"global_step_{step}", "exgrpo", "pool")
        save_experience(directory, pool=pool, extra={"trainer_state": {"global_steps": step}}, fsync=False)
        save_s += time.perf_counter() - t
        saved.append({"step": step, "dir": directory, "trajectories": len(pool), "tokens": pool.total_tokens})
    middle = pool.question_ids()[pool.num_questions // 2]
    return {
        "run": run,
        "checkpoints": saved,
        "questions": pool.num_questions,
        "show_question": middle,
        "show_entries": pool.num_entries(middle),
        "build_s": time.perf_counter() - t0 - save_s,
        "save_s": save_s,
        "file_bytes": sum(os.path.getsize(os.path.join(saved[-1]["dir"], f)) for f in os.listdir(saved[-1]["dir"])),
        "numpy": np.__version__,
    }


def measure(cmd: list[str], label: str, outputs: Sequence[str] = ()) -> dict:
    """Run ``cmd`` (cwd: the repository), return its wall seconds, peak RSS and the bytes it wrote."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        if rc != 0:
            err.seek(0)
            sys.exit(f"[pool_inspect] {label} failed (exit {rc}):\n{err.read().decode(errors='replace')[-3000:]}")
    size = sum(os.path.getsize(p) for p in outputs if os.path.exists(p))
    return {"label": label, "wall_s": wall, "peak_rss_bytes": usage.ru_maxrss * 1024, "output_bytes": size}


def warm(directory: str) -> None:
    """Read every file under ``directory`` once, so that each command finds them in the page cache."""
    buf = bytearray(1 << 24)
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                while f.readinto(buf):
                    pass


def main() -> None:
    ap = argument_parser(__doc__)
    add_synthetic_pool_arguments(ap)
    ap.add_argument("--checkpoints", type=int, default=4, help="checkpoints saved along the build (--across)")
    ap.add_argument("--no-text", action="store_true", help="skip the export with decoded text (the slowest)")
    ap.add_argument("--workdir", default=None, help="where the run and outputs go (default: a temp dir, removed)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(build(args)))
        return

    workdir = args.workdir or tempfile.mkdtemp(prefix="pool_inspect-")
    os.makedirs(workdir, exist_ok=True)
    py = sys.executable
    child = [py, os.path.abspath(__file__), "--child", "--workdir", workdir]
    child += child_arguments(args, (*SYNTHETIC_POOL_OPTIONS, "checkpoints"))
    print(f"[pool_inspect] building {args.trajectories:,} trajectories, {args.checkpoints} checkpoints ...", flush=True)
    proc = subprocess.run(child, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"[pool_inspect] build failed:\n{proc.stderr[-3000:]}")
    built = last_json_line(proc.stdout)
    last = built["checkpoints"][-1]
    pool_dir, run = last["dir"], built["run"]
    ckpt = os.path.dirname(os.path.dirname(pool_dir))  # global_step_N: the inspector finds exgrpo/pool below
    qid = built["show_question"]
    tok = os.path.join(workdir, "tokenizer")
    make_tok = (
        "import pathlib\nfrom tests.helpers.tokenizers import build_tiny_tokenizer\n"
        f"build_tiny_tokenizer(pathlib.Path({tok!r}))"
    )
    subprocess.run([py, "-c", make_tok], cwd=REPO, check=True)

    def out(name: str) -> str:
        return os.path.join(workdir, name)

    m = [py, "-m", "exgrpo.pool"]
    imports = "import exgrpo.pool.cli, exgrpo.pool.summary, exgrpo.pool.export"
    plan = [
        ("interpreter + the inspector's imports (floor)", [py, "-c", imports], []),
        ("inspect (table; streams tokens.arrow)", [*m, "inspect", ckpt], []),
        ("inspect --no-tokens (header + entries.arrow)", [*m, "inspect", ckpt, "--no-tokens"], []),
        ("inspect --json", [*m, "inspect", ckpt, "--json"], []),
        ("inspect --plot", [*m, "inspect", ckpt, "--plot", out("pool.png")], [out("pool.png")]),
        (f"inspect --across ({args.checkpoints} checkpoints)", [*m, "inspect", run, "--across"], []),
        ("inspect --across --plot", [*m, "inspect", run, "--across", "--plot", out("across.png")], [out("across.png")]),
        ("export (token ids)", [*m, "export", ckpt, out("pool.parquet")], [out("pool.parquet")]),
        ("export --log-probs", [*m, "export", ckpt, out("lp.parquet"), "--log-probs"], [out("lp.parquet")]),
        (f"show {qid} (token ids)", [*m, "show", ckpt, str(qid)], []),
        (f"show {qid} --tokenizer", [*m, "show", ckpt, str(qid), "--tokenizer", tok], []),
    ]
    if not args.no_text:
        cmd = [*m, "export", ckpt, out("text.parquet"), "--tokenizer", tok]
        plan.append(("export --tokenizer (decoded text)", cmd, [out("text.parquet")]))
    whole = (
        "from exgrpo.experience import ExperiencePool, load_experience\n"
        f"p = ExperiencePool({args.k}); load_experience({pool_dir!r}, pool=p); p.stats()\n"
    )
    plan.append(("loading whole: load_experience + pool.stats() (resume path)", [py, "-c", whole], []))
    warm(run)
    results = []
    for label, cmd, outputs in plan:
        print(f"[pool_inspect] {label} ...", flush=True)
        results.append(measure(cmd, label, outputs))
        for p in outputs:
            if p.endswith(".parquet") and os.path.exists(p):
                os.remove(p)

    print()
    print(f"python benchmarks/pool_inspect.py --trajectories {args.trajectories} --checkpoints {args.checkpoints}")
    print(f"{platform_line(built['numpy'])}; files in page cache (each command run once, the first also once before)")
    print(
        f"pool: {last['trajectories']:,} trajectories of {built['questions']:,} questions, {last['tokens']:,} tokens, "
        f"{built['file_bytes']:,} bytes on disk; built in {built['build_s']:.1f} s, {args.checkpoints} saves "
        f"{built['save_s']:.1f} s; shown question {qid} holds {built['show_entries']} trajectories"
    )
    width = max(len(r["label"]) for r in results)
    print(f"| {'command':<{width}} | wall s | peak RSS MB | output MB |")
    print(f"|{'-' * (width + 2)}|-------:|------------:|----------:|")
    for r in results:
        size = f"{r['output_bytes'] / 1e6:,.1f}" if r["output_bytes"] else ""
        print(f"| {r['label']:<{width}} | {r['wall_s']:6.2f} | {r['peak_rss_bytes'] / 2**20:11,.0f} | {size:>9} |")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(run_stoppable(main, "pool_inspect"))
