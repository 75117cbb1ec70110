"""Concurrency of the core table through the TF-free binding.

The binding releases the GIL around every core call, so Python threads really
run batches on one table at the same time. Each writer thread owns a disjoint
key range and keeps its own dict model; at the end (and at every export) the
table's content for a thread's keys must equal that thread's model.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_ext  # noqa: E402
from core_model import add_rows, assert_rows_equal, to_model  # noqa: E402

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

NUM_THREADS = 8
DURATION_S = float(os.environ.get("DYNEMB_CONCURRENCY_SECONDS", "3"))
KEYS_PER_THREAD = 2000


@pytest.fixture(scope="module")
def core():
    return core_ext.load_core()


def thread_keys(key_dtype, owner):
    """The keys thread `owner` owns: disjoint across threads, edge keys included."""
    if key_dtype == "string":
        return [b"t%d/%d" % (owner, i) for i in range(KEYS_PER_THREAD)] + \
            ([b""] if owner == 0 else [])
    base = np.arange(KEYS_PER_THREAD, dtype=np.int64) * NUM_THREADS + owner
    base = base - (KEYS_PER_THREAD * NUM_THREADS // 2)  # negative and positive keys
    if owner == 0:
        base = np.concatenate([base, [np.iinfo(np.int64).min, np.iinfo(np.int64).max]])
    return [int(k) for k in base]


def to_keys(keys, key_dtype):
    return list(keys) if key_dtype == "string" else np.array(keys, np.int64)


def random_rows(rng, n, dim, value_dtype):
    if value_dtype == "int32":
        return rng.integers(-1000, 1000, size=(n, dim)).astype(np.int32)
    return rng.integers(-64, 64, size=(n, dim)).astype(np.float32)  # exact sums


class Worker(threading.Thread):
    def __init__(self, table, owner, key_dtype, value_dtype, deadline, others):
        super().__init__(name=f"worker-{owner}")
        self.table, self.owner = table, owner
        self.key_dtype, self.value_dtype = key_dtype, value_dtype
        self.deadline, self.others = deadline, others
        self.keys = thread_keys(key_dtype, owner)
        self.model = {}
        self.ops = 0
        self.error = None

    def check_rows(self, keys, values, exists, what):
        dim = self.table.dim
        want = np.full((len(keys), dim), -7, values.dtype)
        want_exists = np.zeros(len(keys), np.bool_)
        for i, k in enumerate(keys):
            if k in self.model:
                want[i], want_exists[i] = self.model[k], True
        np.testing.assert_array_equal(exists, want_exists, err_msg=f"{what}: exists")
        assert_rows_equal(values, want, self.value_dtype, what)

    def step(self, rng):
        t, dim = self.table, self.table.dim
        # Mostly small batches; sometimes one big enough for the core to split
        # it over the table's runner threads.
        n = int(rng.integers(0, 64)) if rng.random() < 0.95 else 5000
        keys = [self.keys[i] for i in rng.integers(0, len(self.keys), size=n)]
        op = rng.choice(["insert", "find", "accum", "remove", "export", "foreign"],
                        p=[0.3, 0.25, 0.25, 0.12, 0.03, 0.05])
        if op == "insert":
            rows = random_rows(rng, n, dim, self.value_dtype)
            t.insert(to_keys(keys, self.key_dtype), rows)
            for k, r in zip(keys, rows):
                self.model[k] = r
        elif op == "find":
            values, exists = t.find(to_keys(keys, self.key_dtype),
                                    np.full(dim, -7, np.float32 if self.value_dtype == "float32"
                                            else np.int32))
            self.check_rows(keys, values, exists, f"thread {self.owner} find")
        elif op == "accum":
            deltas = random_rows(rng, n, dim, self.value_dtype)
            flip = rng.random(n) < 0.1
            exists = np.array([(k in self.model) != f for k, f in zip(keys, flip)], np.bool_)
            t.accum(to_keys(keys, self.key_dtype), deltas, exists)
            for k, d, e in zip(keys, deltas, exists):
                if e and k in self.model:
                    self.model[k] = add_rows(self.model[k], d, self.value_dtype)
                elif not e and k not in self.model:
                    self.model[k] = d
        elif op == "remove":
            t.remove(to_keys(keys, self.key_dtype))
            for k in keys:
                self.model.pop(k, None)
        elif op == "export":
            self.check_export()
        else:  # read keys other threads own: no model, just sane results
            other = self.others[int(rng.integers(0, len(self.others)))]
            okeys = [other[i] for i in rng.integers(0, len(other), size=n)]
            values, exists = t.find(to_keys(okeys, self.key_dtype))
            assert values.shape == (n, dim) and exists.shape == (n,)
            assert exists.dtype == np.bool_
            assert (to_model(values, self.value_dtype)[~exists] == 0).all()
        self.ops += 1

    def check_export(self):
        keys, values, _ = self.table.export()
        mine = set(self.keys)
        got = {}
        for k, row in zip(keys, to_model(values, self.value_dtype)):
            k = bytes(k) if self.key_dtype == "string" else int(k)
            if k in mine:
                got[k] = row
        assert set(got) == set(self.model), (
            f"thread {self.owner} export: missing {sorted(set(self.model) - set(got))[:5]}, "
            f"extra {sorted(set(got) - set(self.model))[:5]}")
        for k, row in got.items():
            assert_rows_equal(row, self.model[k], self.value_dtype, f"export key {k!r}")

    def run(self):
        rng = np.random.default_rng(1000 + self.owner)
        try:
            while time.monotonic() < self.deadline:
                self.step(rng)
        except BaseException as e:  # reported by the main thread
            self.error = e


@pytest.mark.parametrize("key_dtype,value_dtype,dim,table_threads", [
    ("int64", "float32", 16, 1),
    ("int64", "float32", 16, 2),
    ("string", "int32", 5, 2),
])
def test_threads_own_disjoint_keys(core, key_dtype, value_dtype, dim, table_threads):
    table = core.Table(key_dtype, value_dtype, dim, num_threads=table_threads)
    all_keys = [thread_keys(key_dtype, i) for i in range(NUM_THREADS)]
    duration = DURATION_S if key_dtype == "int64" else DURATION_S / 2
    deadline = time.monotonic() + duration
    workers = [Worker(table, i, key_dtype, value_dtype, deadline,
                      [k for j, k in enumerate(all_keys) if j != i])
               for i in range(NUM_THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=duration + 120)
        assert not w.is_alive(), f"{w.name} did not finish: deadlock?"
    for w in workers:
        if w.error is not None:
            raise AssertionError(f"{w.name} failed after {w.ops} ops") from w.error
    assert all(w.ops > 10 for w in workers), [w.ops for w in workers]
    for w in workers:
        w.check_export()
        keys = list(w.model)
        if keys:
            values, exists = table.find(to_keys(keys, key_dtype))
            assert exists.all()
            assert_rows_equal(values, np.stack([w.model[k] for k in keys]), value_dtype,
                              f"final content of {w.name}")
    assert table.size() == sum(len(w.model) for w in workers)


def test_rows_are_atomic_under_concurrent_writes(core):
    """Readers never see half a row: writers store rows whose elements are all
    equal (a version number), readers check every row they get is constant."""
    dim = 256
    table = core.Table("int64", "int64", dim, strategy="lru", num_threads=2)
    keys = np.arange(4000, dtype=np.int64)
    deadline = time.monotonic() + DURATION_S / 2
    errors, ops = [], [0] * 6

    def writer(i):
        rng = np.random.default_rng(i)
        version = i << 40
        while time.monotonic() < deadline:
            k = rng.choice(keys, size=128)
            version += 1
            if rng.random() < 0.5:
                table.insert(k, np.full((128, dim), version, np.int64))
            else:
                table.accum(k, np.full((128, dim), 1, np.int64), rng.random(128) < 0.5)
            if rng.random() < 0.05:
                table.remove(k[:8])
            ops[i] += 1

    def reader(i):
        rng = np.random.default_rng(100 + i)
        while time.monotonic() < deadline:
            values, exists = table.find(rng.choice(keys, size=512))
            rows = values[exists]
            torn = (rows != rows[:, :1]).any(axis=1)
            if torn.any():
                errors.append(f"torn row: {rows[torn][0][:8]}...")
                return
            if rng.random() < 0.1:
                _, v, _ = table.export()
                if len(v) and (v != v[:, :1]).any():
                    errors.append("torn row in export")
                    return
            ops[i] += 1

    def guarded(fn, i):
        try:
            fn(i)
        except BaseException as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=guarded, args=(writer if i < 3 else reader, i))
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "deadlock?"
    assert not errors, errors[:3]
    assert all(o > 0 for o in ops), ops


def test_gil_is_released_during_core_calls(core):
    """While one thread is inside a long core call, another Python thread runs.

    The main thread spins, counting iterations that happen while the other
    thread is inside `find`. Holding the GIL there would stop the main thread
    for the whole call (a C call is never preempted by the interpreter), so
    it could spin only in the short gaps around the call.
    """
    n, dim = 400_000, 64
    table = core.Table("int64", "float32", dim)
    keys = np.arange(n, dtype=np.int64)
    table.insert(keys, np.zeros((n, dim), np.float32))
    in_call = [False]
    call_seconds = []

    def long_call():
        for _ in range(3):
            in_call[0] = True
            t0 = time.perf_counter()
            table.find(keys)
            call_seconds.append(time.perf_counter() - t0)
            in_call[0] = False

    def spin(seconds):  # the same loop body as below, for the rate
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            if in_call[0]:
                count += 1
            else:
                count += 1
        return count / seconds

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        rate = spin(0.05)
        t = threading.Thread(target=long_call)
        t.start()
        spins_in_call = 0
        while t.is_alive():
            if in_call[0]:
                spins_in_call += 1
            else:
                time.perf_counter()
        t.join()
    finally:
        sys.setswitchinterval(old_interval)
    expected = rate * sum(call_seconds)
    assert sum(call_seconds) > 0.01, call_seconds
    assert spins_in_call > 0.1 * expected, (
        f"{spins_in_call} iterations beside {sum(call_seconds):.3f}s of core calls; "
        f"{expected:.0f} at full rate: is the GIL held during find?")
