"""Experience pool at the paper's scale: insert throughput, sampling + candidate assembly, memory, save/load.

The paper's 7B run ended with 202,011 stored trajectories (+1.77 GB RAM in the released code). This builds a
synthetic pool of that many trajectories (response lengths uniform in [mean-spread, mean+spread], default
1,000-2,000 tokens; int32 token ids, float32 behaviour log-probs) through ``ExperiencePool.collect`` in steps of
128 groups of K = 8, then measures, per storage layout and per implementation (each in its own process, so peak
RSS is per column):

* ``collect`` per step of 128 groups (median / mean / p95 ms) and insert throughput (collect calls only; building
  the synthetic groups is excluded),
* bytes held per stored token (``memory_bytes()`` and the RSS growth),
* per-step time to draw 64 replayed questions (128 per step, rho = 0.5, 64 fresh questions excluded) and
  assemble their candidates (token ids + behaviour log-probs of every stored trajectory; copies and views),
* churn: retire 10% of the questions and insert as many new trajectories (arena compaction at work),
* save (Arrow IPC + JSON header, fsync'd; cold and warm page cache, next to a plain write of as many bytes)
  and load (after freeing the pool) times, and peak RSS.

Before / after, side by side in one run: every measurement runs on this checkout's ``exgrpo`` ("after") and on
the ``exgrpo`` package of ``--baseline REV`` ("before"; by default the last commit before the experience package
was split into components and collection was batched), extracted with ``git archive`` into the work directory.
Both see the same synthetic stream (same seed), so the "behaviour digest" row (a hash of every bucket, retired
question, counter and stored trajectory after the build and the churn) must be equal in both columns.

Multi-turn trajectories (``--tool-share F``, this checkout only: the baseline has no loss masks): a share F of the
stored trajectories holds ``--tool-calls`` tool outputs of ``--tool-len`` tokens each (loss mask 0) between the
model's turns. Their mask is stored inside the float32 log-prob column (NaN on masked tokens, no byte more; see
docs/experience.md), and the run also measures, on the same pool and the same per-step candidates, what the two
other encodings would cost: a bit-packed mask column (one bit per token) and run lengths (one int32 per run), in
bytes per token and in decode time per step (the sentinel's decode is part of "draw + candidates").
``--tool-share 0,0.5`` measures each share in a column of its own, side by side in one run (with a ``--baseline``,
the baseline's column is the share 0 one).

Targets: collect median < 5 ms per step, <= 8.5 bytes per stored token, sampling + assembly < 5 ms,
save + load < 10 s.

    python benchmarks/pool_scale.py                       # full scale, both layouts, before and after (~6 GB RAM)
    python benchmarks/pool_scale.py --trajectories 20000  # a quick run
    python benchmarks/pool_scale.py --baseline none       # this checkout only
    python benchmarks/pool_scale.py --baseline none --tool-share 0.5   # half the pool multi-turn
    python benchmarks/pool_scale.py --trajectories 50000 --layouts arena --baseline eb47d55 --tool-share 0,0.5

``--interleave`` adds collect rows measured with every column of a layout in one process, call by call in turn (each
column its own pool and synthetic stream; the order rotates each step; each implementation's modules swapped in for
its calls): a drift of the machine's load then falls on all columns alike, and each column's calls are also compared
with the first column's call of the same step (the median of those ratios). This is the comparison to read for a
before/after ratio; the build rows above it still come from a process per column.

On a busy machine a column's figures depend on what else ran while it was built; ``--repeat N`` builds every column
N times, round-robin (each repeat in another order), and reports the median over the repeats of the collect rows,
with each repeat's median in a row of its own (the builds after the first stop after collecting). Where other jobs
keep the cores busy, ``--clock cpu`` times the collect calls by the CPU time of the collecting thread instead of the
wall clock (a call that waits for a core is not charged for the wait; it still pays for the caches and memory
bandwidth it shares).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from types import ModuleType

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script: the repository

from benchmarks.common import REPO, Synthetic, extract_baseline  # noqa: E402

PAPER_TRAJECTORIES = 202_011
#: "before": the last commit before the experience package was split into components (entry table, token storage,
#: bucket index, collection rules) and a collect call started storing its trajectories in one batch.
BASELINE_REV = "6e59e2e2707e7563fea5af8e20398f308cf09fff"


def import_experience(impl: str | None) -> ModuleType:
    """``exgrpo.experience`` of this checkout (``impl`` None) or of the source tree at ``impl``; SystemExit when the
    package comes from anywhere else (an installed copy found first would measure the wrong code). Only the
    package's own names are used (``exgrpo.experience``'s exports, which every measured revision has), never a module
    path inside it: modules were renamed since the default baseline (``writer`` -> ``collection``, ``pool`` ->
    ``experience_pool``)."""
    root = os.path.realpath(impl or REPO)
    sys.path.insert(0, root)
    module = importlib.import_module("exgrpo.experience")
    if not os.path.realpath(module.__file__).startswith(os.path.join(root, "exgrpo") + os.sep):
        sys.exit(f"[pool_scale] exgrpo.experience came from {module.__file__}, not from {root}")
    return module


def behaviour_digest(pool, k: int) -> str:
    """Hash of what the pool holds, through its public API only (both implementations have it): bucket member
    lists in draw order, retired questions, counters, and every stored trajectory (ids, reward, step, tokens)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([[list(pool.buckets.members(b)) for b in range(k)], list(pool.retired)]).encode())
    h.update(json.dumps(pool.counters, sort_keys=True).encode())
    for q in pool.question_ids():
        for c in pool.entries(q, copy=False):
            h.update(f"{c.entry_id}:{c.reward}:{c.step}".encode())
            h.update(c.token_ids.tobytes())
            h.update(c.behaviour_log_probs.tobytes())
            if getattr(c, "loss_mask", None) is not None:  # a multi-turn trajectory (none in the baseline's pools)
                h.update(c.loss_mask.tobytes())
    return h.hexdigest()


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return -1


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def run_layout(args: argparse.Namespace) -> dict:
    layout = args.child
    E = import_experience(args.impl)
    ExperiencePool, BucketSampler, Group = E.ExperiencePool, E.BucketSampler, E.Group
    save_experience, load_experience = E.save_experience, E.load_experience
    syn = Synthetic(args, E.GroupMember, E.Group)
    gc.collect()
    rss0 = rss_bytes()
    pool = ExperiencePool(args.k, storage=layout)
    out: dict = {"layout": layout}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter  # the collect calls' clock

    # ---- build
    q = 0
    step = 0
    step_s: list[float] = []
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
        t = clock()
        pool.collect(step, groups)
        step_s.append(clock() - t)
    gc.collect()
    tokens = pool.total_tokens
    collect_s = sum(step_s)
    step_ms = 1e3 * np.asarray(step_s[:-1] or step_s)  # the last step is a partial one
    out.update(
        trajectories=len(pool),
        questions=pool.num_questions,
        tokens=tokens,
        tool_token_share=getattr(pool.table, "total_masked", 0) / tokens,
        insert_traj_per_s=len(pool) / collect_s,
        insert_mtok_per_s=tokens / collect_s / 1e6,
        collect_mb_per_step=8 * tokens / step / 1e6,
        collect_ms_median=float(np.median(step_ms)),
        collect_ms_mean=float(step_ms.mean()),
        collect_ms_p95=float(np.percentile(step_ms, 95)),
        memory_bytes=pool.memory_bytes(),
        bytes_per_token=pool.memory_bytes() / tokens,
        rss_growth_bytes=rss_bytes() - rss0,
        rss_bytes_per_token=(rss_bytes() - rss0) / tokens,
    )

    if args.collect_only:  # a repeat of the build, for the collect figures
        return out

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
    if args.tool_share:
        out.update(mask_encodings(pool, cands))
    out["tool_share_asked"] = args.tool_share
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
    out["behaviour_digest"] = behaviour_digest(pool, args.k)

    # ---- save / load
    del cands, draw  # candidate views would keep the old pool's chunks alive through the load
    probe = [all_q[i] for i in syn.rng.choice(len(all_q), 50, replace=False) if all_q[i] not in pool.retired]
    expected = {
        p: [(c.entry_id, c.token_ids.tobytes(), c.behaviour_log_probs.tobytes()) for c in pool.entries(p)]
        for p in probe
    }
    n_entries, n_tokens = len(pool), pool.total_tokens
    impl_tag = "before" if args.impl else "after"
    target_dir = os.path.join(args.workdir, f"pool-{layout}-{impl_tag}")
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
    raw = os.path.join(args.workdir, f"raw-{layout}-{impl_tag}.bin")
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


def mask_encodings(pool, cands) -> dict:
    """What the loss masks of ``pool`` cost in each encoding: extra bytes per stored token, and the time to decode
    the masks of one step's candidates ``cands`` (median of 20 decodes). The sentinel (NaN in the log-prob column)
    is what the pool stores; the bit-packed column and the run lengths are computed here from the same masks."""
    masks_all = [c.mask for q in pool.question_ids() for c in pool.entries(q, copy=False)]
    tokens = sum(m.shape[0] for m in masks_all)

    def runs_of(m: np.ndarray) -> np.ndarray:
        edges = np.flatnonzero(m[1:] != m[:-1]) + 1
        return np.diff(np.concatenate([[0], edges, [m.shape[0]]])).astype(np.int32)

    bits = sum((m.shape[0] + 7) // 8 for m in masks_all)
    runs = sum(4 * (runs_of(m).shape[0] + 1) for m in masks_all)  # each run's length + the count, int32
    flat = [c for g in cands for c in g]
    stored = [pool.token_storage.view(pool.table.slots_of(c.question_id)[0])[1] for c in flat[:0]]  # (unused)
    del stored
    views = []
    for g in cands:
        for c in g:
            slot = next(
                s for s in pool.table.slots_of(c.question_id) if pool.table.columns["entry_id"][s] == c.entry_id
            )
            views.append(pool.token_storage.view(slot)[1])
    packed = [np.packbits(c.mask) for c in flat]
    lengths = [c.length for c in flat]
    run_lists = [runs_of(c.mask) for c in flat]

    def timed(fn) -> float:
        times = []
        for _ in range(20):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1e3 * float(np.median(times))

    return {
        "mask_sentinel_bytes_per_token": 0.0,
        "mask_bits_bytes_per_token": bits / tokens,
        "mask_runs_bytes_per_token": runs / tokens,
        "mask_sentinel_decode_ms": timed(lambda: [np.isnan(v) for v in views]),
        "mask_bits_decode_ms": timed(
            lambda: [np.unpackbits(p, count=n).view(np.bool_) for p, n in zip(packed, lengths)]
        ),
        "mask_runs_decode_ms": timed(lambda: [np.repeat(np.arange(r.shape[0]) % 2 == 0, r) for r in run_lists]),
    }


def exgrpo_modules() -> dict[str, ModuleType]:
    return {name: m for name, m in sys.modules.items() if name == "exgrpo" or name.startswith("exgrpo.")}


def drop_exgrpo_modules() -> None:
    for name in exgrpo_modules():
        del sys.modules[name]


def use_modules(root: str, modules: dict[str, ModuleType]) -> None:
    """Make ``modules`` (one implementation's ``exgrpo``, from the tree at ``root``) the ones imported by name, so that
    an import inside its functions finds its own package."""
    drop_exgrpo_modules()
    sys.modules.update(modules)
    if root in sys.path:
        sys.path.remove(root)
    sys.path.insert(0, root)


def run_interleaved(args: argparse.Namespace) -> list[dict]:
    """``--interleave``: the collect of every column of one layout (``args.columns``: [[impl or null, tool share],
    ...]) built in this one process, a step of each column in turn (the order rotating every step)."""
    layout = args.child
    specs = json.loads(args.columns)
    loaded: dict[str | None, tuple[str, ModuleType, dict[str, ModuleType]]] = {}
    for impl, _ in specs:
        if impl not in loaded:
            drop_exgrpo_modules()
            module = import_experience(impl)
            loaded[impl] = (os.path.realpath(impl or REPO), module, exgrpo_modules())
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    cols = []
    for impl, share in specs:
        root, E, modules = loaded[impl]
        use_modules(root, modules)
        ns = argparse.Namespace(**{**vars(args), "tool_share": float(share)})
        pool = E.ExperiencePool(args.k, storage=layout)
        stream = Synthetic(ns, E.GroupMember, E.Group).batches(pool, args.trajectories, args.groups_per_step)
        cols.append({"root": root, "modules": modules, "pool": pool, "stream": stream, "times": [], "done": False})
    step = 0
    while not all(c["done"] for c in cols):
        step += 1
        for i in range(len(cols)):
            c = cols[(step + i) % len(cols)]
            if c["done"]:
                continue
            use_modules(c["root"], c["modules"])
            groups = next(c["stream"], None)
            if groups is None:
                c["done"] = True
                continue
            t = clock()
            c["pool"].collect(step, groups)
            c["times"].append(clock() - t)
    out = []
    first = 1e3 * np.asarray(cols[0]["times"][:-1])  # the last step is a partial one
    for c in cols:
        ms = 1e3 * np.asarray(c["times"][:-1])
        n = min(len(ms), len(first))
        out.append(
            {
                "collect_il_median": float(np.median(ms)),
                "collect_il_ratio": float(np.median(ms) / np.median(first)),
                "collect_il_paired": float(np.median(ms[:n] / first[:n])),
            }
        )
    return out


#: the rows a ``--repeat`` reports as the median over the repeats
COLLECT_KEYS = ("collect_ms_median", "collect_ms_mean", "collect_ms_p95", "insert_traj_per_s", "insert_mtok_per_s")

ROWS = [
    ("trajectories", "trajectories stored", "{:,.0f}"),
    ("questions", "questions with trajectories", "{:,.0f}"),
    ("tokens", "response tokens stored", "{:,.0f}"),
    ("tool_token_share", "share of stored tokens that are tool tokens (mask 0)", "{:.3f}"),
    ("collect_ms_median", "collect of 128 groups: median ms  [< 5]", "{:.2f}"),
    ("collect_ms_medians", "  the median of each repeat, ms", "{}"),
    ("collect_il_median", "collect, columns interleaved: median ms", "{:.2f}"),
    ("collect_il_ratio", "  median / the first column's median", "{:.3f}"),
    ("collect_il_paired", "  median of call-by-call ratios to the first column", "{:.3f}"),
    ("collect_ms_mean", "collect of 128 groups: mean ms", "{:.2f}"),
    ("collect_ms_p95", "collect of 128 groups: p95 ms", "{:.2f}"),
    ("collect_mb_per_step", "collect: MB of new tokens per step", "{:.2f}"),
    ("insert_traj_per_s", "insert: trajectories / s", "{:,.0f}"),
    ("insert_mtok_per_s", "insert: M tokens / s", "{:.1f}"),
    ("memory_bytes", "memory_bytes() held", "{:,.0f}"),
    ("bytes_per_token", "bytes / token (memory_bytes)  [<= 8.5]", "{:.3f}"),
    ("rss_bytes_per_token", "bytes / token (RSS growth)", "{:.3f}"),
    ("sample_copy_ms_median", "draw 64 + candidates, copies: median ms  [< 5]", "{:.2f}"),
    ("sample_copy_ms_p95", "draw 64 + candidates, copies: p95 ms", "{:.2f}"),
    ("sample_view_ms_median", "draw 64 + candidates, views: median ms", "{:.2f}"),
    ("sample_view_ms_p95", "draw 64 + candidates, views: p95 ms", "{:.2f}"),
    ("draw_only_ms", "draw 64 only: mean ms", "{:.3f}"),
    ("candidates_per_step", "candidate tokens assembled per step", "{:,.0f}"),
    ("mask_sentinel_bytes_per_token", "loss mask as NaN log-probs (stored): bytes / token", "{:.4f}"),
    ("mask_bits_bytes_per_token", "loss mask as a bit column: bytes / token", "{:.4f}"),
    ("mask_runs_bytes_per_token", "loss mask as run lengths (int32): bytes / token", "{:.4f}"),
    ("mask_sentinel_decode_ms", "decode one step's candidate masks, NaN: median ms", "{:.3f}"),
    ("mask_bits_decode_ms", "decode one step's candidate masks, bits: median ms", "{:.3f}"),
    ("mask_runs_decode_ms", "decode one step's candidate masks, runs: median ms", "{:.3f}"),
    ("retire_ms_per_question", "churn: retire, ms per question", "{:.3f}"),
    ("churn_bytes_per_token", "churn: bytes / token (memory_bytes)", "{:.3f}"),
    ("churn_rss_bytes_per_token", "churn: bytes / token (RSS growth)", "{:.3f}"),
    ("save_cold_s", "save s, first (cold page cache, fsync)", "{:.2f}"),
    ("save_warm_s", "save s, again (warm, fsync)", "{:.2f}"),
    ("raw_write_s", "floor: plain write + fsync of as many bytes", "{:.2f}"),
    ("load_s", "load s (file in page cache)", "{:.2f}"),
    ("file_bytes", "checkpoint bytes on disk", "{:,.0f}"),
    ("load_verified", "load verified (sizes + 50 questions' entries)", "{}"),
    ("behaviour_digest", "behaviour digest (equal = same pool)", "{:.12}"),
    ("peak_rss_before_load_bytes", "peak RSS before the load, bytes", "{:,.0f}"),
    ("peak_rss_bytes", "peak RSS incl. load (mapped file pages count)", "{:,.0f}"),
]


def child_command(args: argparse.Namespace, layout: str, workdir: str, share: float) -> list[str]:
    """The command of a child process measuring ``layout`` with this run's settings and tool share ``share``."""
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
        "tool_calls",
        "tool_len",
        "seed",
        "clock",
    ):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return [*cmd, "--tool-share", str(share)]


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
    ap.add_argument(
        "--baseline",
        default=BASELINE_REV,
        help="git revision whose exgrpo package is measured as 'before' (default: before the component split); "
        "'none' to measure this checkout only",
    )
    ap.add_argument(
        "--tool-share",
        default="0",
        help="share of trajectories with tool outputs (mask 0); several, comma-separated: a column each",
    )
    ap.add_argument("--tool-calls", type=int, default=2, help="tool outputs per multi-turn trajectory")
    ap.add_argument("--tool-len", type=int, default=200, help="tokens per tool output")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="where checkpoints are written (default: a temp dir)")
    ap.add_argument("--keep-files", action="store_true")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="build every column this many times, round-robin (a busy machine): the collect figures are the median "
        "over the repeats, the other rows the first repeat's",
    )
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="what the collect rows measure: wall-clock time, or the CPU time of the collecting thread (a machine "
        "whose other jobs take the cores from it: time spent waiting for a core is not counted; insert throughput "
        "follows the same clock)",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="also measure the collect with every column of a layout in one process, call by call in turn (the "
        "before/after ratio to read on a busy or noisy machine)",
    )
    ap.add_argument("--columns", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--collect-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--impl", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        args.tool_share = float(args.tool_share)
        print(json.dumps(run_interleaved(args) if args.columns else run_layout(args)))
        return
    shares = [float(x) for x in args.tool_share.split(",")]

    workdir = args.workdir or tempfile.mkdtemp(prefix="pool_scale-")
    # (tag, source tree or None for this checkout, tool share): the baseline stores no loss masks, so its column has
    # none; with several shares, each of this checkout's columns says its share
    columns: list[tuple[str, str | None, float]] = []
    if args.baseline != "none":
        if 0.0 not in shares:
            sys.exit("[pool_scale] a --tool-share without 0 needs --baseline none (the baseline stores no loss masks)")
        columns.append((f"before ({args.baseline[:7]})", extract_baseline(args.baseline, workdir), 0.0))
    for share in shares:
        columns.append(("after" + (f", tools {share:g}" if len(shares) > 1 else ""), None, share))
    results = []
    for layout in args.layouts.split(","):
        runs: list[list[dict]] = [[] for _ in columns]
        for r in range(args.repeat):
            # each repeat in another order of the columns, so that a drift of the machine's load spreads over them
            for c in [(r + i) % len(columns) for i in range(len(columns))]:
                tag, impl, share = columns[c]
                cmd = child_command(args, layout, workdir, share)
                if impl:
                    cmd += ["--impl", impl]
                if args.keep_files:
                    cmd.append("--keep-files")
                if r:
                    cmd.append("--collect-only")
                print(
                    f"[pool_scale] {layout}, {tag}: building {args.trajectories:,} trajectories"
                    + (f" (repeat {r + 1} of {args.repeat})" if args.repeat > 1 else "")
                    + " ...",
                    flush=True,
                )
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"[pool_scale] {layout}, {tag} failed:\n{proc.stderr[-3000:]}")
                runs[c].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        interleaved: list[dict] = [{} for _ in columns]
        if args.interleave:
            print(f"[pool_scale] {layout}: every column in one process, call by call in turn ...", flush=True)
            cmd = child_command(args, layout, workdir, 0.0)
            cmd += ["--columns", json.dumps([[impl, share] for _, impl, share in columns])]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"[pool_scale] {layout}, interleaved failed:\n{proc.stderr[-3000:]}")
            interleaved = json.loads(proc.stdout.strip().splitlines()[-1])
        for (tag, _, _), repeats, il in zip(columns, runs, interleaved, strict=True):
            out = {**repeats[0], **il, "column": f"{layout} {tag}"}
            if len(repeats) > 1:  # the collect figures: the median over the repeats
                for key in COLLECT_KEYS:
                    out[key] = float(np.median([x[key] for x in repeats]))
                out["collect_ms_medians"] = " / ".join(f"{x['collect_ms_median']:.2f}" for x in repeats)
            results.append(out)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    print(
        f"python benchmarks/pool_scale.py --trajectories {args.trajectories} --mean-len {args.mean_len} "
        f"--len-spread {args.len_spread} --baseline {args.baseline}"
        + (f" --repeat {args.repeat}" if args.repeat > 1 else "")
        + (f" --clock {args.clock}" if args.clock != "wall" else "")
        + (" --interleave" if args.interleave else "")
        + (
            f" --tool-share {args.tool_share} --tool-calls {args.tool_calls} --tool-len {args.tool_len}"
            if any(shares)
            else ""
        )
    )
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"numpy {np.__version__}"
    )
    width = max(len(r[1]) for r in ROWS)
    col = max(16, *(len(r["column"]) for r in results))
    print(f"| {'metric':<{width}} | " + " | ".join(f"{r['column']:>{col}}" for r in results) + " |")
    print(f"|{'-' * (width + 2)}|" + "|".join("-" * (col + 2) for _ in results) + "|")
    for key, label, fmt in ROWS:
        cells = [fmt.format(r[key]) if key in r else "-" for r in results]
        print(f"| {label:<{width}} | " + " | ".join(f"{c:>{col}}" for c in cells) + " |")


if __name__ == "__main__":
    main()
