"""de.Variable: sharded methods against a dict model, devices, partitioning, bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.variable import sharding
from _tables_util import (
    KEY_DTYPES,
    DictModel,
    assert_table_matches,
    comparable,
    dtype_id,
    make_keys,
    make_values,
    norm_key,
    rng_for,
)
from conftest import NUM_LOGICAL_CPUS

SHARDS = [1, 2, 3]


def make_variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=4, shards=2, **kwargs):
    return de.Variable(
        key_dtype=key_dtype, value_dtype=value_dtype, dim=dim, devices=["/CPU:0"] * shards, **kwargs
    )


# ----------------------------------------------------------------------------------------
# Methods against the dict model
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [1, 5])
@pytest.mark.parametrize("shards", SHARDS)
@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=dtype_id)
def test_methods_match_dict_model(key_dtype, shards, dim):
    rng = rng_for("variable", key_dtype, shards, dim)
    var = make_variable(key_dtype, tf.float32, dim, shards, initializer=-1.0)
    model = DictModel(tf.float32, (dim,), np.full(dim, -1.0, np.float32))
    keys = make_keys(rng, key_dtype, 60)

    # Rank-2 keys with a duplicate: the last row of a key wins, as in one table.
    batch = np.concatenate([keys[:40], keys[:1]]).reshape(1, 41)
    values = make_values(rng, tf.float32, (1, 41, dim))
    var.upsert(batch, values)
    model.insert(batch, values)
    assert_table_matches(var, model)
    assert sum(int(var.size(i)) for i in range(shards)) == len(model.data)

    probe = np.concatenate([keys[30:50], keys[:3]]).reshape(23)
    got, found = var.lookup(probe, return_exists=True)
    want, want_found = model.lookup(probe)
    np.testing.assert_array_equal(comparable(got), want)
    np.testing.assert_array_equal(found.numpy(), want_found)

    # accum: deltas to present keys, values to absent ones (the Variable takes old and
    # new values; delta = new - old).
    acc_keys = np.concatenate([keys[:5], keys[50:53], keys[:2]])
    old, exists = var.lookup(acc_keys, return_exists=True)
    new = old.numpy() + make_values(rng, tf.float32, (len(acc_keys), dim))
    var.accum(acc_keys, old, new, exists)
    model_deltas = np.where(exists.numpy()[:, None], new - old.numpy(), new)
    model.accum(acc_keys, model_deltas, exists.numpy())
    assert_table_matches(var, model)

    var.remove(keys[10:20].reshape(2, 5))
    model.remove(keys[10:20])
    assert_table_matches(var, model)

    var.clear()
    assert int(var.size()) == 0


@pytest.mark.parametrize("shards", [1, 3])
def test_methods_inside_tf_function(shards):
    var = make_variable(tf.int64, tf.float32, 3, shards, initializer=0.5)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 3])])
    def write(keys, values):
        var.upsert(keys, values)
        var.remove(keys[:1])
        return var.size()

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
    def read(keys):
        return var.lookup(keys, return_exists=True)

    keys = np.arange(-5, 15, dtype=np.int64)
    values = np.arange(60, dtype=np.float32).reshape(20, 3)
    assert int(write(keys, values)) == 19
    got, found = read(keys[:8].reshape(2, 4))
    assert got.shape == (2, 4, 3)
    expected = values[:8].copy()
    expected[0] = 0.5  # removed -> the initializer
    np.testing.assert_array_equal(got.numpy().reshape(8, 3), expected)
    np.testing.assert_array_equal(found.numpy().reshape(-1), [False] + [True] * 7)


def test_export_with_hkv_shards_carries_scores():
    config = de.HkvHashTableConfig(
        init_capacity=64,
        max_capacity=1024,
        evict_strategy=de.HkvEvictStrategy.CUSTOMIZED,
        gen_scores_fn=lambda keys: keys * 10,  # upserts through the Variable score this way
    )
    var = make_variable(dim=2, shards=3, kv_creator=de.HkvHashTableCreator(config))
    assert all(isinstance(t, de.HkvHashTable) for t in var.tables)
    for table in var.tables:
        assert table.max_capacity == 1024
    var.upsert(np.arange(30, dtype=np.int64), np.zeros([30, 2], np.float32))
    k, _, s = var.export_with_scores()
    assert sorted(k.numpy().tolist()) == list(range(30))
    np.testing.assert_array_equal(s.numpy(), k.numpy() * 10)


@pytest.mark.parametrize("shards", [1, 3])
def test_accum_and_evict_reports_what_left_every_shard(shards):
    config = de.HkvHashTableConfig(init_capacity=4, max_capacity=4)
    var = make_variable(dim=2, shards=shards, kv_creator=de.HkvHashTableCreator(config))
    reported = 0
    for step in range(6):
        before = {int(k): v.tolist() for k, v in zip(*(t.numpy() for t in var.export()))}
        new = np.arange(10 * step, 10 * step + 5, dtype=np.int64)
        present = np.array(sorted(before)[:2], np.int64)  # accumulated into
        keys = np.concatenate([new, present])
        old = np.zeros([len(keys), 2], np.float32)
        old[len(new):] = np.reshape([before[k] for k in present.tolist()], [-1, 2])
        new_values = old + np.float32(0.5)
        exists = np.array([False] * len(new) + [True] * len(present))
        ev_keys, ev_values, ev_scores = var.accum_and_evict(keys, old, new_values, exists)
        assert ev_keys.dtype == tf.int64 and ev_values.shape == [len(ev_keys), 2]
        assert ev_scores.dtype == tf.int64 and ev_scores.shape == [len(ev_keys)]
        after = {int(k): v.tolist() for k, v in zip(*(t.numpy() for t in var.export()))}
        got = dict(zip(ev_keys.numpy().tolist(), ev_values.numpy().tolist()))
        assert len(got) == len(ev_keys)
        assert set(got) == (set(before) | set(new.tolist())) - set(after), step
        for k, row in got.items():
            if k in before and k not in present.tolist():
                assert row == before[k]
        for k in set(present.tolist()) & set(after):
            np.testing.assert_allclose(after[k], np.array(before[k]) + 0.5)
        assert int(var.size()) == len(after) <= 4 * shards
        reported += len(got)
    assert reported > 0 and int(var.stats()["evictions"]) == reported


def test_unbounded_variable_accum_and_evict_reports_nothing():
    var = make_variable(dim=2, shards=3)
    keys, values, scores = var.accum_and_evict(
        np.arange(10, dtype=np.int64), np.zeros([10, 2], np.float32),
        np.ones([10, 2], np.float32), np.zeros(10, bool))
    assert keys.shape == [0] and values.shape == [0, 2] and scores.shape == [0]
    assert int(var.size()) == 10


def test_stats_sum_the_shards():
    config = de.HkvHashTableConfig(init_capacity=16, max_capacity=40)
    var = make_variable(dim=2, shards=3, kv_creator=de.HkvHashTableCreator(config))
    var.upsert(np.arange(200, dtype=np.int64), np.zeros([200, 2], np.float32))
    var.lookup(np.arange(300, dtype=np.int64))
    stats = {k: v.numpy() for k, v in var.stats().items()}
    shards = [{k: v.numpy() for k, v in t.stats().items()} for t in var.tables]
    for key in ("size", "capacity", "max_capacity", "inserts", "lookups", "misses", "evictions"):
        assert stats[key] == sum(shard[key] for shard in shards), key
    assert stats["size"] == int(var.size()) <= 120 and stats["max_capacity"] == 120
    assert stats["lookups"] == 300 and stats["misses"] == 300 - stats["size"]
    assert stats["evictions"] == 200 - stats["size"]
    np.testing.assert_allclose(stats["load_factor"], stats["size"] / stats["capacity"], rtol=1e-6)


# ----------------------------------------------------------------------------------------
# Devices and partitioning
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [2, 3])
def test_each_shard_lives_on_its_device(shards):
    assert len(tf.config.list_logical_devices("CPU")) >= NUM_LOGICAL_CPUS
    devices = [f"/CPU:{i}" for i in range(shards)]
    var = de.Variable(tf.int64, tf.float32, dim=2, devices=devices)
    for i, table in enumerate(var.tables):
        assert table.resource_handle.device.endswith(f"CPU:{i}"), table.resource_handle.device

    keys = np.random.default_rng(shards).integers(-(2**62), 2**62, 3000)
    keys = np.unique(keys)
    values = np.stack([keys % 1000, -(keys % 777)], axis=1).astype(np.float32)
    var.upsert(keys, values)
    routed = de.default_partition_fn(tf.constant(keys), shards).numpy()
    for i in range(shards):
        assert int(var.size(i)) == int(np.sum(routed == i))
        shard_keys = var.tables[i].export()[0].numpy()
        assert set(shard_keys.tolist()) == set(keys[routed == i].tolist())

    order = np.random.default_rng(7).permutation(len(keys))[:500]
    np.testing.assert_array_equal(var.lookup(keys[order]).numpy(), values[order])


@pytest.fixture
def fresh_device_notes(monkeypatch):
    """No missing device said yet in this process."""
    monkeypatch.setattr(sharding, "_said_missing_devices", set())


def test_a_device_the_process_lacks_gets_no_shard_and_is_said_once(fresh_device_notes):
    """conftest gives this process /CPU:0-2: a shard asked for on /CPU:7 goes to /CPU:0
    (instead of TF's silent soft placement there), `devices` says so, and one warning
    names the device and where its shard went."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        var = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:1", "/CPU:7"], name="lacks")
        again = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:7", "/CPU:2"])
        slots = var.companion("slot", tf.float32, 2, 0.0)
    said = [str(w.message) for w in record if issubclass(w.category, UserWarning)]
    assert len(said) == 1, said
    assert "'lacks'" in said[0] and "/CPU:7 -> /CPU:0" in said[0]
    assert var.devices == slots.devices == ["/CPU:1", "/CPU:0"]
    assert again.devices == ["/CPU:0", "/CPU:2"]
    for table, device in zip(var.tables + again.tables, var.devices + again.devices):
        assert table.resource_handle.device.endswith(device[1:].replace("CPU", "device:CPU"))

    keys = np.arange(100, dtype=np.int64)
    var.upsert(keys, np.stack([keys, -keys], axis=1).astype(np.float32))
    assert int(var.size(0)) + int(var.size(1)) == 100 and int(var.size(1)) > 0
    np.testing.assert_array_equal(var.lookup(keys[::-1]).numpy()[:, 0], keys[::-1])


def test_which_devices_are_checked(fresh_device_notes):
    present = [d.name for d in tf.config.list_logical_devices()]
    gpu = "/GPU:0" if any(":GPU:" in d for d in present) else "/CPU:0"
    assert sharding._missing_devices(["/CPU:0", "/CPU:2", "/device:CPU:1"]) == {}
    assert sharding._missing_devices(["/CPU:9", "/GPU:9", "/job:localhost/device:CPU:5"]) == {
        "/CPU:9": "/CPU:0", "/GPU:9": gpu, "/job:localhost/device:CPU:5": "/CPU:0"}
    # Remote devices are the cluster's to have.
    assert sharding._missing_devices(["/job:ps/task:1/CPU:9", "/job:worker/task:3"]) == {}
    # In a TF1 graph the session's config says which devices exist.
    with tf.Graph().as_default():
        assert sharding._missing_devices(["/CPU:9"]) == {}
        placed, note = sharding.table_devices(["/CPU:9"], tf.int64)
    assert placed == ["/CPU:9"] and note is None


def test_custom_partitioner_routes_keys():
    def by_modulo(keys, num_shards):
        return tf.cast(tf.math.floormod(keys, num_shards), tf.int32)

    var = make_variable(dim=1, shards=3, partitioner=by_modulo)
    keys = np.arange(-9, 21, dtype=np.int64)
    var.upsert(keys, keys[:, None].astype(np.float32))
    for i in range(3):
        assert sorted(var.tables[i].export()[0].numpy()) == sorted(k for k in keys if k % 3 == i)
    np.testing.assert_array_equal(var.lookup(keys).numpy()[:, 0], keys)


def _fmix64(x: int) -> int:
    mask = (1 << 64) - 1
    x &= mask
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & mask
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & mask
    return x ^ (x >> 33)


def _reference_shard(key, num_shards: int) -> int:
    """default_partition_fn written out in Python: the cross-machine contract."""
    if isinstance(key, bytes):
        h = 0xCBF29CE484222325
        for byte in key:
            h = ((h ^ byte) * 0x100000001B3) & ((1 << 64) - 1)
        h = _fmix64(h ^ len(key))
    else:
        h = _fmix64(int(key))
    return ((h >> 32) * num_shards) >> 32


@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=dtype_id)
def test_default_partition_fn_is_the_documented_hash(key_dtype):
    keys = make_keys(rng_for("partition", key_dtype), key_dtype, 400)
    for num_shards in (1, 2, 3, 7, 1000):
        got = de.default_partition_fn(tf.constant(keys, key_dtype), num_shards).numpy()
        want = [_reference_shard(norm_key(k), num_shards) for k in keys]
        np.testing.assert_array_equal(got, want)


def test_default_partition_fn_pinned_values():
    # Any change here re-routes every saved key: these values are a contract.
    got = de.default_partition_fn(tf.constant([0, 1, -1, 2**40, 123456789], tf.int64), 8)
    np.testing.assert_array_equal(got.numpy(), [0, 5, 3, 7, 4])
    got = de.default_partition_fn(tf.constant([0, 1, -1], tf.int32), 8)
    np.testing.assert_array_equal(got.numpy(), [0, 5, 3])
    got = de.default_partition_fn(tf.constant([b"", b"user_1", b"\x00"]), 8)
    np.testing.assert_array_equal(got.numpy(), [7, 3, 5])


def test_default_partition_fn_balances_sequential_ids():
    counts = np.bincount(de.default_partition_fn(tf.range(100000, dtype=tf.int64), 4).numpy())
    assert counts.min() > 0.97 * 25000 and counts.max() < 1.03 * 25000


# ----------------------------------------------------------------------------------------
# Initializers
# ----------------------------------------------------------------------------------------


def test_random_normal_initializer_statistics():
    var = make_variable(
        dim=10, shards=2, initializer=tf.keras.initializers.RandomNormal(0.0, 0.01)
    )
    rows = var.lookup(tf.range(1 << 17, dtype=tf.int64)).numpy()
    assert abs(rows.mean()) < 1e-4
    assert abs(rows.std() - 0.01) < 2e-4
    assert len(np.unique(rows[:, 0])) > 0.99 * (1 << 17)  # every key its own draw
    assert int(var.size()) == 0  # reading does not store


@pytest.mark.parametrize(
    "initializer, check",
    [
        (tf.keras.initializers.RandomUniform(-0.5, 0.5), lambda r: -0.5 <= r.min() and r.max() < 0.5),
        (tf.keras.initializers.TruncatedNormal(0.0, 1.0), lambda r: np.abs(r).max() <= 2.0),
        (tf.random_uniform_initializer(1.0, 2.0), lambda r: 1.0 <= r.min() and r.max() < 2.0),
        (tf.compat.v1.truncated_normal_initializer(0.0, 0.1), lambda r: np.abs(r).max() <= 0.2),
        # maxval=None (its default) is 1, as in tf.random.uniform.
        (tf.compat.v1.random_uniform_initializer(), lambda r: 0.0 <= r.min() and r.max() < 1.0
         and r.max() > 0.99),
        (tf.compat.v1.random_uniform_initializer(-2.0), lambda r: -2.0 <= r.min() < -1.99
         and r.max() < 1.0),
    ],
    ids=["keras-uniform", "keras-truncated", "tf-uniform", "v1-truncated", "v1-uniform-default",
         "v1-uniform-minval"],
)
def test_random_initializers_draw_per_key(initializer, check):
    var = make_variable(dim=6, shards=2, initializer=initializer)
    rows = var.lookup(tf.range(5000, dtype=tf.int64)).numpy()
    assert rows.shape == (5000, 6)
    assert check(rows)
    assert len(np.unique(rows[:, 0])) > 4900


@pytest.mark.parametrize(
    "initializer, expected",
    [
        (None, [0.0, 0.0, 0.0]),
        (2.5, [2.5, 2.5, 2.5]),
        ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]),
        (np.array([4.0, 5.0, 6.0]), [4.0, 5.0, 6.0]),
        (tf.constant([7.0, 8.0, 9.0]), [7.0, 8.0, 9.0]),
        (tf.keras.initializers.Constant([1.0, -1.0, 0.5]), [1.0, -1.0, 0.5]),
        (tf.keras.initializers.Ones(), [1.0, 1.0, 1.0]),
        (tf.zeros_initializer(), [0.0, 0.0, 0.0]),
        (tf.compat.v1.constant_initializer(3.0), [3.0, 3.0, 3.0]),
    ],
    ids=["none", "number", "list", "ndarray", "tensor", "keras-constant", "ones", "zeros", "v1-constant"],
)
def test_constant_initializers_keep_every_element(initializer, expected):
    var = make_variable(dim=3, shards=2, initializer=initializer)
    got = var.lookup(tf.constant([[5, 6], [7, 8]], tf.int64)).numpy()
    np.testing.assert_array_equal(got, np.broadcast_to(np.float32(expected), (2, 2, 3)))


def test_keyed_uniform_rows_stay_below_maxval():
    # [1, 2) in float32: a double draw just below 2 rounds up to 2 about once in 1e7.
    rows = de._ops.ops.dynemb_keyed_random(
        tf.range(3_000_000, dtype=tf.int64), dim=8, seed=3, distribution="uniform",
        a=1.0, b=2.0, dtype=tf.float32,
    ).numpy()
    assert rows.min() >= 1.0 and rows.max() < 2.0


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, tf.string], ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
def test_keyed_random_fill_draws_the_missing_rows_only(key_dtype, dtype):
    keys = tf.range(1000)
    keys = tf.strings.as_string(keys) if key_dtype == tf.string else tf.cast(keys, key_dtype)
    values = tf.random.stateless_normal([1000, 5], seed=[1, 2], dtype=dtype)
    attrs = dict(dim=5, seed=11, distribution="truncated_normal", a=0.5, b=2.0)
    drawn = de._ops.ops.dynemb_keyed_random(keys, dtype=dtype, **attrs)
    half = tf.random.stateless_uniform([1000], seed=[3, 4]) < 0.5
    one_missing = tf.range(1000) != 997
    # Half missing; none (the op draws nothing); one, near the end; all.
    for exists in (half, tf.ones([1000], tf.bool), one_missing, tf.zeros([1000], tf.bool)):
        filled = de._ops.ops.dynemb_keyed_random_fill(values, exists, keys, **attrs)
        want = tf.where(exists[:, tf.newaxis], values, drawn)
        np.testing.assert_array_equal(filled.numpy(), want.numpy())
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="values"):
        de._ops.ops.dynemb_keyed_random_fill(values[:, :4], exists, keys, **attrs)
    huge = dict(attrs, dim=2**62)  # its output's shape would overflow
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dim must be in \[1, 2\^24\]"):
        de._ops.ops.dynemb_keyed_random(keys, dtype=dtype, **huge)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dim must be in \[1, 2\^24\]"):
        de._ops.ops.dynemb_keyed_random_fill(values, exists, keys, **huge)


def uniform_function(shape, dtype):
    return tf.random.uniform(shape, -1.0, 1.0, dtype)


def test_callable_initializer_gives_a_repeated_missing_key_one_row():
    var = make_variable(dim=4, shards=2, initializer=uniform_function)
    rows = var.lookup(tf.constant([5, 6, 5, 5], tf.int64)).numpy()
    np.testing.assert_array_equal(rows[0], rows[2])
    np.testing.assert_array_equal(rows[0], rows[3])
    assert not np.array_equal(rows[0], rows[1])


def place_function(shape, dtype):
    """Row i is [i, i, ...]: shows which place of the call a key read."""
    rows = tf.range(shape[0])[:, tf.newaxis] + tf.zeros(shape, tf.int32)
    return tf.cast(rows, dtype)


def test_callable_initializer_rows_follow_the_keys_places_as_in_tfra():
    """TFRA calls the initializer for all of a lookup's keys and a missing key reads the
    row of its place; found keys keep their rows."""
    var = make_variable(dim=2, shards=2, initializer=place_function)
    var.upsert(tf.constant([6], tf.int64), tf.constant([[-1.0, -1.0]]))
    rows = var.lookup(tf.constant([5, 6, 7, 5, 8], tf.int64)).numpy()
    np.testing.assert_array_equal(rows[:, 0], [0, -1, 2, 0, 3])


@pytest.mark.parametrize(
    "initializer",
    [
        tf.keras.initializers.GlorotUniform(),
        tf.keras.initializers.HeNormal(),
        tf.keras.initializers.Orthogonal(),
        tf.keras.initializers.Identity(),
        tf.compat.v1.glorot_uniform_initializer(),
    ],
    ids=["glorot", "he", "orthogonal", "identity", "v1-glorot"],
)
def test_shape_scaled_initializers_are_refused(initializer):
    with pytest.raises(ValueError, match="`initializer`.*shape of the whole matrix"):
        make_variable(dim=4, shards=1, initializer=initializer)


def test_callable_initializer_works_in_tf_function():
    var = make_variable(dim=4, shards=2, initializer=uniform_function)
    rows = tf.function(lambda k: var.lookup(k))(tf.constant([1, 2, 1], tf.int64)).numpy()
    assert rows.shape == (3, 4) and np.abs(rows).max() <= 1.0
    np.testing.assert_array_equal(rows[0], rows[2])


@pytest.mark.parametrize("value_dtype", [tf.bool, tf.int8, tf.bfloat16], ids=dtype_id)
@pytest.mark.parametrize(
    "initializer, expected",
    [(None, 0), (tf.keras.initializers.Zeros(), 0), (tf.keras.initializers.Ones(), 1)],
    ids=["none", "zeros", "ones"],
)
def test_default_and_zeros_ones_initializers_in_every_value_dtype(value_dtype, initializer, expected):
    var = make_variable(value_dtype=value_dtype, dim=3, initializer=initializer)
    got = comparable(var.lookup(tf.constant([1, 2], tf.int64)))
    np.testing.assert_array_equal(got, np.full((2, 3), expected).astype(got.dtype))


def test_seeded_initializer_depends_only_on_seed_and_key():
    keys = tf.constant([3, -7, 2**50, 0], tf.int64)
    init = tf.keras.initializers.RandomNormal(0.0, 1.0, seed=1234)
    one = make_variable(dim=5, shards=1, initializer=init).lookup(keys).numpy()
    three = make_variable(dim=5, shards=3, initializer=init).lookup(keys).numpy()
    np.testing.assert_array_equal(one, three)
    # The row of key 3 is the same in any position of any batch.
    alone = make_variable(dim=5, shards=2, initializer=init).lookup(tf.constant([3], tf.int64))
    np.testing.assert_array_equal(alone.numpy()[0], one[0])
    other_seed = tf.keras.initializers.RandomNormal(0.0, 1.0, seed=99)
    assert not np.array_equal(make_variable(dim=5, initializer=other_seed).lookup(keys), one)
    # Pinned: the same rows in every process and on every machine (a change would give
    # restored models different initial rows for new keys).
    pinned_key3 = [0.5243966, -0.3798286, -0.16620801, 2.0592568, -0.50493836]
    np.testing.assert_allclose(one[0], pinned_key3, rtol=1e-6)


@pytest.mark.parametrize(
    "value_dtype, initializer, expected",
    [
        (tf.float32, [1.5], [1.5, 1.5, 1.5]),
        (tf.float32, tf.constant([[-1.0]]), [-1.0, -1.0, -1.0]),
        (tf.float32, [[1.0], [2.0], [3.0]], [1.0, 2.0, 3.0]),
        (tf.int32, np.array([-1], np.int64), [-1, -1, -1]),
        (tf.int32, tf.constant([7, 8, 9], tf.int64), [7, 8, 9]),
        (tf.int32, 0.1, [0, 0, 0]),
        (tf.int64, -2.7, [-2, -2, -2]),
        (tf.float32, tf.constant(2, tf.int32), [2.0, 2.0, 2.0]),
        (tf.float64, 0.1, [0.1, 0.1, 0.1]),
        (tf.int32, tf.compat.v1.constant_initializer(0.9), [0, 0, 0]),
    ],
    ids=["one-element-list", "one-element-tensor", "column", "int64-array-int32-rows",
         "int64-tensor-int32-rows", "float-int32-rows", "float-int64-rows",
         "int-tensor-float-rows", "float64-exact", "v1-constant-int-rows"],
)
def test_initializer_values_convert_as_tfra(value_dtype, initializer, expected):
    """One element broadcasts to [dim], dim elements in any shape make the row, and a
    value of another dtype is cast (tf.cast: 0.1 -> 0 for int rows), as TFRA converts
    initializers; a value that fits the dtype converts exactly (0.1 stays float64's)."""
    var = make_variable(value_dtype=value_dtype, dim=3, initializer=initializer)
    got = var.lookup(tf.constant([5, 6], tf.int64)).numpy()
    np.testing.assert_array_equal(got, np.array([expected] * 2, value_dtype.as_numpy_dtype))


def test_initializer_of_wrong_shape_or_dtype_is_rejected():
    # TFRA would fill the row with the first element: a mistake more likely than a wish.
    with pytest.raises(ValueError, match=r"\[dim\] = \[3\]"):
        make_variable(dim=3, initializer=[1.0, 2.0])
    with pytest.raises(TypeError, match="initializer.*string"):
        make_variable(dim=2, initializer="zero")


# ----------------------------------------------------------------------------------------
# get_variable
# ----------------------------------------------------------------------------------------


def test_get_variable_reuses_by_name_in_eager_mode():
    a = de.get_variable("shared_emb_eager", dim=2)
    b = de.get_variable("shared_emb_eager", dim=2)
    assert a is b
    c = de.get_variable("other_emb_eager", dim=2)
    assert c is not a


def test_get_variable_follows_variable_scope_reuse_in_graphs():
    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("tower"):
            a = de.get_variable("emb", dim=2)
            assert a.name == "tower/emb"
            # TFRA's wording, which its tests match.
            with pytest.raises(ValueError, match="Variable tower/emb already exists, disallowed"):
                de.get_variable("emb", dim=2)
        with tf.compat.v1.variable_scope("tower", reuse=True):
            assert de.get_variable("emb", dim=2) is a
            with pytest.raises(ValueError, match="does not exist"):
                de.get_variable("missing", dim=2)
        with tf.compat.v1.variable_scope("tower", reuse=tf.compat.v1.AUTO_REUSE):
            assert de.get_variable("emb", dim=2) is a


# ----------------------------------------------------------------------------------------
# Bad input: clear errors, no crash, stored data unchanged
# ----------------------------------------------------------------------------------------


def _filled(shards=2):
    var = make_variable(dim=2, shards=shards)
    var.upsert(np.arange(10, dtype=np.int64), np.ones([10, 2], np.float32))
    return var


def _assert_unchanged(var):
    keys, values = var.export()
    assert sorted(keys.numpy().tolist()) == list(range(10))
    np.testing.assert_array_equal(values.numpy(), np.ones([10, 2], np.float32))


@pytest.mark.parametrize("method", ["lookup", "upsert", "remove", "accum"])
def test_keys_of_another_dtype_raise_type_error(method):
    var = _filled()
    keys = tf.constant([1, 2], tf.int32)
    rows = tf.zeros([2, 2])
    args = {
        "lookup": (keys,),
        "upsert": (keys, rows),
        "remove": (keys,),
        "accum": (keys, rows, rows, tf.constant([True, False])),
    }[method]
    with pytest.raises(TypeError, match="keys"):
        getattr(var, method)(*args)
    _assert_unchanged(var)


def test_values_of_the_wrong_shape_raise_expected_shape():
    var = _filled()
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        var.upsert(tf.constant([1, 2], tf.int64), tf.zeros([2, 4]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        var.upsert(tf.constant([1, 2, 3, 4], tf.int64), tf.zeros([2, 4]))  # same size, wrong shape
    with pytest.raises(TypeError, match="values"):
        var.upsert(tf.constant([1, 2], tf.int64), tf.zeros([2, 2], tf.float64))
    _assert_unchanged(var)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, 2])])
    def upsert(keys, values):
        var.upsert(keys, values)

    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        upsert(tf.constant([1, 2, 3], tf.int64), tf.zeros([2, 2]))
    _assert_unchanged(var)


def test_partitioner_out_of_range_raises_invalid_argument():
    bad = lambda keys, n: tf.fill(tf.shape(keys), tf.constant(n, tf.int32))  # noqa: E731
    var = make_variable(dim=2, shards=2)
    var.upsert(np.arange(10, dtype=np.int64), np.ones([10, 2], np.float32))
    var._partition_fn = bad  # the same variable, now with a broken partitioner
    with pytest.raises(tf.errors.InvalidArgumentError):
        var.upsert(tf.constant([100, 101], tf.int64), tf.zeros([2, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        var.lookup(tf.constant([1], tf.int64))
    var._partition_fn = de.default_partition_fn
    _assert_unchanged(var)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"dim": 0}, ValueError, "dim"),
        ({"dim": -3}, ValueError, "dim"),
        ({"dim": 2.5}, TypeError, "dim"),
        ({"devices": []}, ValueError, "devices"),
        ({"key_dtype": tf.float32}, TypeError, "key_dtype"),
        ({"value_dtype": tf.string}, TypeError, "value_dtype"),
        ({"init_size": -1}, ValueError, "init_size"),
        ({"partitioner": 3}, TypeError, "partitioner"),
        ({"kv_creator": object()}, TypeError, "kv_creator"),
    ],
)
def test_bad_construction_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        de.Variable(**kwargs)


def test_size_index_out_of_range():
    var = make_variable(shards=2)
    with pytest.raises(ValueError, match="index"):
        var.size(2)


@pytest.mark.parametrize("name", ["user emb:0", "_private", "9lives", "tower/emb"])
def test_any_name_works_in_every_mode(name):
    var = make_variable(dim=2, shards=2, name=name)
    assert var.name == name
    var.upsert([1, 2], np.ones([2, 2], np.float32))

    @tf.function
    def lookup(keys):
        return var.lookup(keys)

    np.testing.assert_array_equal(lookup(tf.constant([2], tf.int64)).numpy(), [[1.0, 1.0]])
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        graph_var = make_variable(dim=2, shards=2, name=name)
        sess.run(graph_var.upsert([3], [[2.0, 2.0]]))
        assert sess.run(graph_var.size()) == 1


def test_properties():
    var = make_variable(tf.string, tf.float16, dim=3, shards=2, name="user/emb", trainable=False)
    assert var.key_dtype == tf.string and var.value_dtype == tf.float16
    assert var.dim == 3 and var.shard_num == 2 and var.devices == ["/CPU:0", "/CPU:0"]
    assert var.name == "user/emb" and not var.trainable and var.restrict_policy is None
    assert var.restrict(5) is None
    assert len(var.tables) == 2
