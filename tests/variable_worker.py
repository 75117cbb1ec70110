"""de.Variable scenarios that need a fresh process; run by the variable tests.

    python tests/variable_worker.py graph WORKDIR
        TF1 graph mode: methods in a Session, get_variable, Saver and
        MonitoredTrainingSession round trips that change the number of shards.
    python tests/variable_worker.py eager-save PREFIX / eager-restore PREFIX
        A tf.train.Checkpoint written by one process, restored by another with
        another number of shards.

Prints one JSON object on the last line of stdout: {scenario: result}; a scenario
that raises records {"error": traceback}.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

from tables_worker import entries, run_worker

SCENARIOS = {}

KEYS = np.array([0, -1, 7, 2**40, -(2**62), 123, 456, 789, 1011, 1213], np.int64)
ROWS = np.arange(30, dtype=np.float32).reshape(10, 3)


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def sharded(de, shards, name="emb", **kwargs):
    return de.Variable(
        tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * shards, name=name, **kwargs
    )


# ----------------------------------------------------------------------------------------
# TF1 graph mode
# ----------------------------------------------------------------------------------------


@scenario
def graph_methods(workdir):
    import tensorflow_dynemb as de

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = sharded(de, 3, initializer=-1.0)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        values = tf.compat.v1.placeholder(tf.float32, [None, 3])
        exists = tf.compat.v1.placeholder(tf.bool, [None])
        upsert = var.upsert(keys, values)
        looked_up, found = var.lookup(keys, return_exists=True)
        accum = var.accum(keys, looked_up, values, exists)
        remove = var.remove(keys)
        sizes = [var.size(i) for i in range(3)] + [var.size()]
        exported = var.export()
        static = var.lookup(tf.constant([[0, 7], [5, 123]], tf.int64))
        assert static.shape.as_list() == [2, 2, 3], static.shape
        result = {}
        sess.run(upsert, {keys: KEYS, values: ROWS})
        result["sizes"] = sess.run(sizes)
        result["lookup"] = sess.run([looked_up, found], {keys: [7, 5, -1]})
        result["rank2"] = sess.run(static)
        # accum: old = current rows (looked up in the same run), new = ones.
        sess.run(accum, {keys: [7, 99], values: np.ones([2, 3]), exists: [True, False]})
        sess.run(remove, {keys: [0, 1]})
        result["export"] = entries(*sess.run(exported))
        try:
            sess.run(upsert, {keys: [1, 2], values: np.ones([3, 3])})
            result["bad_shape"] = "no error"
        except tf.errors.InvalidArgumentError as e:
            result["bad_shape"] = e.message
        result["export_after_error"] = entries(*sess.run(exported))
    return result


@scenario
def graph_saver_reshards(workdir):
    import tensorflow_dynemb as de

    prefix = os.path.join(workdir, "saver", "model")
    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = sharded(de, 2)
        sess.run(var.upsert(KEYS, ROWS))
        saver = tf.compat.v1.train.Saver()
        saver.save(sess, prefix)
    for shards in (3, 1):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var = sharded(de, shards)
            sess.run(var.upsert([555], [[9.0, 9.0, 9.0]]))  # replaced by the restore
            tf.compat.v1.train.Saver().restore(sess, prefix)
            result[f"restored_{shards}"] = entries(*sess.run(var.export()))
            result[f"sizes_{shards}"] = sess.run([var.size(i) for i in range(shards)])
            saver = tf.compat.v1.train.Saver()
            saver.save(sess, prefix)  # the next round restores from this sharding
    return result


@scenario
def graph_monitored_training_session(workdir):
    import tensorflow_dynemb as de

    checkpoint_dir = os.path.join(workdir, "mts")
    with tf.Graph().as_default():
        var = sharded(de, 2)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(var.upsert(KEYS, ROWS), step.assign_add(1))
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=checkpoint_dir, save_checkpoint_steps=1
        ) as sess:
            sess.run(train)
    with tf.Graph().as_default():
        var = sharded(de, 3)
        tf.compat.v1.train.get_or_create_global_step()
        exported = var.export()
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir) as sess:
            return {"restored": entries(*sess.run(exported))}


@scenario
def graph_get_variable_and_files(workdir):
    import tensorflow_dynemb as de

    directory = os.path.join(workdir, "files")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = de.get_variable("emb", dim=3, devices=["/CPU:0"] * 2)
        sess.run(var.upsert(KEYS, ROWS))
        sess.run(var.save_to_file_system(tf.constant(directory)))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = de.get_variable("emb", dim=3, devices=["/CPU:0"] * 3)
        sess.run(var.load_from_file_system(tf.constant(directory)))
        return {"loaded": entries(*sess.run(var.export()))}


# ----------------------------------------------------------------------------------------
# Eager checkpoints across processes
# ----------------------------------------------------------------------------------------


def eager_save(prefix):
    import tensorflow_dynemb as de

    var = de.Variable(tf.string, tf.float32, dim=3, devices=["/CPU:0"] * 3, name="emb")
    var.upsert([str(k).encode() for k in KEYS], ROWS)
    seeded = de.Variable(
        dim=4, initializer=tf.keras.initializers.RandomNormal(0.0, 1.0, seed=5), name="seeded"
    )
    tf.train.Checkpoint(var=var, seeded=seeded).write(prefix)
    return {"initial_rows": seeded.lookup(tf.constant([1, 2, 3], tf.int64)).numpy()}


def eager_restore(prefix):
    import tensorflow_dynemb as de

    var = de.Variable(tf.string, tf.float32, dim=3, devices=["/CPU:0"] * 2, name="emb")
    var.upsert([b"junk"], [[1.0, 1.0, 1.0]])
    seeded = de.Variable(
        dim=4, initializer=tf.keras.initializers.RandomNormal(0.0, 1.0, seed=5), name="seeded"
    )
    tf.train.Checkpoint(var=var, seeded=seeded).read(prefix).assert_consumed()
    return {
        "restored": entries(*[t.numpy() for t in var.export()]),
        "initial_rows": seeded.lookup(tf.constant([1, 2, 3], tf.int64)).numpy(),
    }


def main(argv):
    run_worker(argv, SCENARIOS, {"eager-save": eager_save, "eager-restore": eager_restore})


if __name__ == "__main__":
    main(sys.argv)
