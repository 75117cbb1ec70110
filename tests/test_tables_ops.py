"""Every table method against a plain-dict model (eager mode)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import (
    DIMS,
    EDGE_KEYS,
    KEY_DTYPES,
    VALUE_DTYPES,
    DictModel,
    as_key_array,
    assert_table_matches,
    comparable,
    dtype_id,
    exported_dict,
    make_keys,
    make_values,
    rng_for,
)

# Deeper scenarios run on this subset (every key dtype, value dtypes with distinct
# arithmetic: float, half-width float, narrow int, bool).
DEEP_VALUE_DTYPES = [tf.float32, tf.bfloat16, tf.int8, tf.bool]
TABLE_CLASSES = {
    "HashTable": lambda kd, vd, default, **kw: de.HashTable(kd, vd, default, **kw),
    "HkvHashTable": lambda kd, vd, default, **kw: de.HkvHashTable(
        kd, vd, default, init_capacity=64, max_capacity=1 << 20, **kw
    ),
}

key_dtypes = pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=dtype_id)
value_dtypes = pytest.mark.parametrize("value_dtype", VALUE_DTYPES, ids=dtype_id)
deep_value_dtypes = pytest.mark.parametrize("value_dtype", DEEP_VALUE_DTYPES, ids=dtype_id)
table_kinds = pytest.mark.parametrize("kind", sorted(TABLE_CLASSES))


def new_table(kind, key_dtype, value_dtype, dim, rng, **kwargs):
    """A table with a random `[dim]` default (scalar when dim is None) and its model."""
    shape = () if dim is None else (dim,)
    default = make_values(rng, value_dtype, shape)
    table = TABLE_CLASSES[kind](key_dtype, value_dtype, default, **kwargs)
    return table, DictModel(value_dtype, shape, default)


def check_lookup(table, model, keys, **kwargs):
    values, exists = table.lookup(keys, return_exists=True, **kwargs)
    defaults = kwargs.get("dynamic_default_values")
    want_values, want_exists = model.lookup(np.asarray(keys), defaults)
    assert values.dtype == table.value_dtype
    assert values.shape == want_values.shape
    np.testing.assert_array_equal(comparable(values), comparable(want_values))
    np.testing.assert_array_equal(exists.numpy(), want_exists)


# ----------------------------------------------------------------------------------------
# Full cross product, short scenario
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", DIMS)
@value_dtypes
@key_dtypes
def test_insert_lookup_remove_export(key_dtype, value_dtype, dim):
    rng = rng_for("basic", key_dtype, value_dtype, dim)
    table, model = new_table("HashTable", key_dtype, value_dtype, dim, rng)
    keys = make_keys(rng, key_dtype, 24)  # edge keys included
    values = make_values(rng, value_dtype, (24, dim))
    table.insert(keys, values)
    model.insert(keys, values)
    assert_table_matches(table, model)

    absent = make_keys(rng_for("absent", key_dtype), key_dtype, 40, edges=False)
    absent = as_key_array([k for k in absent if k not in set(keys.tolist())][:8], key_dtype)
    check_lookup(table, model, np.concatenate([keys[::2], absent]))

    table.remove(np.concatenate([keys[:10], absent[:3]]))
    model.remove(keys[:10])
    assert_table_matches(table, model)
    check_lookup(table, model, keys)

    overwrite = make_values(rng, value_dtype, (14, dim))
    table.insert(keys[10:], overwrite)
    model.insert(keys[10:], overwrite)
    assert_table_matches(table, model)


@table_kinds
@value_dtypes
def test_scalar_default_means_scalar_values(kind, value_dtype):
    rng = rng_for("scalar", kind, value_dtype)
    table, model = new_table(kind, tf.int64, value_dtype, None, rng)
    assert table.dim == 1
    assert table.value_shape == tf.TensorShape([])
    keys = make_keys(rng, tf.int64, 10)
    values = make_values(rng, value_dtype, (10,))
    table.insert(keys, values)
    model.insert(keys, values)
    check_lookup(table, model, np.concatenate([keys, [5, 6, 7]]))
    _, exported_values = table.export()
    assert exported_values.shape == [10]
    assert_table_matches(table, model)


# ----------------------------------------------------------------------------------------
# Deeper scenarios on a subset
# ----------------------------------------------------------------------------------------


@table_kinds
@deep_value_dtypes
@key_dtypes
def test_duplicates_last_insert_wins(kind, key_dtype, value_dtype):
    rng = rng_for("dup", kind, key_dtype, value_dtype)
    table, model = new_table(kind, key_dtype, value_dtype, 7, rng)
    unique = make_keys(rng, key_dtype, 6)
    keys = unique[rng.integers(0, len(unique), 40)]
    values = make_values(rng, value_dtype, (40, 7))
    table.insert(keys, values)
    model.insert(keys, values)
    assert_table_matches(table, model)


@table_kinds
@deep_value_dtypes
@key_dtypes
def test_accum_semantics(kind, key_dtype, value_dtype):
    """Present+exists adds, absent+not-exists inserts, the other two change nothing;
    a batch is applied row by row, so duplicate keys' deltas add up."""
    rng = rng_for("accum", kind, key_dtype, value_dtype)
    table, model = new_table(kind, key_dtype, value_dtype, 7, rng)
    keys = make_keys(rng, key_dtype, 12)
    present, absent = keys[:6], keys[6:]
    init = make_values(rng, value_dtype, (6, 7))
    table.insert(present, init)
    model.insert(present, init)

    # Every combination of (present, absent) x (exists, not exists), plus duplicates.
    batch_keys = np.concatenate(
        [present[:3], present[3:], absent[:3], absent[3:], present[:2], absent[3:5]]
    )
    exists = np.repeat([True, False, False, True, True, False], [3, 3, 3, 3, 2, 2])
    deltas = make_values(rng, value_dtype, (len(batch_keys), 7))
    table.accum(batch_keys, deltas, exists)
    model.accum(batch_keys, deltas, exists)
    assert_table_matches(table, model)

    # The usual pattern: lookup with exists, then accumulate.
    _, found = table.lookup(keys, return_exists=True)
    deltas = make_values(rng, value_dtype, (12, 7))
    table.accum(keys, deltas, found)
    model.accum(keys, deltas, found.numpy())
    assert_table_matches(table, model)


@table_kinds
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
@key_dtypes
def test_keys_of_any_rank(kind, key_dtype, rank):
    rng = rng_for("rank", kind, key_dtype, rank)
    table, model = new_table(kind, key_dtype, tf.float32, 3, rng)
    shape = [(), (6,), (2, 3), (2, 1, 3)][rank]
    n = int(np.prod(shape))
    keys = make_keys(rng, key_dtype, n).reshape(shape)
    values = make_values(rng, tf.float32, shape + (3,))
    table.insert(keys, values)
    model.insert(keys, values)
    assert_table_matches(table, model)
    check_lookup(table, model, keys)
    got = table[keys]
    assert got.shape == shape + (3,)
    np.testing.assert_array_equal(got.numpy(), values)

    deltas = make_values(rng, tf.float32, shape + (3,))
    exists = np.ones(shape, bool)
    table.accum(keys, deltas, exists)
    model.accum(np.asarray(keys), deltas, exists)
    assert_table_matches(table, model)

    table.remove(keys)
    model.remove(np.asarray(keys))
    assert_table_matches(table, model)


@table_kinds
@key_dtypes
def test_empty_batches(kind, key_dtype):
    rng = rng_for("empty", kind, key_dtype)
    table, model = new_table(kind, key_dtype, tf.float32, 5, rng)
    keys = make_keys(rng, key_dtype, 4)
    values = make_values(rng, tf.float32, (4, 5))
    table.insert(keys, values)
    model.insert(keys, values)

    empty_keys = tf.zeros([0], key_dtype)
    empty_values = tf.zeros([0, 5], tf.float32)
    table.insert(empty_keys, empty_values)
    table.accum(empty_keys, empty_values, tf.zeros([0], tf.bool))
    table.remove(empty_keys)
    found, exists = table.lookup(empty_keys, return_exists=True)
    assert found.shape == [0, 5] and exists.shape == [0]
    found = table.lookup(tf.zeros([3, 0], key_dtype))
    assert found.shape == [3, 0, 5]
    assert_table_matches(table, model)

    table.import_(empty_keys, empty_values)
    assert int(table.size()) == 0
    keys, values = table.export()
    assert keys.shape == [0] and values.shape == [0, 5]


@table_kinds
@deep_value_dtypes
@key_dtypes
def test_dynamic_default_values(kind, key_dtype, value_dtype):
    rng = rng_for("dyn", kind, key_dtype, value_dtype)
    table, model = new_table(kind, key_dtype, value_dtype, 7, rng)
    keys = make_keys(rng, key_dtype, 10)
    values = make_values(rng, value_dtype, (5, 7))
    table.insert(keys[:5], values)
    model.insert(keys[:5], values)
    query = keys[::-1].reshape(2, 5)
    per_key = make_values(rng, value_dtype, (2, 5, 7))
    check_lookup(table, model, query, dynamic_default_values=per_key)
    one_row = make_values(rng, value_dtype, (7,))
    check_lookup(table, model, query, dynamic_default_values=one_row)
    check_lookup(table, model, query)


@table_kinds
def test_properties(kind):
    rng = rng_for("props", kind)
    table, _ = new_table(kind, tf.int32, tf.float16, 4, rng, name="my_table")
    assert table.key_dtype == tf.int32
    assert table.value_dtype == tf.float16
    assert table.name == "my_table"
    assert table.dim == 4
    assert table.value_shape == tf.TensorShape([4])
    assert table.default_value.dtype == tf.float16 and table.default_value.shape == [4]
    assert table.resource_handle.dtype == tf.resource
    assert int(table.size()) == 0 and table.size().dtype == tf.int64
    assert isinstance(table, tf.saved_model.experimental.TrackableResource)


def test_cuckoo_alias():
    assert de.CuckooHashTable is de.HashTable


def test_tables_are_independent():
    a = de.HashTable(tf.int64, tf.float32, 0.0)
    b = de.HashTable(tf.int64, tf.float32, 0.0)
    a.insert([1], [1.0])
    assert int(a.size()) == 1 and int(b.size()) == 0


def test_shared_name_shares_content():
    a = de.HashTable(tf.int64, tf.float32, 0.0, shared_name="test_shared_name_table")
    b = de.HashTable(tf.int64, tf.float32, 0.0, shared_name="test_shared_name_table")
    a.insert([1], [1.5])
    assert float(b.lookup(1)) == 1.5
    with pytest.raises(tf.errors.OpError):  # same name, other value shape
        de.HashTable(tf.int64, tf.float32, [0.0, 0.0], shared_name="test_shared_name_table")


def test_a_shared_name_with_other_eviction_settings_is_an_error():
    def hkv(max_capacity, strategy=de.HkvEvictStrategy.LRU, init_capacity=8):
        return de.HkvHashTable(tf.int64, tf.float32, 0.0, shared_name="test_shared_hkv",
                               init_capacity=init_capacity, max_capacity=max_capacity,
                               config=de.HkvHashTableConfig(init_capacity=init_capacity,
                                                            max_capacity=max_capacity,
                                                            evict_strategy=strategy))

    a = hkv(64)
    hkv(64, init_capacity=16).insert([1], [1.0])  # init_capacity only presizes: shared
    assert int(a.size()) == 1
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="test_shared_hkv' already exists with max_capacity 64, evict "
                             "strategy lru.*requested max_capacity 32"):
        hkv(32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="requested max_capacity 64, evict strategy lfu"):
        hkv(64, de.HkvEvictStrategy.LFU)


def test_python_lists_and_scalars_are_converted():
    table = de.HashTable(tf.string, tf.float64, [0.0, 0.0])
    table.insert(["a", b"b"], [[1, 2], [3.5, 4]])
    np.testing.assert_array_equal(table.lookup("a").numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(table["b"].numpy(), [3.5, 4.0])
    table.remove(["a"])
    assert int(table.size()) == 1


@table_kinds
@deep_value_dtypes
@key_dtypes
def test_clear(kind, key_dtype, value_dtype):
    rng = rng_for("clear", kind, key_dtype, value_dtype)
    table, model = new_table(kind, key_dtype, value_dtype, 3, rng)
    keys = make_keys(rng, key_dtype, 20)
    table.insert(keys, make_values(rng, value_dtype, (20, 3)))
    table.clear()
    assert_table_matches(table, model)
    check_lookup(table, model, keys)
    values = make_values(rng, value_dtype, (20, 3))
    table.insert(keys, values)
    model.insert(keys, values)
    assert_table_matches(table, model)


# ----------------------------------------------------------------------------------------
# export / import / files
# ----------------------------------------------------------------------------------------


@table_kinds
@deep_value_dtypes
@key_dtypes
def test_export_with_scores_and_import_replace(kind, key_dtype, value_dtype):
    rng = rng_for("import", kind, key_dtype, value_dtype)
    src, model = new_table(kind, key_dtype, value_dtype, 7, rng)
    keys = make_keys(rng, key_dtype, 30)
    values = make_values(rng, value_dtype, (30, 7))
    src.insert(keys[:20], values[:20])
    model.insert(keys[:20], values[:20])
    src.insert(keys[5:10], values[20:25])  # scores of some keys differ from others
    model.insert(keys[5:10], values[20:25])
    exp_keys, exp_values, exp_scores = src.export_with_scores()
    assert exp_scores.dtype == tf.int64 and exp_scores.shape == exp_keys.shape
    saved_scores = dict(zip(exported_dict(exp_keys, exp_values), exp_scores.numpy()))

    dst, _ = new_table(kind, key_dtype, value_dtype, 7, rng)
    dst.insert(keys[20:], values[20:])  # content that the import must replace
    dst.import_(exp_keys, exp_values, exp_scores)
    assert_table_matches(dst, model)
    k2, v2, s2 = dst.export_with_scores()
    assert dict(zip(exported_dict(k2, v2), s2.numpy())) == saved_scores

    # Without scores, the table assigns them; the content is still replaced.
    dst.import_(keys[25:], values[25:])
    model2 = DictModel(value_dtype, (7,), model.default)
    model2.insert(keys[25:], values[25:])
    assert_table_matches(dst, model2)


@table_kinds
@deep_value_dtypes
@key_dtypes
def test_save_load_file_system_round_trip(kind, key_dtype, value_dtype, tmp_path):
    rng = rng_for("file", kind, key_dtype, value_dtype)
    src, model = new_table(kind, key_dtype, value_dtype, 7, rng, name="filetable")
    keys = make_keys(rng, key_dtype, 50)
    values = make_values(rng, value_dtype, (50, 7))
    src.insert(keys[:40], values[:40])
    model.insert(keys[:40], values[:40])
    dirpath = tmp_path / "nested" / "dir"  # created by save
    src.save_to_file_system(str(dirpath), chunk_rows=7)
    assert (dirpath / "filetable.dynemb").exists()
    _, _, src_scores = src.export_with_scores()

    dst, _ = new_table(kind, key_dtype, value_dtype, 7, rng, name="filetable")
    dst.insert(keys[40:], values[40:])  # replaced by the default clear=True
    dst.load_from_file_system(str(dirpath), chunk_rows=3)
    assert_table_matches(dst, model)
    _, _, dst_scores = dst.export_with_scores()
    assert sorted(dst_scores.numpy().tolist()) == sorted(src_scores.numpy().tolist())

    # clear=False merges into the existing content; explicit file name.
    src.save_to_file_system(str(tmp_path), file_name="other.bin")
    merged, merged_model = new_table(kind, key_dtype, value_dtype, 7, rng)
    merged.insert(keys[40:], values[40:])
    merged_model.insert(keys[40:], values[40:])
    merged.load_from_file_system(str(tmp_path), file_name="other.bin", clear=False)
    merged_model.insert(keys[:40], values[:40])
    assert_table_matches(merged, merged_model)


def test_save_load_empty_table(tmp_path):
    src = de.HashTable(tf.string, tf.int8, [0, 0])
    src.save_to_file_system(str(tmp_path), file_name="empty.dynemb")
    dst = de.HashTable(tf.string, tf.int8, [0, 0])
    dst.insert(["x"], [[1, 2]])
    dst.load_from_file_system(str(tmp_path), file_name="empty.dynemb")
    assert int(dst.size()) == 0


# ----------------------------------------------------------------------------------------
# Scores of HkvHashTable
# ----------------------------------------------------------------------------------------


def scores_of(table):
    keys, _, scores = table.export_with_scores()
    return {int(k): int(s) for k, s in zip(keys.numpy(), scores.numpy())}


@key_dtypes
def test_customized_scores_given(key_dtype):
    config = de.HkvHashTableConfig(
        init_capacity=16, max_capacity=1024, evict_strategy=de.HkvEvictStrategy.CUSTOMIZED
    )
    table = de.HkvHashTable(key_dtype, tf.float32, [0.0, 0.0], config=config)
    keys = as_key_array(EDGE_KEYS[key_dtype][:4], key_dtype)
    table.insert(keys, np.ones((4, 2), np.float32), scores=[40, 10, 30, 20])
    exported, _, scores = table.export_with_scores()
    got = dict(zip(exported.numpy().tolist(), scores.numpy().tolist()))
    assert got == dict(zip(keys.tolist(), [40, 10, 30, 20]))

    # Re-inserting with new scores overwrites them; int32 scores are widened.
    table.insert(keys[:2], np.ones((2, 2), np.float32), scores=tf.constant([5, 6], tf.int32))
    exported, _, scores = table.export_with_scores()
    got = dict(zip(exported.numpy().tolist(), scores.numpy().tolist()))
    assert got == dict(zip(keys.tolist(), [5, 6, 30, 20]))


def test_customized_insert_needs_scores_accum_keeps_them():
    table = de.HkvHashTable(
        tf.int64,
        tf.float32,
        0.0,
        init_capacity=16,
        max_capacity=64,
        evict_strategy=de.HkvEvictStrategy.CUSTOMIZED,
    )
    table.insert([1, 2], [1.0, 2.0], scores=[100, 200])
    # Without scores every new key would rank lowest: insert refuses, naming the fix.
    with pytest.raises(ValueError, match=r"CUSTOMIZED.*scores=.*gen_scores_fn"):
        table.insert([2, 3], [2.5, 3.0])
    with pytest.raises(ValueError, match=r"CUSTOMIZED.*scores=.*gen_scores_fn"):
        table.insert_and_evict([3], [3.0])
    assert scores_of(table) == {1: 100, 2: 200}
    # accum takes no scores: an updated key keeps its score, an inserted one gets 0.
    table.accum([2, 3], [0.5, 3.0], [True, False])
    assert scores_of(table) == {1: 100, 2: 200, 3: 0}


def test_customized_gen_scores_fn():
    config = de.HkvHashTableConfig(
        init_capacity=16,
        max_capacity=1024,
        evict_strategy=de.HkvEvictStrategy.CUSTOMIZED,
        gen_scores_fn=lambda keys: tf.cast(keys, tf.int64) * 10 + 1,
    )
    table = de.HkvHashTable(tf.int32, tf.float32, 0.0, config=config)
    table.insert([3, 1, 2], [1.0, 2.0, 3.0])
    assert scores_of(table) == {1: 11, 2: 21, 3: 31}
    # Explicit scores win over gen_scores_fn.
    table.insert([1], [5.0], scores=[7])
    assert scores_of(table) == {1: 7, 2: 21, 3: 31}


def test_lfu_counts_inserts_and_accums():
    table = de.HkvHashTable(
        tf.int64,
        tf.float32,
        0.0,
        init_capacity=16,
        max_capacity=1024,
        config=de.HkvHashTableConfig(
            init_capacity=16, max_capacity=1024, evict_strategy=de.HkvEvictStrategy.LFU
        ),
    )
    table.insert([1, 2, 3], [1.0, 1.0, 1.0])
    table.insert([1, 2], [1.0, 1.0])
    table.insert([1, 1], [1.0, 1.0])  # two rows touch key 1
    table.accum([3, 4], [1.0, 1.0], [True, False])
    table.lookup([1, 2, 3])  # lookups do not count
    assert scores_of(table) == {1: 4, 2: 2, 3: 2, 4: 1}


@pytest.mark.parametrize("kind", ["HashTable", "HkvLRU"])
def test_lru_scores_follow_inserts_and_hkv_lookups(kind):
    if kind == "HashTable":
        table = de.HashTable(tf.int64, tf.float32, 0.0)
    else:
        table = de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=16, max_capacity=64)
    table.insert([1, 2], [1.0, 1.0])
    table.insert([3], [1.0])
    s = scores_of(table)
    assert s[1] == s[2] < s[3]
    table.lookup([1])
    s = scores_of(table)
    if kind == "HkvLRU":  # LRU HKV tables refresh scores on lookup
        assert s[2] < s[3] < s[1]
    else:
        assert s[1] == s[2] < s[3]


def test_epoch_lru_puts_epoch_in_high_bits():
    table = de.HkvHashTable(
        tf.int64,
        tf.float32,
        0.0,
        config=de.HkvHashTableConfig(
            init_capacity=16,
            max_capacity=64,
            evict_strategy=de.HkvEvictStrategy.EPOCHLRU,
            step_per_epoch=1,
        ),
    )
    for k in range(3):
        table.insert([k], [1.0])
    s = scores_of(table)
    epochs = [s[k] >> 32 for k in range(3)]
    assert epochs[1] - epochs[0] == 1 and epochs[2] - epochs[1] == 1


@pytest.mark.parametrize(
    "strategy,op_value",
    [
        (de.HkvEvictStrategy.LRU, "lru"),
        (de.HkvEvictStrategy.LFU, "lfu"),
        (de.HkvEvictStrategy.EPOCHLRU, "epoch_lru"),
        (de.HkvEvictStrategy.EPOCHLFU, "epoch_lfu"),
        (de.HkvEvictStrategy.CUSTOMIZED, "customized"),
    ],
)
def test_every_strategy_creates_a_working_table(strategy, op_value):
    assert strategy.op_value == op_value
    assert de.HkvEvictStrategy.coerce(op_value) is strategy
    table = de.HkvHashTable(
        tf.string,
        tf.int32,
        [-1],
        config=de.HkvHashTableConfig(init_capacity=8, max_capacity=32, evict_strategy=strategy),
    )
    assert table.evict_strategy is strategy
    scores = [5, 6] if strategy == de.HkvEvictStrategy.CUSTOMIZED else None
    table.insert(["a", "b"], [[1], [2]], scores=scores)
    np.testing.assert_array_equal(table.lookup(["b", "c"]).numpy(), [[2], [-1]])


def test_config_overrides_arguments():
    config = de.HkvHashTableConfig(init_capacity=8, max_capacity=32, max_hbm_for_values=0)
    table = de.HkvHashTable(
        tf.int64, tf.float32, 0.0, init_capacity=1000, max_capacity=2000, config=config
    )
    assert (table.init_capacity, table.max_capacity, table.max_hbm_for_values) == (8, 32, 0)


# ----------------------------------------------------------------------------------------
# Large batches (the kernels split them across TF's thread pool)
# ----------------------------------------------------------------------------------------


@table_kinds
def test_large_batches_with_duplicates(kind):
    rng = rng_for("large", kind)
    n, dim = 200_000, 4
    table = TABLE_CLASSES[kind](tf.int64, tf.float32, np.zeros(dim, np.float32))
    keys = rng.integers(-30_000, 30_000, n)
    values = rng.integers(-50, 50, (n, dim)).astype(np.float32)
    table.insert(keys, values)
    # Last insert wins: the last occurrence of each key.
    unique, last_from_end = np.unique(keys[::-1], return_index=True)
    expected = values[::-1][last_from_end]
    np.testing.assert_array_equal(table.lookup(unique).numpy(), expected)
    assert int(table.size()) == len(unique)

    # Deltas of duplicated keys add up (integer-valued floats: exact in any order).
    deltas = rng.integers(-3, 4, (n, dim)).astype(np.float32)
    table.accum(keys, deltas, np.ones(n, bool))
    sums = np.zeros((len(unique), dim), np.float32)
    np.add.at(sums, np.searchsorted(unique, keys), deltas)
    np.testing.assert_array_equal(table.lookup(unique).numpy(), expected + sums)

    table.remove(keys[: n // 2])
    remaining = np.setdiff1d(unique, keys[: n // 2])
    assert int(table.size()) == len(remaining)
    _, found = table.lookup(unique, return_exists=True)
    np.testing.assert_array_equal(found.numpy(), np.isin(unique, remaining))


# Scores written after an import rank above the imported ones (the core advances its
# clock past explicit scores), so a restored table keeps evicting in the saved order.
@pytest.mark.parametrize("kind", ["HashTable", "HkvLRU"])
def test_lru_clock_continues_after_import(kind):
    if kind == "HashTable":
        table = de.HashTable(tf.int64, tf.float32, 0.0)
    else:
        table = de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=8, max_capacity=64)
    table.import_([1, 2], [1.0, 2.0], scores=[100, 200])
    table.insert([3], [3.0])
    s = scores_of(table)
    assert s[3] > s[2] > s[1]


def test_epoch_lru_epoch_continues_after_import():
    config = de.HkvHashTableConfig(
        init_capacity=8, max_capacity=64, evict_strategy=de.HkvEvictStrategy.EPOCHLRU,
        step_per_epoch=1,
    )
    table = de.HkvHashTable(tf.int64, tf.float32, 0.0, config=config)
    table.import_([1], [1.0], scores=[(5 << 32) | 7])
    table.insert([2], [2.0])
    s = scores_of(table)
    assert s[2] >> 32 >= 5
    assert s[2] > s[1]
