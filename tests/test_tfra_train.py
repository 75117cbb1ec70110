"""`de.train` (TFRA's namespace: `DECheckpoint`, `DEHvdSaver`), `de.GraphKeys`,
`de.warm_start` and `de.WarmStartHook`."""

from __future__ import annotations

import doctest
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.train import checkpoint as checkpoint_module
from tensorflow_dynemb.train import warm_start as warm_start_module
from tensorflow_dynemb.variable import graph_keys as graph_keys_module

KEYS = list(range(100))
VALUES = [[float(k), -float(k)] for k in KEYS]


def sorted_content(variable):
    keys, values = variable.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order].tolist(), values.numpy()[order].tolist()


# -- DECheckpoint --------------------------------------------------------------------------


def test_decheckpoint_is_tf_train_checkpoint():
    assert issubclass(de.train.DECheckpoint, tf.train.Checkpoint)
    assert de.train.Checkpoint is de.train.DECheckpoint


def test_decheckpoint_restores_into_any_number_of_shards(tmp_path):
    def module(shards):
        m = tf.Module()
        m.emb = de.get_variable(f"ckpt_{shards}", dim=2, devices=["/CPU:0"] * shards)
        return m

    saved = module(3)
    saved.emb.upsert(tf.constant(KEYS, tf.int64), VALUES)
    ckpt = de.train.DECheckpoint(saved)
    path = ckpt.save(os.path.join(tmp_path, "model"))
    assert tf.train.latest_checkpoint(tmp_path) == path
    written = ckpt.write(os.path.join(tmp_path, "written"))
    for shards in (5, 2, 1):
        restored = module(shards)
        de.train.DECheckpoint(restored).restore(path).assert_consumed()
        assert sorted_content(restored.emb) == (KEYS, VALUES), shards
        again = module(shards)
        de.train.DECheckpoint(root=again).read(written).assert_existing_objects_matched()
        assert sorted_content(again.emb) == (KEYS, VALUES), shards


def test_decheckpoint_with_keyword_objects_and_a_manager(tmp_path):
    emb = de.Variable(dim=2, name="kw")
    emb.upsert(tf.constant([1], tf.int64), [[1.0, 2.0]])
    manager = tf.train.CheckpointManager(de.train.DECheckpoint(emb=emb), tmp_path, max_to_keep=1)
    manager.save()
    other = de.Variable(dim=2, name="kw2", devices=["/CPU:0"] * 2)
    de.train.DECheckpoint(emb=other).restore(manager.latest_checkpoint).assert_consumed()
    assert sorted_content(other) == ([1], [[1.0, 2.0]])


def test_dehvdsaver_is_not_provided():
    with pytest.raises(NotImplementedError, match="Horovod"):
        de.train.DEHvdSaver()


# -- GraphKeys -----------------------------------------------------------------------------


def test_graph_keys_and_no_automatic_collection():
    assert de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES == "dynamic_embedding_variables"
    trainable = de.GraphKeys.TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES
    assert trainable == "trainable_dynamic_embedding_variables"
    with tf.Graph().as_default():
        de.get_variable("not_collected", dim=1)
        assert tf.compat.v1.get_collection(de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES) == []
        assert tf.compat.v1.get_collection(de.GraphKeys.TRAINABLE_DYNAMIC_EMBEDDING_VARIABLES) == []


# -- warm_start ----------------------------------------------------------------------------


def save_in_graph(prefix, name, shards, dim=2, keys=KEYS, values=VALUES, kv_creator=None):
    """Saves a variable `name` of `keys`/`values` with tf.compat.v1.train.Saver."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        emb = de.get_variable(
            name, dim=dim, devices=["/CPU:0"] * shards, initializer=-1.0, kv_creator=kv_creator
        )
        sess.run(emb.upsert(tf.constant(keys, tf.int64), tf.constant(values, tf.float32)))
        return tf.compat.v1.train.Saver().save(sess, prefix)


def warm_started(name, shards, select, **kwargs):
    """A new graph's variable `name` after `de.warm_start(select(emb), **kwargs)`: its
    sorted content and the rows a lookup of the first ids reads."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        emb = de.get_variable(name, dim=2, devices=["/CPU:0"] * shards, initializer=-1.0)
        rows = de.embedding_lookup(emb, tf.constant(KEYS[:3], tf.int64), name="lookup")
        tf.compat.v1.add_to_collection(de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES, emb)
        sess.run(de.warm_start(vars_to_warm_start=select(emb), **kwargs))
        keys, values = sess.run(emb.export())
        order = np.argsort(keys)
        return (keys[order].tolist(), values[order].tolist()), sess.run(rows).tolist()


@pytest.mark.parametrize("save_shards,restore_shards", [(1, 1), (3, 3), (3, 2), (1, 3)])
@pytest.mark.parametrize("selection", ["variables", "regex", "regex_list"])
def test_warm_start(tmp_path, save_shards, restore_shards, selection):
    name = f"ws_{save_shards}_{restore_shards}_{selection}"
    prefix = save_in_graph(os.path.join(tmp_path, "ckpt"), name, save_shards)
    select = {
        "variables": lambda emb: [emb],
        "regex": lambda emb: "ws_.*",
        "regex_list": lambda emb: ["nothing", f".*{selection}"],
    }[selection]
    content, rows = warm_started(name, restore_shards, select, ckpt_to_initialize_from=prefix)
    assert content == (KEYS, VALUES)
    assert rows == VALUES[:3]


def test_warm_start_renamed_and_from_a_directory(tmp_path):
    save_in_graph(os.path.join(tmp_path, "ckpt"), "scope/old_name", 2)
    content, _ = warm_started(
        "new_name", 1, lambda emb: [emb],
        ckpt_to_initialize_from=str(tmp_path),
        var_name_to_prev_var_name={"new_name": "scope/old_name"},
    )
    assert content == (KEYS, VALUES)


def test_warm_start_keeps_hkv_scores(tmp_path):
    config = de.HkvHashTableConfig(
        init_capacity=256, max_capacity=256, evict_strategy=de.HkvEvictStrategy.CUSTOMIZED
    )
    creator = de.HkvHashTableCreator(config=config)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        emb = de.get_variable("scored", dim=1, kv_creator=creator)
        scores = tf.constant([50, 60], tf.int64)
        sess.run(emb.tables[0].insert(tf.constant([5, 6], tf.int64), [[5.0], [6.0]], scores=scores))
        prefix = tf.compat.v1.train.Saver().save(sess, os.path.join(tmp_path, "ckpt"))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        emb = de.get_variable("scored", dim=1, kv_creator=creator)
        sess.run(de.warm_start(prefix, [emb]))
        keys, _, scores = sess.run(emb.export_with_scores())
    assert dict(zip(keys.tolist(), scores.tolist())) == {5: 50, 6: 60}


def test_warm_start_eagerly_from_a_tf_train_checkpoint(tmp_path):
    module = tf.Module()
    module.emb = de.Variable(dim=2, name="eager_saved", devices=["/CPU:0"] * 2)
    module.emb.upsert(tf.constant(KEYS, tf.int64), VALUES)
    path = tf.train.Checkpoint(model=module).save(os.path.join(tmp_path, "ckpt"))
    emb = de.Variable(dim=2, name="eager_restored")
    assert de.warm_start(path, [emb], {"eager_restored": "model/emb"}) is None
    assert sorted_content(emb) == (KEYS, VALUES)


def test_warm_start_hook_in_a_monitored_session(tmp_path):
    prefix = save_in_graph(os.path.join(tmp_path, "ckpt"), "hooked", 3)
    with tf.Graph().as_default():
        emb = de.get_variable("hooked", dim=2, initializer=-1.0)
        rows = de.embedding_lookup(emb, tf.constant([4, 5, 1000], tf.int64))
        hook = de.WarmStartHook(prefix, [emb])
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            assert sess.run(rows).tolist() == [VALUES[4], VALUES[5], [-1.0, -1.0]]


def test_warm_start_errors(tmp_path):
    prefix = save_in_graph(os.path.join(tmp_path, "ckpt"), "err", 1)
    wide = os.path.join(tmp_path, "dim3")
    save_in_graph(wide, "wide", 1, dim=3, keys=[1], values=[[1.0, 2.0, 3.0]])
    with tf.Graph().as_default():
        emb = de.get_variable("err", dim=2)
        with pytest.raises(ValueError, match="selects no de.Variable"):
            de.warm_start(prefix, ".*")  # nothing was added to the collection
        with pytest.raises(ValueError, match="must be a regular expression"):
            de.warm_start(prefix, [emb, "err"])
        with pytest.raises(ValueError, match="neither a checkpoint prefix"):
            de.warm_start(os.path.join(tmp_path, "missing"), [emb])
        with pytest.raises(ValueError, match="holds no content for de.Variable 'unknown'"):
            de.warm_start(prefix, [de.get_variable("unknown", dim=2)])
        with pytest.raises(ValueError, match="has dim 2"):
            de.warm_start(os.path.join(tmp_path, "dim3"), [de.get_variable("wide", dim=2)])
        with pytest.raises(ValueError, match="keys of int32"):
            de.warm_start(prefix, [de.get_variable("err2", tf.int32, dim=2)], {"err2": "err"})


def test_warm_start_asks_to_choose_between_candidates(tmp_path):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        tf.constant(0, name="twin")  # takes the name: both variables get suffixed ones
        first = de.get_variable("twin", dim=1)
        with tf.compat.v1.variable_scope("", reuse=False):
            second = de.Variable(dim=1, name="twin")  # a second one of the same name
        sess.run([first.upsert(tf.constant([1], tf.int64), [[1.0]]),
                  second.upsert(tf.constant([2], tf.int64), [[2.0]])])
        prefix = tf.compat.v1.train.Saver().save(sess, os.path.join(tmp_path, "ckpt"))
        saved = [name for name, _ in tf.train.list_variables(prefix)]
        names = sorted(n[: -len("-keys")] for n in saved if n.endswith("-keys"))
    assert len(names) == 2 and "twin" not in names
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        emb = de.get_variable("twin", dim=1)
        with pytest.raises(ValueError, match="several candidates"):
            de.warm_start(prefix, [emb])
        sess.run(de.warm_start(prefix, [emb], {"twin": names[1]}))
        assert sess.run(emb.export())[0].tolist() == [2]


def test_warm_start_prefers_the_exact_name(tmp_path):
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        first = de.get_variable("twin", dim=1)
        with tf.compat.v1.variable_scope("", reuse=False):
            second = de.Variable(dim=1, name="twin")  # saved as twin_1
        sess.run([first.upsert(tf.constant([1], tf.int64), [[1.0]]),
                  second.upsert(tf.constant([2], tf.int64), [[2.0]])])
        prefix = tf.compat.v1.train.Saver().save(sess, os.path.join(tmp_path, "ckpt"))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        emb = de.get_variable("twin", dim=1)
        sess.run(de.warm_start(prefix, [emb]))
        assert sess.run(emb.export())[0].tolist() == [1]


def test_docstring_examples():
    for module in (checkpoint_module, warm_start_module, graph_keys_module):
        failures, attempted = doctest.testmod(module)
        assert attempted > 0 and failures == 0, module.__name__
