"""Data-parallel generation: one inference engine (replica) per group of ``tensor_parallel_size`` GPUs.

A vLLM engine uses the GPUs of its tensor-parallel group only, so ``--tensor-parallel-size 2`` on 8 GPUs left 6
idle. With ``--data-parallel-size N`` the evaluation starts N replica processes
(``python -m exgrpo.eval.parallel SPEC``), each with ``CUDA_VISIBLE_DEVICES`` set to its own slice of the GPUs,
and gives each a share of the missing ``(row, sample)`` pairs, balanced by sample count. Every replica appends
to its own shard file next to the generation file (``<data>.shard<i>.jsonl``, same records, same settings
sidecar); when all are done the shards are merged into ``<data>.jsonl`` and removed.

What this keeps from the one-engine path:
- the samples: vLLM seeds each row's request with ``sample_seed(seed, row)``, so a row's samples do not depend
  on which replica drew them or on how the rows were split;
- resuming: a shard left by an interrupted run is merged before the remaining work is split again, so nothing
  generated is lost or generated twice;
- the plan: each replica gets its ``{row: [sample, ...]}`` explicitly, computed from the whole file.

The replica processes only need the public ``vllm.LLM`` API (through ``VLLMBackend``); the HF backend works
the same way (CPU tests use it).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exgrpo.eval.generate import GenerationStore, read_generations

REPLICA_DIR = "replicas"  # under the output directory: the replicas' specs, logs and status files


class ReplicaError(RuntimeError):
    """One or more replicas failed; what they generated was kept (merged) and a rerun resumes."""


def replica_devices(data_parallel_size: int, tensor_parallel_size: int, visible: str | None = None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each replica: consecutive slices of ``tensor_parallel_size`` devices.

    ``visible`` is the parent's ``CUDA_VISIBLE_DEVICES`` (the devices to use, in order); unset means devices
    0 .. dp x tp - 1. Fewer devices than dp x tp is an error that names both numbers.
    """
    if data_parallel_size < 1 or tensor_parallel_size < 1:
        raise ValueError(
            f"data_parallel_size and tensor_parallel_size must be >= 1, got {data_parallel_size}, "
            f"{tensor_parallel_size}"
        )
    need = data_parallel_size * tensor_parallel_size
    if visible is None or not visible.strip():
        ids = [str(i) for i in range(need)]
    else:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
    if len(ids) < need:
        raise ValueError(
            f"data parallel {data_parallel_size} x tensor parallel {tensor_parallel_size} = {need} GPUs, but "
            f"CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)}"
        )
    return [",".join(ids[i * tensor_parallel_size : (i + 1) * tensor_parallel_size]) for i in range(data_parallel_size)]


Work = dict[str, dict[int, list[int]]]  # data file -> row -> sample indices


def shard_work(work: Mapping[str, Mapping[int, Sequence[int]]], n: int) -> list[Work]:
    """Split ``{data: {row: [samples]}}`` into ``n`` shards with about equal sample counts.

    Whole rows go to one shard (a row is one request with its n samples); rows are placed largest first on the
    least-loaded shard, ties by data file and row order, so the split is deterministic. Empty shards are
    possible when there are fewer rows than replicas.
    """
    if n < 1:
        raise ValueError(f"need at least one shard, got {n}")
    items = [(data, row, list(samples)) for data, rows in work.items() for row, samples in rows.items() if samples]
    order = sorted(range(len(items)), key=lambda i: (-len(items[i][2]), i))
    shards: list[Work] = [{} for _ in range(n)]
    load = [0] * n
    for i in order:
        data, row, samples = items[i]
        k = min(range(n), key=lambda j: (load[j], j))
        shards[k].setdefault(data, {})[row] = samples
        load[k] += len(samples)
    # rows in file order inside each shard (batches then follow the file, like the one-engine path)
    return [{d: dict(sorted(rows.items())) for d, rows in shard.items()} for shard in shards]


def shard_path(generation_path: str | os.PathLike, index: int) -> pathlib.Path:
    path = pathlib.Path(generation_path)
    return path.with_name(f"{path.stem}.shard{index}{path.suffix}")


def shard_paths(generation_path: str | os.PathLike) -> list[pathlib.Path]:
    path = pathlib.Path(generation_path)
    return sorted(path.parent.glob(f"{path.stem}.shard*{path.suffix}"))


def merge_shards(store: GenerationStore) -> int:
    """Append the records of every shard file of ``store`` that it does not hold yet, then remove the shards
    (and their settings sidecars). A torn last line of a shard is dropped. Returns the records merged."""
    merged = 0
    for path in shard_paths(store.path):
        new = [rec for key, rec in sorted(read_generations(path).items()) if key not in store.records]
        if new:
            store.append(new)
            merged += len(new)
        path.unlink()
        path.with_name(path.name + ".meta.json").unlink(missing_ok=True)
    return merged


@dataclass
class ReplicaSpec:
    """What one replica process generates (written as JSON for ``python -m exgrpo.eval.parallel``)."""

    index: int
    config: dict[str, Any]  # EvalConfig.to_dict()
    work: Work
    shards: dict[str, str]  # data file -> this replica's shard file
    fingerprints: dict[str, dict[str, Any]]  # data file -> the generation settings (the main file's)
    status_file: str

    def to_json(self) -> str:
        d = dict(self.__dict__)
        d["work"] = {data: {str(r): s for r, s in rows.items()} for data, rows in self.work.items()}
        return json.dumps(d, indent=1)

    @classmethod
    def from_json(cls, text: str) -> ReplicaSpec:
        d = json.loads(text)
        d["work"] = {data: {int(r): list(s) for r, s in rows.items()} for data, rows in d["work"].items()}
        return cls(**d)


def run_replicas(
    specs: Sequence[ReplicaSpec],
    devices: Sequence[str],  # CUDA_VISIBLE_DEVICES by replica index
    work_dir: pathlib.Path,
    *,
    total: int,
    progress: bool = True,
    poll_s: float = 2.0,
) -> None:
    """Start one process per spec with its ``CUDA_VISIBLE_DEVICES``, show the shards' progress, wait for all.

    A failed replica does not stop the others; afterwards ``ReplicaError`` names each failed one and the tail of
    its log. Ctrl-C stops every replica (what they wrote stays in their shards and is merged by the caller)."""
    from tqdm.auto import tqdm

    work_dir.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[ReplicaSpec, subprocess.Popen, pathlib.Path]] = []
    try:
        for spec in specs:
            dev = devices[spec.index]
            spec_file = work_dir / f"replica{spec.index}.json"
            spec_file.write_text(spec.to_json(), encoding="utf-8")
            log = work_dir / f"replica{spec.index}.log"
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": dev}
            with log.open("w", encoding="utf-8") as f:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "exgrpo.eval.parallel", str(spec_file)],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,  # its own process group: stopped as a whole, with vLLM's workers
                )
            procs.append((spec, proc, log))
        bar = tqdm(total=total, desc=f"generate ({len(procs)} replicas)", unit="sample", disable=not progress)
        try:
            while True:
                done = sum(_count_lines(pathlib.Path(p)) for spec, _, _ in procs for p in spec.shards.values())
                bar.update(max(0, min(done, total) - bar.n))
                if all(proc.poll() is not None for _, proc, _ in procs):
                    break
                time.sleep(poll_s)
        finally:
            bar.close()
    except BaseException:
        for _, proc, _ in procs:
            _stop(proc)
        raise
    failed = [(spec, proc, log) for spec, proc, log in procs if proc.returncode != 0]
    if failed:
        lines = [
            f"replica {spec.index} (CUDA_VISIBLE_DEVICES={devices[spec.index]}) exited with {proc.returncode}; "
            f"log {log}:\n" + _tail(log)
            for spec, proc, log in failed
        ]
        raise ReplicaError(
            f"{len(failed)} of {len(procs)} replicas failed (what they generated is kept; rerun to finish; "
            "docs/troubleshooting.md#replicaerror):\n" + "\n".join(lines)
        )


def _count_lines(path: pathlib.Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def _tail(path: pathlib.Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def replica_main(spec_file: str) -> int:
    """One replica: build the backend on this process's GPUs and generate the spec's share into its shards."""
    from exgrpo.eval.config import DEFAULT_BATCH_SIZE, EvalConfig
    from exgrpo.eval.generate import generate_to_jsonl

    spec = ReplicaSpec.from_json(pathlib.Path(spec_file).read_text(encoding="utf-8"))
    cfg = EvalConfig.from_dict(spec.config)
    status: dict[str, Any] = {
        "index": spec.index,
        "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "generated": {},
    }
    backend = cfg.build_backend()
    for data, work in spec.work.items():
        rows = [r for r in cfg.load_rows(data) if r.row in work]
        store = GenerationStore.open(spec.shards[data], spec.fingerprints[data])
        status["generated"][data] = generate_to_jsonl(
            backend,
            rows,
            store,
            prompt_format=cfg.prompt_format,
            sampling=cfg.sampling,
            batch_size=cfg.batch_size or DEFAULT_BATCH_SIZE[cfg.backend],
            progress=False,
            samples=work,
        )
        print(f"[replica {spec.index}] {pathlib.Path(data).name}: {status['generated'][data]} samples", flush=True)
    pathlib.Path(spec.status_file).write_text(json.dumps(status, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(replica_main(sys.argv[1]))
