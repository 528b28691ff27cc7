"""Fingerprint of the binary reward mode: the child side of ``tests/unit/test_binary_mode_unchanged.py``.

``python tests/unit/binary_mode_driver.py OUT_DIR`` (with the ``exgrpo`` package to fingerprint first on
``PYTHONPATH``) drives an experience manager in the default binary mode through a scripted sequence of steps
(draws, entropy selection on seeded token statistics, collection with caps, the delayed start, re-added retired
questions), saves the state with ``save_experience`` into OUT_DIR, computes the mixed loss and its gradient on
seeded tensors, and prints one JSON object: the manager's state digest, the SHA-256 of each saved data file and of
the header (its save time left out), and the loss, its metrics and gradient bit for bit. Only APIs that every
version of the package since the persistence format 2 has are used, so two source trees can be compared.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

import exgrpo
from exgrpo.config import ExGRPOConfig
from exgrpo.experience import CandidateTokenStats, GroupMember, save_experience
from exgrpo.experience.manager import ExperienceManager
from exgrpo.objective import LossSettings, mixed_policy_loss

K = 4
STEPS = 10
QUESTIONS_PER_STEP = 8
MAX_LEN = 12


def _member(rng: np.random.Generator, p_correct: float) -> GroupMember:
    n = int(rng.integers(1, MAX_LEN + 1))
    ids = rng.integers(0, 50, n).astype(np.int64)  # a small vocabulary: duplicates happen and are deduplicated
    lps = -rng.exponential(0.7, n).astype(np.float32)
    return GroupMember(ids, lps, float(rng.random() < p_correct))


def drive_pool(out: Path) -> dict:
    cfg = ExGRPOConfig.from_dict(
        {"seed": 7, "max_entries_per_question": 3, "readd_retired_fraction": 0.5, "readd_retired_every": 4}, k=K
    )
    mgr = ExperienceManager(cfg)
    rng = np.random.default_rng(1234)
    questions = [f"q{i}" for i in range(24)]
    difficulty = {q: float(p) for q, p in zip(questions, rng.random(len(questions)))}
    for step in range(1, STEPS + 1):
        plan = mgr.plan_replay(QUESTIONS_PER_STEP, step, max_response_length=MAX_LEN)
        selected = []
        if plan.question_ids:
            flat = [c for group in plan.candidates for c in group]
            mask = torch.zeros(len(flat), MAX_LEN)
            for i, c in enumerate(flat):
                mask[i, : c.length] = 1
            gen = torch.Generator().manual_seed(step)
            stats = CandidateTokenStats(
                response_mask=mask,
                entropy=torch.rand(len(flat), MAX_LEN, generator=gen),
                log_prob=-torch.rand(len(flat), MAX_LEN, generator=gen),
            )
            selected = mgr.select(plan, stats)
        replayed = set(plan.question_ids)
        fresh = [q for q in questions if q not in replayed and q not in mgr.retired]
        fresh = [fresh[int(i)] for i in rng.permutation(len(fresh))[: QUESTIONS_PER_STEP - len(plan)]]
        groups: dict[str, list[GroupMember]] = {}
        for q in fresh:
            groups[q] = [_member(rng, difficulty[q]) for _ in range(K)]
        for s in selected:
            c = s.candidate
            members = [GroupMember(c.token_ids, c.behaviour_log_probs, 1.0, is_replayed=True)]
            groups[c.question_id] = members + [_member(rng, difficulty[c.question_id]) for _ in range(K - 1)]
        mgr.collect(step, groups)
        rewards = [m.reward for ms in groups.values() for m in ms]
        mgr.observe_pass_rate(float(np.mean(np.asarray(rewards) >= 1.0)), step)
        mgr.readd_retired(step)

    save_experience(
        out,
        pool=mgr.pool,
        sampler=mgr.sampler,
        selector=mgr.selector,
        schedule=mgr.schedule,
        extra={"trainer_state": {"leftover_rows": [3, 1, 2]}},
        fsync=False,
    )
    header = json.loads((out / "header.json").read_text())
    header.pop("saved_at")
    header.pop("sha256")  # covers the save time
    files = {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in sorted(header["files"])}
    return {
        "state_digest": mgr.state_digest(),
        "files": files,
        "header": hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest(),
        "pool_entries": len(mgr.pool),
        "retired": len(mgr.retired),
        "mixed": bool(mgr.mixed),
    }


def drive_loss() -> dict:
    cfg = ExGRPOConfig.from_dict({}, k=K)
    settings = LossSettings.from_config(cfg, entropy_coeff=0.001)
    gen = torch.Generator().manual_seed(99)
    rows, length = 12, 16
    old = -torch.rand(rows, length, generator=gen, dtype=torch.float64)
    logits = (old + 0.1 * torch.randn(rows, length, generator=gen, dtype=torch.float64)).requires_grad_(True)
    behaviour = -torch.rand(rows, length, generator=gen, dtype=torch.float64)
    advantages = torch.randn(rows, generator=gen, dtype=torch.float64)
    mask = (torch.rand(rows, length, generator=gen) < 0.8).to(torch.float64)
    mask[:, 0] = 1
    replay = torch.zeros(rows, dtype=torch.bool)
    replay[::3] = True
    entropy = torch.rand(rows, length, generator=gen, dtype=torch.float64)
    out = {}
    for mixed in (False, True):
        logits.grad = None
        loss, metrics = mixed_policy_loss(
            logits, old, behaviour, advantages, mask, replay, settings, mixed=mixed, entropy=entropy
        )
        loss.backward()
        out[f"mixed={mixed}"] = {
            "loss": float(loss.detach()).hex(),
            "grad": hashlib.sha256(logits.grad.numpy().tobytes()).hexdigest(),
            # the values too: a record made on another CPU is compared to them within a tolerance
            "grad_values": [float(v).hex() for v in logits.grad.flatten().tolist()],
            "metrics": {k: float(v).hex() for k, v in sorted(metrics.items())},
        }
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    result = {"package": str(Path(exgrpo.__file__).resolve().parent), "pool": drive_pool(out / "pool")}
    result["loss"] = drive_loss()
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
