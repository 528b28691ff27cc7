"""Two Ray nodes on one machine, started with ``scripts/train/common.sh ray-head`` / ``ray-worker``: the dashboard
listens on 127.0.0.1 only, token authentication is on, a worker without the token (or with a wrong one) is
refused by the head, and one with the token joins.

Each node gets its own home directory (where Ray keeps ``~/.ray/auth_token``) and its own temp dir. Clean-up
kills exactly the processes whose command line names those temp dirs (never ``ray stop``, which would stop
every Ray process of the user on this machine).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from recipe.exgrpo.harness.procs import RAY_STARTUP_PAUSE_S, RAY_STARTUP_RETRIES, RAY_STARTUP_TIMEOUT

REPO = Path(__file__).resolve().parents[2]
COMMON = REPO / "scripts" / "train" / "common.sh"
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS", "RAY_DASHBOARD_HOST")
NODE_OPTS = ("--num-cpus=1", "--disable-usage-stats", "--object-store-memory=100000000")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.dashboard_port = free_port()
        self.temp_dirs: list[str] = []

    def env(self, home: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in AUTH_ENV}
        Path(self.root / home).mkdir(exist_ok=True)
        env.update(HOME=str(self.root / home), PYTHON=sys.executable, N_GPUS_PER_NODE="0", RAY_PORT=str(self.port))
        env.update(extra)
        return env

    def temp_dir(self, name: str) -> str:
        path = str(self.root / name)  # short: Ray's socket paths must stay under ~107 characters
        self.temp_dirs.append(path)
        return path

    def run(self, cmd: list[str], env: dict[str, str], timeout: float = 150) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)

    def processes(self, temp_dirs: list[str] | None = None) -> list[psutil.Process]:
        """The processes of these nodes (default: all of the cluster's): their command lines name a node's temp dir,
        or, for the whole cluster, the head's GCS address (the head's Ray client server names only that)."""
        marks = list(self.temp_dirs if temp_dirs is None else temp_dirs)
        if temp_dirs is None:
            marks.append(f":{self.port} ")
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                line = " ".join(proc.info["cmdline"] or []) + " "
            except psutil.Error:
                continue
            if any(t in line for t in marks):
                found.append(proc)
        return found

    def kill(self, temp_dirs: list[str] | None = None) -> list[int]:
        procs = self.processes(temp_dirs)
        for proc in procs:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=30)
        return [p.pid for p in self.processes(temp_dirs) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    def start_node(self, cmd: Callable[[], list[str]], env: Callable[[], dict[str, str]], temp_dir: str):
        """Run a node's start command (``cmd()`` with ``env()``, rebuilt per attempt); started again, after its
        processes are killed, when it fails only because Ray's node missed ``ray.init``'s fixed 30 s start-up
        deadline (a loaded machine: the suite's other sessions share the cores; the recipe's launcher retries
        the same way, recipe/exgrpo/harness/procs.py). Returns the last attempt's result and its env."""
        for attempt in range(1, RAY_STARTUP_RETRIES + 2):
            run_env = env()
            proc = self.run(cmd(), run_env)
            if proc.returncode == 0 or RAY_STARTUP_TIMEOUT not in proc.stderr or attempt > RAY_STARTUP_RETRIES:
                return proc, run_env
            self.kill([temp_dir])
            shutil.rmtree(temp_dir, ignore_errors=True)
            time.sleep(random.uniform(*RAY_STARTUP_PAUSE_S))
        raise AssertionError("unreachable")


def alive_nodes(cluster: Cluster, env: dict[str, str]) -> int:
    code = (
        f"import ray; ray.init(address='127.0.0.1:{cluster.port}', logging_level='ERROR', log_to_driver=False); "
        "print(sum(bool(n['Alive']) for n in ray.nodes()))"
    )
    proc = cluster.run([sys.executable, "-c", code], env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return int(proc.stdout.strip().splitlines()[-1])


def http_status(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_two_nodes_token_authentication_and_loopback_dashboard():
    if shutil.which("bash") is None:
        pytest.skip("bash is not available")
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="exgra-", dir="/tmp")))
    try:
        # head: the script creates the token and binds the dashboard to loopback
        head_dir = cluster.temp_dir("th")

        def head_cmd() -> list[str]:
            cluster.dashboard_port = free_port()  # a fresh pair per attempt: a killed node's ports may linger
            return [
                *("bash", str(COMMON), "ray-head", f"--temp-dir={head_dir}", *NODE_OPTS),
                *("--include-dashboard=true", f"--dashboard-port={cluster.dashboard_port}"),
            ]

        def make_head_env() -> dict[str, str]:
            cluster.port = free_port()
            return cluster.env("head")

        head, head_env = cluster.start_node(head_cmd, make_head_env, head_dir)
        assert head.returncode == 0, head.stderr[-4000:]
        token_file = cluster.root / "head" / ".ray" / "auth_token"
        assert token_file.is_file() and (token_file.stat().st_mode & 0o777) == 0o600
        token = token_file.read_text().strip()
        assert len(token) == 64
        assert "--dashboard-host=127.0.0.1" in head.stderr

        listening = {
            c.laddr.ip
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == cluster.dashboard_port
        }
        assert listening == {"127.0.0.1"}, f"dashboard listens on {listening}"
        jobs = f"http://127.0.0.1:{cluster.dashboard_port}/api/jobs/"
        assert http_status(jobs) == 401, "the Jobs API answered without the token"
        assert http_status(jobs, token) == 200

        # a worker without the token, and one with a wrong token: refused by the head (plain ray CLI, so it is
        # the cluster that refuses, not the script)
        address = f"127.0.0.1:{cluster.port}"
        no_token = cluster.run(
            [*RAY_CLI, "start", f"--address={address}", f"--temp-dir={cluster.temp_dir('w1')}", *NODE_OPTS],
            cluster.env("w1"),
        )
        assert no_token.returncode != 0, "a worker without the token joined"
        assert "InvalidAuthToken" in no_token.stderr + no_token.stdout, no_token.stderr[-3000:]
        wrong = cluster.run(
            [*RAY_CLI, "start", f"--address={address}", f"--temp-dir={cluster.temp_dir('w2')}", *NODE_OPTS],
            cluster.env("w2", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64),
        )
        assert wrong.returncode != 0, "a worker with a wrong token joined"
        assert "InvalidAuthToken" in wrong.stderr + wrong.stdout, wrong.stderr[-3000:]

        # the script refuses to start a worker that has no token, naming what to do
        script_no_token = cluster.run(["bash", str(COMMON), "ray-worker", address, *NODE_OPTS], cluster.env("w3"))
        assert script_no_token.returncode == 2 and "no Ray auth token on this node" in script_no_token.stderr

        # a worker with the token (here from the head's file, as a shared home directory would give it) joins
        w4 = cluster.temp_dir("w4")
        joined, _ = cluster.start_node(
            lambda: ["bash", str(COMMON), "ray-worker", address, f"--temp-dir={w4}", *NODE_OPTS],
            lambda: cluster.env("w4", RAY_AUTH_TOKEN_PATH=str(token_file)),
            w4,
        )
        assert joined.returncode == 0, joined.stderr[-4000:]
        deadline = time.monotonic() + 60
        while (n := alive_nodes(cluster, cluster.env("driver", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token))) < 2:
            assert time.monotonic() < deadline, f"{n} node(s) alive, the worker with the token did not join"
            time.sleep(2)
        assert n == 2
        status = cluster.run(["bash", str(COMMON), "ray-status", f"--address={address}"], head_env, timeout=120)
        assert status.returncode == 0, status.stderr[-3000:]
    finally:
        left = cluster.kill()
        shutil.rmtree(cluster.root, ignore_errors=True)
    assert left == [], f"Ray processes of the test survived the clean-up: {left}"
