"""Checkpoints: keys, values and scores survive; restore replaces the content."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import (
    graph_mode_results,
    scenario_result,
    worker_results,
)
from tables_worker import eager_tables, entries

# What make_checkpointed_module puts in the tables before saving.
PLAIN = ([7, -1, 0, 2**62], np.arange(12, dtype=np.float32).reshape(4, 3))
HKV = (["", "a", "\u00e9"], [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [300, 100, 200])
LFU = ([1, 2, -3], [1, 2, 3])


def fill(module):
    module.plain.insert(*PLAIN)
    module.hkv.insert(HKV[0], HKV[1], scores=HKV[2])
    module.lfu.insert(*LFU)
    module.lfu.insert(LFU[0][:1], LFU[1][:1])  # key 1 inserted twice: LFU score 2


def export_all(module):
    return {
        name: entries(*[t.numpy() for t in getattr(module, name).export_with_scores()])
        for name in ("plain", "hkv", "lfu")
    }


def as_json_like(exported):
    """The worker's JSON view of `export_all` (string keys, latin-1 bytes)."""
    out = {}
    for name, table in exported.items():
        out[name] = {str(k): v for k, v in table.items()}
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(module, checkpoint prefix, export_all(module) at save time)."""
    module = eager_tables()
    fill(module)
    tmpdir = str(tmp_path_factory.mktemp("eager_ckpt"))
    prefix = tf.train.Checkpoint(model=module).save(os.path.join(tmpdir, "ckpt"))
    return module, prefix, export_all(module)


@pytest.fixture(scope="module")
def fresh_process_restore(checkpoint):
    _, prefix, _ = checkpoint
    result = worker_results("eager-restore", prefix)
    if "error" in result:
        raise AssertionError(result["error"])
    return result


def test_saved_scores_are_the_inserted_ones(checkpoint):
    _, _, saved = checkpoint
    e_acute = "\u00e9".encode().decode("latin-1")  # the worker's view of the UTF-8 bytes
    assert {k: v[1] for k, v in saved["hkv"].items()} == {"": 300, "a": 100, e_acute: 200}
    assert {k: v[1] for k, v in saved["lfu"].items()} == {1: 2, 2: 1, -3: 1}


@pytest.mark.parametrize("restore", ["restored", "deferred"])
def test_fresh_process_restore_matches_saved(checkpoint, fresh_process_restore, restore):
    _, _, saved = checkpoint
    assert fresh_process_restore[restore] == as_json_like(saved)


def test_restore_replaces_content_in_same_process(checkpoint, tmp_path):
    module, prefix, saved = checkpoint
    other = eager_tables()
    other.plain.insert([123, 7], [[1.0, 1.0, 1.0], [9.0, 9.0, 9.0]])  # 123: not in the checkpoint
    other.lfu.insert([50], [5])
    other.hkv.clear()
    tf.train.Checkpoint(model=other).restore(prefix).assert_consumed()
    assert export_all(other) == saved


def test_keys_inserted_after_save_are_gone_after_restore(tmp_path):
    table = de.HkvHashTable(
        tf.int64,
        tf.float32,
        [0.0],
        config=de.HkvHashTableConfig(
            init_capacity=8, max_capacity=64, evict_strategy=de.HkvEvictStrategy.CUSTOMIZED
        ),
    )
    table.insert([1, 2], [[1.0], [2.0]], scores=[11, 22])
    ckpt = tf.train.Checkpoint(table=table)
    prefix = ckpt.save(str(tmp_path / "t"))
    table.insert([3], [[3.0]], scores=[33])
    table.insert([1], [[-1.0]], scores=[44])
    table.remove([2])
    ckpt.restore(prefix).assert_consumed()
    exported = entries(*[t.numpy() for t in table.export_with_scores()])
    assert exported == {1: [[1.0], 11], 2: [[2.0], 22]}


def test_checkpoint_false_saves_nothing(tmp_path):
    kept = de.HashTable(tf.int64, tf.float32, 0.0)
    skipped = de.HashTable(tf.int64, tf.float32, 0.0, checkpoint=False)
    kept.insert([1], [1.0])
    skipped.insert([1], [1.0])
    prefix = tf.train.Checkpoint(kept=kept, skipped=skipped).save(str(tmp_path / "c"))
    names = {name for name, _ in tf.train.list_variables(prefix)}
    assert any(name.startswith("kept/") for name in names)
    assert not any(name.startswith("skipped/") for name in names)


def test_checkpoint_write_read_string_keys(tmp_path):
    table = de.HashTable(tf.string, tf.int64, [-1, -1])
    table.insert(["x", ""], [[1, 2], [3, 4]])
    path = tf.train.Checkpoint(t=table).write(str(tmp_path / "w"))
    restored = de.HashTable(tf.string, tf.int64, [-1, -1])
    tf.train.Checkpoint(t=restored).read(path).assert_consumed()
    np.testing.assert_array_equal(
        restored.lookup(["", "x", "y"]).numpy(), [[3, 4], [1, 2], [-1, -1]]
    )


def test_async_checkpoint_saves_a_snapshot(tmp_path):
    table = de.HkvHashTable(
        tf.int64, tf.float32, [0.0], init_capacity=8, max_capacity=64, evict_strategy="customized"
    )
    table.insert([1, 2], [[1.0], [2.0]], scores=[5, 6])
    ckpt = tf.train.Checkpoint(t=table)
    options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    prefix = ckpt.save(str(tmp_path / "async"), options=options)
    table.insert([3], [[3.0]], scores=[7])  # after the snapshot
    ckpt.sync()
    restored = de.HkvHashTable(
        tf.int64, tf.float32, [0.0], init_capacity=8, max_capacity=64, evict_strategy="customized"
    )
    tf.train.Checkpoint(t=restored).restore(prefix).assert_consumed()
    exported = entries(*[t.numpy() for t in restored.export_with_scores()])
    assert exported == {1: [[1.0], 5], 2: [[2.0], 6]}


# ----------------------------------------------------------------------------------------
# TF1 graph mode: tf.compat.v1.train.Saver
# ----------------------------------------------------------------------------------------


def test_graph_mode_saver_round_trip():
    result = scenario_result(graph_mode_results(), "graph_saver_round_trip")
    saved_plain, saved_hkv = result["saved"]
    assert {int(k): v[0] for k, v in saved_plain.items()} == {
        1: [1.0, 1.5],
        -2: [2.0, 2.5],
        3: [3.0, 3.5],
    }
    assert saved_hkv == {"x": [10, 7], "": [20, 8], "y": [30, 9]}
    # Restores replace the content (keys written after the save are gone) and keep scores.
    assert result["restored_same_session"] == result["saved"]
    assert result["restored_new_graph"] == result["saved"]
    assert result["dense"] == [1.0, 2.0]
