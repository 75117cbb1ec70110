"""`tensorflow_dynemb.variable.step_ops`: the training step's unique, row gather and per-id sums
give exactly TF's `tf.unique`, `sparse_read` (with its gradient) and
`tf.math.unsorted_segment_sum` results, and refuse bad input."""

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_dynemb.variable import step_ops
from tensorflow_dynemb._ops import ops


def _power_law_ids(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(1.2, n) % 100_000
    edges = np.array([0, -1, np.iinfo(np.int32).min, np.iinfo(np.int32).max], np.int64)
    if dtype == tf.int64:
        edges = np.r_[edges, np.iinfo(np.int64).min, np.iinfo(np.int64).max]
        ids = (ranks.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype(np.int64)
    else:
        ids = (ranks - 50_000).astype(np.int64)
    return tf.constant(np.r_[edges, ids, edges], dtype.as_numpy_dtype)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("n", [0, 1, 7, 16, 17, 50_000])
def test_unique_equals_tf_unique(dtype, n):
    ids = _power_law_ids(n, dtype)[: max(n, 0)] if n < 10 else _power_law_ids(n, dtype)
    got_ids, got_index = step_ops.unique(ids)
    want_ids, want_index = tf.unique(ids)
    assert got_ids.dtype == dtype and got_index.dtype == tf.int32
    np.testing.assert_array_equal(got_ids.numpy(), want_ids.numpy())
    np.testing.assert_array_equal(got_index.numpy(), want_index.numpy())


def test_unique_int64_index_and_inside_a_function():
    ids = _power_law_ids(1000, tf.int64)
    got = tf.function(lambda x: ops.dynemb_unique(x, out_idx=tf.int64))(ids)
    want = tf.unique(ids, out_idx=tf.int64)
    assert got[1].dtype == tf.int64
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    unknown = tf.function(ops.dynemb_unique).get_concrete_function(
        tf.TensorSpec([None], tf.int64)
    )
    assert unknown.output_shapes[0].as_list() == [None]


def test_unique_of_strings_falls_back_to_tf():
    ids = tf.constant([b"b", b"", b"a", b"b", b""])
    got_ids, got_index = step_ops.unique(ids)
    assert got_ids.numpy().tolist() == [b"b", b"", b"a"]
    assert got_index.numpy().tolist() == [0, 1, 2, 0, 1]


def test_unique_refuses_a_matrix():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank|vector"):
        ops.dynemb_unique(tf.constant([[1, 2]], tf.int64))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("shape", [(0, 4), (1, 1), (3000, 16), (500, 2, 3)])
def test_segment_sum_equals_tf_bit_for_bit(dtype, shape):
    rng = np.random.default_rng(1)
    values = tf.constant(rng.normal(size=shape) * 10.0 ** rng.integers(-6, 6, size=shape), dtype)
    num = max(shape[0] // 3, 1)
    segments = tf.constant(rng.integers(0, num, size=shape[0]), tf.int32)
    sums, counts = step_ops.segment_sum_with_counts(values, segments, num)
    want = tf.math.unsorted_segment_sum(values, segments, num)
    assert sums.dtype == dtype and counts.dtype == tf.int32
    # Bit for bit: the same additions in the same order (compare the raw bytes so
    # that -0.0, NaN and rounding all count).
    assert sums.numpy().tobytes() == want.numpy().tobytes()
    np.testing.assert_array_equal(counts.numpy(), np.bincount(segments.numpy(), minlength=num))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_segment_sum_of_many_rows_equals_tf_bit_for_bit(dtype):
    # 2**22 values: the kernel splits the segments among the threads (smaller sums
    # run in one pass), and each segment must still add its rows in row order.
    rng = np.random.default_rng(2)
    values = tf.constant(rng.normal(size=(1 << 18, 16)) * 10.0 ** rng.integers(-6, 6, size=(1 << 18, 16)), dtype)
    num = 50_000
    segments = tf.constant(rng.integers(0, num, size=1 << 18), tf.int32)
    sums, counts = step_ops.segment_sum_with_counts(values, segments, num)
    want = tf.math.unsorted_segment_sum(values, segments, num)
    assert sums.numpy().tobytes() == want.numpy().tobytes()
    np.testing.assert_array_equal(counts.numpy(), np.bincount(segments.numpy(), minlength=num))


def test_segment_sum_int64_ids_and_empty_segments():
    values = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    sums, counts = ops.dynemb_segment_sum(
        values, tf.constant([3, 0, 3], tf.int64), tf.constant(5, tf.int64)
    )
    np.testing.assert_array_equal(sums.numpy(), [[3, 4], [0, 0], [0, 0], [6, 8], [0, 0]])
    np.testing.assert_array_equal(counts.numpy(), [1, 0, 0, 2, 0])
    assert counts.dtype == tf.int64


@pytest.mark.parametrize(
    "segments,num,match",
    [
        ([0, 5], 5, r"segment_ids\[1\] = 5 is not in \[0, num_segments = 5\)"),
        ([-1, 0], 5, r"segment_ids\[0\] = -1 is not in"),
        ([0, 1], -1, "num_segments must be >= 0, got -1"),
    ],
)
def test_segment_sum_refuses_ids_out_of_range(segments, num, match):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        ops.dynemb_segment_sum(tf.ones([2, 3]), tf.constant(segments, tf.int32), tf.constant(num))


def test_segment_sum_refuses_sums_too_large_to_shape():
    with pytest.raises(tf.errors.InvalidArgumentError, match="overflow"):
        ops.dynemb_segment_sum(tf.zeros([0, 2**40]), tf.zeros([0], tf.int64),
                               tf.constant(2**30, tf.int64))


def test_segment_sum_refuses_a_row_count_mismatch():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="segment_ids|Dimensions"):
        ops.dynemb_segment_sum(tf.ones([3, 2]), tf.constant([0, 1], tf.int32), tf.constant(2))


def _gather_ops_in(fn, *args):
    return {op.type for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()}


@pytest.mark.parametrize("value_dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("row_shape", [[], [1], [16], [5], [64], [2, 3]])
def test_gather_rows_equals_sparse_read_with_its_gradient(value_dtype, index_dtype, row_shape):
    rng = np.random.default_rng(3)
    rows = 5_000
    variable = tf.Variable(
        rng.standard_normal([rows] + row_shape).astype(value_dtype.as_numpy_dtype),
        shape=tf.TensorShape([None] + row_shape),
    )
    for n in (0, 1, 9, 20_000):  # 20,000: split among threads
        index = tf.constant(rng.integers(0, rows, n), index_dtype)
        weights = tf.constant(rng.standard_normal([n] + row_shape), value_dtype)

        def loss_and_rows(read):
            with tf.GradientTape() as tape:
                got = read(variable, index)
                loss = tf.reduce_sum(got * weights)
            return got, tape.gradient(loss, variable)

        got, grad = loss_and_rows(step_ops.gather_rows)
        want, want_grad = loss_and_rows(lambda v, i: v.sparse_read(i))
        assert got.dtype == value_dtype and got.shape == want.shape
        assert got.numpy().tobytes() == want.numpy().tobytes()
        assert isinstance(grad, tf.IndexedSlices)
        np.testing.assert_array_equal(grad.indices.numpy(), want_grad.indices.numpy())
        assert grad.values.numpy().tobytes() == want_grad.values.numpy().tobytes()
        np.testing.assert_array_equal(grad.dense_shape.numpy(), want_grad.dense_shape.numpy())
    assert "DynembGatherRows" in _gather_ops_in(lambda i: step_ops.gather_rows(variable, i), index)


def test_gather_rows_static_shape_and_fallbacks():
    variable = tf.Variable(tf.zeros([4, 3]), shape=tf.TensorShape([None, 3]))
    index = tf.TensorSpec([None], tf.int32)
    traced = tf.function(lambda i: step_ops.gather_rows(variable, i)).get_concrete_function(index)
    assert traced.outputs[0].shape.as_list() == [None, 3]
    # float16 rows and 2-D indices are not the kernel's: sparse_read reads them.
    half = tf.Variable(tf.ones([4, 3], tf.float16))
    assert "ResourceGather" in _gather_ops_in(lambda i: step_ops.gather_rows(half, i), index)
    ids_2d = tf.constant([[0, 1], [3, 2]])
    np.testing.assert_array_equal(step_ops.gather_rows(variable, ids_2d).numpy(), np.zeros([2, 2, 3]))


@pytest.mark.parametrize("bad", [-1, 4])
def test_gather_rows_refuses_an_index_out_of_range(bad):
    variable = tf.Variable(tf.ones([4, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"indices\[1\] = {bad} is not in \[0, 4\)"):
        step_ops.gather_rows(variable, tf.constant([0, bad, 1]))
    np.testing.assert_array_equal(variable.numpy(), np.ones([4, 3]))


def test_a_training_lookup_in_a_function_reads_its_rows_through_gather_rows():
    """The view's buffers of a lookup first traced in a `tf.function` are that function's
    variables (a subclass of ResourceVariable, as in every Keras `fit` step): their read
    runs DynembGatherRows, and its gradient reaches the optimizer as before."""
    import tensorflow_dynemb as de

    params = de.get_variable("gather_rows_in_a_function", dim=4, initializer=tf.keras.initializers.Ones())
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            rows, trainable = de.embedding_lookup(params, ids, name="probe", return_trainable=True)
            loss = tf.reduce_sum(rows)
        optimizer.apply_gradients([(tape.gradient(loss, trainable), trainable)])
        return loss

    ids = tf.constant([3, 5, 3], tf.int64)
    types = {op.type for op in step.get_concrete_function(ids).graph.get_operations()}
    assert "DynembGatherRows" in types and "ResourceGather" not in types
    step(ids)
    # Key 3 appears twice: its row took two gradient steps of 1.
    np.testing.assert_array_equal(params.lookup(tf.constant([3, 5], tf.int64)).numpy(),
                                  [[-1.0] * 4, [0.0] * 4])
