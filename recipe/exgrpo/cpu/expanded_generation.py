"""Generation with a different number of samples per prompt, through the legacy trainer's own rollout path.

How verl 0.9.1's legacy ``RayPPOTrainer.fit`` generates (ray_trainer.py): it takes the prompt batch, strips it to
the generation keys (``_get_gen_batch``), repeats it ``rollout.n`` times itself
(``gen_batch.repeat(rollout.n, interleave=True)``) and hands the already-expanded batch to
``self.async_rollout_manager.generate_sequences(...)``. The agent-loop manager produces **exactly one response
per row**; ``rollout.n`` plays no part in generation. So a trainer that needs K samples for fresh questions and
K-1 for replayed ones (docs/algorithm.md, the mixed step) expands the batch with per-row counts and calls the same
manager; ``generate_with_counts`` below is that call, with the padding verl's manager needs when it splits the
batch across several agent-loop workers.

Run as a module, it checks this on the real stack (CPU backend, Ray, hf rollout) and writes a JSON report::

    python -m recipe.exgrpo.cpu.expanded_generation --out DIR --counts 4,3,4,3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def expand_by_counts(gen_batch: Any, counts: Sequence[int]) -> Any:
    """Row i of ``gen_batch`` repeated ``counts[i]`` times, consecutively (uid and all other keys repeated too)."""
    counts = [int(c) for c in counts]
    if len(counts) != len(gen_batch):
        raise ValueError(f"counts has {len(counts)} entries for a batch of {len(gen_batch)} prompts")
    if any(c < 1 for c in counts):
        raise ValueError(f"every prompt needs at least one sample, got counts={counts}")
    return gen_batch.sample_level_repeat(counts)


def generate_with_counts(trainer: Any, gen_batch: Any, counts: Sequence[int], sleep_after: bool = True) -> Any:
    """Generate ``counts[i]`` responses for prompt ``i`` with a legacy ``RayPPOTrainer``'s rollout manager.

    ``gen_batch`` is what ``trainer._get_gen_batch(batch)`` returns (with ``uid`` set and
    ``meta_info['global_steps']`` filled in). Returns one output row per sample, prompt-major, aligned with
    ``expand_by_counts(batch, counts)`` of the full batch (repeat the full batch the same way before ``union``).
    """
    from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto

    expanded = expand_by_counts(gen_batch, counts)
    divisor = int(trainer.config.actor_rollout_ref.rollout.agent.num_workers)
    padded, pad_size = pad_dataproto_to_divisor(expanded, divisor)
    output = trainer.async_rollout_manager.generate_sequences(padded)
    if sleep_after:
        trainer.checkpoint_manager.sleep_replicas()
    return unpad_dataproto(output, pad_size=pad_size)


def _build_trainer(cfg: Any) -> Any:
    """The legacy trainer, built in this process the way verl's TaskRunner builds it."""
    from omegaconf import OmegaConf
    from verl.trainer.main_ppo_v0 import BaseTaskRunner
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.dataset.rl_dataset import collate_fn

    OmegaConf.resolve(cfg)
    runner = BaseTaskRunner()
    _, worker_group_cls = runner.add_actor_rollout_worker(cfg)
    runner.add_reward_model_resource_pool(cfg)
    resource_pool_manager = runner.init_resource_pool_mgr(cfg)
    model_config = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
    tokenizer = model_config.tokenizer
    train = create_rl_dataset(cfg.data.train_files, cfg.data, tokenizer, None, is_train=True)
    val = create_rl_dataset(cfg.data.val_files, cfg.data, tokenizer, None, is_train=False)
    trainer = RayPPOTrainer(
        config=cfg,
        tokenizer=tokenizer,
        role_worker_mapping=runner.role_worker_mapping,
        resource_pool_manager=resource_pool_manager,
        ray_worker_group_cls=worker_group_cls,
        train_dataset=train,
        val_dataset=val,
        collate_fn=collate_fn,
        train_sampler=create_rl_sampler(cfg.data, train),
    )
    trainer.init_workers()
    return trainer


def run_probe(out_dir: Path, counts: list[int], wall_limit_s: float) -> dict[str, Any]:
    import ray
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer import main_ppo
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    from .assets import ensure_assets
    from .run_config import CpuRunSpec, cpu_overrides, start_wall_clock_watchdog, validate_cpu_run_config

    start_wall_clock_watchdog(wall_limit_s)
    assets = ensure_assets()
    reward = Path(__file__).resolve().parents[3] / "tests" / "e2e" / "toy_reward.py"
    spec = CpuRunSpec(
        model_path=str(assets.model_path),
        train_files=str(assets.train_file),
        val_files=str(assets.val_file),
        output_dir=str(out_dir),
        reward_fn_path=str(reward),
        train_batch_size=len(counts),
        rollout_n=1,
        ray_temp_dir=os.environ.get("EXGRPO_RAY_TEMP_DIR"),
    )
    overrides = [o for o in cpu_overrides(spec) if not o.lstrip("+").startswith("hydra.")]
    with initialize_config_dir(config_dir=str(Path(main_ppo.__file__).parent / "config"), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
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
        gen_batch = trainer._get_gen_batch(batch)
        gen_batch.meta_info["global_steps"] = 1
        output = generate_with_counts(trainer, gen_batch, counts)
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
