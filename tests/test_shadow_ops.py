"""`de.shadow_ops` (TFRA's namespace): `ShadowVariable` and its lookups.

Training through a shadow is checked against a dense `tf.Variable` holding the same
rows, trained by the same optimizer (rows and slots); lookups against the table's rows.
"""

from __future__ import annotations

import doctest
import os

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.shadow_ops import lookup as lookup_module
from tensorflow_dynemb.shadow_ops import shadow_variable as shadow_module

ROWS = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]], np.float32)


def make(name, initializer=0.1, shards=1, **kwargs):
    """A variable holding keys 1, 2, 3 (rows ROWS) and a shadow of it."""
    params = de.Variable(
        tf.int64, tf.float32, dim=2, name=name, initializer=initializer,
        devices=["/CPU:0"] * shards, **kwargs,
    )
    params.upsert(tf.constant([1, 2, 3], tf.int64), ROWS)
    return params, de.shadow_ops.ShadowVariable(params, name=f"{name}-shadow")


def ids(*values):
    return tf.constant(values, tf.int64)


# -- creation ------------------------------------------------------------------------------


@pytest.mark.parametrize("value_dtype", [tf.float32, tf.float64, tf.int32])
@pytest.mark.parametrize("trainable", [True, False])
def test_create(value_dtype, trainable):
    params = de.Variable(tf.int64, value_dtype, dim=3, initializer=1)
    shadow = de.shadow_ops.ShadowVariable(params, name="s", trainable=trainable)
    assert shadow.dtype == value_dtype and shadow.shape.as_list() == [None, 3]
    assert shadow.ids.dtype == tf.int64 and shadow.exists.dtype == tf.bool
    assert shadow.trainable == trainable
    assert isinstance(shadow, tf.Variable) and isinstance(shadow.ids, de.DEResourceVariable)
    # Only a trainable floating-point shadow is a trainable view of its variable.
    is_view = trainable and value_dtype.is_floating
    assert (params.get_trainable_by_name("s") is shadow) == is_view
    rows = de.shadow_ops.embedding_lookup(shadow, ids(5, 6))
    assert rows.dtype == value_dtype and rows.numpy().tolist() == [[1] * 3] * 2


def test_creation_errors():
    params = de.Variable(dim=2)
    with pytest.raises(TypeError, match="`params` must be a de.Variable"):
        de.shadow_ops.ShadowVariable(tf.Variable([1.0]))
    with pytest.raises(TypeError, match="model_mode"):
        de.shadow_ops.ShadowVariable(params, model_mode="train")
    with pytest.raises(TypeError, match="distribute_strategy"):
        de.shadow_ops.ShadowVariable(params, distribute_strategy="mirrored")
    with pytest.raises(TypeError, match="`ids` must be a resource variable of dtype int64"):
        de.shadow_ops.ShadowVariable(params, ids=tf.Variable([1], dtype=tf.int32))
    with tf.Graph().as_default():
        graph_params = de.Variable(dim=2)
        with pytest.raises(NotImplementedError, match="eagerly"):
            de.shadow_ops.ShadowVariable(graph_params)
    with pytest.raises(NotImplementedError, match="Horovod"):
        de.shadow_ops.HvdVariable("hvd", None, 2)


def test_given_id_buffers_are_used():
    params = de.Variable(dim=2)
    buffer = tf.Variable(tf.zeros([0], tf.int64), shape=[None])
    shadow = de.shadow_ops.ShadowVariable(params, ids=buffer)
    de.shadow_ops.embedding_lookup(shadow, ids(4, 5))
    assert shadow.ids is buffer and buffer.numpy().tolist() == [4, 5]


# -- reading -------------------------------------------------------------------------------


def test_read_value_prefetches_the_rows_of_its_ids():
    params, shadow = make("read")
    assert shadow.read_value().numpy().tolist() == []
    shadow._reset_ids(ids(2, 3, 4))
    assert shadow.read_value(do_prefetch=False).numpy().tolist() == []
    np.testing.assert_allclose(shadow.read_value(do_prefetch=True), [[2, 2], [3, 3], [0.1, 0.1]])
    assert shadow.exists.numpy().tolist() == [True, True, False]
    params.upsert(ids(3), [[9.0, 9.0]])
    shadow._reset_ids(ids(3))
    np.testing.assert_allclose(shadow.read_value(False), [[2, 2], [3, 3], [0.1, 0.1]])
    np.testing.assert_allclose(shadow.read_value(), [[9, 9]])
    assert int(shadow.size()) == 3


def test_lookup_values_shapes_and_no_insertion():
    params, shadow = make("lookup")
    got = de.shadow_ops.embedding_lookup(shadow, tf.constant([[2, 5], [1, 2]], tf.int64))
    np.testing.assert_allclose(got, [[[2, 2], [0.1, 0.1]], [[1, 1], [2, 2]]])
    assert got.shape.as_list() == [2, 2, 2]
    assert int(params.size()) == 3  # looking up a missing key does not store it
    ragged_ids = tf.ragged.constant([[3], [1, 9]], dtype=tf.int64)
    ragged = de.shadow_ops.embedding_lookup(shadow, ragged_ids)
    assert ragged.row_splits.numpy().tolist() == [0, 1, 3]
    np.testing.assert_allclose(ragged.flat_values, [[3, 3], [1, 1], [0.1, 0.1]])
    params.upsert(ids(1), [[1.5, 1.5]])  # a lookup reads the table as it is now
    np.testing.assert_allclose(de.shadow_ops.embedding_lookup(shadow, ids(1)), [[1.5, 1.5]])
    with pytest.raises(TypeError, match="ids"):
        de.shadow_ops.embedding_lookup(shadow, tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="ShadowVariable"):
        de.shadow_ops.embedding_lookup(params, ids(1))


def test_lookup_unique():
    _, shadow = make("unique")
    id_tensor = tf.constant([[2, 3], [4, 5], [1, 2]], tf.int64)
    want = [[[2, 2], [3, 3]], [[0.1, 0.1], [0.1, 0.1]], [[1, 1], [2, 2]]]
    for with_unique in (True, False):
        got = de.shadow_ops.embedding_lookup_unique(shadow, id_tensor, 2, with_unique)
        np.testing.assert_allclose(got, want)
    ragged = tf.RaggedTensor.from_row_splits(ids(2, 3, 4, 5, 1), [0, 2, 5])
    got = de.shadow_ops.embedding_lookup_unique(shadow, ragged, 2)
    np.testing.assert_allclose(got.flat_values, [[2, 2], [3, 3], [0.1, 0.1], [0.1, 0.1], [1, 1]])
    assert got.row_splits.numpy().tolist() == [0, 2, 5]
    with pytest.raises(ValueError, match="embedding_size"):
        de.shadow_ops.embedding_lookup_unique(shadow, id_tensor, 3)


def test_lookup_unique_base_with_any_lookup_function():
    table = tf.constant([[0.0], [10.0], [20.0], [30.0]])
    calls = []

    def gather(unique):
        calls.append(unique.shape[0])
        return tf.gather(table, unique)

    got = de.shadow_ops.embedding_lookup_unique_base(tf.constant([[3, 1], [3, 3]]), 1, gather)
    assert got.numpy()[..., 0].tolist() == [[30.0, 10.0], [30.0, 30.0]]
    assert calls == [2]  # each distinct id looked up once


def test_max_norm_clips_rows():
    params = de.Variable(dim=2, initializer=0.0)
    params.upsert(ids(1, 2), [[3.0, 4.0], [0.3, 0.4]])
    shadow = de.shadow_ops.ShadowVariable(params, max_norm=1.0)
    got = de.shadow_ops.embedding_lookup(shadow, ids(1, 2))
    np.testing.assert_allclose(got, [[0.6, 0.8], [0.3, 0.4]])
    np.testing.assert_allclose(shadow.read_value(), [[0.6, 0.8], [0.3, 0.4]])


def test_lookups_without_a_tape_replace_the_buffer():
    _, shadow = make("no_growth")
    for _ in range(3):
        de.shadow_ops.embedding_lookup(shadow, ids(1, 2, 1))
    # Distinct ids of the last lookup only: repeated inference calls do not grow it.
    assert shadow.ids.numpy().tolist() == [1, 2]
    np.testing.assert_allclose(shadow.read_value(False), ROWS[:2])


def test_inference_mode_reads_the_table_and_leaves_the_shadow_alone():
    _, shadow = make("inference")
    de.enable_inference_mode()
    try:
        lookup = tf.function(lambda x: de.shadow_ops.embedding_lookup(shadow, x))
        np.testing.assert_allclose(lookup(ids(3, 4)), [[3, 3], [0.1, 0.1]])
        np.testing.assert_allclose(de.shadow_ops.embedding_lookup(shadow, ids(1)), [[1, 1]])
    finally:
        de.enable_train_mode()
    assert shadow.ids.numpy().tolist() == [] and shadow.read_value(False).shape == (0, 2)


# -- training ------------------------------------------------------------------------------


def dense_reference(optimizer, rows, lookups, steps):
    """A dense variable of `rows`, trained on `lookups` (lists of row indices) by
    `optimizer` with a `reduce_mean` loss; its final rows and optimizer variables."""
    dense = tf.Variable(rows)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = sum(tf.reduce_mean(tf.gather(dense, i)) for i in lookups)
        optimizer.apply_gradients(zip(tape.gradient(loss, [dense]), [dense]))
    return dense


@pytest.mark.parametrize("bp_v2", [False, True])
def test_training_matches_a_dense_variable(bp_v2):
    params, shadow = make(f"train_{bp_v2}", initializer=0.0, bp_v2=bp_v2)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.01))
    for _ in range(5):
        optimizer.minimize(
            lambda: tf.reduce_mean(de.shadow_ops.embedding_lookup(shadow, ids(1, 3))), [shadow]
        )
    reference = tf.keras.optimizers.Adam(0.01)
    dense = dense_reference(reference, ROWS, [[0, 2]], 5)
    np.testing.assert_allclose(params.lookup(ids(1, 2, 3)), dense, rtol=1e-6)
    slots = params.get_slot_variables(optimizer)
    m, v = (
        [w for w in reference.variables if name in w.name][0] for name in ("momentum", "velocity")
    )
    np.testing.assert_allclose(slots[0].lookup(ids(1, 2, 3)), m, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(slots[1].lookup(ids(1, 2, 3)), v, rtol=1e-6, atol=1e-12)
    # After a step the shadow holds the trained rows of its ids, as TFRA's does.
    assert shadow.ids.numpy().tolist() == [1, 3]
    np.testing.assert_allclose(shadow.read_value(False), params.lookup(ids(1, 3)))


def test_training_with_a_tf1_optimizer_inserts_new_keys():
    params, shadow = make("train_v1", initializer=0.5)
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
    optimizer.minimize(
        lambda: tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, ids(2, 7))), var_list=[shadow]
    )
    keys, values = params.export()
    order = np.argsort(keys.numpy())
    assert keys.numpy()[order].tolist() == [1, 2, 3, 7]
    np.testing.assert_allclose(values.numpy()[order], [[1, 1], [1, 1], [3, 3], [-0.5, -0.5]])


def test_two_lookups_in_one_step_both_train():
    params, shadow = make("two_lookups", initializer=0.0)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.1))

    def loss():
        first = tf.reduce_mean(de.shadow_ops.embedding_lookup(shadow, ids(1, 3)))
        second = tf.reduce_mean(de.shadow_ops.embedding_lookup(shadow, ids(3, 2, 2)))
        return first + second

    for _ in range(2):
        optimizer.minimize(loss, [shadow])
    dense = dense_reference(tf.keras.optimizers.SGD(0.1), ROWS, [[0, 2], [2, 1, 1]], 2)
    np.testing.assert_allclose(params.lookup(ids(1, 2, 3)), dense, rtol=1e-6)


def test_training_through_a_tf_function_lookup():
    params, shadow = make("in_function", initializer=0.0)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))

    @tf.function
    def forward(new_ids):
        return tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, new_ids))

    for step in range(3):
        optimizer.minimize(lambda: forward(ids(10 + step)), [shadow])
    assert int(params.size()) == 6
    np.testing.assert_allclose(params.lookup(ids(10, 11, 12)), -np.ones([3, 2]))


def test_training_a_module_in_a_tf_function_step():
    class Model(tf.Module):
        def __init__(self):
            self.params = de.Variable(dim=2, initializer=1.0, name="module_emb")
            self.shadow = de.shadow_ops.ShadowVariable(self.params)
            self.weight = tf.Variable([[2.0], [3.0]])

        def __call__(self, x):
            return tf.matmul(de.shadow_ops.embedding_lookup(self.shadow, x), self.weight)

    model = Model()
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
    assert {id(v) for v in model.trainable_variables} == {id(model.shadow), id(model.weight)}

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    step(ids(4, 4))
    # d loss / d row 4 = 2 * weight^T (looked up twice).
    np.testing.assert_allclose(model.params.lookup(ids(4)), [[1.0 - 2.0, 1.0 - 3.0]])
    np.testing.assert_allclose(model.weight.numpy(), [[2.0 - 1.0], [3.0 - 1.0]])


def test_restrict_policy_follows_training():
    params, shadow = make("restricted", restrict_policy=de.TimestampRestrictPolicy)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3))
    for start in (10, 20):
        optimizer.minimize(
            lambda: tf.reduce_mean(de.shadow_ops.embedding_lookup(shadow, ids(start, start + 1))),
            [shadow],
        )
    assert int(params.size()) == 7
    assert int(params.restrict_policy.status.size()) == 4


def test_de_lookups_read_through_a_shadow():
    params, shadow = make("de_lookups", initializer=0.0)
    sparse_ids = tf.SparseTensor([[0, 2], [1, 5]], ids(2, 5), [2, 6])
    got = de.safe_embedding_lookup_sparse(shadow, sparse_ids)
    np.testing.assert_allclose(got, [[2, 2], [0, 0]])
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))

    def loss():
        rows, trainable = de.embedding_lookup(shadow, ids(1, 2), return_trainable=True)
        assert trainable is shadow
        combined = de.safe_embedding_lookup_sparse(shadow, sparse_ids)
        return tf.reduce_sum(rows) + tf.reduce_sum(combined)

    optimizer.minimize(loss, [shadow])
    np.testing.assert_allclose(params.lookup(ids(1, 2, 5)), [[0, 0], [0, 0], [-1, -1]])


def test_replicas_of_a_strategy_cannot_share_a_shadow():
    _, shadow = make("mirrored")
    strategy = tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"])
    with pytest.raises(NotImplementedError, match="replicas"):
        strategy.run(tf.function(lambda: de.shadow_ops.embedding_lookup(shadow, ids(1))))


def test_trainable_wrapper_filter():
    params, shadow = make("filtered")
    _, view = de.embedding_lookup(params, ids(1), name="other", return_trainable=True)
    dense = tf.Variable(1.0)
    others, views = de.trainable_wrapper_filter([dense, shadow, shadow.ids, view])
    assert others == (dense,) and views == (shadow, shadow.ids, view)
    pairs = [(1.0, dense), (2.0, shadow)]
    others, views = de.trainable_wrapper_filter(pairs, lambda pair: pair[1] is shadow)
    assert others == ((1.0, dense),) and views == ((2.0, shadow),)


# -- checkpoints and SavedModels -----------------------------------------------------------


class Holder(tf.Module):
    def __init__(self, shards, with_params=True):
        params = de.Variable(dim=2, devices=["/CPU:0"] * shards, initializer=0.0, name="held")
        self.shadow = de.shadow_ops.ShadowVariable(params)
        if with_params:
            self.params = params


@pytest.mark.parametrize("restore_shards", [1, 2, 3])
def test_checkpoint_saves_the_table_and_an_empty_buffer(tmp_path, restore_shards):
    saved = Holder(shards=3)
    keys = tf.range(10, dtype=tf.int64)
    saved.params.upsert(keys, tf.stack([tf.cast(keys, tf.float32)] * 2, 1))
    de.shadow_ops.embedding_lookup(saved.shadow, keys)
    assert saved.shadow.read_value(False).shape == (10, 2)
    path = tf.train.Checkpoint(saved).save(os.path.join(tmp_path, "ckpt"))
    # Saving empties the buffer (as in TFRA), which the checkpoint does not hold.
    assert saved.shadow.read_value(False).shape == (0, 2) and saved.shadow.ids.numpy().shape == (0,)
    assert ("shadow/.ATTRIBUTES/VARIABLE_VALUE", [0, 2]) in tf.train.list_variables(path)

    restored = Holder(shards=restore_shards, with_params=False)  # the table through the shadow
    de.shadow_ops.embedding_lookup(restored.shadow, ids(1))
    tf.train.Checkpoint(restored).restore(path).assert_consumed()
    assert int(restored.shadow.size()) == 10
    assert restored.shadow.read_value(False).shape == (0, 2)
    assert restored.shadow.ids.numpy().shape == (0,)
    got = de.shadow_ops.embedding_lookup(restored.shadow, ids(7, 3))
    np.testing.assert_allclose(got, [[7, 7], [3, 3]])


def test_saving_keeps_the_buffer_of_a_pending_step(tmp_path):
    params, shadow = make("pending", initializer=0.0)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(1.0))
    module = tf.Module()
    module.shadow = shadow
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, ids(1)))
    tf.train.Checkpoint(module).save(os.path.join(tmp_path, "ckpt"))
    optimizer.apply_gradients(zip(tape.gradient(loss, [shadow]), [shadow]))
    np.testing.assert_allclose(params.lookup(ids(1)), [[0.0, 0.0]])


def test_saved_model_serves_without_writing_the_shadow(tmp_path):
    module = Holder(shards=2)
    module.params.upsert(ids(1, 2), [[1.0, 1.0], [2.0, 2.0]])
    module.serve = tf.function(
        lambda x: de.shadow_ops.embedding_lookup(module.shadow, x),
        input_signature=[tf.TensorSpec([None], tf.int64)],
    )
    tf.saved_model.save(module, os.path.join(tmp_path, "model"))
    assert module.shadow.ids.numpy().shape == (0,)  # tracing for the SavedModel wrote nothing
    loaded = tf.saved_model.load(os.path.join(tmp_path, "model"))
    np.testing.assert_allclose(loaded.serve(ids(2, 9)), [[2, 2], [0, 0]])


def test_docstring_examples():
    for module in (shadow_module, lookup_module):
        failures, attempted = doctest.testmod(module)
        assert attempted > 0 and failures == 0, module.__name__
