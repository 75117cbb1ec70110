"""Arguments of the wrong shape are refused inside a tf.function whose input shapes are
unknown (issue 25, item 6): the check runs in the op (its kernel, or a check op the
result depends on), not only in Python, where the shapes are unknown. Every refusal
leaves the table or variable unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de

UNKNOWN = tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.bool)
KEYS = np.array([1, 2, 3], np.int64)


def table():
    t = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    t.insert([1], [[5.0, 5.0]])
    return t


def variable(shards):
    v = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * shards, name="shapes")
    v.upsert([1], [[5.0, 5.0]])
    return v


def content(obj):
    keys, values = obj.export()
    return sorted(zip(keys.numpy().tolist(), values.numpy().tolist()))


def run_unknown(fn, keys, values, exists):
    """Runs `fn(keys, values, exists)` in a tf.function of unknown input shapes."""

    def body(k, v, e):
        fn(k, v, e)  # an op, or a tuple of tensors: not what the function returns

    tf.function(body, input_signature=UNKNOWN)(keys, values, exists)


ROWS = np.ones([3, 2], np.float32)
EXISTS = np.array([True, False, True])

# (name, method, keys, values, exists): each call has one argument of the wrong shape.
TABLE_CASES = [
    ("accum exists [3, 1]", lambda t, k, v, e: t.accum(k, v, e), KEYS, ROWS, EXISTS[:, None]),
    ("accum exists [2]", lambda t, k, v, e: t.accum(k, v, e), KEYS, ROWS, EXISTS[:2]),
    ("accum values [3, 1]", lambda t, k, v, e: t.accum(k, v, e), KEYS, ROWS[:, :1], EXISTS),
    ("accum_and_evict exists [3, 1]", lambda t, k, v, e: t.accum_and_evict(k, v, e), KEYS, ROWS,
     EXISTS[:, None]),
    ("insert values [3, 3]", lambda t, k, v, e: t.insert(k, v), KEYS, np.ones([3, 3], np.float32),
     EXISTS),
    ("insert values [2, 2]", lambda t, k, v, e: t.insert(k, v), KEYS, ROWS[:2], EXISTS),
    ("insert_and_evict values [3, 1]", lambda t, k, v, e: t.insert_and_evict(k, v), KEYS,
     ROWS[:, :1], EXISTS),
    ("import_ values [2, 2]", lambda t, k, v, e: t.import_(k, v), KEYS, ROWS[:2], EXISTS),
    ("lookup dynamic defaults [2, 2]",
     lambda t, k, v, e: t.lookup(k, dynamic_default_values=v), KEYS, ROWS[:2], EXISTS),
]


@pytest.mark.parametrize("case", TABLE_CASES, ids=[c[0] for c in TABLE_CASES])
def test_table_methods_check_shapes_in_the_op(case):
    _, method, keys, values, exists = case
    t = table()
    before = content(t)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        run_unknown(lambda k, v, e: method(t, k, v, e), keys, values, exists)
    assert content(t) == before


def test_table_scores_of_another_shape_are_refused():
    t = table()
    before = content(t)

    @tf.function(input_signature=[tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, tf.int64)])
    def insert(keys, scores):
        t.insert(keys, tf.ones(tf.concat([tf.shape(keys), [2]], 0)), scores=scores)

    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        insert(KEYS, np.array([[1], [2], [3]], np.int64))
    assert content(t) == before


VARIABLE_CASES = [
    ("accum exists [3, 1]", lambda v, k, x, e: v.accum(k, x, x, e), KEYS, ROWS, EXISTS[:, None]),
    ("accum exists [1, 3]", lambda v, k, x, e: v.accum(k, x, x, e), KEYS, ROWS, EXISTS[None, :]),
    ("accum exists [2]", lambda v, k, x, e: v.accum(k, x, x, e), KEYS, ROWS, EXISTS[:2]),
    ("accum rows [3, 1]", lambda v, k, x, e: v.accum(k, x, x, e), KEYS, ROWS[:, :1], EXISTS),
    ("accum_and_evict exists [3, 1]", lambda v, k, x, e: v.accum_and_evict(k, x, x, e), KEYS,
     ROWS, EXISTS[:, None]),
    ("upsert values [3, 3]", lambda v, k, x, e: v.upsert(k, x), KEYS,
     np.ones([3, 3], np.float32), EXISTS),
    ("upsert values [2, 2]", lambda v, k, x, e: v.upsert(k, x), KEYS, ROWS[:2], EXISTS),
    ("insert_and_evict values [3, 1]", lambda v, k, x, e: v.insert_and_evict(k, x), KEYS,
     ROWS[:, :1], EXISTS),
]


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("case", VARIABLE_CASES, ids=[c[0] for c in VARIABLE_CASES])
def test_variable_methods_check_shapes_in_the_graph(case, shards):
    _, method, keys, values, exists = case
    v = variable(shards)
    before = content(v)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        run_unknown(lambda k, x, e: method(v, k, x, e), keys, values, exists)
    assert content(v) == before


@pytest.mark.parametrize("shards", [1, 3])
def test_variable_accum_of_the_right_shapes_still_works(shards):
    v = variable(shards)
    keys = np.array([[1, 2]], np.int64)  # rank 2 keys
    old = v.lookup(keys).numpy()
    new = np.full([1, 2, 2], 2.0, np.float32)
    def accum(k, o, n, e):
        v.accum(k, o, n, e)

    run = tf.function(
        accum,
        input_signature=[tf.TensorSpec(None, tf.int64), tf.TensorSpec(None, tf.float32),
                         tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.bool)],
    )
    run(keys, old, new, np.array([[True, False]]))
    np.testing.assert_array_equal(v.lookup([1, 2]).numpy(), [[2.0, 2.0], [2.0, 2.0]])


def test_eager_accum_refuses_exists_of_another_shape():
    v = variable(2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        v.accum(KEYS, ROWS, ROWS, EXISTS[:, None])
    assert content(v) == [(1, [5.0, 5.0])]
