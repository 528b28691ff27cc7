"""Reward modes are registered strategies (exgrpo/modes/): a third mode is one class and its registration, with no
other file touched, and no code outside the registry branches on a mode's (or, in the step's path, a rollout's)
name."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exgrpo.config import ConfigError, ExGRPOConfig
from exgrpo.experience import PoolCheckpointError
from exgrpo.experience.manager import ExperienceManager
from exgrpo.modes import REWARD_MODES, BinaryMode, BinaryOptions, ModeOptions, RewardMode, register_reward_mode
from exgrpo.settings import setting
from tests.helpers.experience import members

REPO = Path(__file__).resolve().parents[2]
K = 4
MODE = "test_pass_threshold"


@dataclass
class PassThresholdOptions(BinaryOptions):
    """The binary mode's keys and the pass threshold."""

    pass_threshold: float = setting(
        1.0, lo=0.0, lo_open=True, hint="reward units", help="the reward a member needs to pass"
    )


class PassThresholdMode(BinaryMode):
    """A member passes when its reward reaches exgrpo.pass_threshold (the binary mode is this mode at 1)."""

    options_class = PassThresholdOptions

    @classmethod
    def from_config(cls, cfg: Any) -> PassThresholdMode:
        mode = cls()
        mode.success_reward = float(PassThresholdOptions.of(cfg).pass_threshold)
        return mode

    def settings(self) -> dict[str, Any]:
        return {"reward_mode": self.name, "pass_threshold": self.success_reward}


@pytest.fixture
def threshold_mode():
    register_reward_mode(MODE)(PassThresholdMode)
    yield PassThresholdMode
    REWARD_MODES.unregister(MODE)


def test_a_third_mode_runs_through_the_manager_with_its_own_key(threshold_mode, tmp_path):
    cfg = ExGRPOConfig.from_dict(
        {"reward_mode": MODE, "pass_threshold": 0.5, "delayed_start_threshold": 0.4, "seed": 3}, k=K
    )
    assert cfg.mode_options.pass_threshold == 0.5 and cfg.mode is PassThresholdMode
    assert PassThresholdOptions.of(cfg) is cfg.mode_options and BinaryOptions.of(cfg).delayed_start_threshold == 0.4
    mgr = ExperienceManager(cfg)
    groups = {
        "two": members([0.6, 0.2, 0.5, 0.1], salt=1),  # 0.6 and 0.5 pass: bucket 2, both stored
        "all": members([0.9, 0.7, 0.5, 0.8], salt=2),  # every member passes: retired
        "none": members([0.4, 0.0, 0.49, 0.1], salt=3),  # none passes: no signal
        "one": members([0.55, 0.3, 0.3, 0.3], salt=4),  # one passes: bucket 1
    }
    metrics = mgr.collect(1, groups)
    pool = mgr.pool
    assert (pool.bucket_of("two"), pool.bucket_of("one"), pool.bucket_of("none")) == (2, 1, None)
    assert pool.is_retired("all") and (pool.num_entries("two"), pool.num_entries("one")) == (2, 1)
    assert sorted(e.reward for e in pool.entries("two")) == pytest.approx([0.5, 0.6])
    assert metrics["exgrpo/collect/retired"] == 1 and metrics["exgrpo/collect/zero_success"] == 1
    # the delayed start watches the share of passing responses: 7 of 16 = 0.4375 > 0.4
    rewards = [m.reward for group in groups.values() for m in group]
    assert mgr.mode.start_signal(rewards) == pytest.approx(7 / 16)
    assert mgr.observe_rewards(rewards, 1) and mgr.mixed
    # the pool's header carries the mode and its setting; a resume in the same mode restores it exactly
    mgr.save(tmp_path)
    again = ExperienceManager(cfg)
    again.load(tmp_path)
    assert again.state_digest() == mgr.state_digest() and again.pool.settings()["pass_threshold"] == 0.5
    # a binary run refuses the pool, naming both modes
    binary = ExperienceManager(ExGRPOConfig.from_dict({}, k=K))
    with pytest.raises(PoolCheckpointError, match=f"reward_mode={MODE} but this run has exgrpo.reward_mode=binary"):
        binary.load(tmp_path)


def test_a_modes_key_is_validated_by_it_and_refused_elsewhere(threshold_mode):
    with pytest.raises(ConfigError, match=r"exgrpo.pass_threshold must be a number in \(0.0, inf\)"):
        ExGRPOConfig.from_dict({"reward_mode": MODE, "pass_threshold": 0.0}, k=K)
    with pytest.raises(ConfigError, match=f"exgrpo.pass_threshold=0.5 applies only with exgrpo.reward_mode={MODE}"):
        ExGRPOConfig.from_dict({"pass_threshold": 0.5}, k=K)
    # a key it shares with the binary mode is valid in both, and still refused by the continuous mode
    shared = ExGRPOConfig.from_dict({"reward_mode": MODE, "delayed_start_threshold": 0.1}, k=K)
    assert shared.mode_options.delayed_start_threshold
    with pytest.raises(ConfigError, match="is the binary pass rate's tau"):
        ExGRPOConfig.from_dict({"reward_mode": "continuous", "delayed_start_threshold": 0.1}, k=K)
    assert "pass_threshold" in ExGRPOConfig.key_names()
    again = ExGRPOConfig.from_dict(ExGRPOConfig.from_dict({"reward_mode": MODE}, k=K).to_dict())
    assert again.mode_options.pass_threshold == 1.0


def test_the_registry_refuses_a_clashing_key_and_a_non_mode():
    @dataclass
    class ClashOptions(ModeOptions):
        delayed_start_threshold: float = setting(0.5, help="the binary mode's key with another default")

    class Clash(BinaryMode):
        options_class = ClashOptions

    with pytest.raises(ValueError, match="delayed_start_threshold has default 0.5, but reward mode 'binary'"):
        register_reward_mode("test_clash")(Clash)
    assert "test_clash" not in REWARD_MODES

    # the same default, declared again: still two declarations of one key
    @dataclass
    class TwiceOptions(ModeOptions):
        delayed_start_threshold: float = setting(0.35, help="the binary mode's key declared a second time")

    class Twice(BinaryMode):
        options_class = TwiceOptions

    with pytest.raises(ValueError, match="declared differently from reward mode 'binary'.*extend BinaryOptions"):
        register_reward_mode("test_twice")(Twice)
    assert "test_twice" not in REWARD_MODES
    # a mode's keys are a declared dataclass, never a hand-made table
    with pytest.raises(TypeError, match="declare its keys as a ModeOptions dataclass"):

        class Table(BinaryMode):
            options = {"pass_threshold": 1.0}

    with pytest.raises(TypeError, match="declare every key with exgrpo.settings.setting"):

        @dataclass
        class Plain(ModeOptions):
            pass_threshold: float = 1.0

        class Undeclared(BinaryMode):
            options_class = Plain

    with pytest.raises(TypeError, match="must be a RewardMode subclass"):
        register_reward_mode("test_not_a_mode")(dict)
    with pytest.raises(ValueError, match="unknown reward mode 'binray'.*did you mean 'binary'"):
        REWARD_MODES["binray"]
    assert issubclass(BinaryMode, RewardMode) and set(REWARD_MODES) >= {"binary", "continuous"}


# ------------------------------------------------------------------------------------ nothing compares the names
SCANNED = ("exgrpo", "recipe", "benchmarks", "data_preprocess")
#: where a mode's name may be compared: the registry itself
REGISTRY_DIR = REPO / "exgrpo" / "modes"


def _is_mode_ref(node: ast.AST) -> bool:
    """An expression that holds a reward mode's name (``x.reward_mode``, ``reward_mode``)."""
    return (isinstance(node, ast.Attribute) and node.attr == "reward_mode") or (
        isinstance(node, ast.Name) and node.id == "reward_mode"
    )


def _is_fixed_name(node: ast.AST, names: set[str]) -> bool:
    """A literal mode name, or a module constant (a specific mode, e.g. the default)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value in names
    leaf = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return leaf.isupper()


def name_comparisons(source: str, names: set[str]) -> list[int]:
    """Lines of ``source`` that compare a reward mode's name with a particular mode (a literal or a constant), or
    compare a literal mode name at all, or test the continuous rules for None (the old way of saying binary)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        # a literal tuple/list/set of names counts as its elements
        operands += [e for o in operands if isinstance(o, (ast.Tuple, ast.List, ast.Set)) for e in o.elts]
        literal = any(isinstance(o, ast.Constant) and o.value in names for o in operands)
        named = any(_is_mode_ref(o) for o in operands) and any(
            _is_fixed_name(o, names) for o in operands if not _is_mode_ref(o)
        )
        none_test = any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and any(
            (isinstance(o, ast.Attribute) and o.attr == "continuous")
            or (isinstance(o, ast.Name) and o.id == "continuous")
            for o in operands
        )
        if literal or named or none_test:
            lines.append(node.lineno)
    return lines


def test_no_code_outside_the_registry_compares_a_reward_modes_name():
    names = set(REWARD_MODES)
    offenders = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            if REGISTRY_DIR in path.parents:
                continue
            lines = name_comparisons(path.read_text(encoding="utf-8"), names)
            if lines:
                offenders[str(path.relative_to(REPO))] = lines
    assert not offenders, f"compare a reward mode's name outside exgrpo/modes/ (ask the mode instead): {offenders}"


@pytest.mark.parametrize(
    "snippet",
    [
        'if cfg.reward_mode == "continuous": pass',
        'x = "binary" != mode_name',
        "if run.reward_mode == DEFAULT_REWARD_MODE: pass",
        'if self.exgrpo.reward_mode in ("binary",): pass',
        "if self.continuous is None: pass",
    ],
)
def test_the_scan_catches_each_form_of_comparison(snippet):
    assert name_comparisons(snippet, {"binary", "continuous"}) == [1]


def test_the_scan_lets_generic_comparisons_pass():
    # two modes compared with each other (a saved pool against the run), and other strings
    ok = 'if saved != pool.reward_mode: pass\nif args.rollout == "vllm": pass\nif name in REWARD_MODES: pass'
    assert name_comparisons(ok, {"binary", "continuous"}) == []


#: the step's path: its code must not depend on which rollout serves it (hf, vllm) nor which reward mode is on
STEP_PATH = (
    "recipe/exgrpo/legacy/trainer.py",
    "recipe/exgrpo/replay_step/batch.py",
    "recipe/exgrpo/actor_loss.py",
    "recipe/exgrpo/tool_turns.py",
    "exgrpo/experience/experience_pool.py",
    "exgrpo/experience/collection.py",
    "exgrpo/experience/masks.py",
    "exgrpo/experience/records.py",
)
ROLLOUT_NAMES = {"hf", "vllm", "sglang", "trtllm"}


def rollout_name_uses(source: str) -> list[int]:
    """Lines that read ``rollout.name`` or compare with a rollout's name."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "name":
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr == "rollout":
                lines.add(node.lineno)
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and o.value in ROLLOUT_NAMES for o in operands):
                lines.add(node.lineno)
    return sorted(lines)


def test_the_steps_path_branches_on_no_rollout_and_no_mode():
    names = set(REWARD_MODES)
    for rel in STEP_PATH:
        source = (REPO / rel).read_text(encoding="utf-8")
        assert rollout_name_uses(source) == [], rel
        assert name_comparisons(source, names) == [], rel
    assert rollout_name_uses('if config.actor_rollout_ref.rollout.name == "hf": pass') == [1]
    assert rollout_name_uses('mode = "vllm" if x else y\nok = name != "vllm"') == [2]


@pytest.mark.parametrize("count_replayed", [True, False])
def test_the_binary_plan_reads_is_replayed_by_its_truth_value(count_replayed):
    """A member is replayed where ``is_replayed`` is true and fresh where it is false (False, 0, None):
    the replayed ones are never stored and, with ``count_replayed_in_k`` off, not counted in k."""
    import numpy as np

    from exgrpo.experience import ExperiencePool, Group, GroupMember

    def member(n, reward, replayed):
        return GroupMember(np.arange(1, n + 1, dtype=np.int32), np.full(n, -0.1, np.float32), reward, replayed)

    members = [member(3, 1.0, True), member(4, 1.0, None), member(5, 1.0, 0), member(6, 0.0, False)]
    pool = ExperiencePool(4, count_replayed_in_k=count_replayed)
    stats = pool.collect(1, [Group("q", members)])
    assert sorted(c.length for c in pool.entries("q")) == [4, 5]  # the fresh right ones, None and 0 among them
    assert stats.mode_stats["success_counts"] == [3 if count_replayed else 2]
