"""Trajectory selection (docs/algorithm.md §5): masked-mean scores, token-stats input, metrics registry, selector."""

import json

import numpy as np
import pytest
import torch

from exgrpo.config import ExGRPOConfig
from exgrpo.experience import (
    TRAJECTORY_METRICS,
    Candidate,
    CandidateTokenStats,
    TrajectorySelector,
    get_trajectory_metric,
    masked_mean_per_row,
    ngram_overlap_scores,
    register_trajectory_metric,
    selection_metrics,
    trajectory_scores,
)


def cand(qid, eid, tokens):
    ids = np.asarray(tokens, dtype=np.int32)
    return Candidate(qid, eid, ids, np.zeros(len(ids), dtype=np.float32), 1.0, 0)


# ------------------------------------------------------------------------------------------ masked mean
def test_masked_mean_is_per_row_and_ignores_padding():
    values = torch.tensor([[1.0, 3.0, 100.0, 100.0], [2.0, 2.0, 2.0, 6.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    out = masked_mean_per_row(values, mask)
    torch.testing.assert_close(out, torch.tensor([2.0, 3.0, 0.0], dtype=torch.float64))  # empty mask -> 0, not NaN


def test_masked_mean_upcasts_to_float64_and_checks_shapes():
    v = torch.full((1, 4096), 0.3, dtype=torch.bfloat16)
    out = masked_mean_per_row(v, torch.ones(1, 4096))
    assert out.dtype == torch.float64 and out.item() == pytest.approx(float(v[0, 0]), rel=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        masked_mean_per_row(torch.ones(2, 3), torch.ones(2, 4))


def test_short_high_entropy_vs_long_low_entropy_picks_lowest_mean():
    """The released mask bug favoured short trajectories (≈ smallest summed entropy); the mean must not."""
    entropies = torch.zeros(2, 10)
    entropies[0, :2] = 1.0  # short: mean 1.0, sum 2.0
    entropies[1, :10] = 0.5  # long: mean 0.5, sum 5.0
    mask = torch.zeros(2, 10)
    mask[0, :2] = 1
    mask[1, :] = 1
    scores = trajectory_scores("entropy", mask, entropies=entropies)
    torch.testing.assert_close(scores, torch.tensor([1.0, 0.5], dtype=torch.float64))
    assert int(torch.argmin(scores)) == 1
    assert int(torch.argmin((entropies * mask).sum(-1))) == 0  # what a sum would have picked


def test_nll_score_and_missing_inputs():
    lp = torch.log(torch.tensor([[0.5, 0.25, 1.0]]))
    s = trajectory_scores("nll", torch.tensor([[1, 1, 0]]), log_probs=lp)
    torch.testing.assert_close(s, torch.tensor([(np.log(2) + np.log(4)) / 2], dtype=torch.float64))
    with pytest.raises(ValueError, match="needs per-token entropies"):
        trajectory_scores("entropy", torch.ones(1, 2))
    with pytest.raises(ValueError, match="unknown score quantity"):
        trajectory_scores("perplexity", torch.ones(1, 2), log_probs=torch.ones(1, 2))


# ------------------------------------------------------------------------------------------ selector
def test_entropy_selection_calls_provider_once_with_all_candidates():
    groups = [[cand("a", 0, [1]), cand("a", 1, [2]), cand("a", 2, [3])], [cand("b", 3, [4]), cand("b", 4, [5])]]
    table = {0: 0.9, 1: 0.2, 2: 0.5, 3: 0.1, 4: 0.3}
    calls = []

    def provider(cands, quantity):
        calls.append((quantity, [c.entry_id for c in cands]))
        return torch.tensor([table[c.entry_id] for c in cands])

    sel = TrajectorySelector("entropy", "min")
    assert sel.needs_scores
    out = sel.select(groups, provider)
    assert calls == [("entropy", [0, 1, 2, 3, 4])]
    assert [s.entry_id for s in out] == [1, 3] and [s.question_id for s in out] == ["a", "b"]
    assert out[0].score == pytest.approx(0.2) and out[0].num_candidates == 3
    out = TrajectorySelector("entropy", "max").select(groups, provider)
    assert [s.entry_id for s in out] == [0, 4]
    out = TrajectorySelector("nll", "min").select(groups, provider)
    assert calls[-1][0] == "nll" and [s.entry_id for s in out] == [1, 3]
    m = selection_metrics(out)
    assert m["selection/score_mean"] == pytest.approx(0.15) and m["selection/candidates_mean"] == 2.5


def test_ties_go_to_the_oldest_and_nonfinite_is_skipped():
    groups = [[cand("a", 0, [1]), cand("a", 1, [2]), cand("a", 2, [3])]]
    sel = TrajectorySelector("entropy")
    assert sel.select(groups, lambda c, q: [0.4, 0.4, 0.4])[0].entry_id == 0
    assert sel.select(groups, lambda c, q: [float("nan"), 0.7, 0.4])[0].entry_id == 2
    with pytest.raises(ValueError, match="question 'a' are non-finite"):
        sel.select(groups, lambda c, q: [float("nan")] * 3)
    with pytest.raises(ValueError, match="returned 2 entropy scores for 3 candidates"):
        sel.select(groups, lambda c, q: [0.1, 0.2])
    with pytest.raises(ValueError, match="needs a score provider"):
        sel.select(groups)
    with pytest.raises(ValueError, match="at least one candidate"):
        sel.select([[]], lambda c, q: [])
    assert sel.select([], lambda c, q: []) == []


def test_random_selection_is_seeded_uniform_and_resumable():
    groups = [[cand("a", i, [i]) for i in range(4)]]
    a, b = TrajectorySelector("random", seed=5), TrajectorySelector("random", seed=5)
    assert not a.needs_scores
    seq_a = [a.select(groups)[0].entry_id for _ in range(4000)]
    seq_b = [b.select(groups)[0].entry_id for _ in range(4000)]
    assert seq_a == seq_b
    counts = np.bincount(seq_a, minlength=4)
    assert counts.min() > 850 and counts.max() < 1150
    state = json.loads(json.dumps(a.state_dict()))
    c = TrajectorySelector("random", seed=123)
    c.load_state_dict(state)
    assert [a.select(groups)[0].entry_id for _ in range(50)] == [c.select(groups)[0].entry_id for _ in range(50)]


def test_ngram_overlap_scores():
    x = np.arange(20)
    np.testing.assert_allclose(ngram_overlap_scores([x, x.copy()], 3), [1.0, 1.0])
    np.testing.assert_allclose(ngram_overlap_scores([x, x + 1000], 3), [0.0, 0.0])
    np.testing.assert_allclose(ngram_overlap_scores([x], 3), [0.0])
    # half the 3-grams shared: A = 0..9 (8 grams), B = 5..14 (8 grams), shared 5..9 (3 grams) -> 3/13
    np.testing.assert_allclose(ngram_overlap_scores([np.arange(10), np.arange(5, 15)], 3), [3 / 13, 3 / 13])
    assert ngram_overlap_scores([np.array([1]), np.array([1])], 4).tolist() == [1.0, 1.0]  # shorter than n


def test_diversity_picks_the_least_overlapping():
    base = list(range(50))
    groups = [[cand("a", 0, base), cand("a", 1, base[:45] + [99] * 5), cand("a", 2, list(range(500, 550)))]]
    assert TrajectorySelector("diversity", "min", ngram=4).select(groups)[0].entry_id == 2
    assert TrajectorySelector("diversity", "max", ngram=4).select(groups)[0].entry_id == 0


def test_registry_custom_metric_and_errors():
    @register_trajectory_metric("test_length")
    def length_metric(groups, ctx):
        return [np.array([c.length for c in g], dtype=float) for g in groups]

    try:
        groups = [[cand("a", 0, [1, 2, 3]), cand("a", 1, [1])]]
        assert TrajectorySelector("test_length", "min").select(groups)[0].entry_id == 1
        with pytest.raises(ValueError, match="already registered"):
            register_trajectory_metric("test_length")(length_metric)
    finally:
        TRAJECTORY_METRICS.unregister("test_length")
    with pytest.raises(ValueError, match="did you mean 'entropy'"):
        get_trajectory_metric("entropi")
    # the selector trusts its validated config: the mode is checked once, with the config
    with pytest.raises(ValueError, match=r"exgrpo\.trajectory_mode must be one of \['min', 'max'\]"):
        TrajectorySelector.from_config(ExGRPOConfig.from_dict({"trajectory_mode": "argmin"}, k=4))


def test_from_config():
    d = {"trajectory_metric": "diversity", "trajectory_mode": "max", "diversity_ngram": 2}
    cfg = ExGRPOConfig.from_dict(d, k=8)
    sel = TrajectorySelector.from_config(cfg)
    assert (sel.metric, sel.mode, sel.ngram) == ("diversity", "max", 2)


# ------------------------------------------------------------------------------------------ token stats
def test_candidate_token_stats_reduce_per_candidate_and_drive_the_selector():
    """The one model input of selection: padded per-token figures, reduced over each row's own mask."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    entropy = torch.tensor([[0.2, 0.4, 9.0, 9.0], [0.1, 0.1, 0.1, 0.5], [0.05, 7.0, 7.0, 7.0]])
    log_prob = torch.log(torch.tensor([[0.5, 0.5, 1.0, 1.0], [0.25, 0.25, 0.25, 0.25], [0.125, 1.0, 1.0, 1.0]]))
    stats = CandidateTokenStats(mask, entropy=entropy, log_prob=log_prob)
    np.testing.assert_allclose(stats.scores("entropy"), [0.3, 0.2, 0.05], rtol=1e-6)
    np.testing.assert_allclose(stats.scores("nll"), [np.log(2), np.log(4), np.log(8)], rtol=1e-6)
    groups = [[cand("a", 0, [1, 2]), cand("a", 1, [3, 4, 5, 6])], [cand("b", 2, [7])]]
    out = TrajectorySelector("entropy", "min").select(groups, stats.provider())
    assert [s.entry_id for s in out] == [1, 2]
    assert out[0].score == pytest.approx(0.2)
    out = TrajectorySelector("nll", "min").select(groups, stats.provider())
    assert [s.entry_id for s in out] == [0, 2]
    with pytest.raises(ValueError, match="3 candidates for 2"):
        TrajectorySelector("entropy", "min").select([groups[0]], stats.provider())
    with pytest.raises(ValueError, match="shape"):
        CandidateTokenStats(mask, entropy=torch.zeros(3, 5))
