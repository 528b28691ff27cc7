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


def test_prompts_in_flight_at_a_checkpoint_are_reissued_with_their_ledgers_sample_count(monkeypatch):
    """On resume verl re-issues the prompts that were pending or running when the checkpoint was saved
    (``PPOTrainer._reissue_inflight_prompts``, its own code over a stand-in TransferQueue): the adapter gives each its
    ledger's sample count, K−1 for a replayed question (whatever count the stored prompt fields carry), so it trains
    as replayed; a finished group is not re-issued; the issue step becomes the resumed step."""
    import verl.trainer.ppo.v1.trainer_base as base
    from verl.utils import tensordict_utils as tu

    from recipe.exgrpo.v1.async_trainer import ExGRPOTrainerV1ColocateAsync

    stored = {
        "ufresh": {"is_prompt": True, "status": "running", "global_steps": 2},
        "ureplayed": {"is_prompt": True, "status": "pending", "global_steps": 2},
        "udone": {"is_prompt": True, "status": "finished", "global_steps": 2},
        "ufresh_0_0": {
            "status": "running"
        },  # a partial trajectory of a prompt in flight: verl clears it (a uid has no "_")
    }
    calls: dict = {"cleared": [], "put": []}

    class FakeTQ:
        @staticmethod
        def kv_list(partition_id=None):
            return {"train": dict(stored)}

        @staticmethod
        def kv_batch_get(keys, partition_id):
            # the prompt fields verl saved; the sample count as first submitted (here deliberately wrong: 8)
            return tu.get_tensordict(
                {"uid": np.array(list(keys), dtype=object), "__rollout_n__": np.array([8] * len(keys), dtype=object)}
            )

        @staticmethod
        def kv_clear(keys, partition_id):
            calls["cleared"] += list(keys)

        @staticmethod
        def kv_batch_put(keys, partition_id, tags=None, fields=None):
            calls["put"] += list(keys)

    class FakeAgentLoop:
        def __init__(self):
            self.batches = []

        def generate_sequences(self, batch):
            self.batches.append(batch)

    monkeypatch.setattr(base, "tq", FakeTQ)
    trainer = object.__new__(ExGRPOTrainerV1ColocateAsync)
    trainer.trainer_mode = "colocate_async"
    trainer.global_steps = 3
    trainer.agent_loop_manager = manager = FakeAgentLoop()
    trainer.ledger = IssueLedger()
    trainer.ledger.add("ufresh", Issue("qf", 1, False, 2, 4))
    trainer.ledger.add("ureplayed", Issue("qr", 2, True, 2, 3))
    trainer.ledger.add("udone", Issue("qd", 3, True, 2, 3))

    assert trainer._reissue_inflight_prompts() == 2
    (batch,) = manager.batches
    counts = dict(zip([str(u) for u in batch["uid"]], [int(n) for n in batch["__rollout_n__"]]))
    assert counts == {"ufresh": 4, "ureplayed": 3}
    assert calls["cleared"] == ["ufresh_0_0"] and sorted(calls["put"]) == ["ufresh", "ureplayed"]
    assert trainer.ledger.issues["ureplayed"].step == 3 and trainer.ledger.issues["udone"].step == 2
    assert trainer._reissued == {"fresh": 1, "replayed": 1}
    assert "generate_sequences" not in vars(manager)  # the manager's own method again


def test_a_separate_async_steps_figures_reduce_its_local_updates_by_what_they_are():
    """verl's separate_async step is parameter_sync_step local updates; their figures become the step's through verl's
    MetricsAggregator with ExGRPO's rules: counts summed, the pool's and the schedule's states from the last local
    update, rates weighted by each local update's rows, max/min kept by name."""
    from recipe.exgrpo.v1.async_trainer import local_update_metrics

    agg = local_update_metrics()
    agg.add_step_metrics(
        {
            "exgrpo/replayed_questions": 1.0,
            "exgrpo/fresh_questions": 3.0,
            "actor/exgrpo/replayed_tokens": 10.0,
            "exgrpo/collect/added_entries": 2.0,
            "exgrpo/pool/entries": 5.0,
            "exgrpo/async/issued_fresh_total": 12.0,
            "exgrpo/batch_pass_rate": 0.5,
            "exgrpo/staleness/fresh_age_max": 1.0,
        },
        sample_count=12,
    )
    agg.add_step_metrics(
        {
            "exgrpo/replayed_questions": 2.0,
            "exgrpo/fresh_questions": 2.0,
            "actor/exgrpo/replayed_tokens": 6.0,
            "exgrpo/collect/added_entries": 1.0,
            "exgrpo/pool/entries": 7.0,
            "exgrpo/async/issued_fresh_total": 12.0,
            "exgrpo/batch_pass_rate": 0.25,
            "exgrpo/staleness/fresh_age_max": 0.0,
        },
        sample_count=4,
    )
    m = agg.get_aggregated_metrics()
    assert m["exgrpo/replayed_questions"] == 3 and m["exgrpo/fresh_questions"] == 5  # B = 8 groups a step
    assert m["actor/exgrpo/replayed_tokens"] == 16 and m["exgrpo/collect/added_entries"] == 3
    assert m["exgrpo/pool/entries"] == 7 and m["exgrpo/async/issued_fresh_total"] == 12  # states: the last
    assert m["exgrpo/batch_pass_rate"] == pytest.approx((0.5 * 12 + 0.25 * 4) / 16)
    assert m["exgrpo/staleness/fresh_age_max"] == 1.0
