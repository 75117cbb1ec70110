"""Eviction of bounded core tables (max_capacity > 0), through the TF-free binding.

What a full table evicts per strategy, the quality of eviction over many shards (the
entries kept are the highest-ranked ones, table-wide), that insert_and_evict and
accum_and_evict report exactly what left the table, the size bound under concurrent
writers, accum into a full table, growth up to max_capacity, and the counters. The design is described in
cc/core/table.h ("Bounded tables").
"""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_ext  # noqa: E402
from core_model import model_key  # noqa: E402

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

STRATEGIES = ("lru", "lfu", "epoch_lru", "epoch_lfu", "customized")


@pytest.fixture(scope="module")
def core():
    return core_ext.load_core()


def distinct_keys(rng, n):
    """n distinct int64 keys spread over the whole range (and so over all shards)."""
    keys = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 2 * n + 64))
    return rng.permutation(keys)[:n].astype(np.int64)


def rows(keys, dim=2):
    """Value rows that encode their key (so reported values can be checked)."""
    return np.repeat((np.asarray(keys) % 1000003).astype(np.float32)[:, None], dim, axis=1)


def entries(table):
    """{key: (row tuple, score)} of the whole table."""
    keys, values, scores = table.export()
    return {model_key(k): (tuple(v.tolist()), int(s)) for k, v, s in zip(keys, values, scores)}


def evicted_dict(evicted):
    keys, values, scores = evicted
    out = {model_key(k): (tuple(v.tolist()), int(s)) for k, v, s in zip(keys, values, scores)}
    assert len(out) == len(keys), "a key was reported twice"
    return out


def fill(table, keys, batch=1024, dim=2, scores=None):
    for b in range(0, len(keys), batch):
        k = keys[b:b + batch]
        s = None if scores is None else scores[b:b + batch]
        table.insert(k, rows(k, dim), s)


# ===========================================================================
# What each strategy evicts
# ===========================================================================
def test_nothing_is_evicted_below_max_capacity(core):
    rng = np.random.default_rng(1)
    for strategy in STRATEGIES:
        t = core.Table("int64", "float32", 2, init_capacity=16, max_capacity=1000,
                       strategy=strategy)
        keys = distinct_keys(rng, 1000)
        scores = rng.integers(0, 100, 1000).astype(np.uint64)
        for b in range(0, 1000, 100):
            ev = t.insert_and_evict(keys[b:b + 100], rows(keys[b:b + 100]), scores[b:b + 100])
            assert len(ev[0]) == 0, (strategy, b)
            assert t.size() == b + 100
        assert t.counters()["evictions"] == 0
        # Updating present keys never evicts either.
        ev = t.insert_and_evict(keys[:500], rows(keys[:500]), scores[:500])
        assert len(ev[0]) == 0 and t.size() == 1000


def test_lru_evicts_the_least_recently_written_batch(core):
    t = core.Table("int64", "float32", 2, max_capacity=300, strategy="lru")
    batches = [np.arange(100, dtype=np.int64) + 1000 * b for b in range(6)]
    for b in range(3):
        t.insert(batches[b], rows(batches[b]))
    t.insert(batches[0][:50], rows(batches[0][:50]))  # rewrites half of batch 0
    before = entries(t)
    ev = evicted_dict(t.insert_and_evict(batches[3], rows(batches[3])))
    # The oldest: the other half of batch 0, then half of batch 1 -- among equal
    # scores, the rows written first.
    assert set(ev) == set(batches[0][50:].tolist()) | set(batches[1][:50].tolist())
    for k, (row, score) in ev.items():
        assert before[k] == (row, score)
    assert t.size() == 300


def test_lru_lookups_refresh_when_find_updates_scores(core):
    for refresh in (True, False):
        t = core.Table("int64", "float32", 1, max_capacity=200, strategy="lru",
                       find_updates_scores=refresh)
        old, new = np.arange(200, dtype=np.int64), np.arange(1000, 1100, dtype=np.int64)
        t.insert(old[:100], rows(old[:100], 1))
        t.insert(old[100:], rows(old[100:], 1))
        t.find(old[:100])  # the first batch is read again
        ev = evicted_dict(t.insert_and_evict(new, rows(new, 1)))
        expected = old[100:] if refresh else old[:100]
        assert set(ev) == set(expected.tolist()), refresh


def test_lfu_evicts_the_least_frequent_and_turns_away_rarer_new_keys(core):
    t = core.Table("int64", "float32", 1, max_capacity=6, strategy="lfu")
    for reps, keys in ((3, [1, 2]), (2, [3, 4]), (1, [5, 6])):
        for _ in range(reps):
            t.insert(np.array(keys, np.int64), rows(keys, 1))
    # A new key (count 1) ties with 5 and 6: the stored key written first goes.
    ev = evicted_dict(t.insert_and_evict(np.array([7], np.int64), rows([7], 1)))
    assert set(ev) == {5}
    # Counting up 7 and 6 to 2: now every stored key counts >= 2, so a new key
    # (count 1) is turned away, reported with its own row and count.
    t.insert(np.array([7, 6], np.int64), rows([7, 6], 1))
    ev = evicted_dict(t.insert_and_evict(np.array([8], np.int64), rows([8], 1)))
    assert ev == {8: (tuple(rows([8], 1)[0].tolist()), 1)}
    assert 8 not in entries(t)
    # Rows apply in order and each one that needs room is its own attempt: two rows
    # of a new key are turned away twice (and reported twice).
    before = entries(t)
    ev_keys, _, ev_scores = t.insert_and_evict(np.array([9, 9], np.int64), rows([9, 9], 1))
    assert ev_keys.tolist() == [9, 9] and ev_scores.tolist() == [1, 1]
    assert entries(t) == before


def test_epoch_lfu_evicts_old_epochs_first_whatever_their_counts(core):
    t = core.Table("int64", "float32", 1, max_capacity=4, strategy="epoch_lfu", step_per_epoch=5)
    for _ in range(5):  # epoch 0: key 1 counted 5 times
        t.insert(np.array([1], np.int64), rows([1], 1))
    t.insert(np.array([2, 3, 4], np.int64), rows([2, 3, 4], 1))  # epoch 1, count 1
    scores = {k: s for k, (_, s) in entries(t).items()}
    assert scores[1] >> 32 == 0 and scores[1] & 0xFFFFFFFF == 5
    assert all(scores[k] >> 32 == 1 for k in (2, 3, 4))
    ev = evicted_dict(t.insert_and_evict(np.array([5], np.int64), rows([5], 1)))
    assert set(ev) == {1}
    # Plain LFU keeps the frequent key instead.
    lfu = core.Table("int64", "float32", 1, max_capacity=4, strategy="lfu")
    for _ in range(5):
        lfu.insert(np.array([1], np.int64), rows([1], 1))
    lfu.insert(np.array([2, 3, 4], np.int64), rows([2, 3, 4], 1))
    ev = evicted_dict(lfu.insert_and_evict(np.array([5], np.int64), rows([5], 1)))
    assert set(ev) == {2}


def test_epoch_lru_ranks_by_epoch_then_recency(core):
    t = core.Table("int64", "float32", 1, max_capacity=6, strategy="epoch_lru", step_per_epoch=2,
                   find_updates_scores=True)
    t.insert(np.array([1, 2], np.int64), rows([1, 2], 1))   # epoch 0
    t.insert(np.array([3, 4], np.int64), rows([3, 4], 1))   # epoch 0, later
    t.insert(np.array([5, 6], np.int64), rows([5, 6], 1))   # epoch 1
    t.find(np.array([1, 2], np.int64))  # refreshes 1 and 2 within epoch 1's clock
    scores = {k: s for k, (_, s) in entries(t).items()}
    assert {k: scores[k] >> 32 for k in scores} == {1: 1, 2: 1, 3: 0, 4: 0, 5: 1, 6: 1}
    ev = evicted_dict(t.insert_and_evict(np.array([7, 8], np.int64), rows([7, 8], 1)))
    assert set(ev) == {3, 4}
    ev = evicted_dict(t.insert_and_evict(np.array([9, 10], np.int64), rows([9, 10], 1)))
    assert set(ev) == {5, 6}  # epoch 1, written before 1 and 2 were read


def test_customized_evicts_the_lowest_given_scores(core):
    t = core.Table("int64", "float32", 2, max_capacity=5, strategy="customized")
    keys = np.array([10, 20, 30, 40, 50], np.int64)
    t.insert(keys, rows(keys), np.array([5, 1, 4, 2, 3], np.uint64))
    ev = evicted_dict(t.insert_and_evict(np.array([60, 70], np.int64), rows([60, 70]),
                                         np.array([9, 8], np.uint64)))
    assert {k: s for k, (_, s) in ev.items()} == {20: 1, 40: 2}
    # A new key scored below every stored one is turned away; one that ties the
    # minimum (3, key 50) replaces it.
    ev = evicted_dict(t.insert_and_evict(np.array([80, 90], np.int64), rows([80, 90]),
                                         np.array([2, 3], np.uint64)))
    assert {k: s for k, (_, s) in ev.items()} == {80: 2, 50: 3}
    assert ev[80][0] == tuple(rows([80])[0].tolist())
    assert {k: s for k, (_, s) in entries(t).items()} == {10: 5, 30: 4, 60: 9, 70: 8, 90: 3}
    # Lowering a stored key's score makes it the next to go.
    t.insert(np.array([60], np.int64), rows([60]), np.array([0], np.uint64))
    ev = evicted_dict(t.insert_and_evict(np.array([100], np.int64), rows([100]),
                                         np.array([7], np.uint64)))
    assert set(ev) == {60}


@pytest.mark.parametrize("key_dtype", ["int32", "int64", "string"])
def test_evicted_keys_and_values_of_every_key_dtype(core, key_dtype):
    t = core.Table(key_dtype, "int64", 3, max_capacity=50, strategy="customized")
    if key_dtype == "string":
        keys = [b"", b"\x00", b"k" * 200] + [("key%d" % i).encode() for i in range(97)]
    else:
        info = np.iinfo(np.int32 if key_dtype == "int32" else np.int64)
        keys = [0, -1, int(info.min), int(info.max)] + list(range(1, 97))
    values = np.arange(300, dtype=np.int64).reshape(100, 3)
    scores = np.arange(100, dtype=np.uint64)[::-1].copy()  # the first keys rank highest
    key_arg = keys if key_dtype == "string" else np.array(keys, t.key_dtype)
    ev_keys, ev_values, ev_scores = t.insert_and_evict(key_arg, values, scores)
    got = {model_key(k): (v.tolist(), int(s)) for k, v, s in zip(ev_keys, ev_values, ev_scores)}
    want = {model_key(keys[i]): (values[i].tolist(), int(scores[i])) for i in range(50, 100)}
    assert got == want
    assert set(entries(t)) == {model_key(k) for k in keys[:50]}


def test_unbounded_tables_never_evict(core):
    t = core.Table("int64", "float32", 2)
    keys = np.arange(5000, dtype=np.int64)
    k, v, s = t.insert_and_evict(keys, rows(keys))
    assert k.shape == (0,) and v.shape == (0, 2) and s.shape == (0,) and t.size() == 5000


# ===========================================================================
# Quality: what is kept is what ranks highest over the whole table
# ===========================================================================
@pytest.mark.parametrize("max_capacity", [4096, 65536])
@pytest.mark.parametrize("strategy", ["lru", "epoch_lru"])
def test_recency_quality(core, strategy, max_capacity):
    """2 x max_capacity distinct keys in batches of 1024: the most recent max_capacity
    keys stay (>= 99%), although shards receive unequal numbers of them."""
    rng = np.random.default_rng(max_capacity)
    keys = distinct_keys(rng, 2 * max_capacity)
    t = core.Table("int64", "float32", 2, init_capacity=1024, max_capacity=max_capacity,
                   strategy=strategy, step_per_epoch=3)
    for b in range(0, len(keys), 1024):
        t.insert(keys[b:b + 1024], rows(keys[b:b + 1024]))
        assert t.size() == min(b + 1024, max_capacity)
    _, exists = t.find(keys[-max_capacity:])
    assert exists.mean() >= 0.99, exists.mean()
    assert t.counters()["evictions"] == max_capacity


@pytest.mark.parametrize("max_capacity", [4096, 65536])
def test_frequency_quality(core, max_capacity):
    """LFU with a known ranking over 2 x max_capacity distinct keys: tier A (half of
    max_capacity) is written 4 times, tier B (the other half) 3 times, tier C
    (max_capacity keys) once; then max_capacity fresh keys arrive once each. All go in
    shuffled passes of 1024-key batches, the first pass mixing C in. The
    max_capacity most frequent keys (A and B) end up present (>= 99%), and the fresh
    keys are turned away (their count, 1, is below every stored count)."""
    rng = np.random.default_rng(7 + max_capacity)
    half = max_capacity // 2
    pool = distinct_keys(rng, 3 * max_capacity)
    a, b, c, fresh = pool[:half], pool[half:max_capacity], pool[max_capacity:2 * max_capacity], \
        pool[2 * max_capacity:]
    t = core.Table("int64", "float32", 2, max_capacity=max_capacity, strategy="lfu")
    for keys in (np.concatenate([a, b, c]), np.concatenate([a, b]), np.concatenate([a, b]), a):
        fill(t, rng.permutation(keys))
        assert t.size() == max_capacity
    _, exists = t.find(np.concatenate([a, b]))
    assert exists.mean() >= 0.99, exists.mean()
    turned_away = 0
    for start in range(0, max_capacity, 1024):
        batch = fresh[start:start + 1024]
        ev_keys, _, ev_scores = t.insert_and_evict(batch, rows(batch))
        turned_away += int(np.isin(ev_keys, batch).sum())
        assert (ev_scores == 1).all()
    assert turned_away >= 0.99 * max_capacity
    _, exists = t.find(np.concatenate([a, b]))
    assert exists.mean() >= 0.99, exists.mean()


@pytest.mark.parametrize("max_capacity", [4096, 65536])
def test_customized_quality(core, max_capacity):
    """Random given scores, in batches: the max_capacity highest scores stay."""
    rng = np.random.default_rng(11 + max_capacity)
    keys = distinct_keys(rng, 2 * max_capacity)
    scores = rng.permutation(2 * max_capacity).astype(np.uint64)
    t = core.Table("int64", "float32", 2, max_capacity=max_capacity, strategy="customized")
    fill(t, keys, scores=scores)
    top = keys[np.argsort(scores)[-max_capacity:]]
    _, exists = t.find(top)
    assert exists.mean() >= 0.99, exists.mean()
    assert t.size() == max_capacity


# ===========================================================================
# insert_and_evict reports exactly what left the table
# ===========================================================================
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_insert_and_evict_reports_what_disappeared(core, strategy):
    rng = np.random.default_rng(sum(map(ord, strategy)))
    t = core.Table("int64", "float32", 2, max_capacity=3000, strategy=strategy,
                   step_per_epoch=2, find_updates_scores=strategy in ("lru", "epoch_lru"))
    fresh = iter(distinct_keys(rng, 40000))
    for step in range(12):
        n = int(rng.integers(1, 1500))
        keys = np.array([next(fresh) for _ in range(n)], np.int64)
        scores = None
        if strategy == "customized":
            scores = rng.integers(0, 10000, n).astype(np.uint64)
        before = entries(t)
        ev = evicted_dict(t.insert_and_evict(keys, rows(keys), scores))
        after = entries(t)
        # New distinct keys: what left is the stored entries that are gone and the new
        # keys that never made it in.
        assert set(ev) == (set(before) | set(keys.tolist())) - set(after), step
        assert t.size() == len(after) == min(3000, len(before) + n)
        given = dict(zip(keys.tolist(), [None] * n if scores is None else scores.tolist()))
        for k, (row, score) in ev.items():
            if k in before:
                assert (row, score) == before[k]
            else:  # turned away: the row and score it was given
                assert row == tuple(rows([k])[0].tolist())
                if scores is not None:
                    assert score == given[k]
        if strategy in ("lru", "epoch_lru"):
            # The batch's keys carry the newest clock value: none of them is evicted.
            assert not set(ev) & set(keys.tolist())
            t.find(np.array(list(after)[: len(after) // 3], np.int64))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_accum_and_evict_reports_what_disappeared(core, strategy):
    """accum into a full table, mixing present keys (accumulated or left alone) and
    absent ones (inserted or ignored): what it reports is exactly what left."""
    rng = np.random.default_rng(sum(map(ord, strategy)) + 1)
    t = core.Table("int64", "float32", 2, max_capacity=3000, strategy=strategy,
                   step_per_epoch=2)
    fresh = iter(distinct_keys(rng, 40000))
    for step in range(12):
        before = entries(t)
        n_new = int(rng.integers(1, 1500))
        new = np.array([next(fresh) for _ in range(n_new)], np.int64)
        present = np.array(list(before), np.int64)
        present = rng.permutation(present)[: int(rng.integers(0, 300))] if len(present) else present
        keys = np.concatenate([new, present])
        exists = np.concatenate([rng.random(n_new) < 0.2, rng.random(len(present)) < 0.5])
        deltas = rows(keys) + 0.5
        ev = evicted_dict(t.accum_and_evict(keys, deltas, exists))
        after = entries(t)
        inserted = set(new[~exists[:n_new]].tolist())
        accumulated = set(present[exists[n_new:]].tolist())
        assert set(ev) == (set(before) | inserted) - set(after), step
        assert t.size() == len(after) == min(3000, len(before) + len(inserted))
        for k, (row, score) in ev.items():
            if k in accumulated:  # updated by this batch, then evicted by its new keys
                assert row == tuple((np.array(before[k][0], np.float32) + rows([k])[0] + 0.5).tolist())
            elif k in before:
                assert (row, score) == before[k]
            else:  # turned away: the delta it would have been inserted with
                assert k in inserted and row == tuple((rows([k])[0] + 0.5).tolist())
        # Absent keys with exists=True and present keys with exists=False are untouched.
        assert not set(new[exists[:n_new]].tolist()) & set(after)


def test_batch_with_present_keys_and_duplicates(core):
    """A batch mixing present keys, new keys and duplicates into a full table: present
    keys it writes are not evicted by its own new keys (they are rescored first), rows
    of a key apply in order (the last wins), and the report matches the exports."""
    rng = np.random.default_rng(5)
    for strategy in ("lru", "lfu"):
        t = core.Table("int64", "float32", 2, max_capacity=2000, strategy=strategy)
        stored = distinct_keys(rng, 2000)
        fill(t, stored)
        new = np.arange(1, 801, dtype=np.int64) * 7
        present = rng.choice(stored, 400, replace=False)
        keys = rng.permutation(np.concatenate([new, new[:200], present, present[:100]]))
        values = rng.standard_normal((len(keys), 2)).astype(np.float32)
        before = entries(t)
        ev = evicted_dict(t.insert_and_evict(keys, values))
        after = entries(t)
        assert not set(ev) & set(present.tolist()), strategy
        assert set(ev) == set(before) - set(after)
        assert len(ev) == 800 and t.size() == 2000
        last = {}
        for k, v in zip(keys.tolist(), values):
            last[k] = tuple(v.tolist())
        for k, v in last.items():
            assert after[k][0] == v


# ===========================================================================
# accum, growth, counters, concurrency
# ===========================================================================
def test_accum_into_a_full_table(core):
    t = core.Table("int64", "float32", 2, max_capacity=100, strategy="lru")
    old = np.arange(100, dtype=np.int64)
    t.insert(old[:50], rows(old[:50]))
    t.insert(old[50:], rows(old[50:]))
    new = np.arange(1000, 1030, dtype=np.int64)
    deltas = np.ones((30, 2), np.float32)
    # Inserting through accum evicts the oldest; updating through accum does not.
    t.accum(np.concatenate([new, old[60:70]]), np.concatenate([deltas, np.ones((10, 2), np.float32)]),
            np.array([False] * 30 + [True] * 10))
    got = entries(t)
    assert t.size() == 100 and t.counters()["evictions"] == 30
    assert all(k in got for k in new.tolist()) and all(k in got for k in range(60, 70))
    assert sum(k in got for k in range(50)) == 20
    assert got[65][0] == tuple((rows([65])[0] + 1).tolist())
    # An accum row for an evicted key with exists=True changes nothing.
    gone = [k for k in range(50) if k not in got][:5]
    t.accum(np.array(gone, np.int64), np.ones((5, 2), np.float32), np.ones(5, bool))
    assert entries(t) == got


def test_growth_from_init_capacity_to_max_capacity(core):
    rng = np.random.default_rng(3)
    t = core.Table("int64", "float32", 4, init_capacity=1024, max_capacity=65536)
    capacities = [t.capacity()]
    assert 1024 <= capacities[0] < 65536
    keys = distinct_keys(rng, 100000)
    for b in range(0, len(keys), 5000):
        t.insert(keys[b:b + 5000], np.zeros((len(keys[b:b + 5000]), 4), np.float32))
        capacities.append(t.capacity())
        assert t.size() <= t.capacity() <= 65536
    assert capacities == sorted(capacities)  # never shrinks
    assert capacities[-1] == 65536 and t.size() == 65536


def test_counters(core):
    t = core.Table("int64", "float32", 1, max_capacity=10, strategy="customized")
    t.insert(np.arange(10, dtype=np.int64), np.zeros((10, 1), np.float32),
             np.arange(10, dtype=np.uint64) + 10)
    t.insert_and_evict(np.arange(100, 104, dtype=np.int64), np.zeros((4, 1), np.float32),
                       np.array([50, 50, 1, 2], np.uint64))  # 2 evict, 2 turned away
    t.insert(np.arange(0, 3, dtype=np.int64), np.zeros((3, 1), np.float32),
             np.array([60, 60, 60], np.uint64))  # 0 and 1 are gone: they evict 2 more
    t.find(np.array([100, 5, 7, 777], np.int64))
    c = t.counters()
    assert c == dict(inserts=14, updates=1, lookups=4, misses=1, removes=0, evictions=6)


@pytest.mark.slow  # a stress test: tens of seconds on 2 cores
def test_size_bound_with_concurrent_writers(core):
    """8 Python threads (the binding releases the GIL) insert, insert_and_evict,
    accum, accum_and_evict and remove on one bounded table, each with a 2-thread runner, while another
    thread polls size(): it never exceeds max_capacity, and the process survives."""
    for max_capacity in (64, 5000):
        t = core.Table("int64", "float32", 4, max_capacity=max_capacity, strategy="lru",
                       find_updates_scores=True, num_threads=2)
        errors, sizes = [], []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                sizes.append(t.size())

        def work(seed):
            r = np.random.default_rng(seed)
            try:
                for it in range(150):
                    n = 6000 if it % 25 == 0 else int(r.integers(1, 400))
                    keys = r.integers(0, 50000, n).astype(np.int64)
                    vals = np.ones((n, 4), np.float32)
                    op = it % 4
                    if op == 0:
                        ev_keys, ev_values, ev_scores = t.insert_and_evict(keys, vals)
                        assert len(ev_keys) <= n and ev_values.shape == (len(ev_keys), 4)
                    elif op == 1:
                        t.insert(keys, vals)
                    elif op == 2 and it % 8 == 2:
                        ev_keys, ev_values, ev_scores = t.accum_and_evict(keys, vals,
                                                                          r.random(n) < 0.5)
                        assert len(ev_keys) <= n and ev_values.shape == (len(ev_keys), 4)
                    elif op == 2:
                        t.accum(keys, vals, r.random(n) < 0.5)
                    else:
                        t.remove(keys[: n // 4])
                        t.find(keys)
                    assert t.size() <= max_capacity
            except Exception as e:  # reported below, with the thread's traceback
                errors.append(e)

        watcher = threading.Thread(target=watch)
        workers = [threading.Thread(target=work, args=(s,)) for s in range(8)]
        watcher.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        watcher.join()
        assert not errors, errors[0]
        assert max(sizes) <= max_capacity
        k, _, _ = t.export()
        assert len(k) == t.size() <= max_capacity
        # Quiescent again: the full budget is available (no leaked reservations).
        t.clear()
        ev = t.insert_and_evict(np.arange(max_capacity, dtype=np.int64),
                                np.zeros((max_capacity, 4), np.float32))
        assert len(ev[0]) == 0 and t.size() == max_capacity


def test_restored_table_evicts_the_same_keys(core, tmp_path):
    """Export/import and save/load carry scores and emit the oldest writes first, so the
    copies rank ties as the original does and evict exactly the keys it evicts."""
    rng = np.random.default_rng(9)
    for strategy in ("lru", "lfu", "epoch_lru", "customized"):
        kwargs = dict(max_capacity=3000, strategy=strategy, step_per_epoch=4,
                      find_updates_scores=strategy in ("lru", "epoch_lru"))
        original = core.Table("int64", "float32", 2, **kwargs)
        keys = distinct_keys(rng, 9000)
        scores = rng.integers(0, 500, 9000).astype(np.uint64)  # many ties
        for b in range(0, 4000, 500):
            s = scores[b:b + 500] if strategy == "customized" else None
            original.insert(keys[b:b + 500], rows(keys[b:b + 500]), s)
            if strategy == "lfu":
                original.insert(keys[b:b + 100], rows(keys[b:b + 100]))
            original.find(keys[b:b + 300:3])
        imported = core.Table("int64", "float32", 2, **kwargs)
        k, v, s = original.export()
        imported.insert(k, v, s)
        original.save(str(tmp_path / strategy))
        loaded = core.Table("int64", "float32", 2, **kwargs)
        loaded.load(str(tmp_path / strategy))
        for b in range(4000, 9000, 700):
            batch = keys[b:b + 700]
            s = scores[b:b + 700] if strategy == "customized" else None
            reports = [evicted_dict(t.insert_and_evict(batch, rows(batch), s))
                       for t in (original, imported, loaded)]
            assert set(reports[1]) == set(reports[0]), (strategy, b)
            assert set(reports[2]) == set(reports[0]), (strategy, b)
            assert len(reports[0]) > 0
        assert set(entries(imported)) == set(entries(original)) == set(entries(loaded))


def test_large_batches_evict_the_same_keys_on_any_thread_timing(core):
    """Batches large enough to be split over the runner's threads: evictions run on
    one thread, so two identical tables evict identical keys, batch after batch."""
    rng = np.random.default_rng(21)
    keys = distinct_keys(rng, 60000)
    scores = rng.integers(0, 50, 60000).astype(np.uint64)  # many ties
    for strategy in ("lru", "lfu", "customized"):
        tables = [core.Table("int64", "float32", 2, max_capacity=20000, strategy=strategy,
                             num_threads=2) for _ in range(2)]
        for b in range(0, 60000, 12000):
            batch = keys[b:b + 12000]
            s = scores[b:b + 12000] if strategy == "customized" else None
            reports = [evicted_dict(t.insert_and_evict(batch, rows(batch), s)) for t in tables]
            assert reports[0] == reports[1], (strategy, b)
            if b >= 24000:
                assert len(reports[0]) == 12000  # full: each new key evicts or is turned away
        assert entries(tables[0]) == entries(tables[1])


def test_bounded_options(core):
    with pytest.raises(ValueError, match=r"max_capacity.*-5"):
        core.Table("int64", "float32", 1, max_capacity=-5)
    with pytest.raises(ValueError, match=r"init_capacity.*100.*max_capacity.*10"):
        core.Table("int64", "float32", 1, init_capacity=100, max_capacity=10)
    t = core.Table("int64", "float32", 1, max_capacity=1)  # the smallest bounded table
    for k in range(5):
        ev = t.insert_and_evict(np.array([k], np.int64), np.zeros((1, 1), np.float32))
        assert t.size() == 1 and len(ev[0]) == (1 if k else 0)
    assert list(entries(t)) == [4]
