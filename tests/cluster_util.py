"""A local TensorFlow cluster for the distributed tests: every task is its own process
running `tf.distribute.Server` on a loopback port (`dist_worker.py`).

Ports are picked by binding to port 0 first. Every process started here is killed when
its `LocalCluster` closes (or at interpreter exit), so a failed test leaves nothing
running.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")

_LIVE: List[subprocess.Popen] = []


def _kill_all() -> None:
    for proc in list(_LIVE):
        _kill(proc)


atexit.register(_kill_all)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not hang
            pass
    if proc in _LIVE:
        _LIVE.remove(proc)


def free_ports(n: int) -> List[int]:
    """`n` distinct free loopback ports (bound to port 0, then released)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def make_cluster(num_workers: int, num_ps: int, chief: bool = True) -> Dict[str, List[str]]:
    ports = iter(free_ports(int(chief) + num_workers + num_ps))
    spec: Dict[str, List[str]] = {}
    if chief:
        spec["chief"] = [f"127.0.0.1:{next(ports)}"]
    if num_workers:
        spec["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(num_workers)]
    spec["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(num_ps)]
    return spec


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + os.path.dirname(WORKER) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)
    env.pop("TF_USE_LEGACY_KERAS", None)
    return env


def start(
    mode: str,
    args: Dict[str, Any],
    log_path: str,
    script: str = WORKER,
    env: Optional[Dict[str, str]] = None,
) -> subprocess.Popen:
    """Starts `<script> mode '<json args>'` (default `dist_worker.py`) in its own process
    group, with `env` added to the environment."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        # -X faulthandler: a crash (SIGSEGV in TF) logs every thread's Python stack.
        [sys.executable, "-X", "faulthandler", script, mode, json.dumps(args)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=dict(_env(), **(env or {})),
        start_new_session=True,
    )
    log.close()
    _LIVE.append(proc)
    return proc


def child_main(modes: Dict[str, Callable[[Dict[str, Any]], Any]], argv: List[str]) -> str:
    """The main of a child that `start` ran: runs `modes[argv[1]]` on the JSON arguments
    `argv[2]` and prints its result, or `{"error": <traceback>}`, as one JSON line (what
    `result_of` reads). Returns the mode."""
    mode, args = argv[1], json.loads(argv[2])
    try:
        result = modes[mode](args)
    except Exception:
        result = {"error": traceback.format_exc()}
    # One write() of the whole line: with PYTHONUNBUFFERED, print() writes the text and
    # its newline apart, and a TF / gRPC thread logging to stderr (the same log file)
    # could land between them, on the result's line (seen: a PS-failover run whose line
    # ended in a "Failed to connect" log message).
    sys.stdout.flush()
    line = memoryview((json.dumps(result) + "\n").encode())
    while line:
        line = line[os.write(sys.stdout.fileno(), line):]
    return mode


def result_of(proc: subprocess.Popen, log_path: str, timeout: float) -> Any:
    """Waits for `proc` and returns the JSON object on its last output line; kills it
    and fails with its log on timeout or error."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise AssertionError(f"{log_path}: timed out after {timeout}s\n{_tail(log_path)}")
    finally:
        if proc in _LIVE and proc.poll() is not None:
            _LIVE.remove(proc)
    out = _tail(log_path, limit=None)  # the result line may be long
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{log_path}: exit code {proc.returncode}\n{out[-20000:]}")
    result = json.loads(lines[-1])
    if isinstance(result, dict) and "error" in result:
        raise AssertionError(f"{log_path}: failed:\n{result['error']}")
    return result


def _tail(path: str, limit: Optional[int] = 20000) -> str:
    with open(path, "rb") as f:
        data = f.read()
    return (data if limit is None else data[-limit:]).decode("utf-8", "replace")


class LocalCluster:
    """Parameter servers of `spec` as processes (`dist_worker.py ps`); the other tasks
    are started by the test with `run_task`."""

    def __init__(self, spec: Dict[str, List[str]], workdir: str, tag: str = "c"):
        self.spec = spec
        self.workdir = workdir
        self.tag = tag
        self.ps: List[Optional[subprocess.Popen]] = []
        for i in range(len(spec.get("ps", []))):
            self.ps.append(self.start_ps(i))

    def log(self, job: str, index: int) -> str:
        return os.path.join(self.workdir, f"{self.tag}-{job}{index}.log")

    def start_ps(self, index: int) -> subprocess.Popen:
        return start("ps", {"cluster": self.spec, "index": index}, self.log("ps", index))

    def kill_ps(self, index: int) -> None:
        _kill(self.ps[index])

    def restart_ps(self, index: int) -> None:
        self.ps[index] = self.start_ps(index)

    def run_task(self, mode: str, job: str, index: int, **args) -> subprocess.Popen:
        args = dict(args, cluster=self.spec, job=job, index=index, workdir=self.workdir)
        return start(mode, args, self.log(job, index))

    @contextlib.contextmanager
    def worker_servers(self) -> Iterator[List[subprocess.Popen]]:
        """The spec's workers as plain servers (`dist_worker.py server`), for a chief whose
        ParameterServerStrategy schedules onto them; killed on exit."""
        workers = [
            start("server", {"cluster": self.spec, "job": "worker", "index": i}, self.log("worker", i))
            for i in range(len(self.spec.get("worker", [])))
        ]
        try:
            yield workers
        finally:
            for proc in workers:
                _kill(proc)

    def close(self) -> None:
        for proc in self.ps:
            if proc is not None:
                _kill(proc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_for_file(path: str, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.1)
    return False
