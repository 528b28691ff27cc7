"""Experience pool at the paper's scale: insert throughput, sampling + candidate assembly, memory, save/load.

The paper's 7B run ended with 202,011 stored trajectories (+1.77 GB RAM in the released code). This builds a
synthetic pool of that many trajectories (response lengths uniform in [mean-spread, mean+spread], default
1,000-2,000 tokens; int32 token ids, float32 behaviour log-probs) through ``ExperiencePool.collect`` in steps of
128 groups of K = 8, then measures, per storage layout (each in its own process, so peak RSS is per layout):

* insert throughput (collect calls only; building the synthetic groups is excluded),
* bytes held per stored token (``memory_bytes()`` and the RSS growth),
* per-step time to draw 64 replayed questions (128 per step, rho = 0.5, 64 fresh questions excluded) and
  assemble their candidates (token ids + behaviour log-probs of every stored trajectory; copies and views),
* churn: retire 10% of the questions and insert as many new trajectories (arena compaction at work),
* save (Arrow IPC + JSON header, fsync'd; cold and warm page cache, next to a plain write of as many bytes)
  and load (after freeing the pool) times, and peak RSS.

Targets: <= 8.5 bytes per stored token, sampling + assembly < 5 ms, save + load < 10 s.

    python benchmarks/pool_scale.py                       # full scale, both layouts (~2.5 GB RAM per layout)
    python benchmarks/pool_scale.py --trajectories 20000  # a quick run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from exgrpo.experience import (  # noqa: E402
    BucketSampler,
    ExperiencePool,
    Group,
    GroupMember,
    load_experience,
    save_experience,
)

PAPER_TRAJECTORIES = 202_011


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return -1


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


class Synthetic:
    """Groups of K members whose correct responses are views into one random token buffer (no per-call cost)."""

    def __init__(self, args: argparse.Namespace):
        self.rng = np.random.default_rng(args.seed)
        self.k = args.k
        self.lo = max(1, args.mean_len - args.len_spread)
        self.hi = args.mean_len + args.len_spread
        n = 1 << 23
        self.ids = self.rng.integers(0, 151_000, n, dtype=np.int32)
        self.lps = -self.rng.exponential(0.5, n).astype(np.float32)
        self.wrong = GroupMember(np.array([2], dtype=np.int32), np.array([-1.0], dtype=np.float32), 0.0)

    def member(self) -> GroupMember:
        n = int(self.rng.integers(self.lo, self.hi + 1))
        off = int(self.rng.integers(0, self.ids.shape[0] - n))
        return GroupMember(self.ids[off : off + n], self.lps[off : off + n], 1.0)

    def group(self, qid: str, n_correct: int) -> Group:
        members = [self.member() for _ in range(n_correct)] + [self.wrong] * (self.k - n_correct)
        return Group(qid, members)


def run_layout(args: argparse.Namespace) -> dict:
    layout = args.child
    syn = Synthetic(args)
    gc.collect()
    rss0 = rss_bytes()
    pool = ExperiencePool(args.k, storage=layout)
    out: dict = {"layout": layout}

    # ---- build
    q = 0
    step = 0
    collect_s = 0.0
    while len(pool) < args.trajectories:
        groups = []
        budget = args.trajectories - len(pool)
        for _ in range(args.groups_per_step):
            if budget <= 0:
                break
            n_ok = int(min(syn.rng.integers(1, args.k), budget))
            groups.append(syn.group(f"openr1-{q:06d}", n_ok))
            budget -= n_ok
            q += 1
        step += 1
        t = time.perf_counter()
        pool.collect(step, groups)
        collect_s += time.perf_counter() - t
    gc.collect()
    tokens = pool.total_tokens
    out.update(
        trajectories=len(pool),
        questions=pool.num_questions,
        tokens=tokens,
        insert_traj_per_s=len(pool) / collect_s,
        insert_mtok_per_s=tokens / collect_s / 1e6,
        collect_ms_per_step=1e3 * collect_s / step,
        memory_bytes=pool.memory_bytes(),
        bytes_per_token=pool.memory_bytes() / tokens,
        rss_growth_bytes=rss_bytes() - rss0,
        rss_bytes_per_token=(rss_bytes() - rss0) / tokens,
    )

    # ---- sampling + candidate assembly (the trainer's per-step path, without the model's entropy pass)
    sampler = BucketSampler(args.k, seed=args.seed)
    all_q = pool.question_ids()
    n_replay = int(args.batch * args.replay_ratio)
    for copy in (True, False):
        times = []
        cand_tokens = 0
        for _ in range(args.draw_steps):
            fresh = {all_q[i] for i in syn.rng.choice(len(all_q), args.batch - n_replay, replace=False)}
            t = time.perf_counter()
            draw = sampler.draw(pool, n_replay, exclude=fresh)
            cands = pool.candidates(draw.question_ids, copy=copy)
            times.append(time.perf_counter() - t)
            cand_tokens += sum(c.length for g in cands for c in g)
        ms = 1e3 * np.asarray(times)
        tag = "copy" if copy else "view"
        out[f"sample_{tag}_ms_median"] = float(np.median(ms))
        out[f"sample_{tag}_ms_p95"] = float(np.percentile(ms, 95))
        out["candidates_per_step"] = cand_tokens / args.draw_steps
    t = time.perf_counter()
    for _ in range(args.draw_steps):
        sampler.draw(pool, n_replay, exclude=fresh)
    out["draw_only_ms"] = 1e3 * (time.perf_counter() - t) / args.draw_steps

    # ---- churn: retire a share of the questions, then insert as many new trajectories
    if args.churn > 0:
        victims = [all_q[i] for i in syn.rng.choice(len(all_q), int(args.churn * len(all_q)), replace=False)]
        removed = sum(pool.num_entries(v) for v in victims)
        solved = [Group(v, [syn.member()] * args.k) for v in victims]
        t = time.perf_counter()
        for i in range(0, len(solved), args.groups_per_step):
            step += 1
            pool.collect(step, solved[i : i + args.groups_per_step])
        out["retire_ms_per_question"] = 1e3 * (time.perf_counter() - t) / max(1, len(victims))
        target = len(pool) + removed
        while len(pool) < target:
            groups = []
            budget = target - len(pool)
            for _ in range(args.groups_per_step):
                if budget <= 0:
                    break
                n_ok = int(min(syn.rng.integers(1, args.k), budget))
                groups.append(syn.group(f"openr1-{q:06d}", n_ok))
                budget -= n_ok
                q += 1
            step += 1
            pool.collect(step, groups)
        gc.collect()
        out["churn_bytes_per_token"] = pool.memory_bytes() / pool.total_tokens
        out["churn_rss_bytes_per_token"] = (rss_bytes() - rss0) / pool.total_tokens

    # ---- save / load
    del cands, draw  # candidate views would keep the old pool's chunks alive through the load
    probe = [all_q[i] for i in syn.rng.choice(len(all_q), 50, replace=False) if all_q[i] not in pool.retired]
    expected = {
        p: [(c.entry_id, c.token_ids.tobytes(), c.behaviour_log_probs.tobytes()) for c in pool.entries(p)]
        for p in probe
    }
    n_entries, n_tokens = len(pool), pool.total_tokens
    target_dir = os.path.join(args.workdir, f"pool-{layout}")
    # First save into page cache the VM has never used (cold), then again after deleting it (warm): on some
    # VMs the first touch of fresh memory, page cache included, is an order of magnitude slower.
    t = time.perf_counter()
    save_experience(target_dir, pool=pool, sampler=sampler, extra={"bench": True})
    out["save_cold_s"] = time.perf_counter() - t
    out["file_bytes"] = sum(os.path.getsize(os.path.join(target_dir, f)) for f in os.listdir(target_dir))
    shutil.rmtree(target_dir)
    t = time.perf_counter()
    save_experience(target_dir, pool=pool, sampler=sampler, extra={"bench": True})
    out["save_warm_s"] = time.perf_counter() - t
    # The floor: a plain write + fsync of as many bytes from one warm 64 MB buffer.
    raw = os.path.join(args.workdir, f"raw-{layout}.bin")
    block = syn.ids[: 1 << 24]
    t = time.perf_counter()
    with open(raw, "wb") as f:
        for _ in range(max(1, out["file_bytes"] // block.nbytes)):
            f.write(memoryview(block))
        f.flush()
        os.fsync(f.fileno())
    out["raw_write_s"] = time.perf_counter() - t
    os.remove(raw)
    del pool, sampler
    gc.collect()
    out["peak_rss_before_load_bytes"] = peak_rss_bytes()
    fresh_pool = ExperiencePool(args.k, storage=layout)
    fresh_sampler = BucketSampler(args.k)
    t = time.perf_counter()
    load_experience(target_dir, pool=fresh_pool, sampler=fresh_sampler)
    out["load_s"] = time.perf_counter() - t
    ok = len(fresh_pool) == n_entries and fresh_pool.total_tokens == n_tokens
    for p, rows in expected.items():
        got = [(c.entry_id, c.token_ids.tobytes(), c.behaviour_log_probs.tobytes()) for c in fresh_pool.entries(p)]
        ok = ok and got == rows
    out["load_verified"] = bool(ok)
    out["peak_rss_bytes"] = peak_rss_bytes()
    if not args.keep_files:
        shutil.rmtree(target_dir, ignore_errors=True)
    return out


ROWS = [
    ("trajectories", "trajectories stored", "{:,.0f}"),
    ("questions", "questions with trajectories", "{:,.0f}"),
    ("tokens", "response tokens stored", "{:,.0f}"),
    ("insert_traj_per_s", "insert: trajectories / s", "{:,.0f}"),
    ("insert_mtok_per_s", "insert: M tokens / s", "{:.1f}"),
    ("collect_ms_per_step", "insert: ms per collect of 128 groups", "{:.1f}"),
    ("memory_bytes", "memory_bytes() held", "{:,.0f}"),
    ("bytes_per_token", "bytes / token (memory_bytes)  [<= 8.5]", "{:.3f}"),
    ("rss_bytes_per_token", "bytes / token (RSS growth)", "{:.3f}"),
    ("sample_copy_ms_median", "draw 64 + candidates, copies: median ms  [< 5]", "{:.2f}"),
    ("sample_copy_ms_p95", "draw 64 + candidates, copies: p95 ms", "{:.2f}"),
    ("sample_view_ms_median", "draw 64 + candidates, views: median ms", "{:.2f}"),
    ("sample_view_ms_p95", "draw 64 + candidates, views: p95 ms", "{:.2f}"),
    ("draw_only_ms", "draw 64 only: mean ms", "{:.3f}"),
    ("candidates_per_step", "candidate tokens assembled per step", "{:,.0f}"),
    ("retire_ms_per_question", "churn: retire, ms per question", "{:.3f}"),
    ("churn_bytes_per_token", "churn: bytes / token (memory_bytes)", "{:.3f}"),
    ("churn_rss_bytes_per_token", "churn: bytes / token (RSS growth)", "{:.3f}"),
    ("save_cold_s", "save s, first (cold page cache, fsync)", "{:.2f}"),
    ("save_warm_s", "save s, again (warm, fsync)", "{:.2f}"),
    ("raw_write_s", "floor: plain write + fsync of as many bytes", "{:.2f}"),
    ("load_s", "load s (file in page cache)", "{:.2f}"),
    ("file_bytes", "checkpoint bytes on disk", "{:,.0f}"),
    ("load_verified", "load verified (sizes + 50 questions' entries)", "{}"),
    ("peak_rss_before_load_bytes", "peak RSS before the load, bytes", "{:,.0f}"),
    ("peak_rss_bytes", "peak RSS incl. load (mapped file pages count)", "{:,.0f}"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=PAPER_TRAJECTORIES)
    ap.add_argument("--mean-len", type=int, default=1500, help="mean response length in tokens")
    ap.add_argument("--len-spread", type=int, default=500, help="lengths uniform in mean +- spread")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128, help="questions per step B")
    ap.add_argument("--replay-ratio", type=float, default=0.5)
    ap.add_argument("--groups-per-step", type=int, default=128)
    ap.add_argument("--draw-steps", type=int, default=500)
    ap.add_argument("--churn", type=float, default=0.1, help="share of questions retired, then refilled")
    ap.add_argument("--layouts", default="arena,per_entry")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="where checkpoints are written (default: a temp dir)")
    ap.add_argument("--keep-files", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(run_layout(args)))
        return

    workdir = args.workdir or tempfile.mkdtemp(prefix="pool_scale-")
    results = []
    for layout in args.layouts.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", layout, "--workdir", workdir]
        for name in (
            "trajectories",
            "mean_len",
            "len_spread",
            "k",
            "batch",
            "replay_ratio",
            "groups_per_step",
            "draw_steps",
            "churn",
            "seed",
        ):
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        if args.keep_files:
            cmd.append("--keep-files")
        print(f"[pool_scale] {layout}: building {args.trajectories:,} trajectories ...", flush=True)
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(
        f"python benchmarks/pool_scale.py --trajectories {args.trajectories} --mean-len {args.mean_len} "
        f"--len-spread {args.len_spread}"
    )
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"numpy {np.__version__}"
    )
    width = max(len(r[1]) for r in ROWS)
    print(f"| {'metric':<{width}} | " + " | ".join(f"{r['layout']:>16}" for r in results) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * 18 for _ in results) + "|")
    for key, label, fmt in ROWS:
        cells = [fmt.format(r[key]) if key in r else "-" for r in results]
        print(f"| {label:<{width}} | " + " | ".join(f"{c:>16}" for c in cells) + " |")


if __name__ == "__main__":
    main()
