"""TF1-graph behaviours that TFRA 0.8.1 users rely on (its kernel_tests are the spec):
meta graphs, `tf.compat.v1.train.Saver` over tables, ops of finalized graphs, and the
train ops that optimizers return in a graph.

Every test builds its own `tf.Graph` and runs it in a `tf.compat.v1.Session`, so the
process stays in eager mode for the other test files.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import temp_workdir

KEYS = np.array([3, 17, -5, 2**40], np.int64)


def _train_graph(make_optimizer, shards=2, dim=3):
    """A TF1 graph of TFRA's pattern: a de.Variable and a dense variable trained by one
    optimizer's `minimize`. Returns (variable, dense, train_op, lookup of KEYS)."""
    var = de.get_variable("emb", tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * shards,
                          initializer=0.5)
    dense = tf.compat.v1.get_variable("dense", [dim], initializer=tf.compat.v1.ones_initializer())
    ids = tf.constant(KEYS[[0, 1, 0, 3]])
    rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
    loss = tf.reduce_sum(tf.square(rows * dense - 1.0))
    train = de.DynamicEmbeddingOptimizer(make_optimizer()).minimize(loss)
    return var, dense, train, var.lookup(tf.constant(KEYS))


# -- 1. import_meta_graph -----------------------------------------------------------------


def test_import_meta_graph_restores_a_trained_variable_and_its_slots():
    """A checkpoint written by `Saver` restores through `import_meta_graph` alone (no
    Python objects rebuilt), as TF1 users and TFRA's
    `test_import_meta_graph_from_checkpoint` do. The restored graph's next training
    step equals the original graph's, so the optimizer's slots were restored too."""
    prefix = os.path.join(temp_workdir(), "model")
    with tf.Graph().as_default():
        var, dense, train, lookup = _train_graph(lambda: tf.compat.v1.train.AdamOptimizer(0.1))
        size = var.size()
        dense_value = tf.identity(dense)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            saved_rows, saved_dense, saved_size = sess.run([lookup, dense_value, size])
            tf.compat.v1.train.Saver().save(sess, prefix)
            sess.run(train)
            next_rows = sess.run(lookup)
        names = [t.name for t in (lookup, dense_value, size, train)]
    assert saved_size == 3
    assert not np.array_equal(next_rows, saved_rows)

    with tf.Graph().as_default():
        saver = tf.compat.v1.train.import_meta_graph(prefix + ".meta")
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            rows, dense_value, restored_size = sess.run(names[:3])
            sess.run(names[3])
            rows_after_step = sess.run(names[0])
    np.testing.assert_array_equal(rows, saved_rows)
    np.testing.assert_array_equal(dense_value, saved_dense)
    assert restored_size == 3
    np.testing.assert_array_equal(rows_after_step, next_rows)
