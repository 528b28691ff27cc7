"""Bucket sampler (docs/algorithm.md §4): reference probabilities, frequencies, overflow, exclusion, seeding."""

import json

import numpy as np
import pytest

from exgrpo.config import ExGRPOConfig
from exgrpo.experience import (
    BucketSampler,
    ExperiencePool,
    Group,
    GroupMember,
    bucket_probabilities,
    get_bucket_weighting,
)
from tests.helpers.experience import binary_group

K = 8
BUCKETS = list(range(1, 8))


def _pool(sizes: dict[int, int], k=K) -> ExperiencePool:
    """A pool with ``sizes[b]`` questions in bucket b (question ids 'b<b>-<i>')."""
    pool = ExperiencePool(k)
    groups = [binary_group(f"b{b}-{i}", b, k) for b, n in sizes.items() for i in range(n)]
    pool.collect(0, groups)
    assert pool.buckets.sizes()[1:] == [sizes.get(b, 0) for b in range(1, k)]
    return pool


# ------------------------------------------------------------------------------------------ reference vectors
@pytest.mark.parametrize(
    ("mu", "sigma", "ref"),
    [
        # released: mu = 0.5, sigma = 1 success = 1/K in accuracy units (docs/algorithm.md §4)
        (0.5, 1 / 8, [0.0044, 0.054, 0.242, 0.399, 0.242, 0.054, 0.0044]),
        (0.5, 0.5 / 8, [0, 0.0003, 0.107, 0.787, 0.107, 0.0003, 0]),
        (0.5, 1.5 / 8, [0.037, 0.111, 0.217, 0.271, 0.217, 0.111, 0.037]),
        (2 / 8, 1 / 8, [0.257, 0.424, 0.257, 0.057, 0.005, 0.0001, 0]),
    ],
)
def test_reference_probability_vectors(mu, sigma, ref):
    p = bucket_probabilities(BUCKETS, K, "normal", mu, sigma)
    np.testing.assert_allclose(p, ref, atol=1e-3)  # "to 3 decimals"
    assert p.sum() == pytest.approx(1.0)


def test_default_sigma_is_one_over_k_and_paper_sigma_is_almost_uniform():
    np.testing.assert_allclose(bucket_probabilities(BUCKETS, K), bucket_probabilities(BUCKETS, K, sigma=1 / 8))
    p = bucket_probabilities(BUCKETS, K, "normal", 0.5, 1.0)  # the paper's literal sigma = 1 (accuracy units)
    assert 0.136 < p.min() < p.max() < 0.148


def test_other_weightings():
    k = np.arange(1, 8)
    np.testing.assert_allclose(bucket_probabilities(BUCKETS, K, "linear"), k / 28)
    sq = np.sqrt(k / 8)
    np.testing.assert_allclose(bucket_probabilities(BUCKETS, K, "sqrt"), sq / sq.sum())
    clip = np.array([1, 2, 3, 4, 4, 4, 4]) / 8
    np.testing.assert_allclose(bucket_probabilities(BUCKETS, K, "linear_clip"), clip / clip.sum())
    np.testing.assert_allclose(bucket_probabilities(BUCKETS, K, "uniform"), np.full(7, 1 / 7))


def test_probabilities_are_over_nonempty_buckets_only():
    p = bucket_probabilities([3, 4], K)
    w = np.exp(-np.array([1.0, 0.0]) / 2)
    np.testing.assert_allclose(p, w / w.sum())


def test_tiny_sigma_does_not_underflow_to_nan():
    p = bucket_probabilities([1, 2], K, "normal", 0.9, 1e-4)
    assert np.all(np.isfinite(p)) and p[1] == pytest.approx(1.0)


def test_unknown_weighting_suggests():
    with pytest.raises(ValueError, match="did you mean 'linear'"):
        get_bucket_weighting("lineer")


# ------------------------------------------------------------------------------------------ draws
def test_bucket_frequencies_match_probabilities():
    pool = _pool({b: 30 for b in BUCKETS})
    s = BucketSampler(K, sigma=1.5 / 8, seed=1)
    p = bucket_probabilities(BUCKETS, K, "normal", 0.5, 1.5 / 8)
    hits = np.zeros(8)
    per_question = {}
    n_draws = 20000
    for _ in range(n_draws):
        (q,) = s.draw(pool, 1).question_ids
        hits[pool.bucket_of(q)] += 1
        per_question[q] = per_question.get(q, 0) + 1
    freq = hits[1:] / n_draws
    np.testing.assert_allclose(freq, p, atol=0.012)
    # inside a bucket: uniform over its questions (bucket 4 holds ~27% of 20000 draws over 30 questions)
    in4 = np.array([per_question.get(f"b4-{i}", 0) for i in range(30)])
    assert in4.min() > 0.5 * in4.mean() and in4.max() < 1.5 * in4.mean()


def test_uniform_is_over_questions_not_buckets():
    pool = _pool({1: 300, 7: 100})
    s = BucketSampler(K, weighting="uniform", seed=2)
    hits = np.zeros(8)
    for _ in range(4000):
        for q in s.draw(pool, 1).question_ids:
            hits[pool.bucket_of(q)] += 1
    assert hits[1] / hits.sum() == pytest.approx(0.75, abs=0.03)  # per bucket it would be 0.5
    draw = s.draw(pool, 400)
    assert len(set(draw.question_ids)) == 400 and draw.bucket_counts == {1: 300, 7: 100}


def test_no_duplicates_and_n_capped_at_valid():
    pool = _pool({b: 5 for b in BUCKETS})
    s = BucketSampler(K, seed=3)
    for n in (1, 10, 34, 35):
        d = s.draw(pool, n)
        assert len(d.question_ids) == n == len(set(d.question_ids))
        assert sum(d.bucket_counts.values()) == n
    d = s.draw(pool, 64)  # more than the 35 valid questions
    assert len(d) == 35 and sorted(d.question_ids) == sorted(pool.question_ids())
    assert d.num_valid == 35 and d.requested == 64


def test_overflow_is_reassigned_in_proportion_to_p():
    # sigma = 0.5 success: bucket 4 has p = 0.787 but only 2 questions; buckets 3 and 5 (p = 0.106 each)
    # must absorb nearly all the excess, equally; buckets 2 and 6 (p = 0.0003) almost never.
    pool = _pool({1: 40, 2: 40, 3: 40, 4: 2, 5: 40, 6: 40, 7: 40})
    s = BucketSampler(K, sigma=0.5 / 8, seed=4)
    totals = np.zeros(8)
    for _ in range(300):
        d = s.draw(pool, 30)
        assert len(d) == 30 and len(set(d.question_ids)) == 30
        assert d.bucket_counts[4] == 2
        for b, c in d.bucket_counts.items():
            totals[b] += c
    assert totals[4] == 600
    assert totals[3] + totals[5] > 0.99 * (9000 - 600)
    assert totals[3] == pytest.approx(totals[5], rel=0.1)


def test_overflow_fills_every_bucket_when_n_equals_valid():
    pool = _pool({2: 1, 4: 3, 6: 2})
    d = BucketSampler(K, sigma=0.01, seed=5).draw(pool, 6)  # p is ~1 on bucket 4 only
    assert d.bucket_counts == {2: 1, 4: 3, 6: 2}


def test_exclusion_and_bucket0_are_never_drawn():
    pool = _pool({b: 6 for b in BUCKETS})
    # move three questions of bucket 4 to bucket 0 with a 0/K result: never sampled again
    zero = [Group(f"b4-{i}", [GroupMember(np.array([9]), np.array([0.0]), 0.0)] * K) for i in range(3)]
    pool.collect(1, zero)
    assert pool.buckets.size(0) == 3
    excl = {f"b3-{i}" for i in range(6)} | {"b5-0", "b5-3", "not-in-pool"}
    s = BucketSampler(K, seed=6)
    for _ in range(200):
        d = s.draw(pool, 8, exclude=excl)
        assert not set(d.question_ids) & excl
        assert all(pool.bucket_of(q) != 0 for q in d.question_ids)
    everything = s.draw(pool, 1000, exclude=excl)
    expected = {q for q in pool.question_ids() if pool.bucket_of(q) != 0} - excl
    assert set(everything.question_ids) == expected and len(everything) == len(expected)
    assert 3 not in everything.bucket_counts


def test_empty_pool_and_zero_request():
    s = BucketSampler(K, seed=0)
    assert len(s.draw(ExperiencePool(K), 64)) == 0
    assert len(s.draw(_pool({3: 2}), 0)) == 0


def test_seeded_and_state_round_trip():
    pool = _pool({b: 10 for b in BUCKETS})
    a, b = BucketSampler(K, seed=7), BucketSampler(K, seed=7)
    assert [a.draw(pool, 5).question_ids for _ in range(5)] == [b.draw(pool, 5).question_ids for _ in range(5)]
    assert BucketSampler(K, seed=8).draw(pool, 20).question_ids != a.draw(pool, 20).question_ids
    state = json.loads(json.dumps(a.state_dict()))
    c = BucketSampler(K, seed=999)
    c.load_state_dict(state)
    assert [a.draw(pool, 9).question_ids for _ in range(5)] == [c.draw(pool, 9).question_ids for _ in range(5)]


def test_from_config_and_k_mismatch():
    cfg = ExGRPOConfig.from_dict({"weighting": "sqrt", "seed": 3}, k=4)
    s = BucketSampler.from_config(cfg)
    assert s.k == 4 and s.weighting == "sqrt" and s.sigma == 0.25
    with pytest.raises(ValueError, match="K=4 but the pool has K=8"):
        s.draw(ExperiencePool(8), 1)
