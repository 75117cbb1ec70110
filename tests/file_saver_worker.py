"""de.FileSystemSaver scenarios that need TF1 graph mode (a fresh process), run by
tests/test_file_system_saver.py.

    python tests/file_saver_worker.py graph WORKDIR

Prints one JSON object on the last line of stdout: {scenario: result}; a scenario
that raises records {"error": traceback}.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

from tables_worker import run_worker

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def file_saved(de, shards, name="t1", **saver_kwargs):
    """TFRA's test variable: dim 1, initializer -1, a FileSystemSaver."""
    return de.Variable(
        key_dtype=tf.int64,
        value_dtype=tf.float32,
        initializer=-1.0,
        devices=["/CPU:0"] * shards,
        name=name,
        dim=1,
        kv_creator=de.CuckooHashTableCreator(saver=de.FileSystemSaver(**saver_kwargs)),
    )


def listing(directory):
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


@scenario
def saver_var_list_reshard(workdir):
    """TFRA's test_save_restore_file_system: tf.compat.v1.train.Saver with a
    de.Variable in var_list, restored into 2, 3 and 1 shards."""
    import tensorflow_dynemb as de

    save_path = os.path.join(workdir, "var_list", "hash")
    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        v0 = tf.compat.v1.Variable(10.0, name="v0")
        v1 = tf.compat.v1.Variable(20.0, name="v1")
        table = file_saved(de, 2)
        saver = tf.compat.v1.train.Saver(var_list=[v0, v1, table])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(table.upsert(tf.constant([0, 1, 2], tf.int64), tf.constant([[0.0], [1.0], [2.0]])))
        result["saved_to"] = saver.save(sess, save_path)
        result["folder"] = listing(os.path.join(os.path.dirname(save_path), "TFRADynamicEmbedding"))
        result["checkpoint_keys"] = sorted(n for n, _ in tf.train.list_variables(save_path))
    for shards in (2, 3, 1):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            v0 = tf.compat.v1.Variable(-1.0, name="v0")
            v1 = tf.compat.v1.Variable(-1.0, name="v1")
            table = file_saved(de, shards)
            sess.run(table.upsert(tf.constant([0, 1], tf.int64), tf.constant([[12.0], [24.0]])))
            saver = tf.compat.v1.train.Saver(var_list=[v0, v1, table])
            saver.restore(sess, save_path)
            keys = tf.constant([5, 0, 1, 2, 6], tf.int64)
            result[f"restored_{shards}"] = {
                "dense": sess.run([v0, v1]),
                "size": int(sess.run(table.size())),
                "lookup": sess.run(table.lookup(keys)).tolist(),
            }
    return result


@scenario
def older_checkpoint_after_a_newer_save(workdir):
    """The files beside a checkpoint hold the newest save: restoring an older
    checkpoint is an error naming both saves, never newer rows beside older dense
    variables."""
    import tensorflow_dynemb as de

    directory = os.path.join(workdir, "older")
    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        table = file_saved(de, 2)
        saver = tf.compat.v1.train.Saver(var_list=[table], max_to_keep=5)
        sess.run(table.upsert(tf.constant([1], tf.int64), tf.constant([[1.0]])))
        first = saver.save(sess, os.path.join(directory, "model"), global_step=1)
        sess.run(table.upsert(tf.constant([2], tf.int64), tf.constant([[2.0]])))
        second = saver.save(sess, os.path.join(directory, "model"), global_step=2)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        table = file_saved(de, 3)
        saver = tf.compat.v1.train.Saver(var_list=[table])
        try:
            saver.restore(sess, first)
            result["older"] = "restored"
        except tf.errors.FailedPreconditionError as e:
            result["older"] = e.message
        result["size_after_refused"] = int(sess.run(table.size()))
        saver.restore(sess, second)
        result["newer_size"] = int(sess.run(table.size()))
    return result


@scenario
def monitored_session_and_sharded_saver(workdir):
    """A MonitoredTrainingSession's default Scaffold (a sharded Saver of the graph's
    SAVEABLE_OBJECTS) saves the files; another session restores them into other
    shards; `save_path` puts them where asked."""
    import tensorflow_dynemb as de

    checkpoint_dir = os.path.join(workdir, "monitored")
    elsewhere = os.path.join(workdir, "elsewhere")
    result = {}
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        emb = file_saved(de, 2, name="embedding", save_path=elsewhere)
        upsert = emb.upsert(tf.constant([1, 2, 3], tf.int64), tf.constant([[1.0], [2.0], [3.0]]))
        train = tf.group(upsert, tf.compat.v1.assign_add(step, 1))
        scaffold = tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver(sharded=True))
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=checkpoint_dir, scaffold=scaffold, save_checkpoint_steps=1
        ) as sess:
            sess.run(train)
    result["elsewhere"] = listing(elsewhere)
    result["beside"] = listing(os.path.join(checkpoint_dir, "TFRADynamicEmbedding"))
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        emb = file_saved(de, 3, name="embedding", save_path=elsewhere)
        size = emb.size()
        lookup = emb.lookup(tf.constant([1, 2, 3, 4], tf.int64))
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir) as sess:
            result["restored_size"] = int(sess.run(size))
            result["lookup"] = sess.run(lookup).tolist()
    return result


def main(argv):
    run_worker(argv, SCENARIOS, {})


if __name__ == "__main__":
    main(sys.argv)
