"""The contexts users train `de.keras.layers` in, each trained on the same data.

A lookup that trains eagerly must train the same way wherever users write it: a
`@tf.function` on `call`, helper `tf.function`s nested in a custom training step,
Sequential / functional / subclassed models, `run_eagerly=True/False`, custom loops.
Every context trains the same architecture (ids -> Embedding -> Flatten -> Dense(1)),
from the same key-seeded initial rows and dense weights, with the same wrapped Adam,
on the same batches in the same order; each returns the table it trained (keys and
rows), its size and the dense kernel, which `test_training_contexts.py` compares with
the eager functional model's. A table left empty, or rows left at their initial
values, fails there.

`test_training_contexts.py` runs the scenarios with Keras 3 in its own process and with
tf_keras in a subprocess (`keras_worker.py scenarios WORKDIR context_scenarios`), as
`keras_scenarios.py` is run.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.keras._compat import IS_KERAS3, keras_module as K

SCENARIOS: Dict[str, Callable[[str], Any]] = {}

DIM = 3
# 8 examples x 2 features, 4 batches of 2; ids repeat within and across batches.
IDS = np.array(
    [[3, 17], [-5, 3], [2**40, 42], [17, 17], [8, 3], [42, 9], [9, 9], [-5, 8]], np.int64
)
LABELS = np.array([[1.0], [0.0], [0.5], [2.0], [-1.0], [1.5], [0.25], [0.0]], np.float32)
BATCH = 2
EPOCHS = 2


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def embedding(name: str = "user"):
    return de.keras.layers.Embedding(
        DIM, initializer=K.initializers.RandomNormal(0.0, 0.5, seed=7), name=name
    )


def dense():
    return K.layers.Dense(1, kernel_initializer=K.initializers.GlorotUniform(seed=3))


def optimizer():
    return de.DynamicEmbeddingOptimizer(K.optimizers.Adam(0.05))


def batches():
    for _ in range(EPOCHS):
        for start in range(0, len(IDS), BATCH):
            yield tf.constant(IDS[start : start + BATCH]), tf.constant(LABELS[start : start + BATCH])


def trained(layer, dense_layer) -> Dict[str, Any]:
    """What a context trained: the table's keys and rows (sorted by key), its size,
    the rows the same keys would read untrained, and the dense kernel."""
    keys, values = layer.params.export()
    order = np.argsort(keys.numpy())
    keys = keys.numpy()[order]
    initial = embedding("untrained").params.lookup(keys)
    return {
        "size": int(layer.params.size()),
        "keys": keys.tolist(),
        "rows": values.numpy()[order].tolist(),
        "initial_rows": initial.numpy().tolist(),
        "kernel": dense_layer.get_weights()[0].tolist(),
    }


def fit(model, run_eagerly: bool = False, jit_compile=None) -> None:
    kwargs = {} if jit_compile is None else {"jit_compile": jit_compile}
    model.compile(optimizer=optimizer(), loss="mse", run_eagerly=run_eagerly, **kwargs)
    model.fit(IDS, LABELS, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)


# ----------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------


def functional():
    layer, out = embedding(), dense()
    ids = K.Input(shape=(2,), dtype="int64")
    return K.Model(ids, out(K.layers.Flatten()(layer(ids)))), layer, out


def sequential():
    layer, out = embedding(), dense()
    model = K.Sequential([K.Input(shape=(2,), dtype="int64"), layer, K.layers.Flatten(), out])
    return model, layer, out


class Subclassed(K.Model):
    """ids -> embedding -> flatten -> dense, with `call` undecorated."""

    def __init__(self):
        super().__init__()
        self.user = embedding()
        self.flatten = K.layers.Flatten()
        self.out = dense()

    def call(self, ids):
        return self.out(self.flatten(self.user(ids)))


class TfFunctionCall(Subclassed):
    """TFRA's demos' shape: `call` decorated with `@tf.function`."""

    @tf.function
    def call(self, ids):
        return self.out(self.flatten(self.user(ids)))


class NestedHelperCall(Subclassed):
    """`call` runs the lookup in a helper `tf.function` of its own."""

    def __init__(self):
        super().__init__()
        self.embed = tf.function(lambda ids: self.flatten(self.user(ids)))

    def call(self, ids):
        return self.out(self.embed(ids))


class CustomTrainStep(Subclassed):
    """A custom `train_step` whose forward pass is a nested `tf.function` helper."""

    def __init__(self):
        super().__init__()
        self.forward = tf.function(lambda ids: self(ids, training=True))

    def train_step(self, data):
        ids, labels = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.forward(ids) - labels))
        variables = self.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return {"loss": loss}


def subclassed(cls):
    model = cls()
    model(tf.constant(IDS[:1]))  # builds the dense weights (no training lookup: eager, no tape)
    return model, model.user, model.out


# ----------------------------------------------------------------------------------------
# Scenarios
# ----------------------------------------------------------------------------------------


def _register_fit(name: str, make, run_eagerly: bool) -> None:
    """A scenario that fits the model `make()` returns (`(model, layer, out)`)."""

    def run(workdir):
        model, layer, out = make()
        fit(model, run_eagerly=run_eagerly)
        return trained(layer, out)

    run.__name__ = name
    scenario(run)


def _unbuilt(cls):
    """Not built before `fit`: Keras 3 first traces a decorated `call` in its symbolic
    build, and reuses that trace for training."""
    model = cls()
    return model, model.user, model.out


for _name, _make, _eagerly in (
    # The functional model, run eagerly: what every other context must match.
    ("reference", functional, True),
    ("functional_graph", functional, False),
    ("sequential_graph", sequential, False),
    ("subclassed_graph", lambda: subclassed(Subclassed), False),
    ("subclassed_eager", lambda: subclassed(Subclassed), True),
    ("tf_function_call_graph", lambda: subclassed(TfFunctionCall), False),
    ("tf_function_call_unbuilt", lambda: _unbuilt(TfFunctionCall), False),
    # run_eagerly=True: the step is eager, the decorated `call` still a function.
    ("tf_function_call_eager", lambda: subclassed(TfFunctionCall), True),
    ("nested_helper_call_graph", lambda: subclassed(NestedHelperCall), False),
    ("custom_train_step_nested_helper", lambda: subclassed(CustomTrainStep), False),
    ("custom_train_step_nested_helper_eager", lambda: subclassed(CustomTrainStep), True),
):
    _register_fit(_name, _make, _eagerly)


def _custom_loop(model, layer, out, forward, step_is_function: bool) -> Dict[str, Any]:
    opt = optimizer()

    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(forward(ids) - labels))
        variables = model.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    step = tf.function(step) if step_is_function else step
    for ids, labels in batches():
        step(ids, labels)
    return trained(layer, out)


@scenario
def custom_loop_function(workdir):
    model, layer, out = functional()
    return _custom_loop(model, layer, out, lambda ids: model(ids, training=True), True)


@scenario
def custom_loop_nested_helper(workdir):
    """A `tf.function` step whose forward pass is another `tf.function`."""
    model, layer, out = functional()
    forward = tf.function(lambda ids: model(ids, training=True))
    return _custom_loop(model, layer, out, forward, True)


@scenario
def custom_loop_eager_step_function_forward(workdir):
    """An eager step (tape eager) whose forward pass is a `tf.function`."""
    model, layer, out = functional()
    forward = tf.function(lambda ids: model(ids, training=True))
    return _custom_loop(model, layer, out, forward, False)


@scenario
def custom_loop_tf_function_call(workdir):
    model, layer, out = subclassed(TfFunctionCall)
    return _custom_loop(model, layer, out, lambda ids: model(ids, training=True), True)


@scenario
def jit_compile(workdir):
    """`jit_compile=True`: Keras 3 falls back to no XLA (the layer has
    `supports_jit = False`) and trains; tf_keras compiles, and the table refuses at
    trace time, naming jit_compile."""
    model, layer, out = functional()
    try:
        fit(model, jit_compile=True)
    except ValueError as error:
        return {"error_message": str(error), "size": int(layer.params.size())}
    return trained(layer, out)


@scenario
def function_jit_compile(workdir):
    """A custom `tf.function(jit_compile=True)` step: refused at trace time."""
    model, layer, out = functional()
    try:
        _custom_loop(
            model, layer, out,
            tf.function(lambda ids: model(ids, training=True), jit_compile=True), True,
        )
    except ValueError as error:
        return {"error_message": str(error), "size": int(layer.params.size())}
    return {"size": int(layer.params.size())}


def keras_flavor() -> str:
    return "keras3" if IS_KERAS3 else "tf_keras"


@scenario
def issue_34_reproduction(workdir):
    """Issue 34's minimal reproduction, as written there: 4 ids stored and trained."""

    class M(K.Model):
        def __init__(self):
            super().__init__()
            self.e = de.keras.layers.Embedding(4, name="e")
            self.d = K.layers.Dense(1)

        @tf.function
        def call(self, x):
            return self.d(tf.reduce_sum(self.e(x), axis=1))

    m = M()
    m.compile(optimizer=de.DynamicEmbeddingOptimizer(K.optimizers.Adam(1e-2)), loss="mse")
    x = np.array([[1, 2], [3, 4]])
    before = m.e.variable.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    m.fit(x, np.array([[1.0], [2.0]]), epochs=3, verbose=0)
    after = m.e.variable.lookup(tf.constant([1, 2, 3, 4], tf.int64)).numpy()
    return {"size": int(m.e.variable.size()), "moved": np.abs(after - before).max(axis=1).tolist()}
