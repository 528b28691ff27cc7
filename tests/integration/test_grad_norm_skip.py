"""exgrpo.skip_grad_norm_above: verl's real FSDP engine ``optimizer_step`` with the skip bound, no Ray.

The engine object is verl's ``FSDPEngineWithLMHead`` (wrapped by ``recipe.exgrpo.runtime.grad_norm_guard``) with only
the attributes ``optimizer_step`` reads; the module is a small ``nn.Linear``. The FSDP2 case runs in a subprocess:
the CPU platform plugin and this module loaded through ``VERL_USE_EXTERNAL_MODULES`` exactly as in a Ray worker,
the engine looked up in verl's ``EngineRegistry``, the model sharded with ``fully_shard`` on a one-process
gloo group (the ``FSDPModule`` branch that runs on GPUs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

pytest.importorskip("verl")

from verl.workers.config import FSDPOptimizerConfig  # noqa: E402
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # noqa: E402

from recipe.exgrpo.main_exgrpo import install_worker_env  # noqa: E402
from recipe.exgrpo.runtime import grad_norm_guard  # noqa: E402


def _engine(cls, bound, *, scheduler=False):
    """A verl engine object with a 2 → 2 linear model, AdamW (lr 0.1) and grad clip 1.0."""
    torch.manual_seed(0)
    e = object.__new__(cls)
    e.module = torch.nn.Linear(2, 2)
    e.optimizer = torch.optim.AdamW(e.module.parameters(), lr=0.1)
    e.optimizer_config = FSDPOptimizerConfig(lr=0.1, clip_grad=1.0)
    e.scaler, e._qat_enabled = None, False
    e.skip_grad_norm_above, e.exgrpo_skipped_updates = bound, 0
    if scheduler:  # torch's LR scheduler puts a wrapper on optimizer.step (an instance attribute)
        e.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(e.optimizer, lambda s: 1.0)
    return e


def _backward(e, scale):
    """Gradient of scale · sum(W x + b) at x = (1, 1): every weight and bias entry gets ``scale``.

    Norm of the 6 entries: scale · √6 (scale 1000 → 2449.5; scale 10 → 24.49)."""
    e.optimizer.zero_grad()
    (scale * e.module(torch.ones(1, 2)).sum()).backward()


def _params(e):
    return [p.detach().clone() for p in e.module.parameters()]


def test_a_huge_gradient_norm_skips_the_update():
    cls = grad_norm_guard.with_grad_norm_skip(FSDPEngineWithLMHead)
    e = _engine(cls, 500.0)
    before = _params(e)
    _backward(e, 1000.0)
    norm = e.optimizer_step()
    assert norm == pytest.approx(1000.0 * 6**0.5, rel=1e-5)  # verl's pre-clip norm, returned as the metric
    assert all(torch.equal(a, b) for a, b in zip(before, _params(e)))  # no update
    assert all(p.grad is None or not p.grad.any() for p in e.module.parameters())  # gradients dropped
    assert e.exgrpo_skipped_updates == 1 and e.optimizer.state == {}  # AdamW never stepped


@pytest.mark.parametrize("scheduler", [False, True])
def test_a_norm_within_the_bound_updates_exactly_as_verl(scheduler):
    bounded = _engine(grad_norm_guard.with_grad_norm_skip(FSDPEngineWithLMHead), 500.0, scheduler=scheduler)
    plain = _engine(FSDPEngineWithLMHead, None, scheduler=scheduler)
    own_step = bounded.optimizer.__dict__.get("step")
    for e in (bounded, plain):
        _backward(e, 10.0)  # norm 24.5: clipped to 1.0 by verl, within the bound
        assert e.optimizer_step() == pytest.approx(10.0 * 6**0.5, rel=1e-5)
    for a, b in zip(_params(bounded), _params(plain)):
        torch.testing.assert_close(a, b)
    assert bounded.exgrpo_skipped_updates == 0
    assert bounded.optimizer.__dict__.get("step") is own_step  # the optimiser is left as it was
    if scheduler:  # the scheduler saw the optimiser step (else: "lr_scheduler.step() before optimizer.step()")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            bounded.lr_scheduler.step()


def test_non_finite_norms_are_still_skipped_by_verl():
    e = _engine(grad_norm_guard.with_grad_norm_skip(FSDPEngineWithLMHead), 500.0)
    before = _params(e)
    _backward(e, float("inf"))
    assert not torch.isfinite(torch.tensor(e.optimizer_step()))
    assert all(torch.equal(a, b) for a, b in zip(before, _params(e)))
    assert e.exgrpo_skipped_updates == 0  # verl's own skip, not ours


def test_without_a_bound_the_wrapped_engine_is_verl():
    e = _engine(grad_norm_guard.with_grad_norm_skip(FSDPEngineWithLMHead), None)
    _backward(e, 1000.0)
    before = _params(e)
    e.optimizer_step()
    assert not all(torch.equal(a, b) for a, b in zip(before, _params(e)))  # updated (clipped to norm 1)


def test_bound_and_worker_env():
    assert (
        grad_norm_guard.bound_from_env({}) is None
        and grad_norm_guard.bound_from_env({grad_norm_guard.SKIP_ENV: "500"}) == 500.0
    )
    for bad in ("x", "0", "-1", "inf"):
        with pytest.raises(ValueError, match=grad_norm_guard.SKIP_ENV):
            grad_norm_guard.bound_from_env({grad_norm_guard.SKIP_ENV: bad})
    assert grad_norm_guard.worker_env(None) == {}
    env = grad_norm_guard.worker_env(500, {grad_norm_guard.EXTERNAL_MODULES_ENV: "recipe.exgrpo.cpu.plugin"})
    assert env == {
        "VERL_USE_EXTERNAL_MODULES": "recipe.exgrpo.cpu.plugin,recipe.exgrpo.runtime.grad_norm_guard",
        "EXGRPO_SKIP_GRAD_NORM_ABOVE": "500.0",
    }


def test_the_loss_refuses_to_train_without_the_hook(monkeypatch):
    """A worker whose verl import did not load the hook stops at the first update with the fix in the message."""
    with pytest.raises(
        RuntimeError, match="no skip hook.*VERL_USE_EXTERNAL_MODULES must name recipe.exgrpo.runtime.grad_norm_guard"
    ):
        grad_norm_guard.check_installed(500.0, {})  # not loaded at all
    monkeypatch.setattr(grad_norm_guard, "INSTALLED", [])
    with pytest.raises(RuntimeError, match="no skip hook"):
        # loaded, bound unset: nothing wrapped
        grad_norm_guard.check_installed(500.0, {grad_norm_guard.MODULE: grad_norm_guard})
    monkeypatch.setattr(grad_norm_guard, "INSTALLED", ["fsdp2/cuda"])
    monkeypatch.setenv(grad_norm_guard.SKIP_ENV, "400")
    with pytest.raises(RuntimeError, match="no skip hook"):
        # another bound than the config's
        grad_norm_guard.check_installed(500.0, {grad_norm_guard.MODULE: grad_norm_guard})
    monkeypatch.setenv(grad_norm_guard.SKIP_ENV, "500")
    grad_norm_guard.check_installed(500.0, {grad_norm_guard.MODULE: grad_norm_guard})


def test_main_puts_the_hook_into_the_ray_runtime_env():
    from omegaconf import OmegaConf

    config = OmegaConf.create({"ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": {"A": "1"}}}}})
    OmegaConf.set_struct(config, True)
    install_worker_env(config, None)
    assert dict(config.ray_kwargs.ray_init.runtime_env.env_vars) == {"A": "1"}
    install_worker_env(config, 500.0)
    env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.A == "1" and env_vars.EXGRPO_SKIP_GRAD_NORM_ABOVE == "500.0"
    assert env_vars.VERL_USE_EXTERNAL_MODULES.split(",")[-1] == "recipe.exgrpo.runtime.grad_norm_guard"
    # verl's own config has runtime_env without env_vars (or no runtime_env at all)
    for ray_init in ({"runtime_env": {"py_executable": None}}, {"num_cpus": None}):
        config = OmegaConf.create({"ray_kwargs": {"ray_init": ray_init}})
        OmegaConf.set_struct(config, True)
        install_worker_env(config, 500.0)
        assert config.ray_kwargs.ray_init.runtime_env.env_vars.EXGRPO_SKIP_GRAD_NORM_ABOVE == "500.0"


FSDP2_SCRIPT = textwrap.dedent(
    """
    import os, tempfile, torch, torch.distributed as dist
    import verl  # imports the CPU plugin, then recipe.exgrpo.runtime.grad_norm_guard (VERL_USE_EXTERNAL_MODULES)
    from torch.distributed.fsdp import fully_shard
    from verl.workers.config import FSDPOptimizerConfig
    from verl.workers.engine import EngineRegistry
    from recipe.exgrpo.runtime.grad_norm_guard import GradNormSkipMixin

    cls = EngineRegistry.get_engine_cls("language_model", "fsdp2")
    assert issubclass(cls, GradNormSkipMixin), cls
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    torch.manual_seed(0)
    e = object.__new__(cls)
    e.module = fully_shard(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    e.optimizer = torch.optim.AdamW(e.module.parameters(), lr=0.1)
    e.optimizer_config = FSDPOptimizerConfig(lr=0.1, clip_grad=1.0)
    e.scaler, e._qat_enabled = None, False
    e.skip_grad_norm_above, e.exgrpo_skipped_updates = float(os.environ["EXGRPO_SKIP_GRAD_NORM_ABOVE"]), 0
    def step(scale):
        e.optimizer.zero_grad()
        (scale * e.module(torch.ones(1, 2)).sum()).backward()
        before = [p.full_tensor().clone() for p in e.module.parameters()]
        norm = e.optimizer_step()
        changed = any(not torch.equal(a, p.full_tensor()) for a, p in zip(before, e.module.parameters()))
        return norm, changed
    n1, c1 = step(1000.0)
    n2, c2 = step(10.0)
    print("RESULT", round(n1, 2), c1, round(n2, 3), c2, e.exgrpo_skipped_updates)
    dist.destroy_process_group()
    """
)


def test_fsdp2_engine_from_the_registry_skips_in_a_worker_like_process(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        **os.environ,
        "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "VERL_PLATFORM": "cpu",
        "VERL_USE_EXTERNAL_MODULES": "recipe.exgrpo.cpu.plugin,recipe.exgrpo.runtime.grad_norm_guard",
        "EXGRPO_SKIP_GRAD_NORM_ABOVE": "500",
        "OMP_NUM_THREADS": "1",
    }
    script = tmp_path / "fsdp2_skip.py"
    script.write_text(FSDP2_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    # norm 1000·√6 = 2449.49 > 500: skipped, weights unchanged; then 10·√6 = 24.495: updated; one skip
    assert result == ["RESULT 2449.49 False 24.495 True 1"], out.stdout[-2000:]
