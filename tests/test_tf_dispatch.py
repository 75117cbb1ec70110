"""`tf.nn.embedding_lookup*` with a `de.Variable` runs the package's lookups (SOK's
idiom, through TF's type-based dispatch), and trains through the wrapped optimizer."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de


def _variable(dim=3):
    var = de.Variable(tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * 2,
                      initializer=tf.keras.initializers.RandomNormal(seed=4))
    var.upsert(tf.constant([1, 2, 2**40], tf.int64), tf.reshape(tf.range(9.0), [3, 3]))
    return var


@pytest.mark.parametrize("lookup", [tf.nn.embedding_lookup, tf.compat.v1.nn.embedding_lookup],
                         ids=["v2", "compat.v1"])
@pytest.mark.parametrize("as_list", [False, True], ids=["variable", "list"])
def test_embedding_lookup_matches_ours(lookup, as_list):
    var = _variable()
    ids = tf.constant([[1, 7], [2**40, -5]], tf.int64)
    params = [var] if as_list else var
    got = lookup(params, ids)
    np.testing.assert_array_equal(got.numpy(), de.embedding_lookup(var, ids).numpy())
    assert got.shape == [2, 2, 3]


def test_sparse_lookups_match_ours():
    var = _variable()
    sp_ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 2, -5], tf.int64), [3, 2])
    weights = tf.SparseTensor(sp_ids.indices, [2.0, 1.0, 0.5], sp_ids.dense_shape)
    for tf_fn in (tf.nn.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse):
        np.testing.assert_allclose(
            tf_fn(var, sp_ids, weights, combiner="sum").numpy(),
            de.embedding_lookup_sparse(var, sp_ids, weights, combiner="sum").numpy(),
        )
    # TF's default combiner (None) is "mean".
    np.testing.assert_allclose(
        tf.nn.embedding_lookup_sparse(var, sp_ids, None).numpy(),
        de.embedding_lookup_sparse(var, sp_ids, None, combiner="mean").numpy(),
    )
    for tf_fn in (tf.nn.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse):
        got = tf_fn(var, sp_ids, weights, default_id=tf.constant(2, tf.int64))
        want = de.safe_embedding_lookup_sparse(var, sp_ids, weights,
                                               default_id=tf.constant(2, tf.int64))
        np.testing.assert_allclose(got.numpy(), want.numpy())
        # Row 2 is empty: the default id's row. The negative id is a key, not pruned.
        np.testing.assert_allclose(got.numpy()[2], [3.0, 4.0, 5.0])


def test_dense_lookups_are_unchanged():
    table = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(tf.nn.embedding_lookup(table, [1, 0]).numpy(),
                                  [[3.0, 4.0], [1.0, 2.0]])


def test_sok_style_eager_training_step():
    var = de.Variable(tf.int64, tf.float32, dim=3, initializer=13.0)
    ids = tf.constant([0, 1, 2**40, 1], tf.int64)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(learning_rate=1.0))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(var, ids))
    view = var.get_trainable_by_name("embedding_lookup")
    optimizer.apply_gradients(zip([tape.gradient(loss, view)], [view]))
    rows = tf.nn.embedding_lookup(var, tf.constant([0, 1, 2**40], tf.int64)).numpy()
    np.testing.assert_allclose(rows, [[12.0] * 3, [11.0] * 3, [12.0] * 3])


def test_training_in_a_tf_function_matches_de_embedding_lookup():
    results = []
    for lookup in (tf.nn.embedding_lookup, de.embedding_lookup):
        var = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * 2, initializer=0.5)
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))

        @tf.function
        def step(ids):
            with tf.GradientTape() as tape:
                rows = lookup(var, ids, name="feature")
                loss = tf.reduce_sum(tf.square(rows - 1.0))
            view = var.get_trainable_by_name("feature")
            optimizer.apply_gradients([(tape.gradient(loss, view), view)])

        for batch in ([1, 2, 2], [2, 3], [1, 5]):
            step(tf.constant(batch, tf.int64))
        keys, rows = var.export()
        order = np.argsort(keys.numpy())
        results.append((keys.numpy()[order], rows.numpy()[order]))
    np.testing.assert_array_equal(results[0][0], [1, 2, 3, 5])
    np.testing.assert_allclose(results[0][1], results[1][1])
