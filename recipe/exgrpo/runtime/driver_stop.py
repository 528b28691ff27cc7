"""SIGTERM, SIGHUP or SIGINT to the trainer's driver (``python -m recipe.exgrpo.main_exgrpo``) stop the whole run.

Left to Ray, a driver that gets SIGTERM exits through Ray's own handler after a dump of its C++ stack, SIGHUP (the
terminal closed) kills it and leaves Ray's dashboard and runtime-env agents of its local cluster running with parent
PID 1, and Ctrl-C prints a traceback. The handler here stops every process the driver started (its local Ray
cluster: GCS, raylet, agents, workers, a vLLM engine) and every process on this node that carries the run's token
(``runtime/stacks.py``: the workers, when the stage watchdog is on), writes one line and exits with 128 + the
signal's number, without running the interpreter's exit handlers (Ray's would wait on the cluster just stopped).
On a cluster the driver did not start (``RAY_ADDRESS``), Ray ends the job's actors when the driver is gone.

``ray.init`` installs its own SIGTERM handler, so :func:`install` runs twice: when the driver starts, and once
Ray is up (``main_exgrpo.run_stage_watched``).
"""

from __future__ import annotations

import os

from exgrpo.stop_signals import install_stop_handlers, stop_descendants

#: seconds the run's processes get between SIGTERM and SIGKILL
GRACE_S = 5.0


def stop_run(run_token: str | None) -> list[int]:
    """Stop every process this driver started and, with ``run_token``, every process of the run on this node."""
    pids = stop_descendants(grace_s=GRACE_S)
    if run_token:
        from recipe.exgrpo.runtime import stacks

        pids += stacks.terminate_local(run_token, exclude=[os.getpid()], grace_s=GRACE_S)
    return sorted(set(pids))


def run_processes(run_token: str | None) -> list[int]:
    """What :func:`stop_run` stops, found and not yet signalled: this driver's descendants and, with ``run_token``,
    every process of the run on this node."""
    import psutil

    try:
        pids = [p.pid for p in psutil.Process().children(recursive=True)]
    except psutil.Error:
        pids = []
    if run_token:
        from recipe.exgrpo.runtime import stacks

        pids += stacks.run_pids(run_token, exclude=[os.getpid()])
    return sorted(set(pids))


def install(run_token: str | None = None) -> None:
    """The driver's handlers of SIGTERM, SIGHUP and SIGINT (module docstring). The line comes before the run is
    stopped: once its Ray node is gone, the driver's Ray core worker may end the process (a C++ thread's exit), and a
    line written after the stop was lost that way on a loaded machine."""

    def announce(signum: int) -> str:
        n = len(run_processes(run_token))
        return f"stopping the run: {n} of its processes on this node (its Ray cluster included), then exiting"

    def stop(signum: int) -> None:
        stop_run(run_token)

    install_stop_handlers(stop, "exgrpo", exit_now=True, announce=announce)
