"""de.RedisTable's errors: bad configs name the field, an unreachable, killed or hung
server is an UnavailableError within the config's timeouts (never a hang), a refused
password names redis_password, a full Redis is a ResourceExhaustedError, and a build
without hiredis says how to enable the table."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.tables import redis as redis_module
from redis_util import (  # noqa: F401 (fixture)
    RedisServer, free_port, redis_config, redis_server, require_redis, write_config)


def table_of(path, name="emb", dim=2):
    return de.RedisTable(tf.int64, tf.float32, [0.0] * dim, name=name, config=redis_config(path))


def test_a_build_without_hiredis_says_how_to_enable_it(monkeypatch):
    monkeypatch.setattr(redis_module, "redis_available", lambda: False)
    with pytest.raises(NotImplementedError, match="apt-get install libhiredis-dev.*rebuild"):
        de.RedisTable(tf.int64, tf.float32, 0.0)


def test_unreachable_server_fails_fast(tmp_path):
    require_redis()
    path = write_config(tmp_path, free_port(), redis_connect_timeout=300)
    start = time.time()
    with pytest.raises(tf.errors.UnavailableError, match="cannot connect to Redis at 127.0.0.1"):
        table_of(path)
    assert time.time() - start < 5


def test_a_server_that_never_answers_times_out(tmp_path):
    require_redis()
    # A listening socket nobody reads: connecting works, the first command gets no reply.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        path = write_config(tmp_path, silent.getsockname()[1], redis_socket_timeout=300)
        start = time.time()
        with pytest.raises(tf.errors.UnavailableError, match="within redis_socket_timeout 300 ms"):
            table_of(path)
        assert time.time() - start < 5


def test_malformed_json_names_line_and_column(tmp_path):
    require_redis()
    path = tmp_path / "bad.json"
    path.write_text('{"redis_host_ip": ["127.0.0.1"],\n "redis_host_port": [6379,}\n')
    with pytest.raises(ValueError, match=r"malformed JSON .*bad.json.* line 2"):
        table_of(str(path))


@pytest.mark.parametrize("field,value,expected", [
    ("redis_host_port", "six", "an array of integers"),
    ("redis_host_port", [0], r"in \[1, 65535\]"),
    ("storage_slice", 0, ">= 1"),
    ("redis_connection_mode", 7, "0 \\(cluster\\)"),
    ("redis_password", 5, "a string"),
    ("redis_hash_tags_import", "[]", "an array of strings"),
    ("redis_host_ip", "127.0.0.1", "an array of strings"),
    ("using_md5_prefix_name", "yes", "true or false"),
    ("keys_sending_size", 1.5, "an integer"),
])
def test_bad_fields_are_named(tmp_path, redis_server, field, value, expected):
    path = write_config(tmp_path, redis_server.port, **{field: value})
    with pytest.raises(tf.errors.InvalidArgumentError, match=f'field "{field}" must be {expected}'):
        table_of(path)


def test_config_file_lookup_order(tmp_path, redis_server, monkeypatch):
    good = write_config(tmp_path, redis_server.port)
    monkeypatch.delenv("TFRA_REDIS_CONFIG_PATH", raising=False)
    monkeypatch.delenv("MY_REDIS_CONFIG", raising=False)
    with pytest.raises(ValueError, match="environment variable MY_REDIS_CONFIG is not set"):
        de.RedisTable(tf.int64, tf.float32, 0.0,
                      config=de.RedisTableConfig(redis_config_abs_dir_env="MY_REDIS_CONFIG"))
    monkeypatch.setenv("MY_REDIS_CONFIG", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="missing.json.*does not exist"):
        de.RedisTable(tf.int64, tf.float32, 0.0,
                      config=de.RedisTableConfig(redis_config_abs_dir_env="MY_REDIS_CONFIG"))
    with pytest.raises(ValueError, match="names no config file"):
        de.RedisTable(tf.int64, tf.float32, 0.0, config=de.RedisTableConfig())
    # TFRA_REDIS_CONFIG_PATH wins over redis_config_abs_dir.
    monkeypatch.setenv("TFRA_REDIS_CONFIG_PATH", good)
    table = de.RedisTable(tf.int64, tf.float32, 0.0,
                          config=de.RedisTableConfig(redis_config_abs_dir="/nonexistent.json"))
    table.insert([1], [1.0])
    assert int(table.size()) == 1


def test_password(tmp_path):
    require_redis()
    server = RedisServer(str(tmp_path / "auth"), args=["--requirepass", "s3cret"])
    try:
        with pytest.raises(tf.errors.InvalidArgumentError, match="redis_password"):
            table_of(write_config(tmp_path, server.port, redis_password="wrong"))
        with pytest.raises(tf.errors.InvalidArgumentError, match="requires a password"):
            table_of(write_config(tmp_path, server.port))
        table = table_of(write_config(tmp_path, server.port, redis_password="s3cret"))
        table.insert([1], [[1.0, 2.0]])
        assert table.lookup([1]).numpy().tolist() == [[1.0, 2.0]]
    finally:
        server.kill()


def test_killed_server_is_unavailable_and_a_restart_reconnects(tmp_path):
    require_redis()
    server = RedisServer(str(tmp_path / "kill"))
    try:
        table = table_of(write_config(tmp_path, server.port))
        table.insert([1, 2], [[1, 1], [2, 2]])
        server.kill()
        for op in (lambda: table.lookup([1]), lambda: table.insert([3], [[3, 3]]),
                   lambda: table.size(), lambda: table.clear(), lambda: table.export(),
                   lambda: table.accum([1], [[1, 1]], [True]), lambda: table.remove([1])):
            start = time.time()
            with pytest.raises(tf.errors.UnavailableError, match="Redis at 127.0.0.1"):
                op()
            assert time.time() - start < 5
        server.start()  # same port, empty (no persistence)
        table.insert([5], [[5, 5]])  # pooled connections are dead: reconnects
        assert table.lookup([5]).numpy().tolist() == [[5, 5]]
    finally:
        server.kill()


def _client_ids(server, own):
    """The ids of the server's client connections other than `own`'s."""
    lines = own.call("CLIENT", "LIST").decode().splitlines()
    mine = own.call("CLIENT", "ID")
    ids = {int(field[3:]) for line in lines for field in line.split() if field.startswith("id=")}
    return ids - {mine}


# The connection pool is the C++ Redis client's; the test sleeps a minute (the
# shortest lifetime): CI runs it with its first TensorFlow.
@pytest.mark.once_in_ci
@pytest.mark.slow
def test_connections_are_replaced_after_redis_connection_lifetime(tmp_path, redis_server):
    """redis_connection_lifetime (minutes) bounds how long a pooled connection lives: the
    first use after it closes the old connection and opens a new one."""
    own = redis_server.client()
    table = table_of(write_config(tmp_path, redis_server.port, redis_connection_lifetime=1,
                                  redis_conn_pool_size=1))
    table.insert([1], [[1, 1]])
    first = _client_ids(redis_server, own)
    table.lookup([1])
    assert _client_ids(redis_server, own) == first  # reused within the lifetime
    time.sleep(61)
    assert table.lookup([1]).numpy().tolist() == [[1, 1]]
    later = _client_ids(redis_server, own)
    assert later and not (later & first)
    own.close()


def test_hung_server_times_out(tmp_path):
    require_redis()
    server = RedisServer(str(tmp_path / "hung"))
    try:
        table = table_of(write_config(tmp_path, server.port, redis_socket_timeout=400))
        table.insert([1], [[1, 1]])
        server.stop()
        start = time.time()
        with pytest.raises(tf.errors.UnavailableError, match="redis_socket_timeout"):
            table.lookup([1])
        assert time.time() - start < 5
        server.resume()
        assert table.lookup([1]).numpy().tolist() == [[1, 1]]
    finally:
        server.resume()
        server.kill()


def test_full_redis_is_resource_exhausted(tmp_path):
    require_redis()
    server = RedisServer(str(tmp_path / "full"),
                         args=["--maxmemory", "3mb", "--maxmemory-policy", "noeviction"])
    try:
        table = table_of(write_config(tmp_path, server.port), dim=64)
        rows = np.ones((5000, 64), np.float32)
        with pytest.raises(tf.errors.ResourceExhaustedError, match="maxmemory"):
            for i in range(40):  # 40 x 1.3 MB > 3 MB
                table.insert(np.arange(i * 5000, (i + 1) * 5000, dtype=np.int64), rows)
        # What Redis accepted is still there and readable.
        assert int(table.size()) > 0
    finally:
        server.kill()
