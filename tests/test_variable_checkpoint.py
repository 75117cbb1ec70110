"""de.Variable checkpoints: content (not shards) is saved, so restores reshard; files too."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import (
    KEY_DTYPES,
    dtype_id,
    exported_dict,
    graph_mode_results,
    make_keys,
    rng_for,
    scenario_result,
    temp_workdir,
    worker_results,
)

VARIABLE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "variable_worker.py")


def sharded(shards, key_dtype=tf.int64, dim=3, **kwargs):
    return de.Variable(key_dtype, tf.float32, dim=dim, devices=["/CPU:0"] * shards, **kwargs)


def content(var):
    return exported_dict(*var.export())


def assert_same_content(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=f"key {k!r}")


# ----------------------------------------------------------------------------------------
# tf.train.Checkpoint
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("chain", [(2, 3, 1), (3, 5, 2, 1)], ids=lambda c: "->".join(map(str, c)))
@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=dtype_id)
def test_checkpoint_restores_into_any_number_of_shards(key_dtype, chain, tmp_path):
    rng = rng_for("reshard", key_dtype, chain)
    keys = make_keys(rng, key_dtype, 500)
    values = rng.standard_normal((500, 3)).astype(np.float32)
    var = sharded(chain[0], key_dtype)
    var.upsert(keys, values)
    expected = content(var)
    prefix = tf.train.Checkpoint(v=var).write(str(tmp_path / "c0"))
    for step, shards in enumerate(chain[1:], 1):
        restored = sharded(shards, key_dtype)
        restored.upsert(make_keys(rng, key_dtype, 7, edges=False), np.ones([7, 3], np.float32))
        tf.train.Checkpoint(v=restored).read(prefix).assert_consumed()
        assert_same_content(content(restored), expected)  # replaced, not merged
        # Every key sits in the shard the partitioner names.
        routed = de.default_partition_fn(tf.constant(keys, key_dtype), shards).numpy()
        for i in range(shards):
            assert int(restored.size(i)) == int(np.sum(routed == i))
        prefix = tf.train.Checkpoint(v=restored).write(str(tmp_path / f"c{step}"))


def test_checkpoint_keeps_hkv_scores_across_shardings(tmp_path):
    config = de.HkvHashTableConfig(
        init_capacity=64,
        max_capacity=4096,
        evict_strategy=de.HkvEvictStrategy.CUSTOMIZED,
        gen_scores_fn=lambda keys: keys * 3 + 1,
    )
    var = sharded(2, kv_creator=de.HkvHashTableCreator(config))
    var.upsert(np.arange(100, dtype=np.int64), np.zeros([100, 3], np.float32))
    prefix = tf.train.Checkpoint(v=var).write(str(tmp_path / "c"))
    restored = sharded(3, kv_creator=de.HkvHashTableCreator(config))
    tf.train.Checkpoint(v=restored).read(prefix).assert_consumed()
    k, _, s = restored.export_with_scores()
    assert sorted(k.numpy().tolist()) == list(range(100))
    np.testing.assert_array_equal(s.numpy(), k.numpy() * 3 + 1)


def test_checkpoint_manager_and_deferred_restore(tmp_path):
    model = tf.Module()
    model.emb = sharded(2)
    model.emb.upsert(np.arange(20, dtype=np.int64), np.ones([20, 3], np.float32))
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 2)
    path = manager.save()

    # The variable is attached after `restore` was called: restored on attachment.
    fresh = tf.Module()
    status = tf.train.Checkpoint(model=fresh).restore(path)
    fresh.emb = sharded(3)
    status.assert_existing_objects_matched()
    assert_same_content(content(fresh.emb), content(model.emb))


def test_checkpoint_false_saves_nothing(tmp_path):
    var = sharded(2, checkpoint=False)
    var.upsert([1, 2], np.ones([2, 3], np.float32))
    prefix = tf.train.Checkpoint(v=var).write(str(tmp_path / "c"))
    names = [name for name, _ in tf.train.list_variables(prefix)]
    assert not any("keys" in n or "values" in n for n in names), names
    other = sharded(2, checkpoint=False)
    other.upsert([3], np.ones([1, 3], np.float32))
    tf.train.Checkpoint(v=other).read(prefix)
    assert int(other.size()) == 1


def test_restoring_another_dim_names_both(tmp_path):
    var = sharded(2, dim=3)
    var.upsert([1, 2], np.ones([2, 3], np.float32))
    prefix = tf.train.Checkpoint(v=var).write(str(tmp_path / "c"))
    other = sharded(2, dim=5)
    other.upsert([9], np.ones([1, 5], np.float32))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as info:
        tf.train.Checkpoint(v=other).read(prefix)
    message = str(info.value)
    assert "3" in message and "5" in message and "dim" in message
    assert int(other.size()) == 1  # unchanged


@pytest.mark.parametrize(
    "key_dtype, value_dtype, expect",
    [(tf.int32, tf.float32, ("int64", "int32")), (tf.int64, tf.float64, ("float", "double"))],
)
def test_restoring_another_dtype_names_both(tmp_path, key_dtype, value_dtype, expect):
    var = sharded(2)
    var.upsert([1, 2], np.ones([2, 3], np.float32))
    prefix = tf.train.Checkpoint(v=var).write(str(tmp_path / "c"))
    other = de.Variable(key_dtype, value_dtype, dim=3, devices=["/CPU:0"] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        tf.train.Checkpoint(v=other).read(prefix)
    message = str(info.value)
    assert all(name in message for name in expect), message
    assert int(other.size()) == 0


def test_checkpoint_restored_in_a_fresh_process():
    prefix = os.path.join(temp_workdir(), "eager", "ckpt")
    saved = worker_results("eager-save", prefix, VARIABLE_WORKER)
    restored = worker_results("eager-restore", prefix, VARIABLE_WORKER)
    assert "error" not in saved, saved.get("error")
    assert "error" not in restored, restored.get("error")
    assert sorted(restored["restored"]) == sorted(
        str(k) for k in [0, -1, 7, 2**40, -(2**62), 123, 456, 789, 1011, 1213]
    )
    assert "junk" not in restored["restored"]
    # A seeded initializer gives missing keys the same rows in every process.
    np.testing.assert_array_equal(saved["initial_rows"], restored["initial_rows"])


# ----------------------------------------------------------------------------------------
# save_to_file_system / load_from_file_system
# ----------------------------------------------------------------------------------------


def generation_files(directory, prefix, shards):
    """The file names one generation of `prefix` with `shards` shards has, and its id."""
    names = sorted(os.listdir(directory))
    manifest = prefix + ".dynemb-manifest"
    assert manifest in names, names
    (save_id,) = {n.split(".")[-2] for n in names if n != manifest}
    expected = sorted(
        [manifest] + [f"{prefix}-{i:05d}-of-{shards:05d}.{save_id}.dynemb" for i in range(shards)]
    )
    assert names == expected
    return save_id


@pytest.mark.parametrize("saved_shards, loaded_shards", [(3, 3), (3, 2), (1, 4), (2, 1)])
@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string], ids=dtype_id)
def test_files_load_into_any_number_of_shards(tmp_path, key_dtype, saved_shards, loaded_shards):
    rng = rng_for("files", key_dtype, saved_shards, loaded_shards)
    keys = make_keys(rng, key_dtype, 300)
    var = sharded(saved_shards, key_dtype, name="user_emb")
    var.upsert(keys, rng.standard_normal((300, 3)).astype(np.float32))
    var.save_to_file_system(str(tmp_path), chunk_rows=64)
    generation_files(tmp_path, "user_emb", saved_shards)

    loaded = sharded(loaded_shards, key_dtype, name="user_emb")
    loaded.upsert(make_keys(rng, key_dtype, 5, edges=False), np.ones([5, 3], np.float32))
    loaded.load_from_file_system(str(tmp_path), chunk_rows=50)
    assert_same_content(content(loaded), content(var))
    routed = de.default_partition_fn(tf.constant(keys, key_dtype), loaded_shards).numpy()
    for i in range(loaded_shards):
        assert int(loaded.size(i)) == int(np.sum(routed == i))


def test_saving_again_with_fewer_shards_replaces_the_old_files(tmp_path):
    big = sharded(3, name="emb")
    big.upsert(np.arange(50, dtype=np.int64), np.ones([50, 3], np.float32))
    big.save_to_file_system(str(tmp_path))
    small = sharded(2, name="emb")
    small.upsert([1000, 1001], np.zeros([2, 3], np.float32))
    small.save_to_file_system(str(tmp_path))
    generation_files(tmp_path, "emb", 2)  # the 3-shard generation is gone
    loaded = sharded(3, name="emb")
    loaded.load_from_file_system(str(tmp_path))
    assert sorted(loaded.export()[0].numpy().tolist()) == [1000, 1001]


def test_a_symbolic_directory_without_files_is_an_error_not_an_empty_variable(tmp_path):
    var = sharded(2, name="emb")
    var.upsert([1, 2, 3], np.ones([3, 3], np.float32))

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def load(directory):
        var.load_from_file_system(directory)

    with pytest.raises(tf.errors.NotFoundError, match="no table files to load"):
        load(tf.constant(str(tmp_path)))
    assert int(var.size()) == 3


def test_a_symbolic_directory_saves_and_loads(tmp_path):
    var = sharded(2, name="emb")
    var.upsert([1, 2, 3], np.ones([3, 3], np.float32))

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def save(directory):
        var.save_to_file_system(directory)

    save(tf.constant(str(tmp_path)))
    generation_files(tmp_path, "emb", 2)
    loaded = sharded(3, name="emb")

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
    def load(directory):
        loaded.load_from_file_system(directory)

    load(tf.constant(str(tmp_path)))
    assert_same_content(content(loaded), content(var))


def test_file_load_without_clear_upserts(tmp_path):
    var = sharded(2, name="emb")
    var.upsert([1, 2], np.ones([2, 3], np.float32))
    var.save_to_file_system(str(tmp_path))
    other = sharded(3, name="emb")
    other.upsert([3], np.zeros([1, 3], np.float32))
    other.load_from_file_system(str(tmp_path), clear=False)
    assert sorted(other.export()[0].numpy().tolist()) == [1, 2, 3]


def test_file_resharding_needs_the_default_partitioner(tmp_path):
    modulo = lambda keys, n: tf.cast(keys % n, tf.int32)  # noqa: E731
    var = sharded(2, name="emb")
    var.upsert([1, 2], np.ones([2, 3], np.float32))
    var.save_to_file_system(str(tmp_path))
    # Keys routed by default_partition_fn would sit in shards the modulo partitioner
    # does not look in: refused, whatever the number of shards.
    for shards in (2, 3):
        other = sharded(shards, name="emb", partitioner=modulo)
        other.upsert([9], np.ones([1, 3], np.float32))
        with pytest.raises(tf.errors.InvalidArgumentError, match="custom partitioner"):
            other.load_from_file_system(str(tmp_path))
        assert other.export()[0].numpy().tolist() == [9]
    # Saved and loaded with the custom partitioner and as many shards: file i -> shard i.
    custom = sharded(2, name="custom", partitioner=modulo)
    custom.upsert([1, 2, 3], np.ones([3, 3], np.float32))
    custom.save_to_file_system(str(tmp_path))
    same = sharded(2, name="custom", partitioner=modulo)
    same.load_from_file_system(str(tmp_path))
    assert [int(same.size(i)) for i in range(2)] == [1, 2]
    np.testing.assert_array_equal(same.lookup([1, 2, 3]).numpy(), np.ones([3, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="custom partitioner"):
        sharded(3, name="custom").load_from_file_system(str(tmp_path))
    one = sharded(1, name="custom")  # one shard needs no routing
    one.load_from_file_system(str(tmp_path))
    assert int(one.size()) == 3
    with pytest.raises(ValueError, match="no save of `absent`"):
        sharded(2, name="absent").load_from_file_system(str(tmp_path))


def test_a_damaged_file_leaves_the_variable_unchanged(tmp_path):
    var = sharded(2, name="emb")
    var.upsert(np.arange(100, dtype=np.int64), np.ones([100, 3], np.float32))
    var.save_to_file_system(str(tmp_path))
    save_id = generation_files(tmp_path, "emb", 2)
    path = tmp_path / f"emb-00001-of-00002.{save_id}.dynemb"
    path.write_bytes(path.read_bytes()[:-20])
    other = sharded(3, name="emb")
    other.upsert([7], np.zeros([1, 3], np.float32))
    with pytest.raises(tf.errors.DataLossError, match="emb-00001-of-00002"):
        other.load_from_file_system(str(tmp_path))
    assert other.export()[0].numpy().tolist() == [7]


def test_loading_another_dim_names_both(tmp_path):
    var = sharded(2, name="emb", dim=3)
    var.upsert([1], np.ones([1, 3], np.float32))
    var.save_to_file_system(str(tmp_path))
    with pytest.raises(tf.errors.InvalidArgumentError, match="dim 3.*dim 4"):
        sharded(2, name="emb", dim=4).load_from_file_system(str(tmp_path))


# ----------------------------------------------------------------------------------------
# TF1 graph mode (one subprocess for every scenario)
# ----------------------------------------------------------------------------------------

KEYS = [0, -1, 7, 2**40, -(2**62), 123, 456, 789, 1011, 1213]
ROWS = np.arange(30, dtype=np.float32).reshape(10, 3)


def graph_result(name):
    return scenario_result(graph_mode_results(VARIABLE_WORKER), name)


def expected_entries():
    return {str(k): ROWS[i].tolist() for i, k in enumerate(KEYS)}


def rows_of(entries):
    return {k: v[0] for k, v in entries.items()}


def test_graph_mode_methods():
    result = graph_result("graph_methods")
    assert result["sizes"][3] == 10 and sum(result["sizes"][:3]) == 10
    values, found = result["lookup"]
    np.testing.assert_array_equal(values, [ROWS[2], [-1.0] * 3, ROWS[1]])
    assert found == [True, False, True]
    np.testing.assert_array_equal(result["rank2"][0], [ROWS[0], ROWS[2]])
    expected = expected_entries()
    expected["7"] = [1.0, 1.0, 1.0]  # accum of (ones - current row) onto the row
    expected["99"] = [1.0, 1.0, 1.0]
    del expected["0"]
    assert rows_of(result["export"]) == expected
    assert "Expected shape" in result["bad_shape"]
    assert rows_of(result["export_after_error"]) == expected


def test_graph_mode_saver_reshards():
    result = graph_result("graph_saver_reshards")
    for shards in (3, 1):
        assert rows_of(result[f"restored_{shards}"]) == expected_entries()
        assert sum(result[f"sizes_{shards}"]) == 10


def test_graph_mode_monitored_training_session_restores_into_other_shards():
    result = graph_result("graph_monitored_training_session")
    assert rows_of(result["restored"]) == expected_entries()


def test_graph_mode_get_variable_and_file_resharding():
    result = graph_result("graph_get_variable_and_files")
    assert rows_of(result["loaded"]) == expected_entries()
