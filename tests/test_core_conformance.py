"""Conformance of the core table (cc/core/table.h) against a Python dict model.

Runs through the TF-free pybind11 module `tensorflow_dynemb._core` (see
core_ext.py for how it is found or built). The stateful test drives random
sequences of insert / find / accum / remove / clear / size / export over every
key dtype x value dtype pair, with keys from a small pool of edge values so
that batches repeat keys; the plain tests below cover growth, scores and
eviction strategies, save/load, and argument validation.
"""

from __future__ import annotations

import os
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

sys.path.insert(0, os.path.dirname(__file__))
import core_ext  # noqa: E402
from core_model import (  # noqa: E402
    KEY_DTYPES,
    MODEL_DTYPE,
    VALUE_DTYPES,
    add_rows,
    assert_rows_equal,
    export_dict,
    key_array,
    key_pool,
    key_shape,
    model_key,
    random_rows,
    to_model,
)

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

DIMS = (1, 7, 64, 300)
# Examples per (key dtype, value dtype) pair; raise with DYNEMB_CONFORMANCE_EXAMPLES
# for a longer soak.
MAX_EXAMPLES = int(os.environ.get("DYNEMB_CONFORMANCE_EXAMPLES", "40"))
STEPS = int(os.environ.get("DYNEMB_CONFORMANCE_STEPS", "40"))


@pytest.fixture(scope="module")
def core():
    return core_ext.load_core()


# ===========================================================================
# Stateful conformance test
# ===========================================================================
class TableMachine(RuleBasedStateMachine):
    """One table and its dict model {model key: [row, score]}.

    Scores are checked exactly for 'lfu' and 'customized'; for 'lru' the test
    checks that export scores order keys exactly as the model's batch clock
    does (equal within a batch, increasing across batches), since the clock's
    starting value is the implementation's choice.
    """

    core = None
    key_dtype = "int64"
    value_dtype = "float32"

    def __init__(self):
        super().__init__()
        self.pool = key_pool(self.key_dtype)
        self.table = None

    # ------------------------------------------------------------------ setup
    @initialize(dim=st.sampled_from(DIMS),
                strategy=st.sampled_from(["lru", "lfu", "customized"]),
                num_threads=st.sampled_from([1, 2]),
                init_capacity=st.sampled_from([0, 3, 1000]),
                find_updates_scores=st.booleans())
    def create(self, dim, strategy, num_threads, init_capacity, find_updates_scores):
        self.dim = dim
        self.strategy = strategy
        # Only LRU strategies refresh scores on find (table.h).
        self.find_touches = find_updates_scores and strategy == "lru"
        self.table = self.core.Table(self.key_dtype, self.value_dtype, dim,
                                     init_capacity=init_capacity, strategy=strategy,
                                     find_updates_scores=find_updates_scores,
                                     num_threads=num_threads)
        self.model = {}  # model key -> [row, score]
        self.clock = 0   # LRU: model clock, advanced per insert/accum batch
        self.counters = dict(inserts=0, updates=0, lookups=0, misses=0, removes=0,
                             evictions=0)

    # ---------------------------------------------------------------- helpers
    def keys_of(self, idx, layout):
        raw = [self.pool[i] for i in idx]
        return key_array(raw, self.key_dtype, layout), [model_key(k) for k in raw]

    def rows_for(self, keys, rows):
        """rows [n, dim] shaped as keys.shape + (dim,)."""
        return rows.reshape(key_shape(keys) + (self.dim,))

    def new_score(self, present_score, explicit=None):
        """Score after an insert row or an accum row that changed the key."""
        if explicit is not None:
            return int(explicit)
        if self.strategy == "lru":
            return self.clock
        if self.strategy == "lfu":
            return 1 if present_score is None else present_score + 1
        return 0 if present_score is None else present_score  # customized

    # ------------------------------------------------------------------ rules
    batches = st.lists(st.integers(0, 100), max_size=12)
    layouts = st.sampled_from(["flat", "flat", "column", "row", "list"])
    seeds = st.integers(0, 2**32 - 1)

    @precondition(lambda self: self.table is not None)
    @rule(idx=batches, layout=layouts, seed=seeds, explicit=st.booleans())
    def insert(self, idx, layout, seed, explicit):
        idx = [i % len(self.pool) for i in idx]
        keys, mkeys = self.keys_of(idx, layout)
        rng = np.random.default_rng(seed)
        rows = random_rows(rng, len(mkeys), self.dim, self.value_dtype, specials=True)
        scores = None
        if explicit and self.strategy == "customized":
            scores = rng.integers(0, 2**64 - 1, size=len(mkeys), dtype=np.uint64, endpoint=True)
            if rng.random() < 0.5:
                scores[: len(scores) // 2] = rng.choice(np.array([0, 1, 2**64 - 1], np.uint64),
                                                        size=len(scores) // 2)
        self.table.insert(keys, self.rows_for(keys, rows), scores)
        self.clock += 1
        for i, k in enumerate(mkeys):
            entry = self.model.get(k)
            self.counters["updates" if entry else "inserts"] += 1
            score = self.new_score(entry[1] if entry else None,
                                   None if scores is None else scores[i])
            self.model[k] = [rows[i].copy(), score]

    @precondition(lambda self: self.table is not None)
    @rule(idx=batches, layout=layouts, seed=seeds,
          default_kind=st.sampled_from(["none", "scalar", "row", "per_key"]))
    def find(self, idx, layout, seed, default_kind):
        idx = [i % len(self.pool) for i in idx]
        keys, mkeys = self.keys_of(idx, layout)
        n = len(mkeys)
        rng = np.random.default_rng(seed)
        if default_kind == "none":
            default = None
            defaults = np.zeros((n, self.dim), MODEL_DTYPE[self.value_dtype])
        elif default_kind == "scalar":
            one = random_rows(rng, 1, 1, self.value_dtype)
            default = one.reshape(())  # a 0-d array (keeps bfloat16 bit patterns)
            defaults = np.broadcast_to(one, (n, self.dim))
        elif default_kind == "row":
            row = random_rows(rng, 1, self.dim, self.value_dtype, specials=True)
            default = row.reshape(self.dim)
            defaults = np.broadcast_to(row, (n, self.dim))
        else:
            defaults = random_rows(rng, n, self.dim, self.value_dtype, specials=True)
            default = self.rows_for(keys, defaults)
        values, exists = self.table.find(keys, default)
        shape = key_shape(keys)
        assert values.shape == shape + (self.dim,), (values.shape, shape)
        assert exists.shape == shape and exists.dtype == np.bool_, (exists.shape, exists.dtype)
        values = to_model(values, self.value_dtype).reshape(n, self.dim)
        exists = exists.reshape(n)
        want = np.array(defaults, copy=True)
        want_exists = np.zeros(n, np.bool_)
        self.clock += self.find_touches
        for i, k in enumerate(mkeys):
            if k in self.model:
                want[i] = self.model[k][0]
                want_exists[i] = True
                if self.find_touches:
                    self.model[k][1] = self.clock
        np.testing.assert_array_equal(exists, want_exists, err_msg=f"exists for keys {mkeys}")
        assert_rows_equal(values, want, self.value_dtype, f"find values for keys {mkeys}")
        self.counters["lookups"] += n
        self.counters["misses"] += int(n - want_exists.sum())

    @precondition(lambda self: self.table is not None)
    @rule(idx=batches, layout=layouts, seed=seeds, flips=st.lists(st.booleans(), max_size=12))
    def accum(self, idx, layout, seed, flips):
        idx = [i % len(self.pool) for i in idx]
        keys, mkeys = self.keys_of(idx, layout)
        n = len(mkeys)
        rng = np.random.default_rng(seed)
        deltas = random_rows(rng, n, self.dim, self.value_dtype)
        # Mostly the truth at the start of the batch (as a caller's earlier
        # find would say), with some rows flipped to exercise the no-op cases.
        flips = (flips + [False] * n)[:n]
        exists = np.array([(k in self.model) != f for k, f in zip(mkeys, flips)], np.bool_)
        self.table.accum(keys, self.rows_for(keys, deltas), exists.reshape(key_shape(keys)))
        self.clock += 1
        for i, k in enumerate(mkeys):
            entry = self.model.get(k)
            if exists[i] and entry is not None:
                entry[0] = add_rows(entry[0], deltas[i], self.value_dtype)
                entry[1] = self.new_score(entry[1])
                self.counters["updates"] += 1
            elif not exists[i] and entry is None:
                self.model[k] = [deltas[i].copy(), self.new_score(None)]
                self.counters["inserts"] += 1

    @precondition(lambda self: self.table is not None)
    @rule(idx=batches, layout=layouts)
    def remove(self, idx, layout):
        idx = [i % len(self.pool) for i in idx]
        keys, mkeys = self.keys_of(idx, layout)
        self.table.remove(keys)
        for k in mkeys:
            if self.model.pop(k, None) is not None:
                self.counters["removes"] += 1

    @precondition(lambda self: self.table is not None)
    @rule(data=st.data())
    def clear(self, data):
        # Rarer than the other rules: most examples should build up content.
        if not data.draw(st.integers(0, 4), label="clear?") == 0:
            return
        self.table.clear()
        self.model.clear()

    @precondition(lambda self: self.table is not None)
    @rule()
    def export(self):
        got = export_dict(self.table, self.value_dtype)
        assert set(got) == set(self.model), (
            f"export keys: missing {set(self.model) - set(got)}, extra {set(got) - set(self.model)}")
        for k, (row, _) in self.model.items():
            assert_rows_equal(got[k][0], row, self.value_dtype, f"export row of key {k!r}")
        self.check_scores({k: s for k, (_, s) in got.items()})

    def check_scores(self, got):
        want = {k: s for k, (_, s) in self.model.items()}
        if self.strategy != "lru":
            bad = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
            assert not bad, f"{self.strategy} scores (got, expected) by key: {bad}"
            return
        # LRU: the map model clock -> score must be strictly increasing.
        pairs = sorted({(want[k], got[k]) for k in want})
        for (c1, s1), (c2, s2) in zip(pairs, pairs[1:]):
            assert (c1 < c2 and s1 < s2) or (c1 == c2 and s1 == s2), (
                f"lru scores do not follow batch order: model clocks {c1}, {c2} have "
                f"scores {s1}, {s2}; all (clock, score, key): "
                f"{sorted((want[k], got[k], k) for k in want)}")

    @precondition(lambda self: self.table is not None)
    @rule()
    def counters_match(self):
        got = self.table.counters()
        assert got == self.counters, f"counters: got {got}, expected {self.counters}"

    @invariant()
    def size_matches(self):
        if self.table is not None:
            assert self.table.size() == len(self.model)
            assert len(self.table) == len(self.model)
            assert self.table.capacity() >= self.table.size()


@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("key_dtype", KEY_DTYPES)
def test_conformance_random_ops(core, key_dtype, value_dtype):
    machine = type(f"TableMachine_{key_dtype}_{value_dtype}", (TableMachine,),
                   {"core": core, "key_dtype": key_dtype, "value_dtype": value_dtype})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=MAX_EXAMPLES, stateful_step_count=STEPS, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large]))


# ===========================================================================
# Plain tests
# ===========================================================================
def unique_int64_keys(rng, n):
    edge = np.array([0, -1, -2, -3, np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64)
    rest = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=2 * n,
                        dtype=np.int64)
    keys = np.concatenate([edge, rest])
    _, first = np.unique(keys, return_index=True)
    keys = keys[np.sort(first)][:n]
    assert len(keys) == n
    return keys


def check_export_equals(table, keys, values, value_dtype="float32"):
    got_keys, got_values, _ = table.export()
    assert len(got_keys) == len(keys)
    order = np.argsort(got_keys, kind="stable")
    want_order = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(got_keys[order], keys[want_order])
    assert_rows_equal(got_values[order], values[want_order], value_dtype, "export")


@pytest.mark.parametrize("num_threads", [1, 2])
def test_growth_to_200k_and_back(core, num_threads):
    rng = np.random.default_rng(7)
    n, dim, batch = 200_000, 4, 20_000
    keys = unique_int64_keys(rng, n)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    table = core.Table("int64", "float32", dim, num_threads=num_threads)
    memory = [table.memory_bytes()]
    for b in range(0, n, batch):
        table.insert(keys[b:b + batch], values[b:b + batch])
        assert table.size() == b + batch
        assert table.capacity() >= table.size()
        memory.append(table.memory_bytes())
    assert memory[-1] > memory[0]
    assert memory[-1] >= n * dim * 4, "memory_bytes must count at least the values"
    got, exists = table.find(keys, np.full(dim, -1, np.float32))
    assert exists.all()
    assert_rows_equal(got, values, "float32", "find after growth")
    check_export_equals(table, keys, values)

    # Down again: remove in batches (with absent keys mixed in), checking content.
    absent = rng.integers(1, 1 << 40, size=batch).astype(np.int64) * 2 + (1 << 41)
    absent = absent[~np.isin(absent, keys)]
    for b in range(0, n, batch):
        table.remove(np.concatenate([keys[b:b + batch], absent[:100]]))
        assert table.size() == n - b - batch
        if b == n // 2:
            check_export_equals(table, keys[b + batch:], values[b + batch:])
    assert table.size() == 0
    got, exists = table.find(keys[:1000], np.full(dim, -1, np.float32))
    assert not exists.any() and (got == -1).all()
    # Re-growth after shrinking works and reads back.
    table.insert(keys[:5000], values[:5000])
    check_export_equals(table, keys[:5000], values[:5000])


@pytest.mark.parametrize("value_dtype", VALUE_DTYPES)
@pytest.mark.parametrize("key_dtype", KEY_DTYPES)
def test_large_batches_with_duplicates(core, key_dtype, value_dtype):
    """Batches big enough for the core's parallel per-shard path (thousands of
    rows), drawn from a few hundred keys so every batch repeats keys many
    times: the result must still equal applying the rows in order."""
    rng = np.random.default_rng(zlib.crc32(f"{key_dtype}/{value_dtype}".encode()))
    pool = [model_key(k) for k in key_pool(key_dtype)]
    if key_dtype == "string":
        pool += [b"key-%d" % i for i in range(300)]
    else:
        pool += [int(k) for k in rng.integers(-(2**31), 2**31 - 1, size=300)]
    pool = list(dict.fromkeys(pool))
    dim, n = 3, 6000
    table = core.Table(key_dtype, value_dtype, dim, strategy="lfu", num_threads=2)
    model = {}  # key -> [row, lfu count]
    for step in range(8):
        mkeys = [pool[i] for i in rng.integers(0, len(pool), size=n)]
        keys = key_array(mkeys, key_dtype)
        op = ["insert", "accum", "insert", "accum", "remove", "accum", "insert", "accum"][step]
        if op == "insert":
            rows = random_rows(rng, n, dim, value_dtype, specials=True)
            table.insert(keys, rows)
            for k, r in zip(mkeys, rows):
                model[k] = [r, model[k][1] + 1 if k in model else 1]
        elif op == "accum":
            deltas = random_rows(rng, n, dim, value_dtype)
            exists = np.array([(k in model) != (rng.random() < 0.2) for k in mkeys], np.bool_)
            table.accum(keys, deltas, exists)
            for k, d, e in zip(mkeys, deltas, exists):
                if e and k in model:
                    model[k] = [add_rows(model[k][0], d, value_dtype), model[k][1] + 1]
                elif not e and k not in model:
                    model[k] = [d, 1]
        else:
            table.remove(keys[: n // 10])
            for k in mkeys[: n // 10]:
                model.pop(k, None)
        got = export_dict(table, value_dtype)
        assert set(got) == set(model), f"step {step} ({op}): key sets differ"
        for k, (row, count) in model.items():
            assert_rows_equal(got[k][0], row, value_dtype, f"step {step} ({op}) key {k!r}")
            assert got[k][1] == count, f"step {step} ({op}) key {k!r}: lfu {got[k][1]} != {count}"
        values, exists = table.find(keys)
        assert exists.sum() == sum(k in model for k in mkeys)


_M64 = (1 << 64) - 1


def _unmix64(h: int) -> int:
    """The inverse of splitmix64's finaliser (cc/core/hash.h Mix64)."""
    def unxorshift(x, s):
        y = x
        for _ in range(64 // s + 1):
            y = x ^ (y >> s)
        return y & _M64
    h = unxorshift(h, 31)
    h = (h * pow(0x94D049BB133111EB, -1, 1 << 64)) & _M64
    h = unxorshift(h, 27)
    h = (h * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & _M64
    return unxorshift(h, 30)


def _as_int64(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


@pytest.mark.parametrize("num_threads", [1, 2])
def test_keys_with_colliding_hashes(core, num_threads):
    """Keys whose 64-bit hashes (under cc/core/hash.h) share the shard bits and
    the low 32 bits: one probe run of equal slot tags, so every lookup has to
    compare keys, and removal shifts within the run. (If the hash changes the
    keys stop colliding and this is an ordinary test.)"""
    rng = np.random.default_rng(11)
    low, top = 0x1234ABCD, 0x5A
    hashes = {(top << 56) | (int(m) << 32) | low for m in rng.integers(0, 1 << 24, size=300)}
    keys = np.array([_as_int64(_unmix64(h)) for h in hashes], np.int64)
    t = core.Table("int64", "int64", 2, num_threads=num_threads)
    model = {}
    for step in range(30):
        batch = rng.choice(keys, size=int(rng.integers(1, 200)))
        op = rng.choice(["insert", "remove", "accum"], p=[0.5, 0.3, 0.2])
        if op == "insert":
            rows = rng.integers(-1000, 1000, size=(len(batch), 2))
            t.insert(batch, rows)
            model.update({int(k): r for k, r in zip(batch, rows)})
        elif op == "accum":
            rows = rng.integers(-1000, 1000, size=(len(batch), 2))
            exists = np.array([int(k) in model for k in batch])
            t.accum(batch, rows, exists)
            for k, r, e in zip(batch.tolist(), rows, exists):
                if e and k in model:
                    model[k] = model[k] + r
                elif not e and k not in model:
                    model[k] = r
        else:
            t.remove(batch)
            for k in batch:
                model.pop(int(k), None)
        values, exists = t.find(keys, np.array([-7, -7]))
        for k, v, e in zip(keys.tolist(), values, exists):
            assert e == (k in model), f"step {step} ({op}): key {k} exists={e}"
            np.testing.assert_array_equal(v, model.get(k, [-7, -7]), err_msg=f"key {k}")
        assert t.size() == len(model)


@pytest.mark.parametrize("key_dtype", ["int64", "string"])
def test_clear_releases_memory(core, key_dtype):
    """table.h: Clear "removes every key and releases the memory"."""
    n = 100_000
    keys = [b"long-string-key-%030d" % i for i in range(n)] if key_dtype == "string" \
        else np.arange(n, dtype=np.int64)
    t = core.Table(key_dtype, "float32", 16)
    empty = t.memory_bytes()
    t.insert(keys, np.ones((n, 16), np.float32))
    full = t.memory_bytes()
    assert full > empty + n * 16 * 4
    t.clear()
    assert t.size() == 0
    assert t.memory_bytes() <= empty + (full - empty) // 10, (empty, full, t.memory_bytes())
    # and the table is fully usable afterwards
    t.insert(keys[:10], np.full((10, 16), 2, np.float32))
    values, exists = t.find(keys[:20])
    assert exists.tolist() == [True] * 10 + [False] * 10 and (values[:10] == 2).all()


def test_export_scores_explicit(core):
    for strategy in ("customized", "lru", "lfu"):
        table = core.Table("int64", "float32", 2, strategy=strategy)
        keys = np.array([5, -1, np.iinfo(np.int64).min, 0], np.int64)
        scores = np.array([10, 0, 2**64 - 1, 3], np.uint64)
        table.insert(keys, np.zeros((4, 2), np.float32), scores=scores)
        got = export_dict(table, "float32")
        assert {k: s for k, (_, s) in got.items()} == {int(k): int(s) for k, s in zip(keys, scores)}, strategy
        # int64 scores are accepted too; negative ones are rejected.
        table.insert(keys[:1], np.zeros((1, 2), np.float32), scores=np.array([7], np.int64))
        assert export_dict(table, "float32")[5][1] == 7
        with pytest.raises(ValueError, match="scores"):
            table.insert(keys[:1], np.zeros((1, 2), np.float32), scores=np.array([-7], np.int64))
        with pytest.raises(ValueError, match="scores"):
            table.insert(keys, np.zeros((4, 2), np.float32), scores=np.array([1, 2], np.uint64))
        with pytest.raises(TypeError, match="scores"):
            table.insert(keys, np.zeros((4, 2), np.float32), scores=np.ones(4, np.float32))


def scores_of(table, value_dtype="float32"):
    return {k: s for k, (_, s) in export_dict(table, value_dtype).items()}


def z(n, dim=1):
    return np.zeros((n, dim), np.float32)


def test_lru_scores(core):
    t = core.Table("int64", "float32", 1, strategy="lru")
    t.insert(np.array([1, 2]), z(2))
    t.insert(np.array([3]), z(1))
    s = scores_of(t)
    assert s[1] == s[2] < s[3]
    t.insert(np.array([1]), z(1))  # touching a key makes it the most recent
    s = scores_of(t)
    assert s[2] < s[3] < s[1]
    t.accum(np.array([2]), z(1), np.array([True]))
    s2 = scores_of(t)
    assert s2[3] < s2[1] < s2[2]
    # find does not refresh scores unless find_updates_scores
    t.find(np.array([3]))
    assert scores_of(t) == s2
    # an accum row that changes nothing does not touch the key's score
    t.accum(np.array([3]), z(1), np.array([False]))
    assert scores_of(t) == s2

    f = core.Table("int64", "float32", 1, strategy="lru", find_updates_scores=True)
    f.insert(np.array([1]), z(1))
    f.insert(np.array([2]), z(1))
    f.find(np.array([1, 99]))
    s = scores_of(f)
    assert s[2] < s[1]
    assert 99 not in s, "find must not insert"


@pytest.mark.parametrize("strategy", ["lru", "epoch_lru"])
def test_clock_continues_past_explicit_scores(core, strategy):
    """table.h: explicit scores move the LRU clock and epoch past them, so
    entries written after an import rank above the imported ones."""
    t = core.Table("int64", "float32", 1, strategy=strategy)
    t.insert(np.array([1, 2]), z(2), scores=np.array([5, 1000], np.uint64))
    t.insert(np.array([3]), z(1))
    t.insert(np.array([4]), z(1))
    s = scores_of(t)
    assert s[1] < s[2] < s[3] < s[4], s

    # At the top of the range later writes cannot rank strictly above, but
    # they must not rank below: the clock (epoch_lru: its low 32 bits) must
    # not wrap around, which would put later writes below imported keys.
    top = 2**64 - 1 if strategy == "lru" else (5 << 32) | 0xFFFFFFFF
    t = core.Table("int64", "float32", 1, strategy=strategy)
    t.insert(np.array([1, 2]), z(2), scores=np.array([5, top], np.uint64))
    t.insert(np.array([3]), z(1))
    t.insert(np.array([4]), z(1))
    s = scores_of(t)
    assert s[3] >= s[2] and s[4] >= s[3], {k: hex(v) for k, v in s.items()}


def test_lfu_scores(core):
    t = core.Table("int64", "float32", 1, strategy="lfu")
    t.insert(np.array([1, 2, 1]), z(3))  # duplicate rows count
    t.insert(np.array([1]), z(1))
    t.accum(np.array([2, 3]), z(2), np.array([True, False]))
    t.find(np.array([1, 2, 3]))  # lookups do not count
    assert scores_of(t) == {1: 3, 2: 2, 3: 1}
    t.remove(np.array([1]))
    t.insert(np.array([1]), z(1))  # a removed key starts over
    assert scores_of(t)[1] == 1


def test_customized_scores(core):
    t = core.Table("int64", "float32", 1, strategy="customized")
    t.insert(np.array([1, 2]), z(2), scores=np.array([50, 60], np.uint64))
    t.insert(np.array([1, 3]), z(2))  # existing key keeps its score, new key gets 0
    t.accum(np.array([2, 4]), z(2), np.array([True, False]))
    assert scores_of(t) == {1: 50, 2: 60, 3: 0, 4: 0}
    t.insert(np.array([3, 3]), z(2), scores=np.array([9, 8], np.uint64))  # last row wins
    assert scores_of(t)[3] == 8


@pytest.mark.parametrize("strategy", ["epoch_lru", "epoch_lfu"])
def test_epoch_scores(core, strategy):
    t = core.Table("int64", "float32", 1, strategy=strategy, step_per_epoch=2)
    epochs = []
    for b in range(6):
        t.insert(np.array([100 + b, 7]), z(2))
        s = scores_of(t)
        epochs.append(s[100 + b] >> 32)
        low = s[100 + b] & 0xFFFFFFFF
        if strategy == "epoch_lfu":
            assert low == 1, f"batch {b}: frequency within the epoch of a new key is {low}"
    # The epoch advances once every step_per_epoch insert batches.
    assert [epochs[b + 2] - epochs[b] for b in range(4)] == [1, 1, 1, 1], epochs
    assert all(e2 - e1 in (0, 1) for e1, e2 in zip(epochs, epochs[1:])), epochs
    s = scores_of(t)
    assert s[7] >> 32 == epochs[-1]
    if strategy == "epoch_lfu":
        # key 7 was inserted in the last batch, and once or twice within its epoch
        same_epoch = sum(1 for e in epochs if e == epochs[-1])
        assert s[7] & 0xFFFFFFFF == same_epoch, (s[7], epochs)
    else:
        assert s[7] & 0xFFFFFFFF == s[105] & 0xFFFFFFFF


@pytest.mark.parametrize("strategy", ["epoch_lru", "epoch_lfu"])
def test_epoch_counts_insert_batches_only(core, strategy):
    """table.h: "The epoch advances every `step_per_epoch` Insert batches"."""
    t = core.Table("int64", "float32", 1, strategy=strategy, step_per_epoch=2)
    t.insert(np.array([1]), z(1))
    epoch0 = scores_of(t)[1] >> 32
    for _ in range(5):  # accum and find batches are not insert batches
        t.accum(np.array([1]), z(1), np.array([True]))
        t.find(np.array([1]))
    assert scores_of(t)[1] >> 32 == epoch0, (
        f"after 1 insert batch and 5 accum batches (step_per_epoch=2) the epoch moved "
        f"from {epoch0} to {scores_of(t)[1] >> 32}")


def roundtrip_content(t, value_dtype):
    return {k: (to_model(r, value_dtype).tobytes(), s) for k, (r, s) in
            export_dict(t, value_dtype).items()}


@pytest.mark.parametrize("key_dtype,value_dtype,dim,n", [
    ("int64", "float32", 8, 1000),
    ("int32", "int8", 3, 257),
    ("string", "bfloat16", 5, 300),
    ("string", "bool", 1, 0),
    ("int64", "float64", 300, 50),
])
@pytest.mark.parametrize("chunk_rows", [1, 7, 65536])
def test_save_load_roundtrip(core, tmp_path, key_dtype, value_dtype, dim, n, chunk_rows):
    rng = np.random.default_rng(n + dim)
    pool = key_pool(key_dtype)
    if key_dtype == "string":
        keys = list(dict.fromkeys([model_key(k) for k in pool] +
                                  [b"k%d" % i for i in range(n)]))[:n]
    else:
        ints = list(dict.fromkeys(pool + list(range(1000, 1000 + n))))[:n]
        keys = np.array(ints, np.int32 if key_dtype == "int32" else np.int64)
    values = random_rows(rng, n, dim, value_dtype, specials=True)
    scores = rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
    t = core.Table(key_dtype, value_dtype, dim, strategy="customized")
    t.insert(keys, values, scores=scores)
    path = str(tmp_path / "table.bin")
    t.save(path, chunk_rows)
    assert os.path.getsize(path) > 0

    u = core.Table(key_dtype, value_dtype, dim, strategy="lru", num_threads=2)
    u.insert(key_array([pool[1]], key_dtype), random_rows(rng, 1, dim, value_dtype))
    u.load(path, chunk_rows)  # clear_first: the extra key goes
    assert u.size() == n
    want = roundtrip_content(t, value_dtype)
    assert roundtrip_content(u, value_dtype) == want

    # clear_first=False merges: a key absent from the file stays.
    extra = key_array([b"only-here" if key_dtype == "string" else 424242], key_dtype)
    u.insert(extra, random_rows(rng, 1, dim, value_dtype), scores=np.array([5], np.uint64))
    u.load(path, chunk_rows, clear_first=False)
    merged = roundtrip_content(u, value_dtype)
    assert len(merged) == n + 1
    assert {k: v for k, v in merged.items() if k in want} == want


def test_load_mismatch_errors(core, tmp_path):
    t = core.Table("int64", "float32", 8)
    t.insert(np.array([1, 2]), np.ones((2, 8), np.float32))
    path = str(tmp_path / "t.bin")
    t.save(path)
    with pytest.raises(ValueError) as e:
        core.Table("int64", "float32", 4).load(path)
    assert "8" in str(e.value) and "4" in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:
        core.Table("int64", "float64", 8).load(path)
    assert "float32" in str(e.value) and "float64" in str(e.value), str(e.value)
    with pytest.raises(ValueError) as e:
        core.Table("string", "float32", 8).load(path)
    assert "int64" in str(e.value) and "string" in str(e.value), str(e.value)
    # A failed load leaves the target table as it was.
    target = core.Table("int64", "float32", 4)
    target.insert(np.array([9]), np.ones((1, 4), np.float32))
    with pytest.raises(ValueError):
        target.load(path)
    assert target.size() == 1

    # Truncated and garbage files are errors, not crashes, and (table_io.h)
    # a damaged file leaves the table unchanged even with clear_first.
    data = open(path, "rb").read()
    for i, bad in enumerate([data[: len(data) // 2], data[:-1], data[:3], b"",
                             b"not a table file" * 10]):
        p = tmp_path / f"bad{i}.bin"
        p.write_bytes(bad)
        target = core.Table("int64", "float32", 8)
        target.insert(np.array([5]), np.full((1, 8), 3, np.float32))
        with pytest.raises(ValueError):
            target.load(str(p), clear_first=True)
        values, exists = target.find(np.array([5, 1]))
        assert exists.tolist() == [True, False] and (values[0] == 3).all(), f"bad file {i}"
    with pytest.raises(FileNotFoundError, match="no-such"):
        core.Table("int64", "float32", 8).load(str(tmp_path / "no-such-dir" / "x.bin"))
    with pytest.raises(FileNotFoundError, match="no-such"):
        t.save(str(tmp_path / "no-such-dir" / "x.bin"))
    with pytest.raises(ValueError, match="chunk_rows"):
        t.save(path, 0)


@pytest.mark.parametrize("kwargs,field", [
    (dict(dim=0), "dim"),
    (dict(dim=-3), "dim"),
    (dict(value_dtype="float8"), "value_dtype"),
    (dict(value_dtype="string"), "value_dtype"),
    (dict(key_dtype="float32"), "key_dtype"),
    (dict(key_dtype="int16"), "key_dtype"),
    (dict(strategy="fifo"), "strategy"),
    (dict(max_capacity=-1), "max_capacity"),
    (dict(init_capacity=-1), "init_capacity"),
    (dict(step_per_epoch=-1), "step_per_epoch"),
    (dict(num_threads=0), "num_threads"),
    (dict(init_capacity=10, max_capacity=5), "init_capacity"),
])
def test_invalid_options(core, kwargs, field):
    args = dict(key_dtype="int64", value_dtype="float32", dim=4)
    args.update(kwargs)
    with pytest.raises(ValueError) as e:
        core.Table(**args)
    bad_value = str(kwargs[field] if field in kwargs else kwargs["dim"])
    assert field in str(e.value) and bad_value in str(e.value), str(e.value)


def test_argument_validation(core):
    t = core.Table("int64", "float32", 3)
    ok_keys = np.array([1, 2], np.int64)
    ok_values = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match=r"keys.*int64.*int32"):
        t.insert(ok_keys.astype(np.int32), ok_values)
    with pytest.raises(TypeError, match=r"keys.*int64.*float"):
        t.find(np.array([1.0]))
    with pytest.raises(TypeError, match=r"values.*float32.*float64"):
        t.insert(ok_keys, ok_values.astype(np.float64))
    with pytest.raises(ValueError, match=r"values: Expected shape \(2, 3\).*got \(2, 4\)"):
        t.insert(ok_keys, np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"values: Expected shape.*got \(3, 3\)"):
        t.insert(ok_keys, np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match=r"deltas: Expected shape"):
        t.accum(ok_keys, np.zeros((2, 1), np.float32), np.array([True, True]))
    with pytest.raises(TypeError, match=r"exists.*bool"):
        t.accum(ok_keys, ok_values, np.array([1, 1]))
    with pytest.raises(ValueError, match=r"exists: Expected shape"):
        t.accum(ok_keys, ok_values, np.array([True]))
    with pytest.raises(ValueError, match=r"default: Expected shape"):
        t.find(ok_keys, np.zeros(4, np.float32))
    with pytest.raises(TypeError, match=r"default.*float32"):
        t.find(ok_keys, np.zeros(3, np.int32))
    s = core.Table("string", "int32", 2)
    with pytest.raises(TypeError, match=r"keys\[1\].*bytes or str.*int"):
        s.insert([b"a", 3], np.zeros((2, 2), np.int32))
    with pytest.raises(TypeError, match="keys"):
        s.insert(b"ab", np.zeros((2, 2), np.int32))
    with pytest.raises(TypeError, match="keys"):
        s.find(np.array([1, 2]))
    # The table is unchanged by rejected calls.
    assert t.size() == 0 and s.size() == 0
    # Python sequences of the right kind are converted.
    t.insert([1, 2], [[1, 2, 3], [4, 5, 6]])
    values, exists = t.find([2, 3], [9, 9, 9])
    np.testing.assert_array_equal(values, [[4, 5, 6], [9, 9, 9]])
    np.testing.assert_array_equal(exists, [True, False])
    # Non-contiguous inputs are fine.
    big = np.arange(12, dtype=np.float32).reshape(2, 6)
    t.insert(np.array([5, 0, 6], np.int64)[::2], big[:, ::2])
    np.testing.assert_array_equal(t.find(np.array([5, 6]))[0], big[:, ::2])


def test_bfloat16_with_ml_dtypes(core):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    t = core.Table("int32", "bfloat16", 2)
    vals = np.array([[1.5, -2.0], [3.0, 0.25]], ml_dtypes.bfloat16)
    t.insert(np.array([1, 2], np.int32), vals)
    got, _ = t.find(np.array([2, 1], np.int32))
    assert got.dtype == ml_dtypes.bfloat16 and core.BFLOAT16_DTYPE == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.astype(np.float32), vals[::-1].astype(np.float32))
    # uint16 bit patterns are accepted too
    t.insert(np.array([3], np.int32), np.array([[0x3FC0, 0xC000]], np.uint16))
    np.testing.assert_array_equal(t.find(np.array([3], np.int32))[0].astype(np.float32),
                                  [[1.5, -2.0]])
    with pytest.raises(TypeError, match="bfloat16"):
        t.insert(np.array([1], np.int32), np.zeros((1, 2), np.float16))


def test_string_keys_bytes_and_str_agree(core):
    t = core.Table("string", "int64", 1)
    t.insert(["\u00e9", b"", "a"], np.array([[1], [2], [3]], np.int64))
    v, e = t.find([b"\xc3\xa9", "", b"a", b"a\x00"])
    assert e.tolist() == [True, True, True, False]
    assert v[:3, 0].tolist() == [1, 2, 3]
    v2, _ = t.find(np.array([b"\xc3\xa9", b""], dtype="S"))
    assert v2[:, 0].tolist() == [1, 2]
    v3, _ = t.find(np.array(["\u00e9", "a"]))  # numpy unicode array
    assert v3[:, 0].tolist() == [1, 3]


def test_counters(core):
    t = core.Table("int64", "int32", 1)
    t.insert(np.array([1, 2, 1]), np.zeros((3, 1), np.int32))
    t.find(np.array([1, 3, 4]))
    t.accum(np.array([2, 5, 6]), np.ones((3, 1), np.int32), np.array([True, False, True]))
    t.remove(np.array([1, 7]))
    t.clear()
    assert t.counters() == dict(inserts=3, updates=2, lookups=3, misses=2, removes=1,
                                evictions=0)


def test_empty_batches_and_empty_table(core):
    for key_dtype in KEY_DTYPES:
        t = core.Table(key_dtype, "float16", 5)
        keys = [] if key_dtype == "string" else np.array([], np.int32 if key_dtype == "int32"
                                                        else np.int64)
        t.insert(keys, np.zeros((0, 5), np.float16))
        v, e = t.find(keys, np.ones(5, np.float16))
        assert v.shape == (0, 5) and e.shape == (0,)
        t.accum(keys, np.zeros((0, 5), np.float16), np.zeros(0, np.bool_))
        t.remove(keys)
        k, v, s = t.export()
        assert len(k) == 0 and v.shape == (0, 5) and s.shape == (0,)
        assert t.size() == 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_apply_rule_keras_adam_in_batch_order(core, dtype):
    """apply_rule (Table::ApplyRule): a new key's state starts from `initial`, duplicate
    keys apply in batch order each from its own parameter row, and the arithmetic is the
    rule's, operation by operation (NumPy's IEEE ops in the same order)."""
    dim = 5
    t = core.Table("int64", dtype, 2 * dim)
    rng = np.random.default_rng(4)
    initial = rng.uniform(0, 0.1, 2 * dim).astype(dtype)
    c = np.array([0.01, 0.1, 0.001, 1e-7], dtype)
    state = {}
    for _ in range(3):
        keys = rng.integers(0, 6, size=9)
        rows = rng.standard_normal((9, dim)).astype(dtype)
        grads = rng.standard_normal((9, dim)).astype(dtype)
        want = np.empty_like(rows)
        for i, k in enumerate(keys.tolist()):
            m, v = np.split(state.get(k, initial).copy(), 2)
            g = grads[i]
            m = m + (g - m) * c[1]
            v = v + (g * g - v) * c[2]
            want[i] = rows[i] - (m * c[0]) / (np.sqrt(v) + c[3])
            state[k] = np.concatenate([m, v])
        got = t.apply_rule(keys, "keras_adam", rows, grads, initial, c)
        assert got.tobytes() == want.tobytes()
    found, exists = t.find(np.array(sorted(state), np.int64))
    assert exists.all() and t.size() == len(state)
    assert found.tobytes() == np.stack([state[k] for k in sorted(state)]).tobytes()


def test_apply_rule_argument_errors(core):
    t = core.Table("int64", "float32", 8)
    rows = np.zeros((2, 4), np.float32)
    ok = dict(initial=np.zeros(8, np.float32), coefficients=np.ones(4, np.float32))
    with pytest.raises(ValueError, match="rule: expected .* got 'adamm'"):
        t.apply_rule([1, 2], "adamm", rows, rows, **ok)
    with pytest.raises(ValueError, match=r"grads: Expected shape .*got \(2, 3\)"):
        t.apply_rule([1, 2], "keras_adam", rows, np.zeros((2, 3), np.float32), **ok)
    with pytest.raises(ValueError, match=r"initial: Expected shape \(8,\)"):
        t.apply_rule([1, 2], "keras_adam", rows, rows, np.zeros(4, np.float32), ok["coefficients"])
    with pytest.raises(ValueError, match=r"coefficients: Expected shape \(6,\)"):
        t.apply_rule([1, 2], "keras_adam", rows, rows, ok["initial"], np.ones(4, np.float32),
                     weight_decay=True)
    with pytest.raises(ValueError, match="keeps 3 slots"):
        t.apply_rule([1, 2], "keras_adam_amsgrad", rows, rows, **ok)
    with pytest.raises(TypeError, match="rows: expected an array of dtype float32"):
        t.apply_rule([1, 2], "keras_adam", rows.astype(np.float64), rows, **ok)
    assert t.size() == 0  # nothing applied


@pytest.mark.parametrize("num_threads", [2, 3, 5])
def test_large_batches_in_groups_apply_in_batch_order(core, num_threads):
    """A large batch of an unbounded table runs in one group of shards per thread, each
    group's keys in batch order (cc/core/table.h "Locking"): every row still applies as
    if the batch ran row by row, duplicate keys across the whole batch included, and the
    result equals a one-thread table's, bit for bit."""
    rng = np.random.default_rng(7)
    dim, n = 4, 20_000
    pool = rng.choice(np.iinfo(np.int64).max, 3_000, replace=False).astype(np.int64)
    keys = rng.choice(pool, n)  # ~6.7 rows per key, spread over every shard
    pool = np.unique(keys)
    values = rng.standard_normal((n, dim)).astype(np.float32)
    tables = [core.Table("int64", "float32", dim, num_threads=t) for t in (1, num_threads)]

    # Insert: the last row of each key wins.
    last = {k: i for i, k in enumerate(keys.tolist())}
    for t in tables:
        t.insert(keys, values)
    found = [t.find(keys)[0] for t in tables]
    want = values[[last[k] for k in keys.tolist()]]
    assert found[0].tobytes() == want.tobytes() and found[1].tobytes() == want.tobytes()

    # Accum of present keys: each key's deltas add up in batch order.
    exists = np.ones(n, bool)
    model = {k: values[i].copy() for k, i in last.items()}
    for i, k in enumerate(keys.tolist()):
        model[k] = model[k] + values[i]
    for t in tables:
        t.accum(keys, values, exists)
    sums = np.stack([model[k] for k in pool.tolist()])
    for t in tables:
        got, present = t.find(pool)
        assert present.all() and got.tobytes() == sums.tobytes()

    # ApplyRule: duplicate keys step their state in batch order, each from its own row.
    state_tables = [core.Table("int64", "float32", 2 * dim, num_threads=t) for t in (1, num_threads)]
    initial = np.full(2 * dim, 0.01, np.float32)
    c = np.array([0.01, 0.1, 0.001, 1e-7], np.float32)
    new_rows = [t.apply_rule(keys, "keras_adam", values, values[::-1].copy(), initial, c)
                for t in state_tables]
    assert new_rows[0].tobytes() == new_rows[1].tobytes()
    states = [t.find(pool)[0] for t in state_tables]
    assert states[0].tobytes() == states[1].tobytes()
    assert all(t.size() == len(pool) for t in tables + state_tables)
