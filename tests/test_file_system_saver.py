"""de.FileSystemSaver, and TFRA's arguments of save_to_file_system /
load_from_file_system (issue 24): what TFRA code passes works, with TFRA's meaning
where it keeps one under the integrity guarantees, and a clear error where not."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import graph_mode_results, scenario_result

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_saver_worker.py")


def file_saved(shards, name="emb", **saver_kwargs):
    return de.Variable(
        tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * shards, name=name,
        kv_creator=de.HashTableCreator(saver=de.FileSystemSaver(**saver_kwargs)),
    )


def content(obj):
    keys, values = obj.export()
    return sorted(zip(keys.numpy().tolist(), values.numpy().tolist()))


def filled(var, n=200, offset=0):
    keys = np.arange(n, dtype=np.int64) + offset
    var.upsert(keys, np.stack([keys, -keys], 1).astype(np.float32))
    return var


# ----------------------------------------------------------------------------------------
# tf.train.Checkpoint
# ----------------------------------------------------------------------------------------


def test_checkpoint_keeps_the_content_in_files_beside_it(tmp_path):
    var = filled(file_saved(2))
    dense = tf.Variable(3.0)
    prefix = tf.train.Checkpoint(emb=var, dense=dense).write(str(tmp_path / "ckpt"))
    folder = tmp_path / "TFRADynamicEmbedding"
    names = sorted(os.listdir(folder))
    assert names[-1] == "emb.dynemb-manifest" and len(names) == 3
    keys = {name for name, _ in tf.train.list_variables(prefix)}
    assert "emb/.ATTRIBUTES/-file_system_save_id" in keys
    assert not any(k.endswith("-values") for k in keys)  # not inside the bundle
    for shards in (3, 1):
        restored = filled(file_saved(shards), n=5, offset=10**6)
        other = tf.Variable(0.0)
        tf.train.Checkpoint(emb=restored, dense=other).read(prefix).assert_consumed()
        assert content(restored) == content(var) and float(other) == 3.0


def test_restoring_a_checkpoint_whose_files_a_later_save_replaced_is_an_error(tmp_path):
    var = filled(file_saved(2))
    checkpoint = tf.train.Checkpoint(emb=var)
    first = checkpoint.write(str(tmp_path / "ckpt-1"))
    var.upsert([10**7], [[1.0, 1.0]])
    second = checkpoint.write(str(tmp_path / "ckpt-2"))
    restored = filled(file_saved(2), n=3, offset=10**6)
    before = content(restored)
    with pytest.raises(tf.errors.FailedPreconditionError, match="a later save replaced its files"):
        tf.train.Checkpoint(emb=restored).read(first)
    assert content(restored) == before
    tf.train.Checkpoint(emb=restored).read(second).assert_consumed()
    assert content(restored) == content(var)


def test_variables_saved_together_share_one_save_id_and_save_path_works(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    a = filled(file_saved(2, name="a"))
    b = filled(file_saved(1, name="b", save_path=str(elsewhere), buffer_size=16), offset=500)
    prefix = tf.train.Checkpoint(a=a, b=b).write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    ids = {reader.get_tensor(f"{n}/.ATTRIBUTES/-file_system_save_id") for n in ("a", "b")}
    assert len(ids) == 1  # one generation for the whole checkpoint
    (save_id,) = ids
    assert f"b-00000-of-00001.{save_id.decode()}.dynemb" in os.listdir(elsewhere)
    ra, rb = file_saved(3, name="a"), file_saved(2, name="b", save_path=str(elsewhere))
    tf.train.Checkpoint(a=ra, b=rb).read(prefix).assert_consumed()
    assert content(ra) == content(a) and content(rb) == content(b)


def test_checkpoint_in_a_tf_function(tmp_path):
    var = filled(file_saved(2))
    checkpoint = tf.train.Checkpoint(emb=var)
    prefix = tf.function(lambda: checkpoint.write(str(tmp_path / "ckpt")))()
    restored = file_saved(3)
    tf.train.Checkpoint(emb=restored).read(prefix.numpy().decode()).assert_consumed()
    assert content(restored) == content(var)


def test_saved_model_keeps_the_content_inside(tmp_path):
    var = filled(file_saved(2))
    module = tf.Module()
    module.emb = var
    module.lookup = tf.function(lambda k: var.lookup(k),
                                input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "sm"))
    assert not (tmp_path / "sm" / "variables" / "TFRADynamicEmbedding").exists()
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_array_equal(loaded.lookup(tf.constant([3, 7], tf.int64)).numpy(),
                                  [[3.0, -3.0], [7.0, -7.0]])


def test_saved_model_weights_restore_into_variables_with_the_saver(tmp_path):
    """TFRA's `test_keras_save_load_weights_file_system`: a SavedModel's variables (the
    content inside them) restore as a checkpoint (Keras' `load_weights(saved_model_dir)`)
    into variables with a FileSystemSaver, in any number of shards; no files needed."""
    module = tf.Module()
    module.emb = filled(file_saved(3))
    tf.saved_model.save(module, str(tmp_path / "sm"))
    weights = str(tmp_path / "sm" / "variables" / "variables")
    for shards in (5, 2):
        restored = filled(file_saved(shards), n=7, offset=1000)   # replaced, not merged
        tf.train.Checkpoint(emb=restored).restore(weights).expect_partial()
        assert content(restored) == content(module.emb)


def test_saved_model_weights_of_one_process_are_refused_for_several(tmp_path):
    """TFRA's `test_mpi_keras_save_load_weights_file_system`: with `proc_size` > 1 the
    content a SavedModel holds is one process's part, which it does not record; restoring
    it into another rank would mix parts, so it is refused and the variable unchanged."""
    module = tf.Module()
    module.emb = filled(file_saved(2, proc_size=2, proc_rank=0))
    tf.saved_model.save(module, str(tmp_path / "sm"))
    weights = str(tmp_path / "sm" / "variables" / "variables")
    other_rank = filled(file_saved(2, proc_size=2, proc_rank=1), n=5, offset=500)
    before = content(other_rank)
    with pytest.raises(ValueError, match="proc_size=2.*rank 1.*load_from_file_system"):
        tf.train.Checkpoint(emb=other_rank).restore(weights)
    assert content(other_rank) == before


def test_saver_arguments_are_checked():
    with pytest.raises(TypeError, match="proc_size"):
        de.FileSystemSaver(proc_size=2)
    with pytest.raises(ValueError, match="proc_rank"):
        de.FileSystemSaver(proc_size=2, proc_rank=2)
    with pytest.raises(ValueError, match="buffer_size"):
        de.FileSystemSaver(buffer_size=0)
    with pytest.raises(TypeError, match="saver"):
        de.HashTableCreator(saver="files")
    creator = de.HkvHashTableCreator(config=de.HkvHashTableConfig(), saver=de.FileSystemSaver())
    assert isinstance(creator.saver, de.FileSystemSaver)
    assert de.FileSystemSaver().config.buffer_size == 4096


# ----------------------------------------------------------------------------------------
# TF1: tf.compat.v1.train.Saver, MonitoredTrainingSession (one subprocess)
# ----------------------------------------------------------------------------------------


def graph(name):
    return scenario_result(graph_mode_results(WORKER), name)


def test_tf1_saver_with_a_variable_in_var_list_restores_into_2_3_1_shards():
    result = graph("saver_var_list_reshard")
    assert result["folder"][-1] == "t1.dynemb-manifest" and len(result["folder"]) == 3
    assert not any(k.endswith("-values") for k in result["checkpoint_keys"])
    for shards in (2, 3, 1):
        restored = result[f"restored_{shards}"]
        assert restored["dense"] == [10.0, 20.0]
        assert restored["size"] == 3
        assert restored["lookup"] == [[-1.0], [0.0], [1.0], [2.0], [-1.0]]


def test_tf1_saver_refuses_an_older_checkpoint_whose_files_were_replaced():
    result = graph("older_checkpoint_after_a_newer_save")
    assert "a later save replaced its files" in result["older"]
    assert result["size_after_refused"] == 0
    assert result["newer_size"] == 2


def test_tf1_monitored_session_saves_and_restores_files():
    result = graph("monitored_session_and_sharded_saver")
    assert result["beside"] == []  # save_path was given
    assert result["elsewhere"][-1] == "embedding.dynemb-manifest"
    assert result["restored_size"] == 3
    assert result["lookup"] == [[1.0], [2.0], [3.0], [-1.0]]


# ----------------------------------------------------------------------------------------
# TFRA's arguments of save_to_file_system / load_from_file_system
# ----------------------------------------------------------------------------------------


def test_table_accepts_tfra_arguments_and_file_uris(tmp_path):
    table = de.CuckooHashTable(tf.int64, tf.float32, [0.0])
    table.insert([0, 1, 2], [[0.0], [1.0], [2.0]])
    uri = "file://" + str(tmp_path / "0")
    table.save_to_file_system(uri, buffer_size=4096)
    assert os.listdir(tmp_path / "0") == [f"{table.name}.dynemb"]
    other = de.CuckooHashTable(tf.int64, tf.float32, [0.0])
    other.load_from_file_system(uri, buffer_size=4096)
    assert content(other) == content(table)
    with pytest.raises(ValueError, match="append_to_file"):
        table.save_to_file_system(str(tmp_path), append_to_file=True)
    with pytest.raises(ValueError, match="same setting"):
        table.save_to_file_system(str(tmp_path), buffer_size=8, chunk_rows=9)


def test_dirpath_env_overrides_dirpath(tmp_path, monkeypatch):
    table = de.HashTable(tf.int64, tf.float32, [0.0])
    table.insert([5], [[5.0]])
    monkeypatch.setenv("TFRA_SAVED_KV", str(tmp_path / "from_env"))
    table.save_to_file_system(str(tmp_path / "ignored"), file_name="t.dynemb")
    assert os.listdir(tmp_path / "from_env") == ["t.dynemb"]
    assert not (tmp_path / "ignored").exists()
    other = de.HashTable(tf.int64, tf.float32, [0.0])
    other.load_from_file_system("/nonexistent", file_name="t.dynemb")
    assert content(other) == [(5, [5.0])]
    # dirpath_env=None ignores the environment.
    table.save_to_file_system(str(tmp_path / "given"), "t.dynemb", dirpath_env=None)
    assert os.listdir(tmp_path / "given") == ["t.dynemb"]


def test_variable_proc_rank_file_name_list_and_load_entire_dir(tmp_path):
    # Two processes' parts of one variable (as with Horovod), each saved by its rank.
    parts = [filled(file_saved(2, name="emb"), n=100, offset=1000 * r) for r in range(2)]
    for rank, part in enumerate(parts):
        part.save_to_file_system(str(tmp_path), proc_size=2, proc_rank=rank)
    names = os.listdir(tmp_path)
    assert {"emb_rank0_size2.dynemb-manifest", "emb_rank1_size2.dynemb-manifest"} <= set(names)
    rank1 = file_saved(3, name="emb")
    rank1.load_from_file_system(str(tmp_path), proc_size=2, proc_rank=1)
    assert content(rank1) == content(parts[1])
    everything = file_saved(3, name="emb")
    everything.load_from_file_system(str(tmp_path), load_entire_dir=True)
    assert content(everything) == sorted(content(parts[0]) + content(parts[1]))
    # file_name_list names the data files; the manifest finds them on load.
    var = filled(file_saved(2, name="listed"))
    var.save_to_file_system(str(tmp_path / "listed"), file_name_list=["first", "second"])
    assert sorted(n.split(".")[0] for n in os.listdir(tmp_path / "listed")) == [
        "first", "listed", "second"]
    back = file_saved(2, name="listed")
    back.load_from_file_system(str(tmp_path / "listed"), file_name_list=["first", "second"])
    assert content(back) == content(var)
    with pytest.raises(ValueError, match="file_name_list"):
        var.save_to_file_system(str(tmp_path), file_name_list=["only_one"])
    with pytest.raises(ValueError, match="append_to_file"):
        var.save_to_file_system(str(tmp_path), append_to_file=True)


def test_table_load_entire_dir_reads_every_shard_of_a_variable(tmp_path):
    var = filled(file_saved(3, name="whole"), n=90)
    var.save_to_file_system(str(tmp_path))
    table = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    table.load_from_file_system(str(tmp_path), file_name=var.tables[1].name,
                                load_entire_dir=True)
    assert content(table) == content(var)
