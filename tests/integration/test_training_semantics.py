"""Training-semantics switches through the installed actor loss on hand-made DataProtos (no Ray).

Each expectation is computed by hand in the test: the Eq. 4 term weights on whole replay groups
(``exgrpo.weight_terms_by_ratio``), the dual clip and ``fresh_clip`` values, and the two loss scales
(``exgrpo.loss_scale``) on two simulated data-parallel ranks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from exgrpo.config import ConfigError  # noqa: E402
from exgrpo.objective import LossSettings, fresh_clip_on  # noqa: E402
from recipe.exgrpo.actor_loss import exgrpo_actor_loss  # noqa: E402
from recipe.exgrpo.config_bridge import exgrpo_config_from_hydra  # noqa: E402
from recipe.exgrpo.dataproto import rows_of  # noqa: E402
from recipe.exgrpo.replay_step import batch as replay_batch  # noqa: E402
from recipe.exgrpo.replay_step.fields import EXPERIENCE_GROUP_KEY, IS_REPLAY_KEY, MIXED_KEY, RATIO_KEY  # noqa: E402

P_LEN, R_LEN = 2, 3
BETA_F1 = 1 / 1.1  # f(1) = 1 / (1 + β), β = 0.1


def mark_fresh(batch: DataProto) -> None:
    replay_batch.mark_fresh(rows_of(batch))  # the rows share the DataProto's tensors: the fields land in it


def mark_replay_groups(batch: DataProto, replay_ratio: float) -> None:
    replay_batch.mark_replay_groups(rows_of(batch), replay_ratio)


def _rows(uids, response_lens, advantages, replay_rows=(), log_w=None) -> DataProto:
    """Rows with a 2-token prompt, ``response_lens`` response tokens, old = behaviour log-prob 0 everywhere.

    ``log_w``: the model's log-prob of every response token of each row (so the ratio w = exp(log_w)); 0 if None.
    """
    n = len(uids)
    attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
    for i, r in enumerate(response_lens):
        attn[i, : P_LEN + r] = 1
    tokens = torch.randint(3, 50, (n, P_LEN + R_LEN), generator=torch.Generator().manual_seed(0)) * attn
    response_mask = attn[:, P_LEN:].clone()
    batch = DataProto.from_single_dict(
        {
            "prompts": tokens[:, :P_LEN],
            "responses": tokens[:, P_LEN:],
            "response_mask": response_mask,
            "input_ids": tokens,
            "attention_mask": attn,
            "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
            "uid": np.array(uids, dtype=object),
        }
    )
    mark_fresh(batch)
    batch.batch[IS_REPLAY_KEY][list(replay_rows)] = True
    batch.batch["old_log_probs"] = torch.zeros(n, R_LEN)
    batch.batch["advantages"] = torch.tensor(advantages, dtype=torch.float32).unsqueeze(-1) * response_mask
    batch.meta_info["log_w"] = [0.0] * n if log_w is None else log_w
    return batch


def _micro_batch(batch: DataProto, *, mixed: bool, dp_size=1, batch_num_tokens=None, global_batch_size=None):
    """verl's engine view of ``batch``: no-padding TensorDict + the model's flat per-token log-probs."""
    n = len(batch)
    batch.batch[MIXED_KEY] = torch.full((n,), mixed)
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
    # the log-prob of response token t sits at packed position (prompt_len − 1 + t) of its row
    pieces = []
    for i in range(n):
        seq_len = int(batch.batch["attention_mask"][i].sum())
        row = torch.zeros(seq_len)
        row[P_LEN - 1 : seq_len - 1] = batch.meta_info["log_w"][i]
        pieces.append(row)
    flat = torch.cat(pieces).requires_grad_(True)
    return td, flat


def _config(agg="token-sum", scale=None, entropy_coeff=0.0, **kw):
    return ActorConfig(
        strategy="fsdp2",
        loss_agg_mode=agg,
        loss_scale_factor=scale,
        entropy_coeff=entropy_coeff,
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=4,
        rollout_n=1,
        **kw,
    )


# ------------------------------------------------------------------------------------------ item 2: Eq. 4
def _replay_step() -> DataProto:
    """Two K = 3 groups as the trainer leaves them: fresh rows first, the appended replayed member last.

    Group a: fresh siblings (rows 0, 1; reward 0, 1 token each) + replayed member (row 5; reward 1, 2 tokens):
    A = −1/3, −1/3, +2/3. Group b: rows 2, 3, 4 with rewards 1, 0, 0 and 2, 1, 1 tokens: A = 2/3, −1/3, −1/3.
    """
    uids = ["a", "a", "b", "b", "b", "a"]
    adv = [-1 / 3, -1 / 3, 2 / 3, -1 / 3, -1 / 3, 2 / 3]
    return _rows(uids, [1, 1, 2, 1, 1, 2], adv, replay_rows=(5,))


def test_mark_replay_groups_flags_the_replayed_member_and_its_fresh_siblings():
    batch = _replay_step()
    mark_replay_groups(batch, replay_ratio=0.25)
    assert batch.batch[EXPERIENCE_GROUP_KEY].tolist() == [True, True, False, False, False, True]
    assert batch.batch[RATIO_KEY].tolist() == [0.25] * 6
    # a step without replay: no experience group, and the ratio recorded as given
    fresh = _rows(["x", "x", "y", "y"], [1, 1, 1, 1], [0, 0, 0, 0])
    mark_replay_groups(fresh, replay_ratio=0.0)
    assert not fresh.batch[EXPERIENCE_GROUP_KEY].any() and fresh.batch[RATIO_KEY].tolist() == [0.0] * 4
    # ρ is validated once, with the config at start-up (the step trusts it)
    with pytest.raises(ConfigError, match="exgrpo.replay_ratio"):
        exgrpo_config_from_hydra(_hydra("global", replay_ratio=1.5))


def test_weight_terms_by_ratio_weights_whole_replay_groups_in_the_installed_loss():
    batch = _replay_step()
    mark_replay_groups(batch, replay_ratio=0.25)
    td, flat = _micro_batch(batch, mixed=True)
    settings = LossSettings(weight_terms_by_ratio=True)
    loss, _ = exgrpo_actor_loss(_config(), {"log_probs": flat}, td, settings=settings)
    # all ratios 1: group a = 1/3 + 1/3 − (2/3)·f(1)·2 = 2/3 − 40/33 = −6/11 (× ρ = 0.25);
    # group b = −(2/3)·2 + 1/3 + 1/3 = −2/3 (× 1 − ρ = 0.75); token-sum: −3/22 − 1/2 = −7/11
    assert loss.item() == pytest.approx(0.25 * (2 / 3 - 4 / 3 * BETA_F1) + 0.75 * (-2 / 3), rel=1e-5)
    assert loss.item() == pytest.approx(-7 / 11, rel=1e-5)
    # switched off (released): plain sum 2/3 − 40/33 − 2/3
    loss_off, _ = exgrpo_actor_loss(_config(), {"log_probs": flat}, td, settings=LossSettings())
    assert loss_off.item() == pytest.approx(-40 / 33, rel=1e-5)


def test_weight_terms_by_ratio_without_the_marking_names_the_fix():
    batch = _replay_step()
    td, flat = _micro_batch(batch, mixed=True)
    with pytest.raises(KeyError, match="mark_update_rows"):
        exgrpo_actor_loss(_config(), {"log_probs": flat}, td, settings=LossSettings(weight_terms_by_ratio=True))


# ------------------------------------------------------------------------------------------ item 6: clips
# Four one-token fresh rows (one group per row pair): (A, w) = (+1, 1.5), (−1, 0.5), (−1, 5), (+1, 0.5).
CLIP_ADV = [1.0, -1.0, -1.0, 1.0]
CLIP_LOG_W = [float(np.log(w)) for w in (1.5, 0.5, 5.0, 0.5)]


@pytest.mark.parametrize(
    ("fresh_clip", "dual_clip", "mixed", "expected"),
    [
        # PPO clip, ε = 0.2: max(−A·w, −A·clip(w, 0.8, 1.2)) → −1.2, 0.8, 5, −0.5; dual clip caps row 2 at −A·3
        ("released", False, False, -1.2 + 0.8 + 5.0 - 0.5),  # recipe default before the switch: no dual clip
        ("released", True, False, -1.2 + 0.8 + 3.0 - 0.5),  # verl's dual clip (clip_ratio_c = 3)
        ("released", True, True, -1.5 + 0.5 + 5.0 - 0.5),  # mixed phase: unclipped −A·w, dual clip irrelevant
        ("always", False, True, -1.2 + 0.8 + 5.0 - 0.5),
        ("never", False, False, -1.5 + 0.5 + 5.0 - 0.5),  # e.g. the on-policy baseline, unclipped all run
    ],
)
def test_fresh_clip_and_dual_clip_switches(fresh_clip, dual_clip, mixed, expected):
    batch = _rows(["a", "a", "b", "b"], [1, 1, 1, 1], CLIP_ADV, log_w=CLIP_LOG_W)
    td, flat = _micro_batch(batch, mixed=mixed)
    settings = LossSettings(fresh_clip=fresh_clip, dual_clip=dual_clip)
    loss, metrics = exgrpo_actor_loss(_config(clip_ratio_c=3.0), {"log_probs": flat}, td, settings=settings)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # the dual-clip metric exists only with the dual clip on (reported as "would be active" when unclipped)
    lower = metrics["exgrpo/fresh_clip_frac_lower"].aggregate()
    assert lower == pytest.approx(0.25 if dual_clip else 0.0)


def test_fresh_clip_on_table():
    assert [fresh_clip_on("released", m) for m in (False, True)] == [True, False]
    assert [fresh_clip_on("always", m) for m in (False, True)] == [True, True]
    assert [fresh_clip_on("never", m) for m in (False, True)] == [False, False]
    with pytest.raises(ValueError, match="exgrpo.fresh_clip"):
        fresh_clip_on("sometimes", False)


# ------------------------------------------------------------------------------------------ item 4: loss scale
def _rank_batches():
    """Two data-parallel ranks of two fresh rows each (one group per rank), ratio 1, unclipped.

    Rank 0: A = +1 (2 tokens), −1 (1 token): token-loss sum −2 + 1 = −1.
    Rank 1: A = +1 (3 tokens), −1 (1 token): token-loss sum −3 + 1 = −2.
    Global mini-batch: 4 rows, 7 tokens; L_max = 8.
    """
    r0 = _rows(["a", "a"], [2, 1], [1.0, -1.0])
    r1 = _rows(["b", "b"], [3, 1], [1.0, -1.0])
    return r0, r1


@pytest.mark.parametrize(
    ("loss_scale", "per_rank_expected", "averaged"),
    [
        # verl: local sum / 4 global rows × dp 2 / L_max 8; the average over ranks is Σ_all / (4 · 8) = −3/32
        ("global", [-1 / 4 * 2 / 8, -2 / 4 * 2 / 8], -3 / 32),
        # released: each rank's sum / L_max; the average over ranks is Σ_all / (2 · 8) = −3/16
        ("per_rank", [-1 / 8, -2 / 8], -3 / 16),
    ],
)
def test_loss_scale_side_by_side_on_two_ranks(loss_scale, per_rank_expected, averaged):
    config = _config(agg="seq-mean-token-sum-norm", scale=8)
    settings = LossSettings(fresh_clip="never", loss_scale=loss_scale)
    losses = []
    for rank in _rank_batches():
        td, flat = _micro_batch(rank, mixed=False, dp_size=2, batch_num_tokens=7, global_batch_size=4)
        loss, metrics = exgrpo_actor_loss(config, {"log_probs": flat}, td, settings=settings)
        losses.append(loss.item())
    assert losses == pytest.approx(per_rank_expected, rel=1e-5)
    assert sum(losses) / 2 == pytest.approx(averaged, rel=1e-5)  # FSDP averages the ranks' gradients


def test_per_rank_entropy_bonus_is_a_token_mean():
    batch = _rows(["a", "a"], [2, 1], [1.0, -1.0])
    td, flat = _micro_batch(batch, mixed=False, dp_size=1, batch_num_tokens=3, global_batch_size=2)
    entropy = torch.full_like(flat, 2.0)
    config = _config(agg="seq-mean-token-sum-norm", scale=8)
    config_ent = _config(agg="seq-mean-token-sum-norm", scale=8, entropy_coeff=0.5)
    settings = LossSettings(fresh_clip="never", loss_scale="per_rank")
    base, _ = exgrpo_actor_loss(config, {"log_probs": flat}, td, settings=settings)
    with_ent, metrics = exgrpo_actor_loss(config_ent, {"log_probs": flat, "entropy": entropy}, td, settings=settings)
    assert base.item() == pytest.approx(-1 / 8, rel=1e-5)  # (−2 + 1) / L_max
    assert metrics["exgrpo/entropy_loss"].aggregate() == pytest.approx(2.0)  # token mean, not a sum / L_max
    assert with_ent.item() == pytest.approx(-1 / 8 - 0.5 * 2.0, rel=1e-5)


def _hydra(loss_scale, agg="seq-mean-token-sum-norm", scale=8192, **exgrpo):
    return OmegaConf.create(
        {
            "exgrpo": {"loss_scale": loss_scale, **exgrpo},
            "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {"loss_agg_mode": agg, "loss_scale_factor": scale}},
        }
    )


def test_per_rank_needs_the_constant_normaliser_mode():
    assert exgrpo_config_from_hydra(_hydra("per_rank")).loss_scale == "per_rank"
    with pytest.raises(ConfigError, match="loss_agg_mode=seq-mean-token-sum-norm"):
        exgrpo_config_from_hydra(_hydra("per_rank", agg="token-mean"))
    with pytest.raises(ConfigError, match="loss_scale_factor"):
        exgrpo_config_from_hydra(_hydra("per_rank", scale=None))
    assert exgrpo_config_from_hydra(_hydra("global", agg="token-mean", scale=None)).loss_scale == "global"


# ------------------------------------------------------------------------------------------ item 3: fresh stream
class _Fresh:
    """The replay step's real fresh prompts (``FreshPrompts``) on an unshuffled 30-row loader, with an experience
    manager whose pool retires questions, no Ray."""

    def __init__(self, retire_fresh_prompts: bool, n=30, b=8):
        from exgrpo.config import ExGRPOConfig
        from exgrpo.experience.manager import ExperienceManager
        from recipe.exgrpo.replay_step.fresh import FreshPrompts

        self.experience = ExperienceManager(ExGRPOConfig.from_dict({"retire_fresh_prompts": retire_fresh_prompts}, k=2))
        batches = [list(range(s, min(s + b, n))) for s in range(0, n, b)]  # 8, 8, 8, 6 rows
        self.prompts = FreshPrompts(
            [f"q{i}" for i in range(n)],
            b,
            lambda: iter(batches),
            lambda: self.experience.retired,
            immediate=retire_fresh_prompts,
        )

    def take(self, n, exclude, metrics):
        return self.prompts.take(n, exclude, metrics)

    @property
    def loader_epoch(self):
        return self.prompts.loader_epoch


@pytest.mark.parametrize("retire_fresh_prompts", [True, False])
def test_retired_questions_leave_the_fresh_stream(retire_fresh_prompts):
    t = _Fresh(retire_fresh_prompts)
    metrics = {}
    assert t.take(8, set(), metrics) == list(range(8))
    for q in ("q10", "q11"):  # retired during step 1
        t.experience.pool.retire(q, 1)
    step2 = t.take(8, set(), metrics)
    if retire_fresh_prompts:  # OUR CHOICE: skipped from the next step
        assert step2 == [8, 9, 12, 13, 14, 15, 16, 17] and metrics["exgrpo/fresh_skipped_retired"] == 2
    else:  # released: still drawn until the epoch boundary
        assert step2 == list(range(8, 16)) and metrics["exgrpo/fresh_skipped_retired"] == 0
    # finish epoch 0, then epoch 1's first two batches
    while t.loader_epoch == 0:
        t.take(8, set(), metrics)
    epoch1 = t.take(8, set(), metrics) + t.take(8, set(), metrics)
    assert 10 not in epoch1 and 11 not in epoch1  # 30 > B + 20 = 28: removed at the boundary (released)
    assert metrics["exgrpo/fresh_removed_retired"] == (0 if retire_fresh_prompts else 2)
    # the state that goes into the checkpoint's trainer_state restores the same stream
    resumed = _Fresh(retire_fresh_prompts)
    resumed.prompts.load_state_dict(json.loads(json.dumps(t.prompts.state_dict())))
    for q in ("q10", "q11"):
        resumed.experience.pool.retire(q, 1)
    assert 10 not in resumed.take(16, set(), {})


def test_released_mode_keeps_retired_questions_in_a_small_data_set():
    t = _Fresh(False, n=28)  # exactly B + 20 questions: nothing is ever removed
    assert 3 in t.take(8, set(), {})
    t.experience.pool.retire("q3", 1)
    later = []
    while t.loader_epoch < 2:  # the rest of epoch 0 and all of epoch 1
        later += t.take(8, set(), {})
    assert 3 in later  # drawn again in epoch 1 (in a larger data set it would be gone)
