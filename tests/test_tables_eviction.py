"""Bounded `HkvHashTable`s through the ops and the Python API: `insert_and_evict`,
`accum_and_evict`, `stats`, eviction by `insert` and `accum`, CUSTOMIZED scores, configuration errors, and
checkpoint restores that go on evicting exactly as the saved table would have.

Eviction quality and the core's concurrency are tested without TensorFlow in
tests/test_core_eviction.py; this file checks the layers above the core.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import (
    KEY_DTYPES,
    dtype_id,
    graph_mode_results,
    make_keys,
    norm_key,
    rng_for,
    scenario_result,
)

S = de.HkvEvictStrategy


def hkv(key_dtype=tf.int64, value_dtype=tf.float32, default=0.0, max_capacity=8,
        strategy=S.LRU, **kw):
    config = de.HkvHashTableConfig(
        init_capacity=min(8, max_capacity), max_capacity=max_capacity, evict_strategy=strategy,
        **kw
    )
    return de.HkvHashTable(key_dtype, value_dtype, default, config=config)


def content(table):
    """{key: (value row as a tuple, score)}."""
    keys, values, scores = (t.numpy() for t in table.export_with_scores())
    values = values.reshape(len(keys), -1)
    return {norm_key(k): (tuple(v.tolist()), int(s)) for k, v, s in zip(keys, values, scores)}


def evicted(result):
    keys, values, scores = (t.numpy() for t in result)
    values = values.reshape(len(keys), -1)
    out = {norm_key(k): (tuple(v.tolist()), int(s)) for k, v, s in zip(keys, values, scores)}
    assert len(out) == len(keys), "a key was reported twice"
    return out


def stats_of(table):
    return {k: v.numpy().item() for k, v in table.stats().items()}


# ----------------------------------------------------------------------------------------
# insert_and_evict
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=dtype_id)
def test_insert_and_evict_returns_what_left_the_table(key_dtype):
    rng = rng_for("insert_and_evict", key_dtype)
    keys = make_keys(rng, key_dtype, 24)
    table = hkv(key_dtype, tf.int32, [-1, -1], max_capacity=12)
    values = np.arange(48, dtype=np.int32).reshape(24, 2)
    for b in range(0, 12, 4):  # fills the table: nothing evicted
        k, v, s = table.insert_and_evict(keys[b:b + 4], values[b:b + 4])
        assert k.dtype == key_dtype and v.dtype == tf.int32 and s.dtype == tf.int64
        assert k.shape == [0] and v.shape == [0, 2] and s.shape == [0]
    for b in range(12, 24, 4):
        before = content(table)
        got = evicted(table.insert_and_evict(keys[b:b + 4], values[b:b + 4]))
        after = content(table)
        # LRU: the oldest batch, with the rows and scores it had.
        assert set(got) == {norm_key(k) for k in keys[b - 12:b - 8]}
        assert set(got) == set(before) - set(after)
        assert all(got[k] == before[k] for k in got)
        assert int(table.size()) == 12


def test_insert_and_evict_keys_of_any_shape_and_scalar_values():
    table = hkv(tf.int64, tf.float64, 0.5, max_capacity=4, strategy=S.CUSTOMIZED)
    table.insert([[1, 2], [3, 4]], [[1.0, 2.0], [3.0, 4.0]], scores=[[10, 20], [30, 40]])
    keys, values, scores = table.insert_and_evict(
        tf.constant([[5], [6]], tf.int64), tf.constant([[5.0], [6.0]], tf.float64),
        scores=tf.constant([[50], [60]], tf.int64))
    assert keys.shape == [2] and values.shape == [2] and scores.shape == [2]
    assert sorted(zip(keys.numpy().tolist(), values.numpy().tolist(), scores.numpy().tolist())) \
        == [(1, 1.0, 10), (2, 2.0, 20)]


def test_customized_turns_away_keys_scored_below_every_stored_one():
    table = hkv(max_capacity=3, strategy=S.CUSTOMIZED)
    table.insert([1, 2, 3], [1.0, 2.0, 3.0], scores=[30, 10, 20])
    got = evicted(table.insert_and_evict([4, 5], [4.0, 5.0], scores=[5, 40]))
    # 4 (score 5) ranks below everything: not inserted, reported with its own row.
    # 5 (score 40) evicts the lowest stored entry, 2.
    assert got == {4: ((4.0,), 5), 2: ((2.0,), 10)}
    assert content(table) == {1: ((1.0,), 30), 3: ((3.0,), 20), 5: ((5.0,), 40)}


def test_gen_scores_fn_scores_insert_and_evict():
    config = de.HkvHashTableConfig(
        init_capacity=2, max_capacity=2, evict_strategy=S.CUSTOMIZED,
        gen_scores_fn=lambda keys: keys * 10)
    table = de.HkvHashTable(tf.int64, tf.float32, 0.0, config=config)
    table.insert([3, 1], [3.0, 1.0])
    got = evicted(table.insert_and_evict([2], [2.0]))
    assert got == {1: ((1.0,), 10)}


def test_hash_table_never_evicts():
    table = de.HashTable(tf.string, tf.bfloat16, [0.0, 0.0, 0.0])
    keys, values, scores = table.insert_and_evict(["a", "b"], tf.ones([2, 3], tf.bfloat16))
    assert keys.dtype == tf.string and keys.shape == [0]
    assert values.dtype == tf.bfloat16 and values.shape == [0, 3]
    assert scores.shape == [0] and int(table.size()) == 2


def test_insert_and_evict_rejects_bad_inputs_and_leaves_the_table():
    table = hkv(max_capacity=2, default=[0.0, 0.0])
    table.insert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    before = content(table)
    with pytest.raises(TypeError, match="keys"):
        table.insert_and_evict(tf.constant([3], tf.int32), [[3.0, 3.0]])
    with pytest.raises(TypeError, match="values"):
        table.insert_and_evict([3], tf.constant([[3, 3]], tf.int32))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="Expected shape"):
        table.insert_and_evict([3], [[3.0, 3.0, 3.0]])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="Expected shape"):
        table.insert_and_evict([3], [[3.0, 3.0]], scores=[1, 2])
    assert content(table) == before


def test_large_batch_split_over_threads():
    """A batch big enough for the kernel to split it over TF's thread pool."""
    rng = rng_for("large_evict")
    table = hkv(max_capacity=20_000, default=np.zeros(4, np.float32))
    keys = make_keys(rng, tf.int64, 50_000, edges=False)
    values = rng.standard_normal((50_000, 4)).astype(np.float32)
    ev_keys, ev_values, _ = table.insert_and_evict(keys[:30_000], values[:30_000])
    assert int(table.size()) == 20_000 and len(ev_keys) == 10_000
    # What was reported is exactly what is missing, with the rows that were inserted.
    _, found = table.lookup(keys[:30_000], return_exists=True)
    missing = set(keys[:30_000][~found.numpy()].tolist())
    assert set(ev_keys.numpy().tolist()) == missing
    row_of = {k: i for i, k in enumerate(keys[:30_000].tolist())}
    np.testing.assert_array_equal(
        ev_values.numpy(), values[[row_of[k] for k in ev_keys.numpy().tolist()]])
    ev_keys, _, _ = table.insert_and_evict(keys[30_000:], values[30_000:])
    assert int(table.size()) == 20_000 and len(ev_keys) == 20_000


@pytest.mark.parametrize("signature", ["static", "dynamic"])
def test_insert_and_evict_and_stats_in_tf_function(signature):
    table = hkv(tf.string, tf.int8, [0, 0], max_capacity=3)
    if signature == "dynamic":
        decorate = tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                                tf.TensorSpec([None, 2], tf.int8)])
    else:
        decorate = tf.function

    @decorate
    def step(keys, values):
        evicted_keys, evicted_values, evicted_scores = table.insert_and_evict(keys, values)
        return evicted_keys, evicted_values, evicted_scores, table.stats()

    step(tf.constant(["a", "b", "c"]), tf.constant([[1, 1], [2, 2], [3, 3]], tf.int8))
    keys, values, scores, stats = step(tf.constant(["d"]), tf.constant([[4, 4]], tf.int8))
    assert keys.numpy().tolist() in ([b"a"], [b"b"], [b"c"])
    assert values.numpy().tolist() == [[ord(keys.numpy()[0]) - ord("a") + 1] * 2]
    assert stats["size"].numpy() == 3 and stats["evictions"].numpy() == 1
    assert stats["max_capacity"].numpy() == 3 and stats["inserts"].numpy() == 4


def test_graph_mode_insert_and_evict_and_stats():
    result = scenario_result(graph_mode_results(), "graph_eviction_and_stats")
    assert result["first"] == [[], [], []]
    assert result["evicted"] == [[1, 2], [[1.0, 1.0], [2.0, 2.0]], [10, 20]]
    assert result["size"] == 3
    assert result["stats"] == {
        "size": 3, "capacity": 3, "max_capacity": 3, "load_factor": 1.0,
        "inserts": 5, "lookups": 2, "misses": 1, "evictions": 2,
    }
    assert result["customized_without_scores"].startswith("ValueError")


# ----------------------------------------------------------------------------------------
# accum_and_evict
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=dtype_id)
def test_accum_and_evict_returns_what_left_the_table(key_dtype):
    rng = rng_for("accum_and_evict", key_dtype)
    keys = make_keys(rng, key_dtype, 28)
    never = keys[24:]  # never inserted
    table = hkv(key_dtype, tf.int32, [-1, -1], max_capacity=12)
    values = np.arange(48, dtype=np.int32).reshape(24, 2)
    absent = np.zeros(4, bool)
    for b in range(0, 12, 4):  # fills the table: nothing evicted
        k, v, s = table.accum_and_evict(keys[b:b + 4], values[b:b + 4], absent)
        assert k.dtype == key_dtype and v.dtype == tf.int32 and s.dtype == tf.int64
        assert k.shape == [0] and v.shape == [0, 2] and s.shape == [0]
    for b in range(12, 24, 4):
        before = content(table)
        # Besides 4 new keys, a stored key with exists=False and an absent key with
        # exists=True: both left alone, so neither needs room.
        batch_keys = [keys[b:b + 4], keys[b - 5:b - 4], never[b // 4 - 3:b // 4 - 2]]
        deltas = [values[b:b + 4], [[7, 7]], [[9, 9]]]
        exists = [False] * 4 + [False, True]
        expected = keys[b - 12:b - 8]  # LRU: the oldest batch
        if b == 20:
            # Adding to the oldest key rescores it before the new keys need room: the
            # next oldest goes instead.
            batch_keys.append(keys[b - 12:b - 11])
            deltas.append([[100, 100]])
            exists.append(True)
            expected = keys[b - 11:b - 7]
        got = evicted(table.accum_and_evict(
            np.concatenate(batch_keys), np.concatenate(deltas).astype(np.int32), exists))
        after = content(table)
        assert set(got) == {norm_key(k) for k in expected}
        assert set(got) == set(before) - set(after)
        assert all(got[k] == before[k] for k in got)  # the rows and scores they had
        assert after[norm_key(keys[b - 5])][0] == before[norm_key(keys[b - 5])][0]
        assert norm_key(never[b // 4 - 3]) not in after
        assert int(table.size()) == 12
    oldest = norm_key(keys[8])
    assert after[oldest][0] == tuple((np.array(before[oldest][0]) + 100).tolist())


def test_accum_and_evict_turns_away_keys_scored_below_every_stored_one():
    # CUSTOMIZED: a key accum inserts gets score 0, below the stored scores.
    table = hkv(max_capacity=2, strategy=S.CUSTOMIZED)
    table.insert([1, 2], [1.0, 2.0], scores=[10, 20])
    got = evicted(table.accum_and_evict([[3], [1]], [[3.0], [0.5]], [[False], [True]]))
    assert got == {3: ((3.0,), 0)}  # reported with the delta it would have inserted
    assert content(table) == {1: ((1.5,), 10), 2: ((2.0,), 20)}
    assert stats_of(table)["evictions"] == 1


def test_hash_table_accum_and_evict_never_evicts():
    table = de.HashTable(tf.string, tf.bfloat16, [0.0, 0.0, 0.0])
    keys, values, scores = table.accum_and_evict(
        ["a", "b"], tf.ones([2, 3], tf.bfloat16), [False, False])
    assert keys.dtype == tf.string and keys.shape == [0]
    assert values.dtype == tf.bfloat16 and values.shape == [0, 3]
    assert scores.shape == [0] and int(table.size()) == 2


def test_accum_and_evict_rejects_bad_inputs_and_leaves_the_table():
    table = hkv(max_capacity=2, default=[0.0, 0.0])
    table.insert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    before = content(table)
    with pytest.raises(TypeError, match="keys"):
        table.accum_and_evict(tf.constant([3], tf.int32), [[3.0, 3.0]], [False])
    with pytest.raises(TypeError, match="values_or_deltas"):
        table.accum_and_evict([3], tf.constant([[3, 3]], tf.int32), [False])
    with pytest.raises(TypeError, match="exists"):
        table.accum_and_evict([3], [[3.0, 3.0]], tf.constant([0], tf.int32))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="Expected shape"):
        table.accum_and_evict([3], [[3.0, 3.0, 3.0]], [False])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="Expected shape"):
        table.accum_and_evict([3], [[3.0, 3.0]], [False, False])
    assert content(table) == before


@pytest.mark.parametrize("signature", ["static", "dynamic"])
def test_accum_and_evict_in_tf_function(signature):
    table = hkv(tf.string, tf.int8, [0, 0], max_capacity=3)
    if signature == "dynamic":
        decorate = tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                                tf.TensorSpec([None, 2], tf.int8),
                                                tf.TensorSpec([None], tf.bool)])
    else:
        decorate = tf.function

    @decorate
    def step(keys, deltas, exists):
        return table.accum_and_evict(keys, deltas, exists)

    step(tf.constant(["a", "b", "c"]), tf.constant([[1, 1], [2, 2], [3, 3]], tf.int8),
         tf.constant([False] * 3))
    keys, values, scores = step(tf.constant(["d", "a"]), tf.constant([[4, 4], [1, 1]], tf.int8),
                                tf.constant([False, True]))
    # "a" was rescored first by its delta; "b" is the oldest left.
    assert keys.numpy().tolist() == [b"b"] and values.numpy().tolist() == [[2, 2]]
    assert scores.shape == [1] and int(table.size()) == 3
    assert content(table)[b"a"][0] == (2, 2)


def test_graph_mode_accum_and_evict():
    result = scenario_result(graph_mode_results(), "graph_accum_and_evict")
    assert result["first"] == [[], [], []]
    assert result["evicted"] == [[2], [[2.0, 2.0]], [1]]  # LFU: counted once
    assert result["size"] == 3


# ----------------------------------------------------------------------------------------
# insert and accum into a full table; stats
# ----------------------------------------------------------------------------------------


def test_insert_and_accum_evict_lowest_scores():
    table = hkv(max_capacity=4, strategy=S.LFU)
    table.insert([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])
    table.insert([1, 2, 3], [1.0, 2.0, 3.0])  # 4 is the least frequent
    table.insert([5], [5.0])  # evicts 4 (ties with 5 at count 1 evict the stored key)
    assert set(content(table)) == {1, 2, 3, 5}
    # accum inserting a key evicts as insert does; accum updating one does not.
    table.accum([6, 1], [6.0, 0.5], [False, True])
    got = content(table)
    assert set(got) == {1, 2, 3, 6} and got[1] == ((1.5,), 3)
    assert stats_of(table)["evictions"] == 2


def test_stats_counts():
    table = hkv(max_capacity=4, strategy=S.LRU)
    table.insert([1, 2, 3], [1.0, 2.0, 3.0])
    s = stats_of(table)
    assert s == {"size": 3, "capacity": s["capacity"], "max_capacity": 4,
                 "load_factor": pytest.approx(3 / s["capacity"]), "inserts": 3, "lookups": 0,
                 "misses": 0, "evictions": 0}
    assert 3 <= s["capacity"] <= 4
    table.lookup([1, 9, 8])
    table.insert([4, 5, 6], [4.0, 5.0, 6.0])
    s = stats_of(table)
    assert (s["size"], s["capacity"], s["load_factor"]) == (4, 4, 1.0)
    assert (s["inserts"], s["lookups"], s["misses"], s["evictions"]) == (6, 3, 2, 2)
    table.clear()  # counters are since creation
    s = stats_of(table)
    assert s["size"] == 0 and s["inserts"] == 6 and s["evictions"] == 2
    plain = de.HashTable(tf.int64, tf.float32, 0.0)
    plain.insert(np.arange(100), np.zeros(100, np.float32))
    s = stats_of(plain)
    assert s["max_capacity"] == 0 and s["size"] == 100 and s["capacity"] >= 100
    assert s["load_factor"] == pytest.approx(100 / s["capacity"])
    assert set(table.stats()) == {"size", "capacity", "max_capacity", "load_factor", "inserts",
                                  "lookups", "misses", "evictions"}
    assert table.stats()["load_factor"].dtype == tf.float32


def test_capacity_grows_from_init_capacity_to_max_capacity():
    table = de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=1000, max_capacity=50_000)
    capacities = [stats_of(table)["capacity"]]
    rng = rng_for("growth")
    keys = make_keys(rng, tf.int64, 80_000, edges=False)
    for b in range(0, 80_000, 10_000):
        table.insert(keys[b:b + 10_000], np.zeros(10_000, np.float32))
        s = stats_of(table)
        assert s["size"] <= s["capacity"] <= 50_000
        capacities.append(s["capacity"])
    assert 1000 <= capacities[0] < 50_000 and capacities == sorted(capacities)
    assert capacities[-1] == 50_000 and stats_of(table)["size"] == 50_000


# ----------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(init_capacity=0), r"init_capacity.*>= 1.*0"),
        (dict(init_capacity=-4), r"init_capacity.*>= 1.*-4"),
        (dict(max_capacity=0), r"max_capacity.*>= 1.*0"),
        (dict(max_capacity=-7), r"max_capacity.*>= 1.*-7"),
        (dict(evict_strategy="fifo"), r"evict_strategy.*fifo"),
        (dict(evict_strategy=17), r"evict_strategy.*17"),
        (dict(step_per_epoch=-1), r"step_per_epoch.*-1"),
        (dict(max_hbm_for_values=-1), r"max_hbm_for_values.*-1"),
    ],
)
def test_bad_configs_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        de.HkvHashTableConfig(**kwargs)
    with pytest.raises(ValueError, match=match):
        de.HkvHashTable(tf.int64, tf.float32, 0.0, **kwargs)


def test_customized_without_scores_or_gen_scores_fn():
    table = hkv(max_capacity=4, strategy=S.CUSTOMIZED)
    for call in (lambda: table.insert([1], [1.0]), lambda: table.insert_and_evict([1], [1.0])):
        with pytest.raises(ValueError) as e:
            call()
        assert "CUSTOMIZED" in str(e.value) and "scores=" in str(e.value)
        assert "gen_scores_fn" in str(e.value)
    assert int(table.size()) == 0
    table.insert([1], [1.0], scores=[3])  # with scores it works
    assert content(table) == {1: ((1.0,), 3)}


# ----------------------------------------------------------------------------------------
# Checkpoints: the restored table evicts what the saved one would have
# ----------------------------------------------------------------------------------------


def test_restore_into_a_smaller_table_keeps_the_highest_scores(tmp_path):
    saved = hkv(max_capacity=10, strategy=S.CUSTOMIZED)
    saved.insert(np.arange(10), np.arange(10, dtype=np.float32),
                 scores=[5, 1, 9, 3, 7, 2, 8, 0, 6, 4])
    prefix = tf.train.Checkpoint(table=saved).save(str(tmp_path / "ckpt"))
    smaller = hkv(max_capacity=4, strategy=S.CUSTOMIZED)
    tf.train.Checkpoint(table=smaller).restore(prefix)
    assert content(smaller) == {2: ((2.0,), 9), 6: ((6.0,), 8), 4: ((4.0,), 7), 8: ((8.0,), 6)}
    assert stats_of(smaller)["evictions"] == 6


@pytest.mark.parametrize("strategy", [S.LRU, S.LFU, S.EPOCHLRU, S.CUSTOMIZED], ids=str)
def test_restored_table_evicts_the_same_keys(tmp_path, strategy):
    rng = rng_for("restore_evicts", strategy)
    keys = make_keys(rng, tf.int64, 6000, edges=False)
    scores = rng.integers(0, 300, 6000)  # many ties
    make = lambda: hkv(max_capacity=2000, strategy=strategy, step_per_epoch=3)  # noqa: E731

    def scores_for(batch):
        return scores[batch] if strategy == S.CUSTOMIZED else None

    saved = make()
    for b in range(0, 2600, 200):  # fills past max_capacity, with lookups and repeats
        batch = slice(b, b + 200)
        saved.insert(keys[batch], np.full(200, b, np.float32), scores=scores_for(batch))
        saved.lookup(keys[b:b + 100:3])
        if strategy == S.LFU:
            saved.insert(keys[b:b + 50], np.full(50, -b, np.float32))
    prefix = tf.train.Checkpoint(table=saved).save(str(tmp_path / "ckpt"))
    restored = make()
    restored.insert([123456789], [1.0], scores=scores_for([0]))  # overwritten by the restore
    tf.train.Checkpoint(table=restored).restore(prefix).assert_consumed()
    assert content(restored) == content(saved)

    for b in range(2600, 6000, 340):
        batch = slice(b, b + 340)
        values = np.full(340, b, np.float32)
        from_saved = evicted(saved.insert_and_evict(keys[batch], values, scores_for(batch)))
        from_restored = evicted(restored.insert_and_evict(keys[batch], values,
                                                          scores_for(batch)))
        assert {k: v for k, (v, _) in from_restored.items()} == \
            {k: v for k, (v, _) in from_saved.items()}, b
        assert len(from_saved) > 0
        # The LRU clock itself is not saved (a restore moves it just past the highest
        # score), so scores written after the restore may differ by a constant; they
        # rank the same.
        order = sorted(from_saved, key=lambda k: (from_saved[k][1], k))
        assert order == sorted(from_restored, key=lambda k: (from_restored[k][1], k))
        if strategy in (S.LFU, S.CUSTOMIZED):  # no clock in these scores
            assert from_restored == from_saved
        probe = keys[b - 600:b:5]
        saved.lookup(probe)  # keeps LRU scores moving, the same way in both
        restored.lookup(probe)
    assert set(content(restored)) == set(content(saved))
