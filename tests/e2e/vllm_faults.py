"""Faults injected into a CPU run on verl's vLLM rollout, for the tests that show a check catches them.

Named in ``VERL_USE_EXTERNAL_MODULES`` after the CPU plugin, this module is imported in every process of the run
(driver, trainer workers, the vLLM server and its engine worker); ``EXGRPO_TEST_FAULT`` picks the fault:

- ``skip_weight_sync``: the weight transfer of every sync after the first (the one before step 1) is skipped, so the
  engine keeps sampling the initial policy while the actor trains (the rollout/actor agreement check must fail);
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
    # Only the transfer into the engine is skipped: verl's update step around it (the rollout's wake-up after the
    # update, the KV-cache reset) still runs, as it would with a sender that silently sends nothing. Skipping the
    # whole CheckpointEngineManager.update_weights instead also skips the wake-up, and the next generation waits
    # for ever on a paused engine.
    from recipe.exgrpo import verl_compat

    verl_compat.register_rollout_adapter("vllm", "async", "tests.e2e.vllm_faults_adapter.SkippingServerAdapter")

elif FAULT == "no_weight_sync_fix" and "vllm" in sys.modules:
    # In the engine worker vLLM is imported before verl (and so before this module): mark vLLM's own dispatch as
    # already fixed, so that recipe.exgrpo.cpu.vllm_rollout.apply_weight_sync_fix leaves it in place.
    from recipe.exgrpo import verl_compat

    _original = verl_compat.cpu_gemm_dispatch()

    def _unfixed(layer, remove_weight):
        return _original(layer, remove_weight)

    _unfixed._exgrpo_keeps_weight = True
    verl_compat.replace_cpu_gemm_dispatch(_unfixed)
    print("[vllm_faults] the vLLM engine runs without the weight-sync fix", file=sys.stderr, flush=True)
elif FAULT and FAULT not in ("skip_weight_sync", "no_weight_sync_fix"):
    raise ValueError(f"{FAULT_ENV}={FAULT!r}: expected skip_weight_sync or no_weight_sync_fix")
