"""Real Redis servers for the Redis table tests (tests/test_redis_*.py): a single node or
a 3-node cluster of `redis-server` processes on free ports, a minimal RESP client to
look at what the table wrote (byte for byte), and config-file helpers.

The fixtures skip, with a reason that says what to install, where `redis-server` is
missing or the op library was built without hiredis.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional

import pytest

_TAGS = itertools.count()


def free_port() -> int:
    """A TCP port nothing listens on now (and, for a cluster, whose +10000 bus port is
    free too)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server did not start on port {port} within {timeout} s")


class Resp:
    """A minimal blocking RESP2 client: `call(*args)` returns bytes, int, list or None,
    and raises `RuntimeError` on an error reply."""

    def __init__(self, port: int, password: Optional[str] = None):
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self._buf = b""
        if password:
            self.call("AUTH", password)

    def close(self) -> None:
        self._sock.close()

    def call(self, *args) -> Any:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self._sock.sendall(b"".join(out))
        return self._read()

    def _line(self) -> bytes:
        while b"\r\n" not in self._buf:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self._buf) < n + 2:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed")
            self._buf += chunk
        data, self._buf = self._buf[:n], self._buf[n + 2:]
        return data

    def _read(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError(f"unexpected RESP line {line!r}")


class RedisServer:
    """One `redis-server` process (no persistence) in `directory`; with `sentinel_of`
    (a RedisServer), a sentinel monitoring that server as master `master_name`."""

    def __init__(self, directory: str, port: Optional[int] = None, args: List[str] = (),
                 sentinel_of: Optional["RedisServer"] = None, master_name: str = "mymaster"):
        self.directory = directory
        self.port = port or free_port()
        self.args = list(args)
        self.sentinel_of = sentinel_of
        self.master_name = master_name
        self.process: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        os.makedirs(self.directory, exist_ok=True)
        if self.sentinel_of is not None:
            conf = os.path.join(self.directory, f"sentinel_{self.port}.conf")
            with open(conf, "w") as f:
                f.write(f"port {self.port}\nbind 127.0.0.1\nsentinel monitor {self.master_name} "
                        f"127.0.0.1 {self.sentinel_of.port} 1\n")
            argv = ["redis-server", conf, "--sentinel"]
        else:
            argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", self.directory, *self.args]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port)

    def kill(self) -> None:
        """Ends the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (a hung node)."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)

    def client(self, password: Optional[str] = None) -> Resp:
        return Resp(self.port, password)

    def ask(self, *args) -> Any:
        """One command on a connection of its own."""
        client = self.client()
        try:
            return client.call(*args)
        finally:
            client.close()


def write_config(directory, port, **fields) -> str:
    """Writes a Redis config JSON file for a server on `port` (standalone unless
    `redis_connection_mode` says otherwise) into `directory`; returns its path. A
    fresh `model_tag_runtime` per call (unless given) keeps tests apart."""
    config: Dict[str, Any] = {
        "redis_connection_mode": 2,
        "redis_host_ip": ["127.0.0.1"],
        "redis_host_port": [port],
        "model_tag_runtime": f"t{os.getpid()}_{next(_TAGS)}",
        "redis_connect_timeout": 500,
        "redis_socket_timeout": 2000,
    }
    config.update(fields)
    path = os.path.join(str(directory), f"redis_{next(_TAGS)}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    return path


def redis_config(path: str):
    """A de.RedisTableConfig of the file at `path`."""
    import tensorflow_dynemb as de  # lazily: benchmarks/redis_ops.py's parent has no TF

    return de.RedisTableConfig(redis_config_abs_dir=path)


def require_redis() -> None:
    """Skips the calling test where the Redis table cannot run here."""
    from tensorflow_dynemb.tables.redis import redis_available

    if not redis_available():
        pytest.skip("the op library was built without hiredis (apt-get install libhiredis-dev, rebuild)")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A single-node Redis server for the module's tests."""
    require_redis()
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    yield server
    server.kill()


def _cluster_info(node: RedisServer) -> bytes:
    return node.ask("CLUSTER", "INFO")


def _cluster_slots(node: RedisServer) -> list:
    return node.ask("CLUSTER", "SLOTS")


def _start_cluster(root, replicas: int) -> List[RedisServer]:
    """3 masters (and `replicas` replicas of each) made a cluster by `redis-cli --cluster
    create`; the nodes' servers, once every node sees the cluster as ok."""
    require_redis()
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed (apt-get install redis-tools)")
    nodes = [
        RedisServer(str(root / f"n{i}"), args=["--cluster-enabled", "yes",
                                               "--cluster-config-file", "nodes.conf",
                                               "--cluster-node-timeout", "2000"])
        for i in range(3 * (1 + replicas))
    ]
    try:
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes],
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        deadline = time.time() + 30
        # Every node must see the whole cluster, replicas included (gossip brings them
        # into CLUSTER SLOTS a little after cluster_state:ok).
        while time.time() < deadline:
            if all(b"cluster_state:ok" in _cluster_info(n) and
                   all(len(r) == 3 + replicas for r in _cluster_slots(n)) for n in nodes):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("the Redis cluster did not reach cluster_state:ok")
    except BaseException:
        for n in nodes:
            n.kill()
        raise
    return nodes


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    """A 3-master Redis cluster; its nodes' servers."""
    nodes = _start_cluster(tmp_path_factory.mktemp("redis_cluster"), replicas=0)
    yield nodes
    for n in nodes:
        n.kill()


@pytest.fixture(scope="module")
def redis_cluster_with_replicas(tmp_path_factory):
    """A 3-master Redis cluster with one replica of each master; its 6 nodes' servers."""
    nodes = _start_cluster(tmp_path_factory.mktemp("redis_cluster_r"), replicas=1)
    yield nodes
    for n in nodes:
        n.kill()


def command_calls(server: RedisServer, command: str) -> int:
    """How many times `server` has run `command` (INFO commandstats)."""
    info = server.ask("INFO", "commandstats").decode()
    for line in info.splitlines():
        if line.startswith(f"cmdstat_{command.lower()}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def is_replica(server: RedisServer) -> bool:
    return b"role:slave" in server.ask("INFO", "replication")


def wait_replicated(masters: List[RedisServer], timeout_ms: int = 5000) -> None:
    """Until every master's writes so far reached its replicas (WAIT)."""
    for m in masters:
        m.ask("WAIT", "1", str(timeout_ms))
