"""`de.math` and `de.data_flow` (TFRA's namespaces) against NumPy references, with
gradients, in eager mode, in `tf.function` and in TF1 graphs."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.data_flow import partition as partition_module
from tensorflow_dynemb.math import sparse_ops as sparse_ops_module

RNG = np.random.default_rng(7)


def run_in_graph(build):
    """`build()`'s tensors evaluated in a TF1 session of a fresh graph."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        return sess.run(build())


# -- de.math -------------------------------------------------------------------------------


def np_segment_sum(data, indices, segment_ids, num_segments=None):
    rows = (segment_ids[-1] + 1) if num_segments is None else num_segments
    out = np.zeros((rows,) + data.shape[1:], data.dtype)
    for i, s in zip(indices, segment_ids):
        out[s] += data[i]
    return out


@pytest.mark.parametrize("num_segments", [None, 7])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_sparse_segment_sum_values_and_gradient(num_segments, index_dtype):
    data = RNG.normal(size=(5, 3)).astype(np.float32)
    indices = np.array([4, 0, 0, 2, 3], index_dtype)
    segment_ids = np.array([0, 0, 2, 2, 5], index_dtype)
    upstream = RNG.normal(size=(num_segments or 6, 3)).astype(np.float32)
    data_t = tf.constant(data)
    with tf.GradientTape() as tape:
        tape.watch(data_t)
        # TFRA's argument order: name before num_segments.
        out = de.math.sparse_segment_sum(data_t, indices, segment_ids, None, num_segments)
        loss = tf.reduce_sum(out * upstream)
    want = np_segment_sum(data, indices, segment_ids, num_segments)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    # d loss / d data[i] = sum of upstream rows of the segments data[i] went to.
    want = np.zeros_like(data)
    for i, s in zip(indices, segment_ids):
        want[i] += upstream[s]
    grad = tf.convert_to_tensor(tape.gradient(loss, data_t))
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6)


def test_sparse_segment_sum_rejects_mismatched_lengths():
    data = np.arange(20, dtype=np.float32).reshape(10, 2)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        de.math.sparse_segment_sum(data, tf.range(6), tf.range(7))
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        run_in_graph(
            lambda: de.math.sparse_segment_sum(data, tf.range(6), tf.range(7), num_segments=9)
        )


def sparse_5x6(dtype=tf.float32):
    indices = [[0, 0], [1, 0], [1, 3], [1, 4], [3, 2], [3, 3]]
    return tf.SparseTensor(indices, tf.constant([0, 10, 13, 14, 32, 33], dtype), [5, 6])


def test_sparse_fill_empty_rows_values():
    out, empty = de.math.sparse_fill_empty_rows(sparse_5x6(tf.int32), -1)
    dense = tf.sparse.to_dense(out).numpy()
    assert empty.numpy().tolist() == [False, False, True, False, True]
    assert dense[2].tolist() == [-1, 0, 0, 0, 0, 0] and dense[4].tolist() == [-1, 0, 0, 0, 0, 0]
    assert dense[1].tolist() == [10, 0, 0, 13, 14, 0]
    assert out.indices.numpy().tolist() == [
        [0, 0], [1, 0], [1, 3], [1, 4], [2, 0], [3, 2], [3, 3], [4, 0]
    ]


def test_sparse_fill_empty_rows_gradient():
    sp = sparse_5x6()
    default = tf.constant(-1.0)
    upstream = tf.range(1.0, 9.0)  # one weight per output value (8 of them)
    with tf.GradientTape() as tape:
        tape.watch([sp.values, default])
        out, _ = de.math.sparse_fill_empty_rows(sp, default)
        loss = tf.reduce_sum(out.values * upstream)
    d_values, d_default = tape.gradient(loss, [sp.values, default])
    # Output order: the 6 input values interleaved with the 2 filled rows (positions 4, 7).
    np.testing.assert_allclose(d_values.numpy(), [1, 2, 3, 4, 6, 7])
    assert float(d_default) == 5.0 + 8.0


def test_sparse_fill_empty_rows_in_a_graph_takes_a_sparse_tensor_value():
    value = tf.compat.v1.SparseTensorValue([[1, 1]], np.array([3.0], np.float32), [3, 2])
    out, empty = run_in_graph(lambda: de.math.sparse_fill_empty_rows(value, 9.0))
    assert empty.tolist() == [True, False, True]
    assert out.values.tolist() == [9.0, 3.0, 9.0]


def test_sparse_reshape():
    def sparse():
        return tf.SparseTensor([[0, 1, 0], [1, 2, 1]], [1.0, 2.0], [2, 3, 2])

    sp = sparse()
    out = de.math.sparse_reshape(sp, [-1, 4])
    assert out.dense_shape.numpy().tolist() == [3, 4]
    np.testing.assert_array_equal(
        tf.sparse.to_dense(out).numpy().reshape(-1), tf.sparse.to_dense(sp).numpy().reshape(-1)
    )
    got = run_in_graph(lambda: de.math.sparse_reshape(sparse(), tf.constant([12], tf.int64)))
    assert got.indices.tolist() == [[2], [11]]


# -- de.data_flow --------------------------------------------------------------------------


def test_dynamic_partition_values_and_gradient():
    data = tf.constant(RNG.normal(size=(6, 2)).astype(np.float32))
    partitions = tf.constant([2, 0, 2, 1, 0, 2])
    with tf.GradientTape() as tape:
        tape.watch(data)
        parts = de.data_flow.dynamic_partition(data, partitions, 3)
        loss = sum(tf.reduce_sum(p * (i + 1.0)) for i, p in enumerate(parts))
    for i, part in enumerate(parts):
        np.testing.assert_array_equal(part.numpy(), data.numpy()[partitions.numpy() == i])
    # Each row's gradient is its partition's weight.
    want = (partitions.numpy() + 1.0)[:, None] * np.ones((6, 2))
    np.testing.assert_allclose(tape.gradient(loss, data).numpy(), want)


def test_dynamic_partition_errors():
    message = r"partitions\[2\] = 9 is not in \[0, 3\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        de.data_flow.dynamic_partition(tf.zeros([4]), tf.constant([0, 1, 9, 2]), 3)
    with pytest.raises(ValueError):
        run_in_graph(
            lambda: de.data_flow.dynamic_partition(tf.zeros([3, 1]), tf.zeros([2, 1], tf.int32), 2)
        )


@pytest.mark.parametrize("use_fast", [True, False])
def test_dynamic_stitch_values_duplicates_and_gradient(use_fast):
    indices = [tf.constant([0, 4, 2]), tf.constant([[1, 3], [2, 5]])]
    data = [tf.constant([[0.0], [40.0], [20.0]]), tf.constant([[[10.0], [30.0]], [[21.0], [50.0]]])]
    with tf.GradientTape() as tape:
        tape.watch(data)
        # TFRA passes use_fast positionally.
        merged = de.data_flow.dynamic_stitch(indices, data, use_fast)
        loss = tf.reduce_sum(merged * tf.range(1.0, 7.0)[:, None])
    # Index 2 appears twice: the later value (21) wins.
    assert merged.numpy()[:, 0].tolist() == [0.0, 10.0, 21.0, 30.0, 40.0, 50.0]
    grads = tape.gradient(loss, data)
    # Each value gets the gradient of the position its index names, also a value that
    # a later duplicate replaced (TensorFlow's gradient of DynamicStitch, as TFRA's).
    np.testing.assert_allclose(grads[0].numpy()[:, 0], [1.0, 5.0, 3.0])
    np.testing.assert_allclose(grads[1].numpy()[..., 0], [[2.0, 4.0], [3.0, 6.0]])


def test_dynamic_stitch_in_tf_function_and_graph():
    fn = tf.function(lambda i, d: de.data_flow.dynamic_stitch(i, d, use_fast=False))
    got = fn([tf.constant([1]), tf.constant([0])], [tf.constant([7]), tf.constant([5])])
    assert got.numpy().tolist() == [5, 7]
    got = run_in_graph(
        lambda: de.data_flow.dynamic_stitch([tf.constant([1, 0])], [tf.constant([3, 4])])
    )
    assert got.tolist() == [4, 3]


def test_dynamic_stitch_rejects_a_non_bool_use_fast():
    with pytest.raises(TypeError, match="use_fast"):
        de.data_flow.dynamic_stitch([tf.constant([0])], [tf.constant([1])], use_fast="yes")


def test_docstring_examples():
    for module in (sparse_ops_module, partition_module):
        failures, attempted = doctest.testmod(module)
        assert attempted > 0 and failures == 0, module.__name__


# -- de.ragged_embedding_ops ---------------------------------------------------------------


def test_ragged_lookups_equal_the_sparse_ones():
    from tensorflow_dynemb import ragged_embedding_ops

    params = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * 2)
    params.upsert(tf.range(6, dtype=tf.int64), RNG.normal(size=(6, 2)).astype(np.float32))
    ids = tf.ragged.constant([[1, 5, 1], [], [3]], dtype=tf.int64)
    weights = tf.ragged.constant([[1.0, 2.0, -1.0], [], [0.5]])
    sparse_ids, sparse_weights = ids.to_sparse(), weights.to_sparse()
    for combiner in ("sum", "mean", "sqrtn"):
        # TFRA's argument order here: name fourth, combiner fifth.
        got = de.ragged_embedding_ops.embedding_lookup_sparse(params, ids, weights, "n", combiner)
        want = de.embedding_lookup_sparse(params, sparse_ids, sparse_weights, combiner=combiner)
        np.testing.assert_allclose(got, want, rtol=1e-6)
        got = ragged_embedding_ops.safe_embedding_lookup_sparse(params, ids, weights, combiner, 4)
        want = de.safe_embedding_lookup_sparse(
            params, sparse_ids, sparse_weights, combiner, default_id=4
        )
        np.testing.assert_allclose(got, want, rtol=1e-6)
    failures, attempted = doctest.testmod(ragged_embedding_ops)
    assert attempted > 0 and failures == 0
