"""de.RedisTable against a real redis-server (tests/redis_util.py): every table op,
int32/int64/string keys, value dtypes, batch semantics, graph mode, files and
checkpoints, and TFRA's key layout byte for byte. A DictModel (tests/_tables_util.py)
is the reference."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import DictModel, assert_table_matches, make_keys, make_values, rng_for
from redis_util import redis_config, redis_server, write_config  # noqa: F401 (fixture)

KEY_DTYPES = [tf.int32, tf.int64, tf.string]


def make_table(tmp_path, server, key_dtype=tf.int64, value_dtype=tf.float32, default=(0.0, 0.0),
               name="emb", **fields):
    path = write_config(tmp_path, server.port, **fields)
    return de.RedisTable(key_dtype, value_dtype, list(default) if isinstance(default, tuple)
                         else default, name=name, config=redis_config(path)), path


@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=lambda d: d.name)
def test_every_op_matches_a_dict(tmp_path, redis_server, key_dtype):
    table, _ = make_table(tmp_path, redis_server, key_dtype, tf.float32, [0.0] * 3)
    model = DictModel(tf.float32, [3], np.zeros(3, np.float32))
    rng = rng_for("redis", key_dtype.name)
    keys = make_keys(rng, key_dtype, 300)
    values = make_values(rng, tf.float32, (300, 3))
    table.insert(keys[:200], values[:200])
    model.insert(keys[:200], values[:200])
    assert_table_matches(table, model)

    got, exists = table.lookup(keys, return_exists=True)
    want, want_exists = model.lookup(keys)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(exists.numpy(), want_exists)

    per_key = make_values(rng, tf.float32, (300, 3))
    got = table.lookup(keys, dynamic_default_values=per_key)
    np.testing.assert_array_equal(got.numpy(), model.lookup(keys, per_key)[0])

    exist_flags = rng.integers(0, 2, 300).astype(bool)
    deltas = make_values(rng, tf.float32, (300, 3))
    table.accum(keys, deltas, exist_flags)
    model.accum(keys, deltas, exist_flags)
    assert_table_matches(table, model)

    table.remove(keys[::3])
    model.remove(keys[::3])
    assert_table_matches(table, model)

    table.clear()
    assert int(table.size()) == 0
    assert table.export()[0].shape == [0]


def test_keys_of_any_shape_and_empty_batches(tmp_path, redis_server):
    table, _ = make_table(tmp_path, redis_server)
    keys = np.array([[1, 2], [3, 4]], np.int64)
    table.insert(keys, np.arange(8, dtype=np.float32).reshape(2, 2, 2))
    out = table.lookup(keys)
    assert out.shape == [2, 2, 2]
    np.testing.assert_array_equal(out.numpy(), np.arange(8).reshape(2, 2, 2))
    table.insert(np.zeros([0], np.int64), np.zeros([0, 2], np.float32))
    assert table.lookup(np.zeros([0], np.int64)).shape == [0, 2]
    table.remove(np.zeros([0], np.int64))
    assert int(table.size()) == 4


@pytest.mark.parametrize(
    "value_dtype", [tf.float64, tf.int32, tf.int64, tf.int8, tf.bool, tf.float16],
    ids=lambda d: d.name)
def test_value_dtypes(tmp_path, redis_server, value_dtype):
    default = np.zeros(4, value_dtype.as_numpy_dtype)
    table, _ = make_table(tmp_path, redis_server, tf.int64, value_dtype, default)
    model = DictModel(value_dtype, [4], default)
    rng = rng_for("redis-values", value_dtype.name)
    keys = make_keys(rng, tf.int64, 64)
    values = make_values(rng, value_dtype, (64, 4))
    table.insert(keys, values)
    model.insert(keys, values)
    assert_table_matches(table, model)
    if value_dtype == tf.float16:
        with pytest.raises(tf.errors.InvalidArgumentError, match="float16"):
            table.accum(keys, values, np.ones(64, bool))
        return
    flags = rng.integers(0, 2, 64).astype(bool)
    table.accum(keys, values, flags)
    model.accum(keys, values, flags)
    assert_table_matches(table, model)


def test_batches_of_many_commands_and_duplicates_keep_batch_order(tmp_path, redis_server):
    # keys_sending_size 64: a 20,000-row batch is hundreds of commands on several lanes.
    table, _ = make_table(tmp_path, redis_server, default=(0.0,), keys_sending_size=64)
    model = DictModel(tf.float32, [1], np.zeros(1, np.float32))
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 5000, 20000).astype(np.int64)  # many duplicates
    values = rng.integers(-50, 50, (20000, 1)).astype(np.float32)
    table.insert(keys, values)
    model.insert(keys, values)  # the last row of a key wins
    assert_table_matches(table, model)
    flags = rng.integers(0, 2, 20000).astype(bool)
    table.accum(keys, values, flags)  # deltas of a duplicated key add up, in order
    model.accum(keys, values, flags)
    assert_table_matches(table, model)


def test_graph_mode_and_tf_function(tmp_path, redis_server):
    table, _ = make_table(tmp_path, redis_server)

    @tf.function
    def step(k, v):
        table.insert(k, v)
        return table.lookup(k + 100, return_exists=True), table.size()

    (vals, exists), size = step(tf.constant([1, 2], tf.int64), tf.ones([2, 2]))
    assert not exists.numpy().any() and int(size) == 2

    path = write_config(tmp_path, redis_server.port)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        t = de.RedisTable(tf.int64, tf.float32, [0.0, 0.0], name="g", config=redis_config(path))
        sess.run(t.insert(tf.constant([5], tf.int64), tf.constant([[1.0, 2.0]])))
        assert sess.run(t.lookup(tf.constant([5], tf.int64))).tolist() == [[1.0, 2.0]]
        assert sess.run(t.size()) == 1


def test_file_system_save_and_load(tmp_path, redis_server):
    table, path = make_table(tmp_path, redis_server)
    table.insert([1, 2, 3], [[1, 1], [2, 2], [3, 3]])
    table.save_to_file_system(str(tmp_path / "files"))
    table.clear()
    table.load_from_file_system(str(tmp_path / "files"))
    assert sorted(table.export()[0].numpy().tolist()) == [1, 2, 3]
    np.testing.assert_array_equal(table.lookup([2]).numpy(), [[2, 2]])


@pytest.mark.parametrize("store_mode", [0, 2])
def test_checkpoints_follow_table_store_mode(tmp_path, redis_server, store_mode):
    path = write_config(tmp_path, redis_server.port, table_store_mode=store_mode)
    table = de.RedisTable(tf.int64, tf.float32, [0.0], name="ck", checkpoint=True,
                          config=redis_config(path))
    table.insert([1, 2], [[1.0], [2.0]])
    ckpt = tf.train.Checkpoint(table=table)
    saved = ckpt.write(str(tmp_path / "ckpt"))
    table.insert([3], [[3.0]])
    table.remove([1])
    ckpt.read(saved).assert_consumed() if store_mode == 0 else ckpt.read(saved)
    keys = sorted(table.export()[0].numpy().tolist())
    # Mode 0: the checkpoint's content comes back. Mode 2: Redis keeps what it has.
    assert keys == ([1, 2] if store_mode == 0 else [2, 3])


def test_tfra_key_layout_byte_for_byte(tmp_path, redis_server):
    """TFRA's layout (cc/core/redis/redis_table.h): one hash per bucket named
    <model_tag_runtime>:<name up to _mht_>{<tag>}; fields are the keys' raw bytes and
    values the rows' raw little-endian bytes."""
    path = write_config(tmp_path, redis_server.port, model_tag_runtime="layout")
    table = de.RedisTable(tf.int64, tf.float32, [0.0, 0.0], name="user_emb_mht_1of1",
                          config=redis_config(path))
    table.insert([7, -1], [[1.5, 2.5], [3.0, -4.0]])
    client = redis_server.client()
    # 3560 is the first integer whose decimal string hashes to cluster slot 0.
    assert client.call("KEYS", "layout:*") == [b"layout:user_emb{3560}"]
    stored = client.call("HGETALL", "layout:user_emb{3560}")
    stored = dict(zip(stored[::2], stored[1::2]))
    assert stored == {struct.pack("<q", 7): struct.pack("<2f", 1.5, 2.5),
                      struct.pack("<q", -1): struct.pack("<2f", 3.0, -4.0)}

    tags = ["{a}", "{b}"]
    path = write_config(tmp_path, redis_server.port, model_tag_runtime="layout2",
                        storage_slice=2, redis_hash_tags_runtime=tags)
    strings = de.RedisTable(tf.string, tf.int32, [0], name="s", config=redis_config(path))
    strings.insert(["x", ""], [[1], [2]])
    # Standalone mode writes every key to the first bucket, as TFRA does.
    stored = client.call("HGETALL", "layout2:s{a}")
    assert dict(zip(stored[::2], stored[1::2])) == {b"x": struct.pack("<i", 1),
                                                    b"": struct.pack("<i", 2)}
    assert client.call("EXISTS", "layout2:s{b}") == 0
    assert int(strings.size()) == 2

    # Rows written by another writer in that layout are read.
    client.call("HSET", "layout:user_emb{3560}", struct.pack("<q", 9), struct.pack("<2f", 9, 9))
    np.testing.assert_array_equal(table.lookup([9]).numpy(), [[9, 9]])
    client.close()


def test_md5_prefix_names_the_bucket_by_digest(tmp_path, redis_server):
    import hashlib

    path = write_config(tmp_path, redis_server.port, model_tag_runtime="m",
                        using_md5_prefix_name=True)
    table = de.RedisTable(tf.int64, tf.float32, [0.0], name="md5emb", config=redis_config(path))
    table.insert([1], [[1.0]])
    client = redis_server.client()
    name = hashlib.md5(b"m:md5emb").digest() + b"{3560}"
    assert client.call("HLEN", name) == 1
    client.close()


def test_rows_of_another_width_are_an_error(tmp_path, redis_server):
    table, path = make_table(tmp_path, redis_server, default=(0.0, 0.0), name="w")
    table.insert([1], [[1.0, 2.0]])
    wider = de.RedisTable(tf.int64, tf.float32, [0.0] * 3, name="w", config=redis_config(path))
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds a row of 8 bytes"):
        wider.lookup([1])


def test_stats_and_repr(tmp_path, redis_server):
    table, _ = make_table(tmp_path, redis_server)
    table.insert([1, 2], [[1, 1], [2, 2]])
    table.lookup([1, 3])
    stats = {k: int(v) for k, v in table.stats().items() if k != "load_factor"}
    assert stats["size"] == 2 and stats["lookups"] == 2 and stats["misses"] == 1
    assert "RedisTable" in repr(table)
    assert table.embedding_name == "emb"


def test_changed_hash_tags_move_the_rows_when_the_table_opens(tmp_path, redis_server):
    """Standalone: the import layout's bucket (slot-tag name) moves to the runtime
    hash tag's bucket when both layouts share a model tag (TFRA's rehash)."""
    tag = "retag"
    table, _ = make_table(tmp_path, redis_server, name="rt", model_tag_runtime=tag,
                          model_tag_import=tag)
    table.insert([1, 2, 3], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    moved, _ = make_table(tmp_path, redis_server, name="rt", model_tag_runtime=tag,
                          model_tag_import=tag, redis_hash_tags_runtime=["{x}"])
    np.testing.assert_array_equal(moved.lookup([3, 1]).numpy(), [[3.0, 3.0], [1.0, 1.0]])
    client = redis_server.client()
    assert client.call("KEYS", f"{tag}:*") == [f"{tag}:rt{{x}}".encode()]
    assert client.call("HLEN", f"{tag}:rt{{x}}") == 3
    client.close()
