"""de.RedisTable on a 3-master Redis cluster (tests/redis_util.py): every op, keys spread
over storage_slice buckets as TFRA spreads them (one bucket per master by default),
and routing that follows a slot moved to another node; with replicas,
redis_read_access_slave sends lookups to them. Also sentinel mode: the table asks a
sentinel for the master's address (and, with redis_read_access_slave, a replica's)."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import DictModel, assert_table_matches, make_keys, make_values, rng_for
from redis_util import (  # noqa: F401 (fixtures)
    RedisServer, command_calls, is_replica, redis_cluster, redis_cluster_with_replicas,
    redis_config, require_redis, wait_replicated, write_config)


def cluster_config(tmp_path, nodes, **fields):
    return write_config(tmp_path, nodes[0].port, redis_connection_mode=0,
                        redis_host_ip=["127.0.0.1"] * len(nodes),
                        redis_host_port=[n.port for n in nodes], **fields)


def bucket_owner(nodes, bucket: bytes):
    """The node whose HLEN of `bucket` answers (the others redirect)."""
    owners = []
    for n in nodes:
        client = n.client()
        try:
            client.call("HLEN", bucket)
            owners.append(n.port)
        except RuntimeError:  # MOVED
            pass
        finally:
            client.close()
    return owners


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string], ids=lambda d: d.name)
def test_every_op_on_a_cluster(tmp_path, redis_cluster, key_dtype):
    path = cluster_config(tmp_path, redis_cluster, storage_slice=3)
    table = de.RedisTable(key_dtype, tf.float32, [0.0, 0.0], name="cemb", config=redis_config(path))
    model = DictModel(tf.float32, [2], np.zeros(2, np.float32))
    rng = rng_for("redis-cluster", key_dtype.name)
    keys = make_keys(rng, key_dtype, 3000)
    values = make_values(rng, tf.float32, (3000, 2))
    table.insert(keys, values)
    model.insert(keys, values)
    assert_table_matches(table, model)
    flags = rng.integers(0, 2, 3000).astype(bool)
    table.accum(keys, values, flags)
    model.accum(keys, values, flags)
    table.remove(keys[::4])
    model.remove(keys[::4])
    assert_table_matches(table, model)
    got, exists = table.lookup(keys, return_exists=True)
    want, want_exists = model.lookup(keys)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(exists.numpy(), want_exists)
    table.clear()
    assert int(table.size()) == 0


def test_buckets_spread_over_the_masters_in_tfra_layout(tmp_path, redis_cluster):
    path = cluster_config(tmp_path, redis_cluster, storage_slice=3, model_tag_runtime="cl")
    table = de.RedisTable(tf.int64, tf.float32, [0.0], name="spread", config=redis_config(path))
    keys = np.arange(30, dtype=np.int64)
    table.insert(keys, keys.reshape(-1, 1).astype(np.float32))
    names = set()
    for n in redis_cluster:
        client = n.client()
        names |= set(client.call("KEYS", "cl:spread*"))
        client.close()
    assert len(names) == 3
    owners = {port for name in names for port in bucket_owner(redis_cluster, name)}
    assert owners == {n.port for n in redis_cluster}  # one bucket per master
    # TFRA's bucket of an int64 key: (uint32)key % storage_slice, buckets in the order
    # of the masters' first slots.
    for b, bucket in enumerate(sorted(names, key=lambda b: _first_slot(redis_cluster, b))):
        for n in redis_cluster:
            client = n.client()
            try:
                fields = client.call("HKEYS", bucket)
            except RuntimeError:
                continue
            finally:
                client.close()
            assert sorted(struct.unpack("<q", f)[0] for f in fields) == list(range(b, 30, 3))


def _first_slot(nodes, bucket: bytes) -> int:
    client = nodes[0].client()
    slot = client.call("CLUSTER", "KEYSLOT", bucket)
    client.close()
    return slot


def test_routing_follows_a_moved_slot(tmp_path, redis_cluster):
    path = cluster_config(tmp_path, redis_cluster, storage_slice=1, model_tag_runtime="mv")
    table = de.RedisTable(tf.int64, tf.float32, [0.0], name="moving", config=redis_config(path))
    table.insert([1, 2], [[1.0], [2.0]])
    # Find the bucket, its slot and owner, and migrate the slot to another master.
    bucket = next(iter(k for n in redis_cluster for k in n.client().call("KEYS", "mv:moving*")))
    slot = _first_slot(redis_cluster, bucket)
    ids = {}
    for n in redis_cluster:
        c = n.client()
        ids[n.port] = c.call("CLUSTER", "MYID").decode()
        c.close()
    (source,) = [n for n in redis_cluster if bucket_owner(redis_cluster, bucket) == [n.port]]
    target = next(n for n in redis_cluster if n is not source)
    src, dst = source.client(), target.client()
    dst.call("CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source.port])
    src.call("CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target.port])
    # Every key of the slot moves (other tests' buckets may share slot 0).
    keys = src.call("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    assert bucket in keys
    assert src.call("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys) == b"OK"
    for n in [target, source] + [n for n in redis_cluster if n not in (source, target)]:
        c = n.client()
        c.call("CLUSTER", "SETSLOT", slot, "NODE", ids[target.port])
        c.close()
    src.close(), dst.close()
    # The table's map still names the source: it gets MOVED, re-reads the map, retries.
    np.testing.assert_array_equal(table.lookup([1, 2, 3]).numpy(), [[1.0], [2.0], [0.0]])
    table.insert([3], [[3.0]])
    assert int(table.size()) == 3


def test_sentinel_mode_finds_the_master(tmp_path):
    require_redis()
    master = RedisServer(str(tmp_path / "master"))
    sentinel = RedisServer(str(tmp_path / "sentinel"), sentinel_of=master)
    try:
        path = write_config(tmp_path, sentinel.port, redis_connection_mode=1,
                            redis_master_name="mymaster", model_tag_runtime="sent")
        table = de.RedisTable(tf.int64, tf.float32, [0.0], name="s", config=redis_config(path))
        table.insert([1, 2], [[1.0], [2.0]])
        assert master.client().call("HLEN", "sent:s{3560}") == 2
        wrong = write_config(tmp_path, sentinel.port, redis_connection_mode=1,
                             redis_master_name="nosuch")
        with pytest.raises(tf.errors.UnavailableError, match="no master named 'nosuch'"):
            de.RedisTable(tf.int64, tf.float32, [0.0], name="s", config=redis_config(wrong))
        # As in TFRA, sentinel mode (also the default) given a Redis server uses it.
        direct = write_config(tmp_path, master.port, redis_connection_mode=1,
                              model_tag_runtime="direct")
        de.RedisTable(tf.int64, tf.float32, [0.0], name="s", config=redis_config(direct)).insert(
            [1], [[1.0]])
        assert master.client().call("HLEN", "direct:s{3560}") == 1
    finally:
        sentinel.kill()
        master.kill()


def _cluster_buckets(nodes, pattern):
    """{bucket name: HLEN} over the cluster's masters."""
    found = {}
    for n in nodes:
        client = n.client()
        for name in client.call("KEYS", pattern):
            found[name] = client.call("HLEN", name)
        client.close()
    return found


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string], ids=lambda d: d.name)
def test_a_changed_storage_slice_moves_every_row_when_the_table_opens(tmp_path, redis_cluster,
                                                                      key_dtype):
    """TFRA's rehash: the table opens with storage_slice 3 over rows written with 2
    (storage_slice_import 2, one model tag): every row is found, and each is in exactly
    one bucket, its runtime one."""
    tag = f"rehash{key_dtype.name}"
    rng = rng_for("redis-rehash", key_dtype.name)
    keys = make_keys(rng, key_dtype, 500)
    values = make_values(rng, tf.float32, (500, 2))
    old = cluster_config(tmp_path, redis_cluster, storage_slice=2, model_tag_runtime=tag,
                         model_tag_import=tag)
    de.RedisTable(key_dtype, tf.float32, [0.0, 0.0], name="re", config=redis_config(old)).insert(
        keys, values)
    assert len(_cluster_buckets(redis_cluster, f"{tag}:re*")) == 2

    new = cluster_config(tmp_path, redis_cluster, storage_slice=3, storage_slice_import=2,
                         model_tag_runtime=tag, model_tag_import=tag)
    table = de.RedisTable(key_dtype, tf.float32, [-1.0, -1.0], name="re", config=redis_config(new))
    got, exists = table.lookup(keys, return_exists=True)
    assert exists.numpy().all()
    np.testing.assert_array_equal(got.numpy(), values)
    buckets = _cluster_buckets(redis_cluster, f"{tag}:re*")
    assert len(buckets) == 3 and sum(buckets.values()) == 500 == int(table.size())

    # Opening again (every shard of a variable opens its table) moves nothing more.
    again = de.RedisTable(key_dtype, tf.float32, [0.0, 0.0], name="re", config=redis_config(new))
    assert _cluster_buckets(redis_cluster, f"{tag}:re*") == buckets and int(again.size()) == 500


def test_without_storage_slice_import_nothing_moves(tmp_path, redis_cluster):
    """As TFRA: storage_slice_import unset means the layout did not change; the rows
    of the old buckets stay where they are (so set it when changing storage_slice)."""
    tag = "norehash"
    old = cluster_config(tmp_path, redis_cluster, storage_slice=2, model_tag_runtime=tag,
                         model_tag_import=tag)
    de.RedisTable(tf.int64, tf.float32, [0.0], name="nr", config=redis_config(old)).insert(
        np.arange(20, dtype=np.int64), np.ones([20, 1], np.float32))
    before = _cluster_buckets(redis_cluster, f"{tag}:nr*")
    new = cluster_config(tmp_path, redis_cluster, storage_slice=3, model_tag_runtime=tag,
                         model_tag_import=tag)
    de.RedisTable(tf.int64, tf.float32, [0.0], name="nr", config=redis_config(new))
    assert {k: v for k, v in _cluster_buckets(redis_cluster, f"{tag}:nr*").items()
            if k in before} == before


def test_lookups_read_the_replicas_with_redis_read_access_slave(tmp_path,
                                                                redis_cluster_with_replicas):
    nodes = redis_cluster_with_replicas
    masters = [n for n in nodes if not is_replica(n)]
    replicas = [n for n in nodes if is_replica(n)]
    assert len(masters) == len(replicas) == 3
    path = cluster_config(tmp_path, nodes, storage_slice=3, redis_read_access_slave=True,
                          model_tag_runtime="replicas")
    table = de.RedisTable(tf.int64, tf.float32, [0.0, 0.0], name="ro", config=redis_config(path))
    keys = np.arange(1, 3001, dtype=np.int64)
    values = np.stack([keys, -keys], axis=1).astype(np.float32)
    table.insert(keys, values)  # writes go to the masters
    wait_replicated(masters)
    before = {n.port: command_calls(n, "hmget") for n in nodes}
    got, exists = table.lookup(keys, return_exists=True)
    assert exists.numpy().all()
    np.testing.assert_array_equal(got.numpy(), values)
    read = {n.port: command_calls(n, "hmget") - before[n.port] for n in nodes}
    assert all(read[m.port] == 0 for m in masters), read
    assert all(read[r.port] > 0 for r in replicas), read  # one bucket per master

    # Accum reads and writes the masters (a replica's row may be a write behind).
    table.accum(keys[:10], values[:10], np.ones(10, bool))
    wait_replicated(masters)
    np.testing.assert_array_equal(table.lookup(keys[:10]).numpy(), 2 * values[:10])

    # Without the field, lookups read the masters.
    plain = de.RedisTable(tf.int64, tf.float32, [0.0, 0.0], name="ro", config=redis_config(
        cluster_config(tmp_path, nodes, storage_slice=3, model_tag_runtime="replicas")))
    before = {n.port: command_calls(n, "hmget") for n in nodes}
    np.testing.assert_array_equal(plain.lookup(keys[10:]).numpy(), values[10:])
    read = {n.port: command_calls(n, "hmget") - before[n.port] for n in nodes}
    assert all(read[r.port] == 0 for r in replicas) and sum(read.values()) > 0, read


def test_sentinel_lookups_read_a_replica_with_redis_read_access_slave(tmp_path):
    require_redis()
    master = RedisServer(str(tmp_path / "master"))
    replica = RedisServer(str(tmp_path / "replica"),
                          args=["--replicaof", "127.0.0.1", str(master.port)])
    sentinel = RedisServer(str(tmp_path / "sentinel"), sentinel_of=master)
    try:
        # A sentinel learns of replicas from the master's INFO (every 10 s at most).
        client = sentinel.client()
        deadline = time.time() + 30
        while time.time() < deadline:
            known = client.call("SENTINEL", "replicas", "mymaster")
            if any(dict(zip(r[::2], r[1::2])).get(b"master-link-status") == b"ok"
                   for r in known):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the sentinel never listed the replica as up")
        client.close()
        path = write_config(tmp_path, sentinel.port, redis_connection_mode=1,
                            redis_master_name="mymaster", redis_read_access_slave=True)
        table = de.RedisTable(tf.int64, tf.float32, [0.0], name="sr", config=redis_config(path))
        table.insert([1, 2], [[1.0], [2.0]])
        wait_replicated([master])
        before = command_calls(master, "hmget"), command_calls(replica, "hmget")
        np.testing.assert_array_equal(table.lookup([2, 1, 3]).numpy(), [[2.0], [1.0], [0.0]])
        assert command_calls(master, "hmget") == before[0]
        assert command_calls(replica, "hmget") > before[1]
    finally:
        sentinel.kill()
        replica.kill()
        master.kill()
