"""The reward on the real evaluation rows of ../shared/data/benchmarks (skipped when absent), and its contract
with verl 0.9.1's custom-reward loading and naive reward manager.

Real-data tests cover every row of test_id, valid_id, arc_c and gpqa_diamond (9,652 rows). Grading is a
deterministic function of (response, ground truth, data_source), so each distinct triple is graded once and its
result applies to every row holding it (AIME/AMC rows repeat 32 / 8 / 4 times); the assertions count rows.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from exgrpo.reward import RewardResult, canonical_answer, choice_labels, grade_batch, is_multiple_choice

FILES = ("test_id", "valid_id", "arc_c", "gpqa_diamond")
REPO = Path(__file__).resolve().parents[2]


def _response(answer: str, think: bool = True) -> str:
    body = f"Let me work this out carefully.\n... so the final answer is $\\boxed{{{answer}}}$."
    return f"<think>\nSome reasoning about the problem.\n</think>\n\n{body}" if think else f"{body}"


@pytest.fixture(scope="module")
def rows(shared_benchmarks: Path) -> pd.DataFrame:
    frames = []
    for name in FILES:
        df = pd.read_parquet(shared_benchmarks / f"{name}.parquet", columns=["data_source", "reward_model"])
        frames.append(
            pd.DataFrame({"file": name, "data_source": df["data_source"].astype(str)}).assign(
                truth=[rm["ground_truth"] for rm in df["reward_model"]]
            )
        )
    out = pd.concat(frames, ignore_index=True)
    assert len(out) == 6023 + 2259 + 1172 + 198
    return out


def _grade_rows(responses: Sequence[str], gts: Sequence[str], sources: Sequence[str], **kw) -> list[RewardResult]:
    """Grade each distinct (response, gt, data_source) once; return one result per row."""
    keys = list(zip(responses, gts, sources, strict=True))
    unique = list(dict.fromkeys(keys))
    graded = grade_batch([k[0] for k in unique], [k[1] for k in unique], [k[2] for k in unique], **kw)
    by_key = dict(zip(unique, graded, strict=True))
    return [by_key[k] for k in keys]


def _failures(rows: pd.DataFrame, results: list[RewardResult], want: float, limit: int = 8) -> list[str]:
    bad = [i for i, r in enumerate(results) if r.score != want]
    return [f"{rows['file'][i]}:{rows['data_source'][i]} gt={rows['truth'][i]!r} -> {results[i]}" for i in bad[:limit]]


def test_own_answer_scores_one_on_every_row(rows):
    # exact_shortcut=False: every math row goes through math-verify in the worker pool, as a paraphrase would
    results = _grade_rows(
        [_response(g) for g in rows["truth"]], list(rows["truth"]), list(rows["data_source"]), exact_shortcut=False
    )
    bad = _failures(rows, results, 1.0)
    assert not bad, f"{sum(r.score != 1.0 for r in results)} rows not scored 1:\n" + "\n".join(bad)
    assert all(r.outcome == "correct" for r in results)


def _partner_answers(rows: pd.DataFrame, seed: int = 0) -> list[str]:
    """For each row, the answer of another row with a different answer (not equal up to LaTeX spacing), drawn
    deterministically: math rows from any math benchmark, multiple-choice rows from their own benchmark with the
    same label set. Rows of one question share their partner."""
    rng = random.Random(seed)
    groups: dict[tuple, list[str]] = {}
    for gt, ds in zip(rows["truth"], rows["data_source"], strict=True):
        mc = is_multiple_choice(ds)
        key = (ds, choice_labels(gt)) if mc else ("math",)
        groups.setdefault(key, [])
        if gt not in groups[key]:
            groups[key].append(gt)
    for answers in groups.values():
        rng.shuffle(answers)
    partner: dict[tuple, str] = {}
    for key, answers in groups.items():
        for pos, gt in enumerate(answers):
            for step in range(1, len(answers)):
                other = answers[(pos + step) % len(answers)]
                if canonical_answer(other) != canonical_answer(gt):
                    partner[(key, gt)] = other
                    break
    out = []
    for gt, ds in zip(rows["truth"], rows["data_source"], strict=True):
        key = (ds, choice_labels(gt)) if is_multiple_choice(ds) else ("math",)
        out.append(partner[(key, gt)])
    return out


def test_another_rows_answer_scores_zero_on_at_least_99_percent(rows):
    others = _partner_answers(rows)
    assert all(canonical_answer(o) != canonical_answer(g) for o, g in zip(others, rows["truth"], strict=True))
    results = _grade_rows([_response(o) for o in others], list(rows["truth"]), list(rows["data_source"]))
    ones = [i for i, r in enumerate(results) if r.score != 0.0]
    rate = len(ones) / len(rows)
    examples = [f"gt={rows['truth'][i]!r} answered {others[i]!r}" for i in ones[:10]]
    print(f"different-answer rows scored 1: {len(ones)} / {len(rows)} ({rate:.2%}); e.g. {examples}")
    assert rate <= 0.01, f"{len(ones)} rows ({rate:.2%}) scored 1 with another row's answer: {examples}"
    # multiple-choice rows compare labels, so a different label can never pass
    mc = [i for i, ds in enumerate(rows["data_source"]) if is_multiple_choice(ds)]
    assert len(mc) == 1172 + 198 and not [i for i in mc if results[i].score != 0.0]


def test_missing_think_close_scores_zero_with_gate_and_one_without(rows):
    responses = [_response(g, think=False) for g in rows["truth"]]
    gated = _grade_rows(responses, list(rows["truth"]), list(rows["data_source"]), think_gate=True)
    assert all(r.score == 0.0 and r.outcome == "no_think" for r in gated)
    ungated = _grade_rows(responses, list(rows["truth"]), list(rows["data_source"]), think_gate=False)
    bad = _failures(rows, ungated, 1.0)
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------- verl 0.9.1 contract (no data)


class _CharTokenizer:
    """Just enough tokenizer for NaiveRewardManager: ids are code points."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(int(i)) for i in ids)


def _data_item(response: str, data_source: str, ground_truth: str):
    from verl import DataProto

    ids = torch.tensor([[ord(c) for c in response]])
    prompt_len = 3
    return DataProto.from_dict(
        tensors={
            "prompts": torch.zeros(1, prompt_len, dtype=torch.long),
            "responses": ids,
            "attention_mask": torch.ones(1, prompt_len + ids.shape[1], dtype=torch.long),
        },
        non_tensors={
            "data_source": np.array([data_source], dtype=object),
            "reward_model": np.array([{"ground_truth": ground_truth, "style": "rule"}], dtype=object),
            "extra_info": np.array([{"index": 0, "split": "test"}], dtype=object),
        },
    )


@pytest.mark.parametrize("path", [str(REPO / "recipe" / "exgrpo" / "reward.py"), "pkg://recipe.exgrpo.reward"])
def test_verl_loads_entry_point_and_naive_manager_scores_with_reward_kwargs(path):
    from omegaconf import OmegaConf
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    def manager(reward_kwargs: dict) -> NaiveRewardManager:
        config = OmegaConf.create(
            {
                "reward": {
                    "custom_reward_function": {"path": path, "name": "compute_score", "reward_kwargs": reward_kwargs}
                }
            }
        )
        fn = get_custom_reward_fn(config)
        assert fn is not None
        return NaiveRewardManager(config, _CharTokenizer(), fn)

    async def run(m: NaiveRewardManager, *items):
        return await asyncio.gather(*(m.run_single(item) for item in items))

    items = [
        _data_item("<think>r</think> so \\boxed{\\frac{1}{2}}", "math", "0.5"),
        _data_item("no think close \\boxed{9}", "toy_arithmetic", "9"),
        _data_item("<think>r</think>\nANSWER: C", "gpqa", "C"),
        _data_item("<think>r</think> \\boxed{9^{9^{9^{9}}}}", "math", "1"),
    ]
    # the manager binds the current event loop when built (as in verl's reward-loop actors)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        gated = loop.run_until_complete(run(manager({"timeout_s": 2}), *items))
        ungated = loop.run_until_complete(run(manager({"think_gate": False, "timeout_s": 2}), *items[1:2]))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    assert [o["reward_score"] for o in gated] == [1.0, 0.0, 1.0, 0.0]
    assert gated[3]["reward_extra_info"]["reward_timeout"] == 1.0  # the hang was cut off, not raised
    assert ungated[0]["reward_score"] == 1.0
    # verl stacks extra-info values across responses by the first response's keys: they must all match
    assert len({tuple(sorted(o["reward_extra_info"])) for o in gated}) == 1
    assert {"score", "acc", "pred"} <= set(gated[0]["reward_extra_info"])
