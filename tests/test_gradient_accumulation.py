"""Keras 3's `gradient_accumulation_steps` with de.Variables: rows change every N-th
step only, by the rule applied to the average gradient of the N steps, exactly as a
dense variable trained by the same optimizer changes (row for row)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de

keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3."):
    pytest.skip("gradient accumulation is Keras 3's", allow_module_level=True)

DIM = 4
VOCAB = 6
STEPS = 3
# Each window of STEPS batches covers every id, so that every row has a gradient at
# every update and the dense optimizer's update equals the lazy one.
BATCHES = [[0, 1, 1, 2], [3, 4, 0], [5, 2, 2, 3], [1, 0, 5], [4, 4, 3], [2, 5, 1, 0]]
INITIAL = np.random.RandomState(7).uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)
TARGET = np.random.RandomState(8).uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)


def _loss(rows, ids):
    return tf.reduce_sum(tf.square(rows - tf.gather(TARGET, ids)))


OPTIMIZERS = {
    "sgd": lambda **kw: keras.optimizers.SGD(0.1, momentum=0.5, **kw),
    "adam": lambda **kw: keras.optimizers.Adam(0.05, **kw),
    "adagrad": lambda **kw: keras.optimizers.Adagrad(0.2, **kw),
    "adam_schedule_clipnorm": lambda **kw: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=0.7),
        clipnorm=0.5, **kw),
}


def _dense_history(make_optimizer):
    table = tf.Variable(INITIAL)
    optimizer = make_optimizer(gradient_accumulation_steps=STEPS)
    history = []
    for batch in BATCHES:
        ids = tf.constant(batch)
        with tf.GradientTape() as tape:
            loss = _loss(tf.gather(table, ids), ids)
        optimizer.apply_gradients([(tape.gradient(loss, table), table)])
        history.append(table.numpy().copy())
    return history


def _dynamic_history(make_optimizer, traced):
    var = de.Variable(tf.int64, tf.float32, dim=DIM, devices=["/CPU:0"] * 2)
    var.upsert(tf.range(VOCAB, dtype=tf.int64), INITIAL)
    optimizer = de.DynamicEmbeddingOptimizer(make_optimizer(gradient_accumulation_steps=STEPS))

    def step(ids):
        with tf.GradientTape() as tape:
            rows = de.embedding_lookup(var, tf.cast(ids, tf.int64), name="acc")
            loss = _loss(rows, ids)
        view = var.get_trainable_by_name("acc")
        optimizer.apply_gradients([(tape.gradient(loss, view), view)])

    step = tf.function(step, reduce_retracing=True) if traced else step
    history = []
    for batch in BATCHES:
        step(tf.constant(batch))
        history.append(var.lookup(tf.range(VOCAB, dtype=tf.int64)).numpy())
    return history, optimizer


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_rows_follow_the_dense_optimizer(name, traced):
    dense = _dense_history(OPTIMIZERS[name])
    dynamic, optimizer = _dynamic_history(OPTIMIZERS[name], traced)
    previous = INITIAL
    for i, (want, got) in enumerate(zip(dense, dynamic)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"after step {i}")
        if (i + 1) % STEPS:  # no update before the window is complete
            np.testing.assert_array_equal(got, previous)
        previous = got
    # Keras counts iterations in updates under accumulation.
    assert int(optimizer.iterations) == len(BATCHES) // STEPS


def test_accumulator_is_saved_with_the_optimizer(tmp_path):
    """A checkpoint taken in the middle of a window carries the accumulated gradients."""
    make = OPTIMIZERS["adam"]
    full, _ = _dynamic_history(make, traced=False)

    var = de.Variable(tf.int64, tf.float32, dim=DIM)
    var.upsert(tf.range(VOCAB, dtype=tf.int64), INITIAL)
    optimizer = de.DynamicEmbeddingOptimizer(make(gradient_accumulation_steps=STEPS))

    def step(var, optimizer, batch):
        ids = tf.constant(batch)
        with tf.GradientTape() as tape:
            loss = _loss(de.embedding_lookup(var, tf.cast(ids, tf.int64), name="acc"), ids)
        view = var.get_trainable_by_name("acc")
        optimizer.apply_gradients([(tape.gradient(loss, view), view)])

    for batch in BATCHES[:4]:  # one update, then one step into the second window
        step(var, optimizer, batch)
    path = tf.train.Checkpoint(var=var, optimizer=optimizer).write(str(tmp_path / "ckpt"))

    restored_var = de.Variable(tf.int64, tf.float32, dim=DIM, devices=["/CPU:0"] * 3)
    restored_optimizer = de.DynamicEmbeddingOptimizer(make(gradient_accumulation_steps=STEPS))
    # The optimizer's state is created at its first step, which restores it then.
    tf.train.Checkpoint(var=restored_var, optimizer=restored_optimizer).read(path)
    for batch in BATCHES[4:]:
        step(restored_var, restored_optimizer, batch)
    np.testing.assert_allclose(
        restored_var.lookup(tf.range(VOCAB, dtype=tf.int64)).numpy(), full[-1], rtol=1e-6
    )


def test_model_fit_matches_a_dense_embedding():
    def model_with(embedding):
        ids = keras.Input(shape=(2,), dtype="int64")
        out = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(
            keras.layers.Flatten()(embedding(ids))
        )
        return keras.Model(ids, out)

    x = np.array([[0, 1], [2, 3], [4, 5], [1, 3], [0, 2], [4, 5]], np.int64)
    y = np.linspace(-1, 1, len(x)).astype(np.float32)[:, None]
    dense = model_with(keras.layers.Embedding(
        VOCAB, DIM, embeddings_initializer=keras.initializers.Constant(0.1)))
    dynamic = model_with(de.keras.layers.Embedding(DIM, initializer=0.1, name="acc_fit"))
    for model in (dense, dynamic):
        model.compile(optimizer=keras.optimizers.Adam(0.05, gradient_accumulation_steps=3),
                      loss="mse")
        model.fit(x, y, batch_size=1, epochs=1, shuffle=False, verbose=0)
    want = dense.layers[1].embeddings.numpy()
    got = dynamic.layers[1].params.lookup(tf.range(VOCAB, dtype=tf.int64)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dynamic.layers[-1].kernel.numpy(), dense.layers[-1].kernel.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_global_clipnorm_with_accumulation_is_refused():
    with pytest.raises(ValueError, match="global_clipnorm.*clipnorm"):
        de.DynamicEmbeddingOptimizer(
            keras.optimizers.Adam(global_clipnorm=1.0, gradient_accumulation_steps=2)
        )
