"""Skip an optimiser update whose gradient norm exceeds a bound (``exgrpo.skip_grad_norm_above``).

The released code skips the update when the gradient norm is non-finite *or* above 500; verl 0.9.1's FSDP
engine (``FSDPEngine.optimizer_step``) only skips non-finite norms. This module adds the bound without patching
verl: a mixin that overrides ``optimizer_step``, applied to every FSDP language-model engine class registered
in verl's ``EngineRegistry`` (``cuda`` and ``npu`` from verl, ``cpu`` from the CPU backend), so the same code
runs on the GPU path (FSDP2 on cuda) and on CPU.

How it reaches the Ray workers: when the bound is set, ``recipe.exgrpo.main_exgrpo`` adds this module to
``VERL_USE_EXTERNAL_MODULES`` and the bound to ``EXGRPO_SKIP_GRAD_NORM_ABOVE`` in the job's Ray
``runtime_env`` (:func:`worker_env`); ``import verl`` imports this module in every process, before any engine
is built, and importing it wraps the registered engines (:func:`install`). With the bound unset nothing is
installed and verl's engines run unchanged.

The update is decided with verl's own norm: ``optimizer_step`` runs verl's (unscale, clip, norm all-reduced over
the data-parallel group, non-finite check) with the optimiser's ``step`` deferred; afterwards the deferred step
is taken if the pre-clip norm is within the bound, else the gradients are dropped. Every rank sees the same
all-reduced norm, so all ranks skip together. The metric ``exgrpo/update_skipped`` (logged as
``actor/exgrpo/update_skipped``) is the share of this step's optimiser updates that were skipped.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

from verl.utils.metric import AggregationType, Metric

from recipe.exgrpo import verl_compat

SKIP_ENV = "EXGRPO_SKIP_GRAD_NORM_ABOVE"
MODULE = "recipe.exgrpo.runtime.grad_norm_guard"
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
SKIPPED_METRIC = "exgrpo/update_skipped"


def bound_from_env(environ=None) -> float | None:
    """The bound in ``EXGRPO_SKIP_GRAD_NORM_ABOVE`` (unset or empty: None); a bad value is a clear error."""
    raw = (os.environ if environ is None else environ).get(SKIP_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{SKIP_ENV}={raw!r} is not a number (exgrpo.skip_grad_norm_above)") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{SKIP_ENV}={raw!r} must be a finite number > 0 (exgrpo.skip_grad_norm_above)")
    return value


def worker_env(bound: float | None, environ=None) -> dict[str, str]:
    """The Ray ``runtime_env`` variables that install the bound in every verl process ({} when the bound is None).

    ``VERL_USE_EXTERNAL_MODULES`` keeps the modules already named in ``environ`` (e.g. the CPU backend's plugin,
    which must register its engines first) and appends this module.
    """
    if bound is None:
        return {}
    environ = os.environ if environ is None else environ
    modules = [m for m in environ.get(EXTERNAL_MODULES_ENV, "").split(",") if m and m != MODULE]
    return {EXTERNAL_MODULES_ENV: ",".join([*modules, MODULE]), SKIP_ENV: repr(float(bound))}


class GradNormSkipMixin:
    """Put before a verl FSDP engine class: its ``optimizer_step`` also skips updates with norm > the bound."""

    skip_grad_norm_above: float | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.skip_grad_norm_above = bound_from_env()
        self.exgrpo_skipped_updates = 0

    def optimizer_step(self):
        bound = self.skip_grad_norm_above
        if bound is None:
            return super().optimizer_step()
        optimizer = self.optimizer
        # torch's LR scheduler may have put its own wrapper on the instance; restore exactly what was there
        own_step = optimizer.__dict__.get("step")
        real_step = optimizer.step
        deferred: list[tuple[tuple, dict]] = []
        optimizer.step = lambda *args, **kwargs: deferred.append((args, kwargs))
        try:
            grad_norm = super().optimizer_step()  # verl: unscale, clip, all-reduced norm, non-finite skip
        finally:
            if own_step is None:
                del optimizer.step
            else:
                optimizer.step = own_step
        if not deferred:  # verl (or its grad scaler) skipped a non-finite norm and zeroed the gradients
            return grad_norm
        if float(grad_norm) > bound:
            print(f"WARN: grad_norm {float(grad_norm):.4g} > exgrpo.skip_grad_norm_above={bound:g}: update skipped")
            optimizer.zero_grad()
            self.exgrpo_skipped_updates += 1
            return grad_norm
        args, kwargs = deferred[0]
        real_step(*args, **kwargs)
        if verl_compat.engine_qat_enabled(self):  # verl invalidates QAT scales after the step; redo it after ours
            from verl.utils.qat.core import invalidate_all_scales

            invalidate_all_scales(self.module)
        return grad_norm

    def train_batch(self, data, loss_function):
        before = self.exgrpo_skipped_updates
        outputs = super().train_batch(data, loss_function)
        if self.skip_grad_norm_above is not None and self.is_mp_src_rank_with_outputs():
            skipped = float(self.exgrpo_skipped_updates - before)
            outputs["metrics"][SKIPPED_METRIC] = Metric(aggregation=AggregationType.MEAN, value=skipped)
        return outputs


_WRAPPED: dict[type, type] = {}


def with_grad_norm_skip(engine_cls: type) -> type:
    """``engine_cls`` with :class:`GradNormSkipMixin` in front (one cached subclass per class)."""
    if issubclass(engine_cls, GradNormSkipMixin):
        return engine_cls
    if engine_cls not in _WRAPPED:
        _WRAPPED[engine_cls] = type(
            f"GradNormSkip{engine_cls.__name__}",
            (GradNormSkipMixin, engine_cls),
            {"__module__": __name__, "__doc__": f"{engine_cls.__name__} + exgrpo.skip_grad_norm_above."},
        )
    return _WRAPPED[engine_cls]


FSDP_BACKENDS = ("fsdp", "fsdp2", "fsdp_turbo")


def install(model_type: str = "language_model", backends: tuple[str, ...] = FSDP_BACKENDS) -> list[str]:
    """Wrap every engine registered for ``model_type`` and ``backends`` (every device and vendor key).

    verl's ``EngineRegistry.register`` refuses a second class for a key, so the registered class is replaced
    in place with its wrapped subclass; returns the keys wrapped (for logs and tests).
    """
    with warnings.catch_warnings():
        # verl.workers.engine warns once per optional engine it cannot import (torchtitan, megatron, ...)
        warnings.simplefilter("ignore", UserWarning)
        registry = verl_compat.engine_table(model_type)
    done = []
    for backend in backends:
        for key, engine_cls in list(registry.get(backend, {}).items()):
            verl_compat.replace_engine(model_type, backend, key, with_grad_norm_skip(engine_cls))
            done.append(f"{backend}/{key}")
    INSTALLED.extend(k for k in done if k not in INSTALLED)
    return done


#: Registry keys wrapped in this process (empty: the hook is not installed here).
INSTALLED: list[str] = []


def check_installed(bound: float, modules=None) -> None:
    """Raise unless this process loaded the hook with ``bound`` when verl was imported (before any engine was
    built). The actor loss calls it in the worker, so a run whose workers missed the hook stops at the first
    update instead of silently never skipping. It looks the hook up in ``modules`` (default ``sys.modules``):
    importing this module now would wrap the registry after the engine exists and prove nothing."""
    modules = sys.modules if modules is None else modules
    hook = modules.get(MODULE)
    if hook is not None and hook.INSTALLED and hook.bound_from_env() == bound:
        return
    raise RuntimeError(
        f"exgrpo.skip_grad_norm_above={bound:g} but this verl worker has no skip hook ({SKIP_ENV}="
        f"{os.environ.get(SKIP_ENV)!r}, {EXTERNAL_MODULES_ENV}={os.environ.get(EXTERNAL_MODULES_ENV)!r}): launch "
        f"through recipe.exgrpo.main_exgrpo, which puts both into the Ray runtime_env, or set them for every Ray "
        f"process ({EXTERNAL_MODULES_ENV} must name {MODULE})"
    )


# Imported through VERL_USE_EXTERNAL_MODULES by ``import verl``: wrap the engines before any is built.
if bound_from_env() is not None:
    install()
