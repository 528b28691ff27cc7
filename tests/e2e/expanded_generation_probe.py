"""Check on the real stack (CPU backend, Ray, hf rollout) that generation with per-prompt sample counts works.

``recipe.exgrpo.legacy.generation.generate_with_counts`` is the trainer's generation (K samples per fresh prompt, K−1
per replayed one); this script runs it once through a legacy ``RayPPOTrainer`` built as verl's task runner builds
it, and writes a JSON report (group sizes, aligned prompts, non-empty responses, the fields verl adds)::

    python -m tests.e2e.expanded_generation_probe --out DIR --counts 4,3,4,3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from recipe.exgrpo import verl_compat
from recipe.exgrpo.legacy.generation import expand_by_counts, generate_with_counts


def _build_trainer(cfg: Any) -> Any:
    """The legacy trainer, built in this process the way verl's TaskRunner builds it (``build_trainer``)."""
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from recipe.exgrpo.main_exgrpo import build_trainer

    OmegaConf.resolve(cfg)
    trainer = build_trainer(BaseTaskRunner(), cfg, RayPPOTrainer)
    trainer.init_workers()
    return trainer


def run_probe(out_dir: Path, counts: list[int], wall_limit_s: float) -> dict[str, Any]:
    import ray
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from recipe.exgrpo.cpu.run_config import cpu_overrides, start_wall_clock_watchdog, validate_cpu_run_config
    from recipe.exgrpo.harness.assets import ensure_assets
    from tests.e2e.helpers import cpu_run_spec
    from tests.helpers.cpu_runs import compose_ppo_trainer

    start_wall_clock_watchdog(wall_limit_s)
    spec = cpu_run_spec(
        ensure_assets(),
        out_dir,
        reward_fn_path=str(Path(__file__).resolve().parent / "toy_reward.py"),
        train_batch_size=len(counts),
        rollout_n=1,
        ray_temp_dir=os.environ.get("EXGRPO_RAY_TEMP_DIR"),
    )
    cfg = compose_ppo_trainer(cpu_overrides(spec))
    validate_cpu_run_config(cfg)
    ray_init = OmegaConf.to_container(cfg.ray_kwargs.ray_init)
    ray_init["runtime_env"] = OmegaConf.to_container(
        OmegaConf.merge(get_ppo_ray_runtime_env(cfg), ray_init.get("runtime_env") or {})
    )
    ray.init(**ray_init)
    try:
        trainer = _build_trainer(cfg)
        trainer.checkpoint_manager.update_weights(0)
        batch = DataProto.from_single_dict(next(iter(trainer.train_dataloader)))
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen_batch = verl_compat.gen_batch(trainer, batch)
        gen_batch.meta_info["global_steps"] = 1
        output = generate_with_counts(
            trainer.async_rollout_manager,
            gen_batch,
            counts,
            num_workers=int(cfg.actor_rollout_ref.rollout.agent.num_workers),
            sleep=trainer.checkpoint_manager.sleep_replicas,
        )
        full = expand_by_counts(batch, counts).union(output)
        uids = list(full.non_tensor_batch["uid"])
        group_sizes = [uids.count(u) for u in dict.fromkeys(uids)]
        response_mask = full.batch["response_mask"] if "response_mask" in full.batch else None
        report = {
            "counts": counts,
            "rows": len(full),
            "group_sizes": group_sizes,
            "prompts_match": bool(
                all(
                    (full.batch["prompts"][i] == full.batch["prompts"][j]).all()
                    for i, j in zip(range(len(full) - 1), range(1, len(full)), strict=True)
                    if uids[i] == uids[j]
                )
            ),
            "responses_non_empty": bool(
                (full.batch["attention_mask"][:, -full.batch["responses"].shape[1] :].sum(-1) > 0).all()
            ),
            "has_rollout_log_probs": "rollout_log_probs" in full.batch.keys(),
            "has_rm_scores": "rm_scores" in full.batch.keys(),
            "response_mask_tokens": int(response_mask.sum()) if response_mask is not None else None,
        }
    finally:
        ray.shutdown()
    (out_dir / "expanded_generation.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Check generation with per-prompt sample counts on the CPU stack.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--counts", default="4,3,4,3", help="samples per prompt, comma separated")
    parser.add_argument("--wall-limit", type=float, default=300)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = run_probe(out, [int(c) for c in args.counts.split(",")], args.wall_limit)
    print(json.dumps(report))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
