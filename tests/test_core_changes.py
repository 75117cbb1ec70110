"""Change tracking of core tables (cc/core/table.h, "Change tracking"), through the
TF-free binding: replaying each window's changes (tombstones removed, then rows
upserted) onto a copy taken at the window's start reproduces the table at its end,
for unbounded and bounded (evicting) tables and string keys, under random
inserts, accums, removals and reads.
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


@pytest.fixture(scope="module")
def core():
    return core_ext.load_core()


def contents(table):
    keys, values, _ = table.export()
    return {model_key(k): tuple(v.tolist()) for k, v in zip(keys, values)}


def make_keys(key_dtype, ints):
    if key_dtype == "string":
        return np.array([f"k{i}".encode() for i in ints], dtype=object)
    return np.asarray(ints, dtype=key_dtype)


@pytest.mark.parametrize("key_dtype,max_capacity", [("int64", 0), ("int64", 600), ("int32", 300),
                                                    ("string", 0)])
def test_windows_replay_to_the_table(core, key_dtype, max_capacity):
    rng = np.random.default_rng(7)
    table = core.Table(key_dtype, "float32", 3, max_capacity=max_capacity, num_threads=2)
    copy = {}
    mark = table.mark()
    for _ in range(12):
        for _ in range(6):
            op = rng.integers(4)
            keys = make_keys(key_dtype, np.unique(rng.integers(0, 2000, 150)))
            values = rng.standard_normal((len(keys), 3)).astype(np.float32)
            if op == 0:
                table.insert(keys, values)
            elif op == 1:
                table.accum(keys, values, rng.integers(2, size=len(keys)).astype(bool))
            elif op == 2:
                table.remove(keys[: len(keys) // 3])
            else:
                table.find(keys)  # reads are no writes
        until = table.mark()
        complete, keys, values, removed = table.export_changes(mark, until, chunk_rows=64)
        assert complete
        removed_set = {model_key(k) for k in removed}
        row_keys = [model_key(k) for k in keys]
        assert len(removed_set) == len(removed), "a tombstone was reported twice"
        assert len(set(row_keys)) == len(row_keys), "a row was reported twice"
        assert not removed_set & set(row_keys)
        for k in removed_set:
            copy.pop(k, None)
        for k, v in zip(row_keys, values):
            copy[k] = tuple(v.tolist())
        assert copy == contents(table)
        # The window holds no more than what changed in it.
        assert len(row_keys) <= 6 * 150
        mark = until
    if max_capacity:
        assert table.counters()["evictions"] > 0


def test_untracked_and_cleared(core):
    table = core.Table("int64", "float32", 1, track_changes=False)
    with pytest.raises(Exception, match="track_changes"):
        table.mark()
    tracked = core.Table("int64", "float32", 1)
    tracked.insert(np.arange(10), np.ones((10, 1), np.float32))
    before = tracked.mark()
    tracked.clear()
    tracked.insert(np.arange(3), np.ones((3, 1), np.float32))
    complete, *_ = tracked.export_changes(before, tracked.mark())
    assert not complete  # a Clear's removals are unknown: export the whole table


def test_marks_under_concurrent_writers(core):
    table = core.Table("int64", "float32", 1, num_threads=2)
    marks = [table.mark()]
    done = threading.Event()

    def write(w):
        for b in range(100):
            keys = np.arange(b * 64, (b + 1) * 64, dtype=np.int64) + w * 10_000_000
            table.insert(keys, np.full((64, 1), w, np.float32))

    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        marks.append(table.mark())
    for t in threads:
        t.join()
    done.set()
    marks.append(table.mark())
    seen = []
    for a, b in zip(marks, marks[1:]):
        complete, keys, _, removed = table.export_changes(a, b)
        assert complete and len(removed) == 0
        seen.extend(keys.tolist())
    assert sorted(seen) == sorted(contents(table))
