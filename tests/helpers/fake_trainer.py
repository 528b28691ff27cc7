"""A stand-in for ``python -m recipe.exgrpo.main_exgrpo`` that the CPU demo's tests run instead of the trainer, by
path (``tests/helpers/fake_runs.py`` makes the interpreter the demo starts it with), in a second.

What it does of a real run: reads the overrides the demo gives (``trainer.total_training_steps``,
``trainer.resume_mode``, ``trainer.default_local_dir``), resumes from verl's tracker file with ``resume_mode=auto``,
writes one metrics record per step into ``$VERL_FILE_LOGGER_PATH`` (starting it empty, as verl's file logger does;
a validation record at the step it resumes from, as verl's ``val_before_train`` does), saves a "checkpoint" (the
tracker file) at every ``trainer.save_freq``. With ``FAKE_TRAINER_HANG`` set it then starts two processes that
stand for its Ray cluster (a child and a grandchild), writes their pids into that file and waits to be stopped; on
SIGTERM it writes ``SIGTERM`` into ``<that file>.stopped``, stops them and exits 143, as the real driver's handler
does (recipe/exgrpo/runtime/driver_stop.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _overrides(argv: list[str]) -> dict[str, str]:
    return dict(a.lstrip("+").split("=", 1) for a in argv if "=" in a)


def main(argv: list[str]) -> int:
    o = _overrides(argv)
    steps, save_freq = int(o["trainer.total_training_steps"]), int(o["trainer.save_freq"])
    checkpoints = Path(o["trainer.default_local_dir"])
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    start = int(tracker.read_text()) if o["trainer.resume_mode"] == "auto" and tracker.exists() else 0
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "w") as log:
        log.write(json.dumps({"step": start, "data": {"val-core/toy_arithmetic_easy/acc/mean@1": 0.5}}) + "\n")
        for step in range(start + 1, steps + 1):
            data = {
                "exgrpo/batch_pass_rate": 0.1 * (step % 5),
                "exgrpo/sampled_pass_rate": 0.1 * (step % 5),
                "exgrpo/mixed": float(step > 2),
                "exgrpo/replayed_questions": 8 if step > 2 else 0,
                "exgrpo/fresh_questions": 8 if step > 2 else 16,
                "exgrpo/pool/entries": step,
                "resumed_from": start,
            }
            log.write(json.dumps({"step": step, "data": data}) + "\n")
            log.flush()
            if save_freq > 0 and step % save_freq == 0:
                checkpoints.mkdir(parents=True, exist_ok=True)
                (checkpoints / f"global_step_{step}").mkdir(exist_ok=True)
                tracker.write_text(str(step))
    pids_file = os.environ.get("FAKE_TRAINER_HANG")
    if not pids_file:
        return 0
    cluster = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    grandchild = int(cluster.stdout.readline())

    def stop(signum, frame):
        Path(pids_file + ".stopped").write_text(signal.Signals(signum).name)
        for pid in (grandchild, cluster.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    tmp = pids_file + ".tmp"
    Path(tmp).write_text(json.dumps([os.getpid(), cluster.pid, grandchild]))
    os.replace(tmp, pids_file)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    # the demo runs ``<interpreter> -m recipe.exgrpo.main_exgrpo OVERRIDES...``
    sys.exit(main(sys.argv[3:] if sys.argv[1:3] == ["-m", "recipe.exgrpo.main_exgrpo"] else sys.argv[1:]))
