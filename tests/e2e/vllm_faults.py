"""Faults injected into a CPU run on verl's vLLM rollout, for the tests that show a check catches them.

Named in ``VERL_USE_EXTERNAL_MODULES`` after the CPU plugin, this module is imported in every process of the run
(driver, trainer workers, the vLLM server and its engine worker); ``EXGRPO_TEST_FAULT`` picks the fault:

- ``skip_weight_sync``: every weight sync after the first (the one before step 1) is skipped, so the engine keeps
  sampling the initial policy while the actor trains (the rollout/actor agreement check must fail);
- ``no_weight_sync_fix``: the vLLM engine worker runs without the CPU backend's weight-sync fix, so the first
  weight sync fails inside the engine (the run must stop with ``WeightSyncError`` instead of hanging).

Never imported by the recipe itself.
"""

from __future__ import annotations

import os
import sys

FAULT_ENV = "EXGRPO_TEST_FAULT"
FAULT = os.environ.get(FAULT_ENV, "")

if FAULT == "skip_weight_sync":
    from verl.checkpoint_engine.base import CheckpointEngineManager

    _update_weights = CheckpointEngineManager.update_weights

    def _skip_after_start(self, global_steps=None):
        if global_steps:  # the sync before step 1 (global_steps 0) still runs: the engine starts on dummy weights
            print(f"[vllm_faults] weight sync after step {global_steps} skipped", file=sys.stderr, flush=True)
            return {}
        return _update_weights(self, global_steps)

    CheckpointEngineManager.update_weights = _skip_after_start

elif FAULT == "no_weight_sync_fix" and "vllm" in sys.modules:
    # In the engine worker vLLM is imported before verl (and so before this module): mark vLLM's own dispatch as
    # already fixed, so that recipe.exgrpo.cpu.vllm_rollout.apply_weight_sync_fix leaves it in place.
    from vllm.model_executor.layers import utils as _layer_utils

    _original = _layer_utils.dispatch_cpu_unquantized_gemm

    def _unfixed(layer, remove_weight):
        return _original(layer, remove_weight)

    _unfixed._exgrpo_keeps_weight = True
    _layer_utils.dispatch_cpu_unquantized_gemm = _unfixed
    print("[vllm_faults] the vLLM engine runs without the weight-sync fix", file=sys.stderr, flush=True)
elif FAULT and FAULT not in ("skip_weight_sync", "no_weight_sync_fix"):
    raise ValueError(f"{FAULT_ENV}={FAULT!r}: expected skip_weight_sync or no_weight_sync_fix")
