"""The asynchronous v1 adapter's own bookkeeping (recipe/exgrpo/v1/async_trainer.py) without a run: the issue ledger
(what was issued, what the sampler evicted, its checkpoint form) and the staleness metrics (docs/algorithm.md §15)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("verl")

from recipe.exgrpo.v1.async_trainer import Issue, IssueLedger, staleness_metrics  # noqa: E402


def test_the_ledger_tracks_questions_in_flight_and_forgets_evicted_issues():
    ledger = IssueLedger()
    ledger.add("u1", Issue("q1", 0, False, 1, 4))
    ledger.add("u2", Issue("q2", 5, True, 1, 3))
    ledger.add("u3", Issue("q3", 7, True, 2, 3))
    with pytest.raises(ValueError, match="issued twice"):
        ledger.add("u1", Issue("q9", 9, False, 2, 4))
    assert ledger.questions() == {"q1", "q2", "q3"}
    assert ledger.pop("u1").question_id == "q1"
    with pytest.raises(KeyError, match="did not issue"):
        ledger.pop("u1")
    # u3's prompt is gone from TransferQueue without being trained: evicted; its question may be drawn again
    (evicted,) = ledger.forget_missing({"u2"})
    assert evicted == Issue("q3", 7, True, 2, 3)
    assert ledger.questions() == {"q2"}
    restored = IssueLedger()
    restored.load_state_dict(json.loads(json.dumps(ledger.state_dict())))
    assert restored.issues == ledger.issues and restored.issues["u2"].replayed and restored.issues["u2"].n == 3


def test_staleness_metrics_split_by_age_and_span():
    # step 5 trains the weights of version 4: rows generated from versions 4, 3 (through 4) and 2
    versions = [(4, 4), (3, 4), (2, 2)]
    ratio_rows = [(0, [0.0, 0.0]), (1, [math.log(2.0)]), (2, [math.log(0.5), 0.0])]
    m = staleness_metrics(5, versions, replay_steps=[1, 3], ratio_rows=ratio_rows)
    assert m["exgrpo/staleness/fresh_age_mean"] == pytest.approx(1.0) and m["exgrpo/staleness/fresh_age_max"] == 2
    assert m["exgrpo/staleness/fresh_span_max"] == 1 and m["exgrpo/staleness/fresh_spanning_rows"] == 1
    assert m["exgrpo/staleness/replay_age_mean"] == 3 and m["exgrpo/staleness/replay_age_max"] == 4
    assert m["exgrpo/staleness/old_vs_rollout_ratio/age_0/mean"] == 1.0
    assert m["exgrpo/staleness/old_vs_rollout_ratio/age_1/mean"] == pytest.approx(2.0)
    assert m["exgrpo/staleness/old_vs_rollout_ratio/age_2plus/min"] == pytest.approx(0.5)
    assert m["exgrpo/staleness/old_vs_rollout_ratio/age_2plus/tokens"] == 2
    assert staleness_metrics(1, np.zeros((0, 2)), []) == {}
