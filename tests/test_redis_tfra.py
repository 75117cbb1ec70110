"""Interoperability with TFRA's RedisTable through a real redis-server: TFRA writes and we
read, we write and TFRA reads, each side in its own process. TFRA needs TF 2.16, so it
runs in the interpreter named by DYNEMB_TFRA_PYTHON (a virtualenv with TFRA 0.8.1); the
tests skip without it."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from redis_util import (  # noqa: F401 (fixtures)
    redis_cluster, redis_config, redis_server, write_config)

TFRA_PYTHON = os.environ.get("DYNEMB_TFRA_PYTHON")

pytestmark = pytest.mark.skipif(
    not TFRA_PYTHON or not os.path.exists(TFRA_PYTHON),
    reason="DYNEMB_TFRA_PYTHON does not name a Python with TFRA 0.8.1 installed",
)


def run_tfra(script: str, config: str) -> dict:
    """Runs `script` under TFRA (`de` is TFRA's dynamic_embedding, `cfg` the config);
    the JSON it prints last."""
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        import tensorflow as tf
        from tensorflow_recommenders_addons import dynamic_embedding as de
        cfg = de.RedisTableConfig(redis_config_abs_dir=sys.argv[1])
    """) + textwrap.dedent(script)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH="")
    proc = subprocess.run([TFRA_PYTHON, "-c", code, config], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("storage_slice", [1, 2])
def test_tfra_writes_we_read(tmp_path, redis_server, storage_slice):
    path = write_config(tmp_path, redis_server.port, storage_slice=storage_slice)
    run_tfra("""
        t = de.RedisTable(tf.int64, tf.float32, tf.zeros([3]), name="ints", config=cfg)
        t.insert(tf.constant([1, -2, 2**40], tf.int64), tf.reshape(tf.range(9, dtype=tf.float32), [3, 3]))
        s = de.RedisTable(tf.string, tf.float64, tf.zeros([1], tf.float64), name="strs", config=cfg)
        s.insert(tf.constant(["a", "bc"]), tf.constant([[1.5], [2.5]], tf.float64))
        print(json.dumps({"size": int(t.size())}))
    """, path)
    ints = de.RedisTable(tf.int64, tf.float32, [0.0] * 3, name="ints", config=redis_config(path))
    np.testing.assert_array_equal(ints.lookup([1, -2, 2**40, 5]).numpy(),
                                  [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 0, 0]])
    assert int(ints.size()) == 3
    strs = de.RedisTable(tf.string, tf.float64, [0.0], name="strs", config=redis_config(path))
    np.testing.assert_array_equal(strs.lookup(["bc", "a", "z"]).numpy(), [[2.5], [1.5], [0.0]])


def test_we_write_tfra_reads(tmp_path, redis_server):
    path = write_config(tmp_path, redis_server.port)
    ints = de.RedisTable(tf.int64, tf.float32, [0.0] * 2, name="ours", config=redis_config(path))
    ints.insert([3, 4], [[1.0, 2.0], [3.0, 4.0]])
    ints.accum([3, 5], [[1.0, 1.0], [5.0, 5.0]], [True, False])
    strs = de.RedisTable(tf.string, tf.int32, [0], name="ours_s", config=redis_config(path))
    strs.insert(["x", ""], [[7], [8]])
    got = run_tfra("""
        t = de.RedisTable(tf.int64, tf.float32, tf.zeros([2]), name="ours", config=cfg)
        s = de.RedisTable(tf.string, tf.int32, tf.zeros([1], tf.int32), name="ours_s", config=cfg)
        print(json.dumps({
            "ints": t.lookup(tf.constant([3, 4, 5, 6], tf.int64)).numpy().tolist(),
            "size": int(t.size()),
            "strs": s.lookup(tf.constant(["x", "", "y"])).numpy().tolist(),
        }))
    """, path)
    assert got == {"ints": [[2.0, 3.0], [3.0, 4.0], [5.0, 5.0], [0.0, 0.0]], "size": 3,
                   "strs": [[7], [8], [0]]}


def test_a_variable_tfra_trained_is_read_by_ours(tmp_path, redis_server):
    path = write_config(tmp_path, redis_server.port)
    got = run_tfra("""
        var = de.get_variable("shared_emb", tf.int64, tf.float32, dim=4,
                              initializer=tf.keras.initializers.Constant(0.5),
                              kv_creator=de.RedisTableCreator(cfg))
        ids = tf.constant([1, 2, 3], tf.int64)
        var.upsert(ids, tf.reshape(tf.range(12, dtype=tf.float32), [3, 4]))
        print(json.dumps({"rows": var.lookup(ids).numpy().tolist()}))
    """, path)
    ours = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=4, name="shared_emb",
                       kv_creator=de.RedisTableCreator(redis_config(path)))
    np.testing.assert_array_equal(ours.lookup(np.array([1, 2, 3], np.int64)).numpy(), got["rows"])


@pytest.mark.parametrize("hashed", [False, True], ids=["modulo", "crc32c"])
def test_cluster_layout_both_ways(tmp_path, redis_cluster, hashed):
    """A 3-master cluster, storage_slice 3: TFRA's buckets (one per master, int64 keys by
    (uint32)key % 3, or by CRC32C with using_hash_storage_slice) are the ones we read and
    write."""
    path = write_config(tmp_path, redis_cluster[0].port, redis_connection_mode=0,
                        redis_host_ip=["127.0.0.1"] * 3,
                        redis_host_port=[n.port for n in redis_cluster], storage_slice=3,
                        using_hash_storage_slice=hashed)
    run_tfra("""
        t = de.RedisTable(tf.int64, tf.float32, tf.zeros([2]), name="cl_tfra", config=cfg)
        k = tf.range(0, 30, dtype=tf.int64)
        t.insert(k, tf.stack([tf.cast(k, tf.float32)] * 2, axis=1))
        print(json.dumps({"size": int(t.size())}))
    """, path)
    ours = de.RedisTable(tf.int64, tf.float32, [0.0, 0.0], name="cl_tfra", config=redis_config(path))
    keys = np.arange(30, dtype=np.int64)
    np.testing.assert_array_equal(ours.lookup(keys).numpy(), np.stack([keys, keys], 1))
    assert int(ours.size()) == 30

    mine = de.RedisTable(tf.int64, tf.float32, [0.0, 0.0], name="cl_ours", config=redis_config(path))
    mine.insert(keys + 100, np.stack([keys, -keys], 1).astype(np.float32))
    got = run_tfra("""
        t = de.RedisTable(tf.int64, tf.float32, tf.zeros([2]), name="cl_ours", config=cfg)
        print(json.dumps({"rows": t.lookup(tf.range(100, 130, dtype=tf.int64)).numpy().tolist(),
                          "size": int(t.size())}))
    """, path)
    assert got["size"] == 30
    np.testing.assert_array_equal(got["rows"], np.stack([keys, -keys], 1))


def test_cluster_string_keys_land_in_tfras_buckets(tmp_path, redis_cluster):
    """String keys of up to 22 bytes (TF stores them inline; TFRA hashes that object)
    in a cluster with storage_slice 3: each side finds the other's rows."""
    path = write_config(tmp_path, redis_cluster[0].port, redis_connection_mode=0,
                        redis_host_ip=["127.0.0.1"] * 3,
                        redis_host_port=[n.port for n in redis_cluster], storage_slice=3)
    words = ["", "a", "bc", "user_12345", "x" * 22] + [f"id{i}" for i in range(40)]
    run_tfra(f"""
        words = {words!r}
        t = de.RedisTable(tf.string, tf.float32, tf.zeros([1]), name="s_tfra", config=cfg)
        t.insert(tf.constant(words), tf.reshape(tf.range(len(words), dtype=tf.float32), [-1, 1]))
        print(json.dumps({{}}))
    """, path)
    ours = de.RedisTable(tf.string, tf.float32, [0.0], name="s_tfra", config=redis_config(path))
    values, exists = ours.lookup(words, return_exists=True)
    assert exists.numpy().all()
    np.testing.assert_array_equal(values.numpy()[:, 0], np.arange(len(words)))

    mine = de.RedisTable(tf.string, tf.float32, [0.0], name="s_ours", config=redis_config(path))
    mine.insert(words, np.arange(len(words), dtype=np.float32).reshape(-1, 1) * 2)
    got = run_tfra(f"""
        t = de.RedisTable(tf.string, tf.float32, tf.zeros([1]), name="s_ours", config=cfg)
        values, exists = t.lookup(tf.constant({words!r}), return_exists=True)
        print(json.dumps({{"exists": exists.numpy().tolist(), "values": values.numpy()[:, 0].tolist()}}))
    """, path)
    assert all(got["exists"])
    assert got["values"] == [2.0 * i for i in range(len(words))]
