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
    optimizer's `minimize`. Returns (variable, dense, train_op, lookup of KEYS, optimizer)."""
    var = de.get_variable("emb", tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * shards,
                          initializer=0.5)
    dense = tf.compat.v1.get_variable("dense", [dim], initializer=tf.compat.v1.ones_initializer())
    ids = tf.constant(KEYS[[0, 1, 0, 3]])
    rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
    loss = tf.reduce_sum(tf.square(rows * dense - 1.0))
    optimizer = de.DynamicEmbeddingOptimizer(make_optimizer())
    train = optimizer.minimize(loss)
    return var, dense, train, var.lookup(tf.constant(KEYS)), optimizer


# -- 1. import_meta_graph -----------------------------------------------------------------


def test_import_meta_graph_restores_a_trained_variable_and_its_slots():
    """A checkpoint written by `Saver` restores through `import_meta_graph` alone (no
    Python objects rebuilt), as TF1 users and TFRA's
    `test_import_meta_graph_from_checkpoint` do. The restored graph's next training
    step equals the original graph's, so the optimizer's slots were restored too."""
    prefix = os.path.join(temp_workdir(), "model")
    with tf.Graph().as_default():
        var, dense, train, lookup, _ = _train_graph(lambda: tf.compat.v1.train.AdamOptimizer(0.1))
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


# -- 3. tf.compat.v1.train.Saver given tables or variables ---------------------------------


def _fill(var, keys, dim, offset=0.0):
    values = np.arange(len(keys) * dim, dtype=np.float32).reshape(len(keys), dim) + offset
    return var.upsert(tf.constant(keys, tf.int64), values), values


def test_saver_of_a_variables_shard_tables_restores_them():
    """TFRA's `test_save_restore_only_table`: `Saver(var.tables)` saves each shard table
    (made with checkpoint=False, as the variable checkpoints the content) under its
    name, and restores it into the same-named tables of a new graph."""
    prefix = os.path.join(temp_workdir(), "tables")
    keys = [0, 1, 2, -7, 2**40]
    with tf.Graph().as_default():
        var = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * 2, name="t1")
        fill, values = _fill(var, keys, 2)
        saver = tf.compat.v1.train.Saver(var.tables)
        with tf.compat.v1.Session() as sess:
            sess.run(fill)
            assert saver.save(sess, prefix) == prefix
    names = {name for name, _ in tf.train.list_variables(prefix)}
    assert {f"t1_mht_{i}of2-{part}" for i in (1, 2) for part in ("keys", "values")} <= names
    with tf.Graph().as_default():
        var = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * 2, name="t1",
                          initializer=-1.0)
        overwritten, _ = _fill(var, [0, 99], 2, offset=100.0)
        saver = tf.compat.v1.train.Saver(var.tables)
        with tf.compat.v1.Session() as sess:
            sess.run(overwritten)
            saver.restore(sess, prefix)
            size, rows = sess.run([var.size(), var.lookup(tf.constant(keys + [99], tf.int64))])
    assert size == len(keys)
    np.testing.assert_array_equal(rows, np.concatenate([values, [[-1.0, -1.0]]]))


def test_saver_var_list_with_a_variable_among_dense_ones():
    """TFRA's `test_save_restore`: `Saver(var_list=[v0, v1, de_variable])` saves the
    variable's content under its name (the keys `Saver()` without `var_list` writes),
    and restores it, replacing what the table held."""
    prefixes = [os.path.join(temp_workdir(), name) for name in ("listed", "collected")]
    keys = [0, 1, 2]
    with tf.Graph().as_default():
        v0, v1 = tf.Variable(10.0, name="v0"), tf.Variable(20.0, name="v1")
        var = de.Variable(tf.int64, tf.float32, dim=1, name="t1", initializer=-1.0)
        fill, values = _fill(var, keys, 1)
        savers = [tf.compat.v1.train.Saver(var_list=[v0, v1, var]), tf.compat.v1.train.Saver()]
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), fill])
            for saver, prefix in zip(savers, prefixes):
                saver.save(sess, prefix)
    listed, collected = (dict(tf.train.list_variables(prefix)) for prefix in prefixes)
    assert listed == collected
    assert listed["t1-keys"] == [3] and listed["t1-values"] == [3, 1]
    with tf.Graph().as_default():
        v0, v1 = tf.Variable(-1.0, name="v0"), tf.Variable(-1.0, name="v1")
        var = de.Variable(tf.int64, tf.float32, dim=1, name="t1", initializer=-1.0)
        overwritten, _ = _fill(var, [0, 1], 1, offset=12.0)
        saver = tf.compat.v1.train.Saver(var_list=[v0, v1, var])
        with tf.compat.v1.Session() as sess:
            sess.run(overwritten)
            saver.restore(sess, prefixes[0])
            got = sess.run([v0, v1, var.size(), var.lookup(tf.constant([5, 0, 1, 2], tf.int64))])
    assert got[:3] == [10.0, 20.0, 3]
    np.testing.assert_array_equal(got[3], [[-1.0], [0.0], [1.0], [2.0]])


def test_saver_of_variable_and_slot_tables_after_training():
    """TFRA's `test_training_save_restore`: a Saver of the variable's tables and of its
    slots' tables (listed once per slot: the slots share their state table) restores
    the trained rows and the slots in a new session."""
    prefix = os.path.join(temp_workdir(), "trained")
    with tf.Graph().as_default():
        var, _, train, _, optimizer = _train_graph(lambda: tf.compat.v1.train.AdamOptimizer(0.3))
        optimizer_slots = var.get_slot_variables(optimizer)
        tables = list(var.tables)
        for slot in optimizer_slots:
            tables.extend(slot.tables)
        saver = tf.compat.v1.train.Saver(tables)
        exports = [var.export()] + [slot.export() for slot in optimizer_slots]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                sess.run(train)
            before = sess.run(exports)
            saver.save(sess, prefix)
        with tf.compat.v1.Session() as sess:  # a new session: empty tables
            assert sess.run(var.size()) == 0
            saver.restore(sess, prefix)
            after = sess.run(exports)
    assert len(optimizer_slots) == 2 and len(before[0][0]) == 3
    for (keys, rows), (keys_after, rows_after) in zip(before, after):
        order, order_after = np.argsort(keys), np.argsort(keys_after)
        np.testing.assert_array_equal(keys[order], keys_after[order_after])
        np.testing.assert_array_equal(rows[order], rows_after[order_after])


# -- 4. size() in a finalized graph ----------------------------------------------------


def test_size_in_a_finalized_graph_reuses_the_first_size_op():
    """TFRA's MonitoredTrainingSession test calls `table.size()` again once the session
    has finalized the graph: the op of the first call serves (per index), reading the
    size when it runs; an index never asked before is a clear error."""
    with tf.Graph().as_default() as graph:
        tf.compat.v1.train.create_global_step()
        var = de.Variable(tf.int64, tf.float32, dim=1, devices=["/CPU:0"] * 2, name="m100")
        fill, _ = _fill(var, [0, 1, 2], 1)
        with tf.control_dependencies([fill]):  # not carried over to later calls
            var.size()
        first_of_shard = var.size(0)
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=temp_workdir(), save_checkpoint_secs=None
        ) as sess:
            assert graph.finalized
            assert sess.run(var.size()) == 0
            sess.run(fill)
            sizes = sess.run([var.size(), var.size(0), first_of_shard])
            with pytest.raises(RuntimeError, match=r"size\(index=1\).*finalized"):
                var.size(1)
    assert sizes[0] == 3 and sizes[1] == sizes[2] and 0 < sizes[1] < 3


# -- 8. TF1 Adam: the optimizer's own beta powers -----------------------------------------


def _no_graph_rewrites():
    """A session config without grappler, whose rewrites of the dense optimizer's graph
    (not of ours) change float32 round-off."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


@pytest.mark.parametrize("with_dense", [False, True], ids=["embedding_only", "with_dense"])
def test_tf1_adam_equals_the_dense_sparse_path_bit_for_bit(with_dense):
    """TFRA's TestGraph: AdamOptimizer(1.0) for 10 steps on a de.Variable and on a dense
    table read by `tf.nn.embedding_lookup` (TF1 Adam's sparse path): the same rows, to
    the bit. TF1 Adam's bias corrections come from its float32 `beta1_power` /
    `beta2_power` variables (multiplied by beta each step), which the sparse rule reads
    too; with a dense variable in the step they advance in the optimizer's `_finish`,
    without one in the wrapper."""
    rng = np.random.RandomState(0)
    dim, ids = 10, [1, 2, 1]
    init = rng.rand(3, dim).astype(np.float32)
    x_init = rng.rand(dim, 1).astype(np.float32)
    with tf.Graph().as_default():
        table = tf.Variable(init)
        emb = de.get_variable("adam_emb", tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * 2)
        fill = emb.upsert(tf.constant([0, 1, 2], tf.int64), tf.constant(init))
        rows, trainable = de.embedding_lookup(emb, tf.constant(ids, tf.int64), return_trainable=True)
        losses, dense_vars = [], []
        for lookup, optimizer in (
            (tf.nn.embedding_lookup(table, ids), tf.compat.v1.train.AdamOptimizer(1.0)),
            (rows, de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1.0))),
        ):
            x = tf.Variable(x_init, trainable=with_dense)
            loss = tf.reduce_sum(tf.square(tf.matmul(lookup, x)))
            var_list = [table if lookup is not rows else trainable] + ([x] if with_dense else [])
            losses.append(optimizer.minimize(loss, var_list=var_list))
            dense_vars.append(x)
        read = [tf.gather(table, [0, 1, 2]), emb.lookup(tf.constant([0, 1, 2], tf.int64))]
        with tf.compat.v1.Session(config=_no_graph_rewrites()) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), fill])
            for step in range(10):
                sess.run(losses)
                expected, actual = sess.run(read)
                np.testing.assert_array_equal(actual, expected, err_msg=f"step {step + 1}")
            dense_expected, dense_actual = sess.run(dense_vars)
    np.testing.assert_array_equal(dense_actual, dense_expected)
    assert not np.array_equal(expected, init)


def test_tf1_adam_equals_the_dense_sparse_path_bit_for_bit_eagerly():
    """The same as in a graph, executing eagerly, where the wrapper advances the beta
    powers after each step of the embedding alone."""
    rng = np.random.RandomState(1)
    dim, ids = 4, tf.constant([1, 2, 1], tf.int64)
    init = rng.rand(3, dim).astype(np.float32)
    x = tf.constant(rng.rand(dim, 1).astype(np.float32))
    table = tf.Variable(init)
    emb = de.Variable(tf.int64, tf.float32, dim=dim, name="adam_eager")
    emb.upsert(tf.constant([0, 1, 2], tf.int64), init)
    dense_optimizer = tf.compat.v1.train.AdamOptimizer(1.0)
    optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1.0))
    for step in range(10):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.matmul(tf.nn.embedding_lookup(table, ids), x)))
        dense_optimizer.apply_gradients([(tape.gradient(loss, table), table)])
        with tf.GradientTape() as tape:
            rows, trainable = de.embedding_lookup(emb, ids, return_trainable=True)
            loss = tf.reduce_sum(tf.square(tf.matmul(rows, x)))
        optimizer.apply_gradients([(tape.gradient(loss, trainable), trainable)])
        np.testing.assert_array_equal(
            emb.lookup(tf.constant([0, 1, 2], tf.int64)).numpy(), table.numpy(),
            err_msg=f"step {step + 1}",
        )
    beta_1_power, beta_2_power = optimizer.inner_optimizer._get_beta_accumulators()
    assert float(beta_1_power) == pytest.approx(0.9**11, rel=1e-6)
    assert float(beta_2_power) == pytest.approx(0.999**11, rel=1e-6)


# -- 10. TF1 optimizers: the kernels' sparse formulas, to the bit ---------------------------

V1 = tf.compat.v1.train

# name -> optimizer(global_step), with hyperparameters that are not the defaults. Not
# Adam: its sparse path still decays every row's m and v (not lazy), which TFRA's and our
# updates do not (the test of Adam above looks up every row in every step).
TF1_OPTIMIZERS = {
    "GradientDescent": lambda gs: V1.GradientDescentOptimizer(0.1),
    "Momentum": lambda gs: V1.MomentumOptimizer(0.1, 0.9),
    "Adagrad": lambda gs: V1.AdagradOptimizer(0.2, initial_accumulator_value=0.2),
    "Ftrl": lambda gs: V1.FtrlOptimizer(0.1, l1_regularization_strength=0.01,
                                        l2_regularization_strength=0.02),
    "ProximalAdagrad": lambda gs: V1.ProximalAdagradOptimizer(
        0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
    "ProximalGradientDescent": lambda gs: V1.ProximalGradientDescentOptimizer(
        0.3, l1_regularization_strength=0.05, l2_regularization_strength=0.1),
    "ProximalGradientDescent_l2": lambda gs: V1.ProximalGradientDescentOptimizer(
        0.3, l2_regularization_strength=0.1),
    "AdagradDA": lambda gs: V1.AdagradDAOptimizer(
        0.5, gs, initial_gradient_squared_accumulator_value=0.2,
        l1_regularization_strength=0.01, l2_regularization_strength=0.05),
    "AdagradDA_l2": lambda gs: V1.AdagradDAOptimizer(0.5, gs, l2_regularization_strength=0.05),
}
# Those whose kernels round differently from TF ops on whole batches: GradientDescent
# adds duplicate ids' gradients one by one (scatter_add) where the step sums them
# first; Eigen's vectorised rsqrt / pow (Adagrad, Ftrl, ProximalAdagrad) round by an
# element's position in a packet, which differs between a kernel's row and a batch.
ROUND_OFF_ONLY = {"GradientDescent", "Adagrad", "Ftrl", "ProximalAdagrad"}

# Batches of row indices: duplicates (summed) and rows left out of some steps.
_STEP_ROWS = [[0, 1, 0, 2], [1, 3, 3, 1], [2, 0, 4, 4], [3, 1, 0, 2], [4, 4, 2, 1]] * 2


def _train_dense_and_embedding(make_optimizer, dim):
    """10 steps of the optimizer on a dense [5, dim] table read by `tf.nn.embedding_lookup`
    (its sparse kernel, as in TFRA's tests) and on a de.Variable holding the same rows,
    each with its own global step (advanced by `minimize`). Returns the rows of both
    after every step."""
    rng = np.random.RandomState(dim)
    init = rng.uniform(-1, 1, (5, dim)).astype(np.float32)
    weights = rng.uniform(-1, 1, (4, dim)).astype(np.float32)
    with tf.Graph().as_default():
        keys = tf.constant([10, -3, 2**40, 7, 0], tf.int64)
        rows_ph = tf.compat.v1.placeholder(tf.int32, [4])
        table = tf.Variable(init)
        emb = de.get_variable("emb", tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * 2)
        fill = emb.upsert(keys, init)
        train_ops = []
        for dense in (True, False):
            global_step = tf.Variable(0, dtype=tf.int64, trainable=False)
            optimizer = make_optimizer(global_step)
            if dense:
                lookup, var = tf.nn.embedding_lookup(table, rows_ph), table
            else:
                optimizer = de.DynamicEmbeddingOptimizer(optimizer)
                lookup, var = de.embedding_lookup(
                    emb, tf.gather(keys, rows_ph), return_trainable=True
                )
            loss = tf.reduce_sum(tf.square(lookup * weights - 0.5))
            train_ops.append(optimizer.minimize(loss, global_step=global_step, var_list=[var]))
        read = [table.read_value(), emb.lookup(keys)]
        expected, actual = [], []
        with tf.compat.v1.Session(config=_no_graph_rewrites()) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), fill])
            for rows in _STEP_ROWS:
                sess.run(train_ops, {rows_ph: rows})
                dense_rows, embedding_rows = sess.run(read)
                expected.append(dense_rows)
                actual.append(embedding_rows)
    return np.array(expected), np.array(actual), init


@pytest.mark.parametrize("dim", [1, 3])
@pytest.mark.parametrize("name", list(TF1_OPTIMIZERS))
def test_tf1_optimizer_equals_its_sparse_kernel(name, dim):
    """Each TF1 optimizer's rule computes what its ResourceSparseApply* kernel computes
    for the same rows, with TFRA's test setup (a dense table read by embedding_lookup
    beside a de.Variable): to the bit (for dim 1 some kernels take another path, in
    double, which the rules reproduce too), or, for ROUND_OFF_ONLY, within float32
    round-off (TFRA's tolerance)."""
    expected, actual, init = _train_dense_and_embedding(TF1_OPTIMIZERS[name], dim)
    for step, (e, a) in enumerate(zip(expected, actual), start=1):
        message = f"{name}, dim {dim}, step {step}"
        if name in ROUND_OFF_ONLY:
            np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6, err_msg=message)
        else:
            np.testing.assert_array_equal(a, e, err_msg=message)
    assert not np.allclose(expected[-1], init, atol=1e-3)


# -- 2 and 10. Legacy Keras optimizers (tf_keras' and TensorFlow's own) in a TF1 graph ------


def _tf_legacy_keras():
    """TensorFlow's own legacy Keras optimizers (`tensorflow.python.keras`, which TFRA's
    tests use); TF 2.16-2.21 ship them."""
    adam = pytest.importorskip("tensorflow.python.keras.optimizer_v2.adam")
    gradient_descent = pytest.importorskip("tensorflow.python.keras.optimizer_v2.gradient_descent")
    return adam, gradient_descent


def _legacy_keras_optimizers():
    import tf_keras  # noqa: PLC0415

    adam, gradient_descent = _tf_legacy_keras()
    return {
        "tf_keras-Adam": lambda: tf_keras.optimizers.legacy.Adam(0.1),
        "tf.python.keras-Adam": lambda: adam.Adam(0.1, beta_1=0.8),
        "tf.python.keras-SGD": lambda: gradient_descent.SGD(0.1, momentum=0.5, nesterov=True),
    }


@pytest.mark.parametrize("name", ["tf_keras-Adam", "tf.python.keras-Adam", "tf.python.keras-SGD"])
def test_legacy_keras_minimize_returns_the_train_op_in_a_graph(name):
    """TFRA's graph pattern with an OptimizerV2 (callable loss and var_list): the wrapped
    optimizer's `minimize` returns the train op, as the optimizer's own does, and the
    session trains the embedding and the dense variable like the optimizer trains a dense
    table (every row looked up in every step: legacy Adam's sparse path is not lazy)."""
    make = _legacy_keras_optimizers()[name]
    rng = np.random.RandomState(3)
    init = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
    ids = [0, 2, 1, 0]
    with tf.Graph().as_default():
        keys = tf.constant([5, 6, 7], tf.int64)
        emb = de.get_variable("legacy_emb", tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * 2)
        fill = emb.upsert(keys, init)
        table = tf.Variable(init)
        train_ops, dense_weights = [], []
        for wrapped in (False, True):
            weights = tf.Variable([[0.5], [-1.0]])
            optimizer = de.DynamicEmbeddingOptimizer(make()) if wrapped else make()
            trainables = []

            def loss(wrapped=wrapped, weights=weights, trainables=trainables):
                if wrapped:
                    rows, trainable = de.embedding_lookup(
                        emb, tf.gather(keys, ids), return_trainable=True, name="user"
                    )
                    trainables[:] = [trainable]
                else:
                    rows = tf.nn.embedding_lookup(table, ids)
                return tf.reduce_sum(tf.square(tf.matmul(rows, weights) - 1.0))

            var_list = (
                (lambda trainables=trainables, weights=weights: trainables + [weights])
                if wrapped else [table, weights]
            )
            train_ops.append(optimizer.minimize(loss, var_list))
            dense_weights.append(weights)
        assert isinstance(train_ops[1], tf.Operation), train_ops[1]
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), fill])
            for _ in range(5):
                sess.run(train_ops)
            rows, expected_rows, weights, expected_weights, iterations = sess.run(
                [emb.lookup(keys), table, dense_weights[1], dense_weights[0],
                 optimizer.iterations]
            )
    np.testing.assert_allclose(rows, expected_rows, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-6, atol=1e-6)
    assert not np.allclose(rows, init, atol=1e-3)
    assert iterations == 5


def test_tf_legacy_keras_optimizer_trains_eagerly():
    """tensorflow.python.keras' Adam, wrapped, in eager `minimize` calls (TFRA's
    `test_*_v2_minimize_trainable` in eager mode), equals it on a dense table."""
    adam, _ = _tf_legacy_keras()
    ids = tf.constant([0, 1, 1, 2], tf.int64)
    init = np.array([[0.5, -0.2], [1.0, 0.3], [-0.7, 0.9]], np.float32)
    table = tf.Variable(init)
    emb = de.Variable(tf.int64, tf.float32, dim=2, name="eager_legacy")
    emb.upsert([0, 1, 2], init)
    optimizer = de.DynamicEmbeddingOptimizer(adam.Adam(0.1))
    dense_optimizer = adam.Adam(0.1)
    trainable = emb.get_eager_trainable_by_name("user")
    for _ in range(5):
        optimizer.minimize(
            lambda: tf.reduce_sum(tf.square(de.embedding_lookup(emb, ids, name="user") - 1.0)),
            [trainable],
        )
        dense_optimizer.minimize(
            lambda: tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, ids) - 1.0)), [table]
        )
    np.testing.assert_allclose(emb.lookup([0, 1, 2]).numpy(), table.numpy(), rtol=1e-6, atol=1e-6)
    assert int(optimizer.iterations) == 5
    # tf.train.Checkpoint reaches the wrapped optimizer and the embedding slots.
    path = tf.train.Checkpoint(optimizer=optimizer).write(os.path.join(temp_workdir(), "opt"))
    names = [name for name, _ in tf.train.list_variables(path)]
    assert any("inner_optimizer/iter" in name for name in names), names
    assert any("dynamic_embedding_slots" in name for name in names), names


# -- 10. get_slot_names / get_slot, as TFRA's ---------------------------------------------


@pytest.mark.parametrize("family", ["tf1", "tf.python.keras"])
def test_get_slot_names_and_get_slot_as_tfra(family):
    """TFRA's restrict tests read `optimizer.get_slot(trainable, name).params` for every
    `name in optimizer.get_slot_names()`: the slot names of the rule, and slots of the
    variable's size. A dense variable's slots are the wrapped optimizer's: the wrapper
    does not answer for them (TF's checkpoints would save them twice)."""
    adam, _ = _tf_legacy_keras()
    make = (lambda: V1.AdamOptimizer(0.1)) if family == "tf1" else (lambda: adam.Adam(0.1))
    with tf.Graph().as_default():
        emb = de.get_variable("slots_emb", tf.int64, tf.float32, dim=2)
        dense = tf.Variable([1.0, 2.0])
        optimizer = de.DynamicEmbeddingOptimizer(make())
        trainables = []

        def loss():
            rows, trainable = de.embedding_lookup(
                emb, tf.constant([1, 2, 3], tf.int64), return_trainable=True
            )
            trainables[:] = [trainable]
            return tf.reduce_sum(rows * dense)

        if family == "tf1":  # a loss tensor and a list, as TF1 optimizers take them
            train = optimizer.minimize(loss(), var_list=trainables + [dense])
        else:
            train = optimizer.minimize(loss, lambda: trainables + [dense])
        names = optimizer.get_slot_names()
        slots = [optimizer.get_slot(trainables[0], name).params for name in names]
        assert optimizer.get_slot(dense, "m") is None
        dense_slot = optimizer.inner_optimizer.get_slot(dense, "m")
        with pytest.raises(KeyError, match="'accumulator'"):
            optimizer.get_slot(trainables[0], "accumulator")
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            sizes = sess.run([slot.size() for slot in slots])
    assert names == ["m", "v"]
    assert sizes == [3, 3]
    assert isinstance(dense_slot, tf.Variable) and dense_slot.shape == [2]


# -- 9. The trainable view: names, device, update_op ------------------------------------


def test_trainable_is_named_and_placed_as_tfra():
    """TFRA's `test_scope_reuse_embedding_lookup` and `test_colocate_to_ids`: the view of
    `embedding_lookup(..., name)` is `<variable scope>/<name>/<name>` (unique in the
    graph), and lives with the ids, not where the lookup is called."""
    with tf.Graph().as_default():
        ids = tf.constant([0, 1, 2], tf.int64)
        with tf.compat.v1.variable_scope("test", reuse=tf.compat.v1.AUTO_REUSE):
            p1 = de.get_variable("p1")
            with tf.compat.v1.variable_scope("q"):
                _, t1 = de.embedding_lookup(p1, ids, name="emb", return_trainable=True)
        with tf.compat.v1.variable_scope("test", reuse=tf.compat.v1.AUTO_REUSE):
            p2 = de.get_variable("p2")
            with tf.compat.v1.variable_scope("q"):
                _, t2 = de.embedding_lookup(p2, ids, name="emb", return_trainable=True)
        with tf.device("/CPU:1"):
            features = tf.constant([1, 2, 3], tf.int64)
        with tf.device("/CPU:2"):
            _, placed = de.embedding_lookup(p1, features, name="on_cpu_2", return_trainable=True)
    assert (t1.name, t2.name) == ("test/q/emb/emb:0", "test/q/emb/emb_1:0")
    assert p1.get_trainable_by_name("emb") is t1 and p2.get_trainable_by_name("emb") is t2
    assert tf.DeviceSpec.from_string(placed.device).device_index == 1


@pytest.mark.parametrize("policy", [None, de.TimestampRestrictPolicy])
def test_trainable_update_op_writes_the_looked_up_rows(policy):
    """TFRA's `test_simple_sharded`: `trainable.update_op()` writes the rows the lookup
    read (here the initializer's, as max_norm clips only the output) into the variable,
    and, with a restrict policy, the policy's status of those ids."""
    with tf.Graph().as_default():
        var = de.get_variable("t300", tf.int64, tf.float32, dim=1, devices=["/CPU:0"] * 2,
                              initializer=2.0, restrict_policy=policy)
        ids = tf.constant([0, 1, 2, 3, 4], tf.int64)
        embedding, trainable = de.embedding_lookup(var, ids, max_norm=1.0, return_trainable=True)
        update = trainable.update_op()
        with tf.compat.v1.Session() as sess:
            rows = sess.run(embedding)
            assert sess.run(var.size()) == 0  # a lookup stores nothing
            sess.run(update)
            sizes = sess.run([var.size(), var.size(0), var.size(1)])
            stored = sess.run(var.lookup(ids))
            status = sess.run(var.restrict_policy.status.size()) if policy else None
    np.testing.assert_array_equal(rows, np.ones([5, 1]))
    np.testing.assert_array_equal(stored, np.full([5, 1], 2.0))
    assert sizes[0] == 5 and sizes[1] + sizes[2] == 5 and min(sizes[1:]) > 0
    assert status == (5 if policy else None)


def test_trainable_update_op_of_a_bp_v2_variable_needs_the_rows_before():
    with tf.Graph().as_default():
        var = de.get_variable("bp_v2_emb", dim=1, initializer=1.0, bp_v2=True)
        _, trainable = de.embedding_lookup(var, tf.constant([7], tf.int64), return_trainable=True)
        with pytest.raises(ValueError, match="bp_v2.*v0"):
            trainable.update_op()


@pytest.mark.parametrize("family", ["tf1", "tf_keras-legacy", "tf.python.keras"])
def test_checkpoint_of_a_wrapper_that_lists_slot_names(family):
    """TF's checkpoints ask every object with `get_slot_names` for the slots of every
    variable: a wrapper (which has them, as TFRA's) must not answer for the wrapped
    optimizer's dense slots, or they would be saved twice. The dense and the embedding
    slots both restore."""
    import tf_keras  # noqa: PLC0415

    adam, _ = _tf_legacy_keras()
    make = {
        "tf1": lambda: V1.AdamOptimizer(0.1),
        "tf_keras-legacy": lambda: tf_keras.optimizers.legacy.Adam(0.1),
        "tf.python.keras": lambda: adam.Adam(0.1),
    }[family]

    def build():
        emb = de.Variable(tf.int64, tf.float32, dim=2, name="ckpt_emb", initializer=0.5)
        dense = tf.Variable([1.0, -1.0], name="ckpt_dense")
        optimizer = de.DynamicEmbeddingOptimizer(make())
        return emb, dense, optimizer

    emb, dense, optimizer = build()
    trainable = emb.get_eager_trainable_by_name("user")
    for _ in range(2):
        with tf.GradientTape() as tape:
            rows = de.embedding_lookup(emb, tf.constant([1, 2], tf.int64), name="user")
            loss = tf.reduce_sum(tf.square(rows * dense - 1.0))
        optimizer.apply_gradients(zip(tape.gradient(loss, [trainable, dense]), [trainable, dense]))
    inner = optimizer.inner_optimizer
    saved_dense_m = inner.get_slot(dense, "m").numpy()
    saved_m = optimizer.get_slot(trainable, "m").params.lookup([1, 2]).numpy()
    path = tf.train.Checkpoint(emb=emb, dense=dense, optimizer=optimizer).write(
        os.path.join(temp_workdir(), "ckpt")
    )

    emb, dense, optimizer = build()
    tf.train.Checkpoint(emb=emb, dense=dense, optimizer=optimizer).read(path)
    trainable = emb.get_eager_trainable_by_name("user")
    # The slots exist once the optimizer builds them for these variables.
    with tf.GradientTape() as tape:
        rows = de.embedding_lookup(emb, tf.constant([1, 2], tf.int64), name="user")
        loss = tf.reduce_sum(rows * dense) * 0.0
    optimizer.apply_gradients(zip(tape.gradient(loss, [trainable, dense]), [trainable, dense]))
    np.testing.assert_allclose(
        optimizer.inner_optimizer.get_slot(dense, "m").numpy(), saved_dense_m * 0.9, rtol=1e-6
    )
    np.testing.assert_allclose(
        optimizer.get_slot(trainable, "m").params.lookup([1, 2]).numpy(), saved_m * 0.9,
        rtol=1e-6,
    )
