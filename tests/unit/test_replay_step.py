"""The replay step (recipe/exgrpo/replay_step/step.py) through two whole steps, driven by a backend made of
hand-written functions (tests/helpers/replay_rows.py), with no verl, no Ray and no trainer: the draw, the ONE pass over
the generated rows and every candidate, the selection by entropy, the replayed members' rewards, the update's fields,
the advantages of the mixed groups, the collection, the metrics, the trace and the checkpoint state."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from exgrpo.config import ExGRPOConfig
from recipe.exgrpo.replay_step import TRACE_FILE, ReplayStep
from recipe.exgrpo.replay_step.fields import (
    EXPERIENCE_GROUP_KEY,
    IS_REPLAY_KEY,
    MIXED_KEY,
    RATIO_KEY,
)
from tests.helpers.replay_rows import PAD, PASS_TOKEN, R_LEN, FakeBackend, prompt_rows, token_entropy

REPO = Path(__file__).resolve().parents[2]
K = 4
QUESTIONS = [f"q{i}" for i in range(8)]
#: per question: how many of its K step-1 responses pass (0 < k < K: partially solved, stored)
PASSES = {"q0": 2, "q1": 1, "q2": 3, "q3": 0}


def _prompt(row: int) -> list[int]:
    return [20 + row, 21 + row]


class _Loader:
    """A data loader that keeps its position (as verl's, whose state a checkpoint holds): batches of 4 rows."""

    def __init__(self, position: int = 0) -> None:
        self.position = position

    def epoch(self):
        batches = [[0, 1, 2, 3], [4, 5, 6, 7]]
        while self.position < len(batches):
            self.position += 1
            yield batches[self.position - 1]
        self.position = 0


def _replay_step(tmp_path, experience=None, loader=None, **settings) -> ReplayStep:
    cfg = ExGRPOConfig.from_dict({"delayed_start_threshold": -1.0, "replay_ratio": 0.5, "seed": 1, **settings}, k=K)
    return ReplayStep(
        cfg,
        questions_per_step=4,
        question_ids=QUESTIONS,
        row_of_question={q: i for i, q in enumerate(QUESTIONS)},
        epoch_batches=(loader or _Loader()).epoch,
        pad_token_id=PAD,
        response_width=R_LEN,
        trace_dir=tmp_path,
        experience=experience,
    )


def _responses(rows: list[int], counts, rng, passes: dict[str, int]) -> list[list[int]]:
    """K (or K−1) responses per prompt row: the first ``passes[q]`` hold the pass token, of random lengths."""
    out = []
    for row, c in zip(rows, counts):
        for j in range(int(c)):
            length = int(rng.integers(2, R_LEN + 1))
            tokens = rng.integers(30, 60, size=length).tolist()
            if j < passes.get(QUESTIONS[row], 0):
                tokens[0] = PASS_TOKEN
            out.append(tokens)
    return out


def _run_step(replay, step, rng, passes, backend):
    state = replay.begin(step, is_last=False)
    rows = replay.draw(state)
    responses = _responses(rows, state.counts, rng, passes)
    generated = prompt_rows([_prompt(r) for r in rows], state.counts, responses, [QUESTIONS[r] for r in rows])
    replay.score_and_select(state, generated, backend)
    replay.mark_update_rows(state)
    replay.advantages(state, state.rows.tensors["rm_scores"], None)
    replay.collect(state)
    state.metrics.update(replay.metrics(state))
    return state, rows


def test_two_steps_through_a_fake_backend(tmp_path):
    rng = np.random.default_rng(0)
    replay, backend = _replay_step(tmp_path), FakeBackend()
    # step 1: an empty pool, four fresh prompts, K each; the partially solved ones are collected
    s1, rows1 = _run_step(replay, 1, rng, PASSES, backend)
    assert s1.mixed and rows1 == [0, 1, 2, 3] and len(s1.plan) == 0 and s1.counts.tolist() == [K] * 4
    assert backend.log_prob_calls == [4 * K] and backend.score_calls == []  # one pass; the rows came scored
    assert sorted(replay.experience.pool.question_ids()) == ["q0", "q1", "q2"]  # q3 solved 0/4: not stored
    assert s1.pass_rate == pytest.approx(sum(PASSES.values()) / 16)

    # step 2: two of them replayed (ρ = 0.5 of 4), two fresh prompts; one pass over the generated rows and every
    # candidate; each replayed question's lowest-entropy stored trajectory joins its group
    s2, rows2 = _run_step(replay, 2, rng, {}, backend)
    plan = s2.plan
    assert len(plan) == 2 and s2.num_fresh == 2 and s2.counts.tolist() == [K, K, K - 1, K - 1]
    assert rows2 == s2.fresh_rows + [QUESTIONS.index(q) for q in plan.question_ids]
    assert not set(plan.question_ids) & {QUESTIONS[r] for r in s2.fresh_rows}
    n_generated = 2 * K + 2 * (K - 1)
    assert backend.log_prob_calls[1:] == [n_generated + plan.num_candidates]
    expected = []
    for cands in plan.candidates:
        means = [float(token_entropy(torch.as_tensor(c.token_ids)).mean()) for c in cands]
        assert len(set(np.round(means, 9))) == len(means), "the test's candidates must not tie"
        expected.append(cands[int(np.argmin(means))])
    assert s2.trace["selected_entry_ids"] == [c.entry_id for c in expected]
    rows = s2.rows
    assert len(rows) == n_generated + 2 and "entropys" not in rows.keys()
    assert rows.tensors[IS_REPLAY_KEY].tolist() == [False] * n_generated + [True, True]
    for j, c in enumerate(expected):
        row = n_generated + j
        assert rows.tensors["responses"][row, : c.length].tolist() == c.token_ids.tolist()
        assert rows.columns["uid"][row] == rows.columns["uid"][2 * K + j * (K - 1)]  # joined its question's group
    # the replayed members were re-scored, by one call on those two rows: they pass (stored correct answers)
    assert backend.score_calls == [2] and rows.tensors["rm_scores"][n_generated:].sum(-1).tolist() == [1.0, 1.0]
    # the update's fields: mixed everywhere, ρ recorded, the replay groups flagged
    assert bool(rows.tensors[MIXED_KEY].all()) and rows.tensors[RATIO_KEY].tolist() == [0.5] * len(rows)
    assert rows.tensors[EXPERIENCE_GROUP_KEY].tolist() == [False] * 2 * K + [True] * (2 * (K - 1) + 2)
    # advantages: group-relative (no std division), zero-sum per group
    adv = rows.tensors["advantages"][:, 0].numpy()
    for uid in set(rows.columns["uid"]):
        assert adv[rows.columns["uid"] == uid].sum() == pytest.approx(0.0, abs=1e-6)
    m = s2.metrics
    assert m["exgrpo/replayed_questions"] == 2 and m["exgrpo/fresh_questions"] == 2 and m["exgrpo/mixed"] == 1.0
    assert m["exgrpo/replayed_rows"] == 2.0 and m["exgrpo/old_log_prob_candidate_rows"] == plan.num_candidates
    assert m["exgrpo/replay_group_size_min"] == K and m["exgrpo/replay_group_size_max"] == K
    assert {"exgrpo_sample", "old_log_prob", "exgrpo_select", "exgrpo_replay_reward", "exgrpo_collect"} <= set(
        s2.timing
    )
    # the trace: one record per step, with what was replayed and drawn fresh
    trace = [json.loads(line) for line in (tmp_path / TRACE_FILE).read_text().splitlines()]
    assert [r["step"] for r in trace] == [1, 2] and trace[1]["replay_question_ids"] == plan.question_ids
    assert len(trace[1]["replayed_members"]) == 2


def test_trace_rows_records_every_row_trained_on(tmp_path):
    """exgrpo.trace_rows: each step's record holds every row (question, digests, reward, advantage), sorted so that
    two runs compare whatever their row order; off by default."""
    rng = np.random.default_rng(5)
    replay = _replay_step(tmp_path, trace_rows=True)
    _run_step(replay, 1, rng, PASSES, FakeBackend())
    state, _ = _run_step(replay, 2, rng, {}, FakeBackend())
    records = state.trace["rows"]
    assert len(records) == len(state.rows) == 4 * K
    assert records == sorted(records, key=lambda r: (r["question"], r["replayed"], r["tokens_sha"], r["mask_sha"]))
    assert sum(r["replayed"] for r in records) == len(state.plan) == 2
    rewards = state.rows.tensors["rm_scores"].sum(-1).tolist()
    assert sorted(r["reward"] for r in records) == sorted(rewards)
    assert sum(r["advantage"] for r in records) == pytest.approx(0.0, abs=1e-6)  # zero-sum groups
    trace = [json.loads(line) for line in (tmp_path / TRACE_FILE).read_text().splitlines()]
    assert [len(r["rows"]) for r in trace] == [4 * K, 4 * K]
    plain = tmp_path / "plain"
    replay = _replay_step(plain)
    _run_step(replay, 1, np.random.default_rng(5), PASSES, FakeBackend())
    assert "rows" not in json.loads((plain / TRACE_FILE).read_text().splitlines()[0])


def test_the_checkpoint_restores_the_pool_and_the_fresh_prompts(tmp_path):
    rng = np.random.default_rng(3)
    loader = _Loader()
    replay = _replay_step(tmp_path, loader=loader)
    _run_step(replay, 1, rng, PASSES, FakeBackend())
    replay.save(tmp_path / "global_step_1", 1)
    resumed = _replay_step(tmp_path, loader=_Loader(loader.position))  # the trainer restores its loader itself
    assert resumed.restore(tmp_path / "global_step_1", 1)
    assert resumed.experience.state_digest() == replay.experience.state_digest()
    assert resumed.fresh.state_dict() == replay.fresh.state_dict()
    # what each draws next is the same
    a, b = replay.begin(2, False), resumed.begin(2, False)
    assert replay.draw(a) == resumed.draw(b) and a.trace == b.trace
    events = [json.loads(line)["event"] for line in (tmp_path / TRACE_FILE).read_text().splitlines()]
    assert events == ["step", "save", "resume"]
    with pytest.raises(FileNotFoundError, match="holds no ExGRPO pool"):
        _replay_step(tmp_path).restore(tmp_path / "elsewhere", 1)


def test_the_replay_step_runs_without_verl_or_ray():
    """The two steps above, run by pytest in a fresh interpreter: verl, Ray and vLLM are never imported."""
    code = (
        "import sys, pytest\n"
        "rc = pytest.main(['-q', '-p', 'no:cacheprovider', "
        "'tests/unit/test_replay_step.py::test_two_steps_through_a_fake_backend'])\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'verl', 'ray', 'vllm'})\n"
        "print('exit', int(rc), 'loaded', loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "exit 0 loaded []", out.stdout[-2000:] + out.stderr[-2000:]


def test_a_step_in_parts_checks_the_delayed_start_once_on_all_its_rewards(tmp_path):
    """A step collected in parts (verl's separate_async: one collection per local update) leaves the delayed-start
    check and the re-add ablation to ``end_step``, once, on the whole step's rewards: a part whose own pass rate is
    above τ does not switch mixed mode when the step's is not, and the re-add runs once a step, not once a part."""
    rng = np.random.default_rng(0)
    settings = {"delayed_start_threshold": 0.35, "readd_retired_fraction": 0.5, "readd_retired_every": 1}
    replay, backend = _replay_step(tmp_path, **settings), FakeBackend()
    # two parts of one step: the first passes 5 of 8 (0.625 > τ), the second 0 of 8; the step's rate 0.3125 < τ
    part_passes = [{"q0": 4, "q1": 1}, {}]
    scores = []
    for passes in part_passes:
        state = replay.begin(1, is_last=False)
        rows = replay.draw(state)[:2]
        state.fresh_rows, state.counts = rows, state.counts[:2]
        generated = prompt_rows(
            [_prompt(r) for r in rows],
            state.counts,
            _responses(rows, state.counts, rng, passes),
            [QUESTIONS[r] for r in rows],
        )
        replay.score_and_select(state, generated, backend)
        replay.mark_update_rows(state)
        replay.advantages(state, state.rows.tensors["rm_scores"], None)
        replay.collect(state, end_of_step=False)
        assert state.pass_rate == pytest.approx(sum(passes.values()) / 8)
        assert not replay.experience.mixed, "a part's pass rate switched the delayed start"
        scores.append(state.scores)
    calls: list[int] = []
    original = replay.experience.readd_retired
    replay.experience.readd_retired = lambda step: calls.append(step) or original(step)
    replay.end_step(np.concatenate(scores), 1)
    assert not replay.experience.mixed and calls == [1]
    assert replay.experience.schedule.last_pass_rate == pytest.approx(5 / 16)
    # the whole step's rewards decide: above τ, the next step is mixed
    replay.end_step(np.ones(16), 2)
    assert replay.experience.mixed and calls == [1, 2]
