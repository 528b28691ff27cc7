"""Multi-turn trajectories through the verl adapter without Ray: collection takes the whole exchange (the model's
turns and the tool outputs) with its mask and log-probs, refuses what was cut in a tool turn or whose mask and
log-probs disagree, a replayed row is rebuilt with its stored mask (and its own turn count), the installed actor loss
trains its model tokens only, and the dry run accepts verl's multi-turn keys on the hf and the vllm rollout."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from exgrpo.config import ExGRPOConfig  # noqa: E402
from exgrpo.experience import masks  # noqa: E402
from exgrpo.experience.manager import ExperienceManager  # noqa: E402
from exgrpo.objective import LossSettings  # noqa: E402
from recipe.exgrpo.actor_loss import exgrpo_actor_loss  # noqa: E402
from recipe.exgrpo.replay_step import Rows  # noqa: E402
from recipe.exgrpo.replay_step.batch import (  # noqa: E402
    append_candidates,
    build_replay_members,
    collection_groups,
    mark_fresh,
    replayed_row_digests,
    turn_count,
)
from recipe.exgrpo.replay_step.fields import (  # noqa: E402
    BEHAVIOUR_LOG_PROBS_KEY,
    MIXED_KEY,
    NUM_TURNS_KEY,
    QUESTION_ID_KEY,
)
from recipe.exgrpo.tool_turns import ToolCallDetector, last_model_turn, runs_tools  # noqa: E402

PAD = 0
P_LEN, R_LEN = 4, 16
K = 4
#: a two-turn exchange: model turn (5), tool output (4), model turn (3); 12 of 16 columns
EXCHANGE_MASK = [1] * 5 + [0] * 4 + [1] * 3


def _objects(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _rows(responses, masks_, uids, seed=0, extra=None) -> Rows:
    """Rows as verl's agent loop hands them over: responses right-padded, ``response_mask`` 1 on the model's tokens
    only, attention 1 on every response token, rollout log-probs 0.0 on the others, and the loop's per-row keys."""
    g = torch.Generator().manual_seed(seed)
    n = len(responses)
    prompts = torch.randint(3, 50, (n, P_LEN), generator=g)
    resp = torch.full((n, R_LEN), PAD)
    mask = torch.zeros(n, R_LEN, dtype=torch.int64)
    attn = torch.zeros(n, P_LEN + R_LEN, dtype=torch.int64)
    attn[:, :P_LEN] = 1
    for i, (r, m) in enumerate(zip(responses, masks_)):
        resp[i, : len(r)] = torch.as_tensor(r)
        mask[i, : len(m)] = torch.as_tensor(m)
        attn[i, P_LEN : P_LEN + len(r)] = 1
    rollout = torch.where(mask.bool(), -torch.rand(n, R_LEN, generator=g) - 0.01, 0.0)
    data = {
        "prompts": prompts,
        "responses": resp,
        "response_mask": mask,
        "input_ids": torch.cat([prompts, resp], 1),
        "attention_mask": attn,
        "position_ids": torch.clip(torch.cumsum(attn, -1) - 1, min=0),
        "rm_scores": torch.zeros(n, R_LEN),
        "rollout_log_probs": rollout,
        "uid": np.array(uids, dtype=object),
        "data_source": np.array(["toy"] * n, dtype=object),
        NUM_TURNS_KEY: np.array([turn_count(m) for m in masks_], dtype=np.int32),
        "turn_scores": _objects([[] for _ in range(n)]),
        "tool_rewards": _objects([[0.0] * (turn_count(m) // 2 - 1) for m in masks_]),
    }
    data.update(extra or {})
    tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
    return Rows.of(tensors, {k: v for k, v in data.items() if k not in tensors})


def _defect(member):
    """What the trainer found wrong with a collected member (it hands the pool a function of no argument)."""
    return member.defect() if callable(member.defect) else member.defect


def _exchange(seed, mask=EXCHANGE_MASK):
    return np.random.default_rng(seed).integers(3, 50, len(mask)).tolist()


def test_turn_count_is_verls_num_turns():
    assert turn_count([1, 1, 1]) == 2  # verl's single-turn agent loop says 2
    assert turn_count(EXCHANGE_MASK) == 4  # user + 2 assistant turns + 1 tool turn
    assert turn_count([1, 0, 1, 0, 1]) == 6
    assert last_model_turn(np.array(EXCHANGE_MASK)) == (9, 12) and last_model_turn(np.zeros(3)) is None


def test_collection_takes_the_whole_exchange_with_its_mask_and_log_probs():
    single = [1] * 6
    gen = _rows([_exchange(0), _exchange(1, single)], [EXCHANGE_MASK, single], ["a", "a"])
    mark_fresh(gen)
    gen.tensors["old_log_probs"] = -torch.rand(2, R_LEN) - 0.1  # the actor's: a value on every position
    gen.tensors["token_level_scores"] = torch.zeros(2, R_LEN)
    gen.tensors["token_level_scores"][:, 0] = 1.0
    gen.columns[QUESTION_ID_KEY] = np.array(["q", "q"], dtype=object)
    (multi, one) = collection_groups(gen)["q"]
    assert multi.token_ids.tolist() == _exchange(0)  # tool outputs included, not only the model's tokens
    assert np.asarray(multi.loss_mask).astype(int).tolist() == EXCHANGE_MASK and _defect(multi) is None
    assert np.array_equal(multi.behaviour_log_probs, gen.tensors["old_log_probs"][0, :12].numpy())
    assert one.loss_mask is None and len(one.token_ids) == 6  # a single-turn response: no mask to carry
    # the pool stores it as handed over: the same tokens and mask come back
    mgr = ExperienceManager(ExGRPOConfig.from_dict({}, k=2))
    wrong = one.__class__(one.token_ids, one.behaviour_log_probs, 0.0)
    mgr.collect(1, {"q": [multi, wrong]})
    (stored,) = mgr.pool.entries("q")
    assert stored.token_ids.tolist() == _exchange(0) and stored.mask.astype(int).tolist() == EXCHANGE_MASK
    assert np.array_equal(stored.behaviour_log_probs, np.where(stored.mask, multi.behaviour_log_probs, 0.0))


def test_collection_names_what_must_not_be_stored():
    cut_in_tool_output = [1] * 5 + [0] * 4  # ends on a tool token
    gen = _rows(
        [_exchange(2), _exchange(3), _exchange(4, cut_in_tool_output)],
        [EXCHANGE_MASK] * 2 + [cut_in_tool_output],
        ["a"] * 3,
    )
    mark_fresh(gen)
    gen.tensors["old_log_probs"] = -torch.rand(3, R_LEN) - 0.1
    gen.tensors["token_level_scores"] = torch.zeros(3, R_LEN)
    gen.tensors["rollout_log_probs"][1, 6] = -0.7  # the rollout sampled a token its mask calls a tool's
    gen.columns[QUESTION_ID_KEY] = np.array(["q"] * 3, dtype=object)
    ok, disagree, cut = collection_groups(gen)["q"]
    assert _defect(ok) is None and _defect(disagree) == masks.INCONSISTENT
    assert _defect(cut) is None and masks.trajectory_defect(cut.behaviour_log_probs, np.asarray(cut.loss_mask, bool))[
        0
    ] == (masks.TRUNCATED)
    # the trainer's tool-call check sees the last model turn of every generated row
    seen = []

    def ends_in_tool_call(ids, mask):
        seen.append(last_model_turn(mask))
        return True

    flagged = collection_groups(gen, ends_in_tool_call)["q"]
    assert [_defect(m) for m in flagged] == [masks.TRUNCATED, masks.INCONSISTENT, masks.TRUNCATED]
    assert seen == [(9, 12), (0, 5)]


def _tokenizer():
    from recipe.exgrpo.harness.assets import build_tokenizer

    return build_tokenizer()


def test_the_tool_call_check_reads_the_last_model_turn_with_the_runs_parser():
    from omegaconf import OmegaConf

    tok = _tokenizer()
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"multi_turn": {"enable": True, "format": "hermes"}}}})
    detector = ToolCallDetector.from_config(config, tok)
    assert detector is not None and detector.marker == "<tool_call>"
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'

    def exchange(*turns):
        ids, mask = [], []
        for t, text in enumerate(turns):
            part = tok.encode(text, add_special_tokens=False)
            ids += part
            mask += [t % 2 == 0] * len(part)  # model, tool, model, ...
        return np.asarray(ids), np.asarray(mask)

    answered = exchange(call + "<|im_end|>", "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n", "\\boxed{3}")
    assert not detector(*answered)
    assert detector(*exchange(call + "<|im_end|>"))  # the tool's answer did not fit: the call is unanswered
    assert detector(*exchange('\\boxed{3} <tool_call>{"name": "ad'))  # cut in the call by the response length
    assert not detector(*exchange("\\boxed{3}<|im_end|>"))
    off = OmegaConf.create({"actor_rollout_ref": {"rollout": {"multi_turn": {"enable": False}}}})
    assert not runs_tools(off) and ToolCallDetector.from_config(off, tok) is None
    tools_only = OmegaConf.create({"actor_rollout_ref": {"rollout": {"multi_turn": {"function_tool_path": "t.py"}}}})
    assert runs_tools(tools_only)  # verl's agent loop runs tools per row (agent_name), whatever enable says
    bad = OmegaConf.create({"actor_rollout_ref": {"rollout": {"multi_turn": {"enable": True, "format": "xml9"}}}})
    with pytest.raises(ValueError, match="multi_turn.format=xml9"):
        ToolCallDetector.from_config(bad, tok)


def _stored_pool():
    """A pool whose question "q" holds one two-turn exchange and one single-turn response."""
    from exgrpo.experience import GroupMember

    mgr = ExperienceManager(ExGRPOConfig.from_dict({"delayed_start_threshold": -1.0, "seed": 1}, k=K))
    rng = np.random.default_rng(9)
    multi = GroupMember(
        np.asarray(_exchange(5)), -rng.random(12).astype(np.float32) - 0.1, 1.0, loss_mask=EXCHANGE_MASK
    )
    single = GroupMember(np.asarray(_exchange(6, [1] * 7)), -rng.random(7).astype(np.float32) - 0.1, 1.0)
    wrong = GroupMember(np.array([3, 4]), np.array([-0.3, -0.3], np.float32), 0.0)
    mgr.collect(1, {"q": [multi, single, wrong, wrong]})
    return mgr, mgr.pool.entries("q")


def test_a_replayed_row_is_rebuilt_with_its_stored_mask_and_carries_every_key():
    mgr, (multi, single) = _stored_pool()
    gen = _rows([_exchange(7, [1] * 3)] * 3, [[1] * 3] * 3, ["g"] * 3)  # K - 1 generated rows of the replay group
    mark_fresh(gen)
    batch = append_candidates(gen, np.array([3]), 0, [[multi, single]], PAD)
    rows = batch.select(np.array([3, 4]))
    b = rows.tensors
    assert b["responses"][0, :12].tolist() == multi.token_ids.tolist()
    assert b["response_mask"][0].tolist() == EXCHANGE_MASK + [0] * 4  # the stored mask, not ones over its length
    assert b["attention_mask"][0, P_LEN:].tolist() == [1] * 12 + [0] * 4  # the tool output is context: attended
    assert b["position_ids"][0, P_LEN : P_LEN + 12].tolist() == list(range(P_LEN, P_LEN + 12))
    tool = torch.tensor(EXCHANGE_MASK + [0] * 4) == 0
    assert float(b[BEHAVIOUR_LOG_PROBS_KEY][0][tool].abs().sum()) == 0.0  # no log-prob where none was sampled
    assert torch.equal(b[BEHAVIOUR_LOG_PROBS_KEY][0, :12], torch.as_tensor(multi.behaviour_log_probs))
    assert torch.equal(b["rollout_log_probs"][0], b[BEHAVIOUR_LOG_PROBS_KEY][0])
    assert b["response_mask"][1].tolist() == [1] * 7 + [0] * 9
    # every key of the generated rows, with the stored exchange's own turn count and no tool record of the loop
    assert set(rows.columns) == set(gen.columns)
    assert rows.columns[NUM_TURNS_KEY].tolist() == [4, 2]
    assert rows.columns["tool_rewards"].tolist() == [None, None]
    assert gen.columns[NUM_TURNS_KEY].tolist() == [2, 2, 2]  # the template rows are untouched
    # the trace's digests are those of the stored tokens and mask
    digests = replayed_row_digests(batch)
    sha = lambda a: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]  # noqa: E731
    assert [d["tokens_sha"] for d in digests] == [sha(c.token_ids.astype(np.int32)) for c in (multi, single)]
    assert [d["mask_sha"] for d in digests] == [sha(c.mask.astype(np.uint8)) for c in (multi, single)]
    assert [(d["length"], d["model_tokens"], d["mask_beyond"]) for d in digests] == [(12, 8, 0), (7, 7, 0)]


def test_a_multimodal_row_is_refused_by_name():
    image = np.array([{"pixel_values": torch.zeros(1, 3)}], dtype=object)
    gen = _rows([_exchange(8, [1] * 3)], [[1] * 3], ["g"], extra={"multi_modal_inputs": image})
    with pytest.raises(ValueError, match="text models only"):
        build_replay_members(gen, [np.array([5, 6])], [np.array([-0.1, -0.2], np.float32)], PAD)
    # verl's agent loop gives a text-only row an empty multi_modal_inputs: replayed like any text row
    gen = _rows([_exchange(8, [1] * 3)], [[1] * 3], ["g"], extra={"multi_modal_inputs": np.array([{}], dtype=object)})
    rows = build_replay_members(gen, [np.array([5, 6])], [np.array([-0.1, -0.2], np.float32)], PAD)
    assert rows.tensors["responses"][0, :2].tolist() == [5, 6]


TOOL_COLS = [c for c, m in enumerate(EXCHANGE_MASK) if not m]


def _micro_batch(behaviour, tool_shift=0.0):
    """A micro-batch of one generated and one replayed two-turn exchange, as verl hands it to the loss, and the
    model's packed log-probs. ``behaviour``: the replayed exchange's stored log-probs; ``tool_shift`` moves every
    other log-prob of the tool tokens (the recomputed old ones of both rows, the model's current ones)."""
    _, (multi, _) = _stored_pool()
    gen = _rows([_exchange(10)], [EXCHANGE_MASK], ["g"], seed=3)
    mark_fresh(gen)
    batch = Rows.concat([gen, build_replay_members(gen, [multi.token_ids], [behaviour], PAD, [multi.loss_mask])])
    g = torch.Generator().manual_seed(4)
    batch.tensors["old_log_probs"] = -torch.rand(2, R_LEN, generator=g) - 0.2
    batch.tensors["old_log_probs"][:, TOOL_COLS] += tool_shift
    batch.tensors["advantages"] = torch.tensor([[-0.5], [0.5]]).expand(2, R_LEN) * batch.tensors["response_mask"]
    batch.tensors[MIXED_KEY] = torch.full((2,), True)
    td = left_right_2_no_padding(DataProto(batch=batch.tensors, non_tensor_batch=batch.columns).to_tensordict())
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    flat = -torch.rand(int(batch.tensors["attention_mask"].sum()), generator=torch.Generator().manual_seed(5)) - 0.3
    for row in (0, 1):
        flat[_packed_positions(batch, row, TOOL_COLS)] += tool_shift
    return batch, td, flat.requires_grad_(True)


def _installed_loss(td, flat):
    config = ActorConfig(
        strategy="fsdp2",
        loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=R_LEN,
        entropy_coeff=0.0,
        ppo_mini_batch_size=2,
        ppo_micro_batch_size_per_gpu=2,
        rollout_n=1,
    )
    loss, metrics = exgrpo_actor_loss(config, {"log_probs": flat}, td, settings=LossSettings())
    (grad,) = torch.autograd.grad(loss, flat)
    return loss.detach(), grad, metrics


def _packed_positions(batch, row, columns):
    """Packed indices whose log-prob scores response column ``c`` of ``row`` (one token left, verl's layout)."""
    attn = batch.tensors["attention_mask"]
    offset = int(attn[:row].sum())
    p = int(attn[row, :P_LEN].sum())
    return [offset + p - 1 + c for c in columns]


def test_the_installed_loss_trains_the_model_tokens_of_a_replayed_exchange_only():
    _, (multi, _) = _stored_pool()
    stored = multi.behaviour_log_probs
    batch, td, flat = _micro_batch(stored)
    loss, grad, metrics = _installed_loss(td, flat)
    assert float(metrics["exgrpo/replayed_tokens"].aggregate()) == sum(EXCHANGE_MASK)  # 8 model tokens, not 12
    tool_positions = [i for row in (0, 1) for i in _packed_positions(batch, row, TOOL_COLS)]
    assert all(float(grad[i]) == 0.0 for i in tool_positions) and float(grad.abs().sum()) > 0
    # every log-prob of the tool tokens moved: the stored behaviour ones, the recomputed old ones, the current ones
    junk = stored.copy()
    junk[TOOL_COLS] = -5.0
    _, td2, flat2 = _micro_batch(junk, tool_shift=-2.0)
    loss2, grad2, _ = _installed_loss(td2, flat2)
    assert torch.equal(loss2, loss) and torch.equal(grad2, grad)
    # one model token's stored behaviour log-prob: the importance ratio, the loss and the gradient move
    moved = stored.copy()
    moved[10] -= 0.5
    _, td3, flat3 = _micro_batch(moved)
    loss3, grad3, _ = _installed_loss(td3, flat3)
    assert not torch.equal(loss3, loss) and not torch.equal(grad3, grad)


# ------------------------------------------------------------------------------------------------ dry run
@pytest.fixture
def tool_file(tmp_path):
    path = tmp_path / "lookup_tool.py"
    path.write_text(
        "from verl.tools.function_tool import function_tool\n\n\n@function_tool\ndef lookup_28a() -> str:\n"
        '    """Look the answer up."""\n    return "ok"\n'
    )
    return path


def _cpu_launch(tmp_path, extra):
    from recipe.exgrpo.cpu.run_config import CpuRunSpec, cpu_overrides
    from recipe.exgrpo.harness.assets import asset_spec

    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    spec = CpuRunSpec(
        model_path=str(model), train_files=str(data), val_files=str(data), output_dir=str(tmp_path / "out")
    )
    assert asset_spec("hf")  # the CPU backend's rollouts are importable here
    return [o for o in cpu_overrides(spec) if not o.startswith("+hydra.callbacks")] + list(extra)


MULTI_TURN = [
    "actor_rollout_ref.rollout.multi_turn.enable=True",
    "actor_rollout_ref.rollout.multi_turn.format=hermes",
    "actor_rollout_ref.rollout.multi_turn.max_user_turns=1",
]


def _dry_run_cli(overrides, *flags):
    """``python -m recipe.exgrpo.dry_run`` with the CPU backend's environment (its platform loads at verl's import,
    so it runs in a process of its own): (exit status, stderr)."""
    import os
    import subprocess
    import sys

    from recipe.exgrpo.cpu.run_config import REPO_ROOT, cpu_env

    proc = subprocess.run(
        [sys.executable, "-m", "recipe.exgrpo.dry_run", "-q", *flags, *overrides],
        env={**os.environ, **cpu_env()},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.returncode, proc.stderr


def test_the_dry_run_accepts_multi_turn_on_the_hf_rollout(tmp_path, tool_file):
    fn = f"actor_rollout_ref.rollout.multi_turn.function_tool_path={tool_file}"
    code, err = _dry_run_cli(_cpu_launch(tmp_path, [*MULTI_TURN, fn]), "--check-paths")
    assert code == 0, err
    assert "rollout=hf" in err and f"multi-turn: format=hermes tools=[function={tool_file}]" in err
    empty = tmp_path / "none.py"
    empty.write_text("x = 1\n")
    bad = [
        *MULTI_TURN,
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={empty}",
        "actor_rollout_ref.rollout.multi_turn.format=xml9",
    ]
    code, err = _dry_run_cli(_cpu_launch(tmp_path, bad), "--check-paths")
    assert code == 1
    assert "multi_turn.format=xml9 is not a tool-call format verl reads" in err and "'hermes'" in err
    assert f"function_tool_path={empty} defines no @function_tool" in err
    stateful = [*MULTI_TURN, "actor_rollout_ref.rollout.multi_turn.tool_config_path=tools.yaml"]
    code, err = _dry_run_cli(_cpu_launch(tmp_path, stateful))
    assert code == 1 and "tool_config_path='tools.yaml' is not supported" in err
    assert "exgrpo.replay_reward=stored" in err


def test_the_dry_run_accepts_multi_turn_on_the_vllm_rollout_of_a_gpu_launch(tool_file):
    """A GPU launch script with verl's multi-turn keys as extra arguments (``DRY_RUN=1``: the dry run of what the
    script would launch, verl's vLLM rollout)."""
    import os
    import subprocess
    import sys

    from recipe.exgrpo.cpu.run_config import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    mt = "actor_rollout_ref.rollout.multi_turn"
    args = [
        f"{mt}.enable=True",
        f"{mt}.function_tool_path={tool_file}",
        f"{mt}.tool_config_path=tools.yaml",
        "exgrpo.replay_reward=stored",  # stateful tools: a replayed member keeps the reward it earned
    ]
    proc = subprocess.run(
        ["bash", "scripts/train/exgrpo_qwen2.5_math_7b.sh", *args],
        env={**env, "PYTHON": sys.executable, "DRY_RUN": "1"},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = proc.stderr.strip().splitlines()[-1]
    assert ok.startswith("[dry-run] OK") and "rollout=vllm" in ok
    assert f"multi-turn: format=hermes tools=[function={tool_file}, stateful=tools.yaml]" in ok
