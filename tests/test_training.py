"""End-to-end training of `de.Variable`s with `de.DynamicEmbeddingOptimizer`.

What is checked, and against what:

- lazy-equals-dense optimizers (plain SGD, Adagrad, Ftrl, TF1 GradientDescent /
  Adagrad / ProximalAdagrad / Ftrl): the trained table equals a dense `tf.Variable`
  table read with `tf.nn.embedding_lookup` and trained by the same optimizer;
- every supported optimizer: the trained table equals "the same optimizer applied to
  only the looked-up rows", built from the optimizer itself (one dense `tf.Variable`
  per key; each step, `apply_gradients` on the keys of that step and the dense
  variable), not from a re-implementation of its formulas;
- learning-rate schedules, clipping and weight decay; duplicate ids and several
  lookups per step; bp_v2 write-back; TFRA's eager `minimize` pattern; TF1 graph mode
  (in a subprocess, `training_worker.py`); checkpoints holding the slots; errors.

Every training run is 10 steps over the same batches (`STEP_IDS`, shared with the
worker): ids repeat within a batch and some appear only in some steps (one only once,
one only from step 6 on), so laziness, duplicate summing and new ids are exercised
together, with a dense variable trained by the same optimizer call.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Dict, List, NamedTuple, Sequence

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tensorflow_dynemb as de
from tensorflow_dynemb.variable import trainable as trainable_module
from _tables_util import graph_mode_results, scenario_result, temp_workdir
from training_worker import (
    GRAPH_ADAM_LR,
    GRAPH_DIM,
    GRAPH_SHARDS,
    KEYS,
    NUM_STEPS,
    STEP_IDS,
    dense_initial,
    loss_fn,
    loss_weights,
    random_initializer,
)

TRAINING_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training_worker.py")

K3 = keras.optimizers
TFK = tf_keras.optimizers
V1 = tf.compat.v1.train

# Tolerances of "the same optimizer": the sparse rules compute each row with the
# optimizer's own formula, so only float32 round-off (different operation order in
# a few TF kernels) separates them.
RTOL, ATOL = 1e-5, 1e-6

# ----------------------------------------------------------------------------------------
# Optimizers (non-default hyperparameters, so a rule reading a wrong one fails)
# ----------------------------------------------------------------------------------------


def keras_optimizers(m) -> Dict[str, Callable[[], object]]:
    """Every supported optimizer of `m` (`keras.optimizers` or `tf_keras.optimizers`)."""
    return {
        "SGD_momentum": lambda: m.SGD(0.1, momentum=0.9),
        "SGD_nesterov": lambda: m.SGD(0.05, momentum=0.8, nesterov=True),
        "Adam": lambda: m.Adam(0.1, beta_1=0.8, beta_2=0.95, epsilon=1e-4),
        "Adam_amsgrad": lambda: m.Adam(0.1, beta_1=0.8, beta_2=0.95, amsgrad=True),
        "AdamW": lambda: m.AdamW(0.1, weight_decay=0.05, beta_1=0.85),
        "Adagrad": lambda: m.Adagrad(0.2, initial_accumulator_value=0.2, epsilon=1e-5),
        "RMSprop_momentum": lambda: m.RMSprop(0.05, rho=0.8, momentum=0.5, epsilon=1e-4),
        "RMSprop_centered": lambda: m.RMSprop(0.05, rho=0.85, centered=True),
        "Adadelta": lambda: m.Adadelta(1.0, rho=0.9, epsilon=1e-4),
        "Adamax": lambda: m.Adamax(0.1, beta_1=0.8, beta_2=0.9),
        "Nadam": lambda: m.Nadam(0.1, beta_1=0.85, beta_2=0.95),
        "Ftrl": lambda: m.Ftrl(
            0.1,
            learning_rate_power=-0.6,
            initial_accumulator_value=0.2,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
            l2_shrinkage_regularization_strength=0.01,
            beta=0.1,
        ),
    }


def legacy_optimizers() -> Dict[str, Callable[[], object]]:
    """The supported `tf_keras.optimizers.legacy` (OptimizerV2) optimizers: those of
    `keras_optimizers` but AdamW (which OptimizerV2 lacks), with the Nesterov SGD also
    using OptimizerV2's `decay`."""
    m = TFK.legacy
    optimizers = keras_optimizers(m)
    del optimizers["AdamW"], optimizers["SGD_nesterov"]
    optimizers["SGD_nesterov_decay"] = lambda: m.SGD(0.05, momentum=0.8, nesterov=True, decay=0.1)
    return optimizers


def tf1_optimizers() -> Dict[str, Callable[[], object]]:
    """Every supported `tf.compat.v1.train` optimizer."""
    return {
        "GradientDescent": lambda: V1.GradientDescentOptimizer(0.1),
        "Momentum": lambda: V1.MomentumOptimizer(0.1, 0.9),
        "Momentum_nesterov": lambda: V1.MomentumOptimizer(0.05, 0.8, use_nesterov=True),
        "Adam": lambda: V1.AdamOptimizer(0.1, beta1=0.8, beta2=0.95, epsilon=1e-4),
        "Adagrad": lambda: V1.AdagradOptimizer(0.2, initial_accumulator_value=0.2),
        "Adadelta": lambda: V1.AdadeltaOptimizer(1.0, rho=0.9, epsilon=1e-4),
        "RMSProp_momentum": lambda: V1.RMSPropOptimizer(
            0.05, decay=0.8, momentum=0.5, epsilon=1e-4
        ),
        "RMSProp_centered": lambda: V1.RMSPropOptimizer(0.05, decay=0.85, centered=True),
        "Ftrl": lambda: V1.FtrlOptimizer(
            0.1,
            learning_rate_power=-0.6,
            initial_accumulator_value=0.2,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
            l2_shrinkage_regularization_strength=0.01,
            beta=0.1,
        ),
        "ProximalAdagrad": lambda: V1.ProximalAdagradOptimizer(
            0.2,
            initial_accumulator_value=0.2,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
        ),
        "ProximalGradientDescent": lambda: V1.ProximalGradientDescentOptimizer(
            0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02
        ),
        # Its step is its global_step + 1: 3 here, in every step.
        "AdagradDA": lambda: V1.AdagradDAOptimizer(
            0.2,
            tf.constant(2, tf.int64),
            initial_gradient_squared_accumulator_value=0.2,
            l1_regularization_strength=0.01,
            l2_regularization_strength=0.02,
        ),
    }


def _cases(prefix: str, optimizers: Dict[str, Callable]) -> List:
    return [pytest.param(make, id=f"{prefix}-{name}") for name, make in optimizers.items()]


# Keras extras beyond the plain list: weight decay on SGD, clipvalue (elementwise, so a
# per-key variable clips exactly as a table does).
def _keras_extras(m) -> Dict[str, Callable[[], object]]:
    return {
        "SGD_weight_decay": lambda: m.SGD(0.1, momentum=0.9, weight_decay=0.05),
        "Adam_clipvalue": lambda: m.Adam(0.1, clipvalue=0.05),
    }


PER_KEY_CASES = (
    _cases("keras3", {**keras_optimizers(K3), **_keras_extras(K3)})
    + _cases("tf_keras", {**keras_optimizers(TFK), **_keras_extras(TFK)})
    + _cases("tf_keras_legacy", legacy_optimizers())
    + _cases("tf1", tf1_optimizers())
)

# ----------------------------------------------------------------------------------------
# Training a de.Variable (the code under test)
# ----------------------------------------------------------------------------------------

SEEN_KEYS = np.unique(np.concatenate(STEP_IDS))


@pytest.fixture(params=["buffers", "records"])
def views(request, monkeypatch):
    """Runs a test with both kinds of trainable view: the variable buffers used by
    default, and the per-graph records used under ParameterServerStrategy (forced here
    without a cluster; tests/test_distributed.py runs them on one)."""
    if request.param == "records":
        _record_mode(monkeypatch)
    return request.param


def _record_mode(monkeypatch):
    """Makes every trainable view created from now on record its step's tensors."""
    monkeypatch.setattr(trainable_module, "under_parameter_server_strategy", lambda: True)


class Run(NamedTuple):
    """What a 10-step training run ends with."""

    losses: np.ndarray  # [NUM_STEPS], each step's loss before its update
    rows: np.ndarray  # [len(KEYS), dim]: the rows of KEYS after the last step
    dense: np.ndarray  # [dim]


def make_variable(name: str, dim: int, shards: int, initializer=None, **kwargs) -> de.Variable:
    """A float32 de.Variable with one shard per logical CPU (conftest configures 3)."""
    return de.Variable(
        tf.int64,
        tf.float32,
        dim=dim,
        devices=[f"/CPU:{i}" for i in range(shards)],
        name=name,
        initializer=random_initializer() if initializer is None else initializer,
        **kwargs,
    )


def train_dynamic(
    var: de.Variable,
    optimizer,
    dense: tf.Variable,
    steps: Sequence[np.ndarray] = STEP_IDS,
    compiled: bool = False,
) -> np.ndarray:
    """Trains `var` and `dense` with `optimizer` (a DynamicEmbeddingOptimizer), one
    step per batch of `steps`, eagerly or as one `tf.function` step; returns the
    per-step losses."""
    weights = tf.constant(loss_weights(var.dim))

    def step(ids):
        with tf.GradientTape() as tape:
            emb, trainable = de.embedding_lookup(var, ids, name="user", return_trainable=True)
            loss = loss_fn(emb, dense, weights)
        grads = tape.gradient(loss, [trainable, dense])
        optimizer.apply_gradients(zip(grads, [trainable, dense]))
        return loss

    if compiled:
        step = tf.function(step, input_signature=[tf.TensorSpec([None], tf.int64)])
    return np.array([float(step(tf.constant(ids))) for ids in steps])


def run_dynamic(
    make_optimizer: Callable[[], object],
    shards: int = 2,
    dim: int = 10,
    compiled: bool = False,
    initializer=None,
) -> Run:
    """A fresh variable and dense variable trained over STEP_IDS."""
    var = make_variable("emb", dim, shards, initializer)
    dense = tf.Variable(dense_initial(dim), name="dense")
    optimizer = de.DynamicEmbeddingOptimizer(make_optimizer())
    losses = train_dynamic(var, optimizer, dense, compiled=compiled)
    # Every id looked up got a row, and no other key did.
    assert int(var.size()) == len(SEEN_KEYS)
    return Run(losses, var.lookup(KEYS).numpy(), dense.numpy())


# ----------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------


def initial_rows(dim: int, initializer=None) -> np.ndarray:
    """`[len(KEYS), dim]`: the rows a fresh variable reads for KEYS before training."""
    return make_variable("initial_rows", dim, 1, initializer).lookup(KEYS).numpy()


def is_keras(optimizer) -> bool:
    """A Keras 3 or tf_keras optimizer (built with `build`, given dense gradients)."""
    return isinstance(optimizer, (K3.Optimizer, TFK.Optimizer, TFK.legacy.Optimizer))


def run_dense_table(make_optimizer, dim: int, initializer=None) -> Run:
    """The embedding as one dense `tf.Variable` `[len(KEYS), dim]` read with
    `tf.nn.embedding_lookup`, trained by the optimizer itself (all rows, every step).
    Equals the lazy sparse update only for optimizers that leave a row without
    gradient unchanged."""
    table = tf.Variable(initial_rows(dim, initializer), name="table")
    dense = tf.Variable(dense_initial(dim), name="dense")
    optimizer = make_optimizer()
    weights = tf.constant(loss_weights(dim))
    index_of = {int(k): i for i, k in enumerate(KEYS)}
    losses = []
    for ids in STEP_IDS:
        indices = tf.constant([index_of[int(k)] for k in ids])
        with tf.GradientTape() as tape:
            loss = loss_fn(tf.nn.embedding_lookup(table, indices), dense, weights)
        table_grad, dense_grad = tape.gradient(loss, [table, dense])
        if is_keras(optimizer):
            # Keras gets the table's gradient as a dense tensor (duplicate ids summed):
            # with duplicate indices, Keras 3 applies its elementwise ops to the
            # IndexedSlices' unsummed values (Adagrad would add sum(g_i^2), not
            # (sum g_i)^2, or fail), and `clipnorm` would take the norm of unsummed
            # values. TF1 optimizers sum duplicates themselves and then run the sparse
            # kernels, which is the reference wanted for them (ProximalAdagrad's and
            # Ftrl's dense kernels would also shrink rows without gradient).
            table_grad = tf.convert_to_tensor(table_grad)
        optimizer.apply_gradients(zip([table_grad, dense_grad], [table, dense]))
        losses.append(float(loss))
    return Run(np.array(losses), table.numpy(), dense.numpy())


def build_optimizer(optimizer, variables: List[tf.Variable]) -> None:
    """Builds a Keras 3 / tf_keras optimizer over all `variables` up front, so that later
    `apply_gradients` calls may pass any subset (legacy tf_keras and TF1 optimizers
    create the state of a variable when it is first passed, and need nothing)."""
    if isinstance(optimizer, (K3.Optimizer, TFK.Optimizer)):
        optimizer.build(variables)


def run_per_key_reference(make_optimizer, dim: int, initializer=None, clip=None) -> Run:
    """The same optimizer applied to only the looked-up rows, made of the optimizer
    itself: one dense `tf.Variable([dim])` per key, starting at the key's initial row,
    and each step one `apply_gradients` over the keys of that step (their gradients
    summed over duplicates by autodiff) and the dense variable. Keras optimizers update
    only the variables passed and advance `iterations` once per call; TF1 ones keep
    their state per variable and advance Adam's beta powers once per call: exactly the
    lazy semantics the sparse rules implement. A `global_clipnorm` of the optimizer
    acts on [per-key grads..., dense grad], the same global norm as over a table.

    `clip(key_grads, dense_grad) -> (key_grads, dense_grad)` does clipping that a
    per-key variable would do differently from a table (see clip_table_by_norm).
    """
    rows = initial_rows(dim, initializer)
    per_key = [tf.Variable(row, name=f"key_{i}") for i, row in enumerate(rows)]
    var_of = {int(k): v for k, v in zip(KEYS, per_key)}
    dense = tf.Variable(dense_initial(dim), name="dense")
    optimizer = make_optimizer()
    build_optimizer(optimizer, per_key + [dense])
    weights = tf.constant(loss_weights(dim))
    losses = []
    for ids in STEP_IDS:
        variables = [var_of[k] for k in dict.fromkeys(int(k) for k in ids)]  # distinct keys
        with tf.GradientTape() as tape:
            emb = tf.stack([var_of[int(k)] for k in ids])
            loss = loss_fn(emb, dense, weights)
        *key_grads, dense_grad = tape.gradient(loss, variables + [dense])
        if clip is not None:
            key_grads, dense_grad = clip(key_grads, dense_grad)
        optimizer.apply_gradients(zip(list(key_grads) + [dense_grad], variables + [dense]))
        losses.append(float(loss))
    return Run(np.array(losses), np.stack([v.numpy() for v in per_key]), dense.numpy())


def clip_table_by_norm(clipnorm: float):
    """`clipnorm` as it acts on a table: the gradient of all the looked-up rows together
    is clipped by its norm (not each key's by its own); the dense one by its own."""

    def clip(key_grads, dense_grad):
        table = tf.clip_by_norm(tf.stack(key_grads), clipnorm)
        return tf.unstack(table), tf.clip_by_norm(dense_grad, clipnorm)

    return clip


def assert_runs_close(got: Run, expected: Run, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Same per-step losses, same dense variable, same row for every key."""
    np.testing.assert_allclose(got.losses, expected.losses, rtol=rtol, atol=atol, err_msg="losses")
    np.testing.assert_allclose(got.dense, expected.dense, rtol=rtol, atol=atol, err_msg="dense")
    for i, key in enumerate(KEYS):
        np.testing.assert_allclose(
            got.rows[i], expected.rows[i], rtol=rtol, atol=atol, err_msg=f"row of key {key}"
        )


def assert_runs_differ(a: Run, b: Run) -> None:
    """Guards a comparison against being vacuous (e.g. a clip threshold never reached)."""
    assert not np.allclose(a.rows, b.rows, rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------------------
# 1a. Optimizers whose sparse update touches only looked-up rows == a dense table
# ----------------------------------------------------------------------------------------

ZEROS = 0.0

# (optimizer, initializer). Keras Ftrl's dense update rewrites every row from its
# `linear` slot, w = (clip(z, -l1, l1) - z) / quadratic: a row without gradient keeps
# its value only once it has been trained (z and n unchanged), and a row never trained
# (z = 0) becomes 0. So its table starts at zeros, where both agree; l2_shrinkage (which
# adds 2 * shrinkage * w to every row's gradient, trained or not) stays 0 for it. TF1
# optimizers get the IndexedSlices gradient and run the sparse kernels (lazy
# themselves), so random rows and every option work for them.
LAZY_EQUALS_DENSE = {
    "keras3-SGD": (lambda: K3.SGD(0.2), None),
    "keras3-Adagrad": (lambda: K3.Adagrad(0.2, initial_accumulator_value=0.2, epsilon=1e-5), None),
    "keras3-Ftrl": (
        lambda: K3.Ftrl(
            0.1, learning_rate_power=-0.6, initial_accumulator_value=0.2,
            l1_regularization_strength=0.01, l2_regularization_strength=0.02, beta=0.1,
        ),
        ZEROS,
    ),
    "tf_keras-SGD": (lambda: TFK.SGD(0.2), None),
    "tf_keras-Adagrad": (
        lambda: TFK.Adagrad(0.2, initial_accumulator_value=0.2, epsilon=1e-5), None
    ),
    "tf_keras-Ftrl": (
        lambda: TFK.Ftrl(
            0.1, learning_rate_power=-0.6, initial_accumulator_value=0.2,
            l1_regularization_strength=0.01, l2_regularization_strength=0.02, beta=0.1,
        ),
        ZEROS,
    ),
    "tf1-GradientDescent": (tf1_optimizers()["GradientDescent"], None),
    "tf1-Adagrad": (tf1_optimizers()["Adagrad"], None),
    "tf1-ProximalAdagrad": (tf1_optimizers()["ProximalAdagrad"], None),
    "tf1-Ftrl": (tf1_optimizers()["Ftrl"], None),
}


@pytest.mark.parametrize("name", list(LAZY_EQUALS_DENSE))
def test_lazy_optimizer_matches_dense_table(name):
    make_optimizer, initializer = LAZY_EQUALS_DENSE[name]
    expected = run_dense_table(make_optimizer, dim=10, initializer=initializer)
    assert_runs_close(run_dynamic(make_optimizer, initializer=initializer), expected)


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("dim", [1, 10])
@pytest.mark.parametrize("name", ["keras3-Adagrad", "tf1-Ftrl"])
def test_dense_table_shards_and_dims(name, dim, shards):
    make_optimizer, initializer = LAZY_EQUALS_DENSE[name]
    expected = run_dense_table(make_optimizer, dim=dim, initializer=initializer)
    assert_runs_close(run_dynamic(make_optimizer, shards, dim, initializer=initializer), expected)


# ----------------------------------------------------------------------------------------
# 1b. Every optimizer == itself applied to only the looked-up rows
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_optimizer", PER_KEY_CASES)
def test_matches_per_key_reference(make_optimizer):
    expected = run_per_key_reference(make_optimizer, dim=10)
    got = run_dynamic(make_optimizer)
    assert_runs_close(got, expected)
    assert not np.allclose(got.rows, initial_rows(10))  # the rows trained at all


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("dim", [1, 10])
@pytest.mark.parametrize(
    "make_optimizer",
    [
        pytest.param(keras_optimizers(K3)["Adam"], id="keras3-Adam"),
        pytest.param(keras_optimizers(TFK)["RMSprop_centered"], id="tf_keras-RMSprop_centered"),
        pytest.param(tf1_optimizers()["Momentum"], id="tf1-Momentum"),
    ],
)
def test_per_key_reference_shards_and_dims(make_optimizer, dim, shards, views):
    expected = run_per_key_reference(make_optimizer, dim=dim)
    assert_runs_close(run_dynamic(make_optimizer, shards, dim), expected)


@pytest.mark.parametrize(
    "make_optimizer",
    [
        pytest.param(keras_optimizers(K3)["Nadam"], id="keras3-Nadam"),
        # (not tf_keras Nadam: built inside a tf.function, it diverges on dense
        # variables by itself, a tf_keras bug)
        pytest.param(keras_optimizers(TFK)["Adam"], id="tf_keras-Adam"),
        pytest.param(legacy_optimizers()["Adam"], id="tf_keras_legacy-Adam"),
        pytest.param(tf1_optimizers()["Adam"], id="tf1-Adam"),
    ],
)
def test_train_step_in_tf_function(make_optimizer, views):
    """The whole step (lookup, tape, apply_gradients) traced once in a tf.function."""
    expected = run_per_key_reference(make_optimizer, dim=10)
    assert_runs_close(run_dynamic(make_optimizer, compiled=True), expected)


# ----------------------------------------------------------------------------------------
# 1c. Schedules, clipping, weight decay: as on dense variables
# ----------------------------------------------------------------------------------------

FAMILIES = [pytest.param(K3, id="keras3"), pytest.param(TFK, id="tf_keras")]


def _decay(m):
    """A learning rate halved every 2 steps: a rule that evaluates it at the wrong step
    (or once) fails."""
    return m.schedules.ExponentialDecay(0.2, decay_steps=2, decay_rate=0.5)


@pytest.mark.parametrize("m", FAMILIES)
def test_learning_rate_schedule(m):
    make_sgd = lambda: m.SGD(_decay(m))  # noqa: E731
    assert_runs_close(run_dynamic(make_sgd), run_dense_table(make_sgd, dim=10))
    make_adam = lambda: m.Adam(_decay(m), beta_1=0.8)  # noqa: E731
    assert_runs_close(run_dynamic(make_adam), run_per_key_reference(make_adam, dim=10))
    assert_runs_differ(run_dynamic(make_adam), run_dynamic(lambda: m.Adam(0.2, beta_1=0.8)))


@pytest.mark.parametrize("m", FAMILIES)
def test_clipnorm(m):
    """clipnorm clips the table's gradient (duplicates summed) by its own norm."""
    make_sgd = lambda: m.SGD(0.2, clipnorm=0.3)  # noqa: E731
    sgd = run_dynamic(make_sgd)
    assert_runs_close(sgd, run_dense_table(make_sgd, dim=10))
    assert_runs_differ(sgd, run_dynamic(lambda: m.SGD(0.2)))
    # Adam is not lazy-equals-dense: the reference clips the per-key gradients as one
    # table gradient and gives them to an Adam without clipnorm.
    make_adam = lambda: m.Adam(0.1, beta_1=0.8, clipnorm=0.3)  # noqa: E731
    expected = run_per_key_reference(
        lambda: m.Adam(0.1, beta_1=0.8), dim=10, clip=clip_table_by_norm(0.3)
    )
    assert_runs_close(run_dynamic(make_adam), expected)


@pytest.mark.parametrize("m", FAMILIES)
def test_global_clipnorm(m):
    """global_clipnorm clips by the norm over the dense and the table gradients."""
    make_sgd = lambda: m.SGD(0.2, global_clipnorm=0.5)  # noqa: E731
    sgd = run_dynamic(make_sgd)
    assert_runs_close(sgd, run_dense_table(make_sgd, dim=10))
    assert_runs_differ(sgd, run_dynamic(lambda: m.SGD(0.2)))
    make_adam = lambda: m.Adam(0.1, beta_1=0.8, global_clipnorm=0.5)  # noqa: E731
    assert_runs_close(run_dynamic(make_adam), run_per_key_reference(make_adam, dim=10))


@pytest.mark.parametrize("m", FAMILIES)
def test_weight_decay(m):
    """Weight decay shrinks only the rows trained in a step, like the per-key
    variables Keras decays only when they are passed; it has an effect."""
    make_adamw = lambda: m.AdamW(0.1, weight_decay=0.2)  # noqa: E731
    make_sgd = lambda: m.SGD(0.1, momentum=0.5, weight_decay=0.2)  # noqa: E731
    for make in (make_adamw, make_sgd):
        assert_runs_close(run_dynamic(make), run_per_key_reference(make, dim=10))
    assert_runs_differ(run_dynamic(make_sgd), run_dynamic(lambda: m.SGD(0.1, momentum=0.5)))


# ----------------------------------------------------------------------------------------
# 2. Duplicate ids and several lookups in one step
# ----------------------------------------------------------------------------------------

SGD_FAMILIES = [
    pytest.param(lambda: K3.SGD(0.5), id="keras3"),
    pytest.param(lambda: TFK.SGD(0.5), id="tf_keras"),
    pytest.param(lambda: V1.GradientDescentOptimizer(0.5), id="tf1"),
]


def ones_variable(name: str, shards: int = 2, **kwargs) -> de.Variable:
    """dim 2, every row starts at 1.0: SGD results below are exact in float32."""
    return make_variable(name, 2, shards, initializer=1.0, **kwargs)


def ids(keys) -> tf.Tensor:
    return tf.constant(keys, tf.int64)


def rows_of(var: de.Variable, keys) -> np.ndarray:
    return var.lookup(ids(keys)).numpy()


@pytest.mark.parametrize("make_sgd", SGD_FAMILIES)
def test_duplicate_ids_sum_their_gradients(make_sgd, views):
    var = ones_variable("duplicates")
    optimizer = de.DynamicEmbeddingOptimizer(make_sgd())
    with tf.GradientTape() as tape:
        emb, trainable = de.embedding_lookup(
            var, tf.constant([[5, 5], [7, 5]], tf.int64), name="dup", return_trainable=True
        )
        loss = tf.reduce_sum(emb)  # d loss / d row = 1 per occurrence
    optimizer.apply_gradients([(tape.gradient(loss, trainable), trainable)])
    # 5 occurs 3 times: 1 - 0.5 * 3; 7 once: 1 - 0.5.
    np.testing.assert_array_equal(rows_of(var, [5, 7]), [[-0.5, -0.5], [0.5, 0.5]])
    assert int(var.size()) == 2


@pytest.mark.parametrize("make_sgd", SGD_FAMILIES)
def test_two_lookup_names_in_one_step(make_sgd, views):
    """Two lookups of one variable under two names, applied in one call: both train,
    and a key read by both gets both gradients."""
    var = ones_variable("two_names")
    optimizer = de.DynamicEmbeddingOptimizer(make_sgd())
    with tf.GradientTape() as tape:
        a, trainable_a = de.embedding_lookup(var, ids([1, 2]), name="a", return_trainable=True)
        b, trainable_b = de.embedding_lookup(var, ids([2, 3]), name="b", return_trainable=True)
        loss = tf.reduce_sum(a) + 2.0 * tf.reduce_sum(b)
    grads = tape.gradient(loss, [trainable_a, trainable_b])
    optimizer.apply_gradients(zip(grads, [trainable_a, trainable_b]))
    np.testing.assert_array_equal(rows_of(var, [1, 2, 3]), [[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0]])
    assert int(var.size()) == 3


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("make_sgd", SGD_FAMILIES)
def test_one_name_looked_up_twice_in_one_step(make_sgd, compiled, views):
    """Two lookups with the same name before one optimizer step (a layer shared by two
    features), twice: both lookups' gradients reach their keys in every step."""
    var = ones_variable("same_name")
    optimizer = de.DynamicEmbeddingOptimizer(make_sgd())

    def step():
        with tf.GradientTape() as tape:
            a, trainable = de.embedding_lookup(var, ids([1, 2]), name="u", return_trainable=True)
            b, again = de.embedding_lookup(var, ids([2, 3]), name="u", return_trainable=True)
            loss = tf.reduce_sum(a) + 2.0 * tf.reduce_sum(b)
        assert again is trainable
        optimizer.apply_gradients([(tape.gradient(loss, trainable), trainable)])

    if compiled:
        step = tf.function(step)
    step()
    step()
    np.testing.assert_array_equal(rows_of(var, [1, 2, 3]), [[0.0, 0.0], [-2.0, -2.0], [-1.0, -1.0]])
    assert int(var.size()) == 3


# ----------------------------------------------------------------------------------------
# 3. bp_v2: concurrent writers' deltas all count
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wrapper_bp_v2, variable_bp_v2, accumulates",
    [(True, False, True), (None, True, True), (False, True, False), (None, False, False)],
    ids=["wrapper-true", "variable-true", "wrapper-false-wins", "default-upsert"],
)
@pytest.mark.parametrize("make_sgd", SGD_FAMILIES)
def test_bp_v2_accumulates_concurrent_updates(make_sgd, wrapper_bp_v2, variable_bp_v2, accumulates):
    """Two workers (two wrappers) both read key 7's old row, then both apply: with
    bp_v2 each adds its own delta, so both count; otherwise the last write wins."""
    var = ones_variable("bp_v2", bp_v2=variable_bp_v2)
    var.upsert(tf.constant([7], tf.int64), tf.ones([1, 2]))  # stored, so both reads find it
    workers = []
    for name, scale in (("worker_1", 1.0), ("worker_2", 3.0)):
        with tf.GradientTape() as tape:
            emb, trainable = de.embedding_lookup(
                var, tf.constant([7], tf.int64), name=name, return_trainable=True
            )
            loss = scale * tf.reduce_sum(emb)
        workers.append((tape.gradient(loss, trainable), trainable))
    for grad, trainable in workers:
        optimizer = de.DynamicEmbeddingOptimizer(make_sgd(), bp_v2=wrapper_bp_v2)
        optimizer.apply_gradients([(grad, trainable)])
    # Gradients 1 and 3, lr 0.5: both deltas 1 - 0.5 * (1 + 3); last wins 1 - 0.5 * 3.
    expected = -1.0 if accumulates else -0.5
    np.testing.assert_array_equal(rows_of(var, [7]), [[expected, expected]])


# ----------------------------------------------------------------------------------------
# 4. TFRA's eager pattern (seed 004): minimize over get_eager_trainable_by_name
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family, make_optimizer",
    [
        pytest.param("keras3", keras_optimizers(K3)["Adam"], id="keras3"),
        pytest.param("tf_keras", keras_optimizers(TFK)["Adam"], id="tf_keras"),
        pytest.param("tf_keras_legacy", legacy_optimizers()["Adam"], id="tf_keras_legacy"),
        pytest.param("tf1", tf1_optimizers()["Adam"], id="tf1"),
    ],
)
def test_eager_minimize_pattern(family, make_optimizer):
    """`opt.minimize(lambda: loss_fn(ids), var_list=[params.get_eager_trainable_by_name(
    'user_embedding'), ...])`, the loss a tf.function doing the lookup; the trainable
    view is listed before the first lookup ran."""
    dim = 4
    params = de.get_variable(f"seed004_{family}", dim=dim, initializer=random_initializer())
    dense = tf.Variable(dense_initial(dim), name="dense")
    weights = tf.constant(loss_weights(dim))
    optimizer = de.DynamicEmbeddingOptimizer(make_optimizer())

    @tf.function
    def model_loss(ids):
        emb = de.embedding_lookup(params, ids, name="user_embedding")
        return loss_fn(emb, dense, weights)

    for ids in STEP_IDS:
        ids = tf.constant(ids)
        var_list = [params.get_eager_trainable_by_name("user_embedding"), dense]
        optimizer.minimize(lambda: model_loss(ids), var_list=var_list)
    expected = run_per_key_reference(make_optimizer, dim=dim)
    np.testing.assert_allclose(dense.numpy(), expected.dense, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(params.lookup(KEYS).numpy(), expected.rows, rtol=RTOL, atol=ATOL)
    assert int(params.size()) == len(SEEN_KEYS)


# ----------------------------------------------------------------------------------------
# 5. TF1 graph mode (subprocess): Session and MonitoredTrainingSession
# ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def eager_tf1_adam_run() -> Run:
    """The graph scenarios' model trained eagerly."""
    return run_dynamic(lambda: V1.AdamOptimizer(GRAPH_ADAM_LR), GRAPH_SHARDS, GRAPH_DIM)


def test_graph_session_trains_like_eager():
    result = scenario_result(graph_mode_results(TRAINING_WORKER), "graph_session")
    assert result["trainable_is_listed"] and result["trainable_by_name"]
    eager = eager_tf1_adam_run()
    graph = Run(np.array(result["losses"]), np.array(result["rows"]), np.array(result["dense"]))
    assert_runs_close(graph, eager)
    assert result["size"] == len(SEEN_KEYS)
    assert result["slot_sizes"] == [len(SEEN_KEYS)] * 2  # Adam's m and v
    assert result["step"] == NUM_STEPS
    assert result["loss_after"] < result["losses"][0]  # the first batch's loss went down


def test_graph_monitored_session_restarts_identically():
    """Stopping after 5 steps and restarting MonitoredTrainingSession (3 shards instead
    of 2) on the checkpoint_dir restores table, slots, dense state and step: the 10
    losses equal an uninterrupted run's."""
    results = graph_mode_results(TRAINING_WORKER)
    result = scenario_result(results, "graph_monitored_session")
    uninterrupted = scenario_result(results, "graph_session")
    for field in ("rows", "dense", "size", "slot_sizes", "step"):
        np.testing.assert_array_equal(
            result["restored"][field], result["first"][field], err_msg=field
        )
    assert result["first"]["step"] == 5
    assert result["first"]["slot_sizes"] == [result["first"]["size"]] * 2
    losses = result["losses_first"] + result["losses_second"]
    np.testing.assert_allclose(losses, uninterrupted["losses"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result["rows"], uninterrupted["rows"], rtol=1e-6, atol=1e-6)
    assert result["step"] == NUM_STEPS


# ----------------------------------------------------------------------------------------
# 6. Checkpoints hold the slots
# ----------------------------------------------------------------------------------------

CHECKPOINT_OPTIMIZERS = {
    "keras3-Adam": keras_optimizers(K3)["Adam"],
    "tf_keras-Adam": keras_optimizers(TFK)["Adam"],
    "tf1-Adam": tf1_optimizers()["Adam"],
}


@functools.lru_cache(maxsize=None)
def uninterrupted_losses(name: str) -> np.ndarray:
    var = make_variable("emb", 10, 2)
    dense = tf.Variable(dense_initial(10), name="dense")
    optimizer = de.DynamicEmbeddingOptimizer(CHECKPOINT_OPTIMIZERS[name]())
    losses = train_dynamic(var, optimizer, dense)
    slots = var.get_slot_variables(optimizer)
    assert len(slots) == 2  # m and v
    assert [int(slot.size()) for slot in slots] == [int(var.size())] * 2
    return losses


@pytest.mark.parametrize("restore_shards", [2, 3])
@pytest.mark.parametrize("name", list(CHECKPOINT_OPTIMIZERS))
def test_checkpoint_restores_slots(name, restore_shards):
    """5 steps, tf.train.Checkpoint(emb, optimizer, dense), restored into fresh objects
    (another number of shards too), 5 more steps: the losses of an uninterrupted run."""
    make_optimizer = CHECKPOINT_OPTIMIZERS[name]
    var = make_variable("emb", 10, 2)
    dense = tf.Variable(dense_initial(10), name="dense")
    optimizer = de.DynamicEmbeddingOptimizer(make_optimizer())
    first = train_dynamic(var, optimizer, dense, steps=STEP_IDS[:5])
    saved_slots = var.get_slot_variables(optimizer)
    assert [int(slot.size()) for slot in saved_slots] == [int(var.size())] * 2
    prefix = tf.train.Checkpoint(emb=var, optimizer=optimizer, dense=dense).write(
        os.path.join(temp_workdir(), "ckpt")
    )

    var = make_variable("emb", 10, restore_shards)
    dense = tf.Variable(np.zeros(10, np.float32), name="dense")
    optimizer = de.DynamicEmbeddingOptimizer(make_optimizer())
    status = tf.train.Checkpoint(emb=var, optimizer=optimizer, dense=dense).read(prefix)
    second = train_dynamic(var, optimizer, dense, steps=STEP_IDS[5:])
    status.assert_existing_objects_matched()
    np.testing.assert_allclose(
        np.concatenate([first, second]), uninterrupted_losses(name), rtol=1e-6, atol=1e-6
    )
    slots = var.get_slot_variables(optimizer)
    assert [int(slot.size()) for slot in slots] == [int(var.size())] * 2


# ----------------------------------------------------------------------------------------
# 7. Errors
# ----------------------------------------------------------------------------------------


def test_non_floating_variable_is_not_trainable():
    var = de.Variable(tf.int64, tf.int32, dim=2, name="int_emb")
    with pytest.raises(TypeError, match="int32"):
        de.embedding_lookup(var, tf.constant([1], tf.int64), return_trainable=True)


class OwnTF1Optimizer(V1.Optimizer):
    """A TF1 optimizer of the user's own, which no rule reproduces."""


@pytest.mark.parametrize(
    "make_optimizer, class_name",
    [
        (lambda: K3.Lion(0.1), "Lion"),
        (lambda: OwnTF1Optimizer(use_locking=False, name="Own"), "OwnTF1Optimizer"),
        (lambda: object(), "object"),
    ],
    ids=["keras3-Lion", "tf1-own-optimizer", "not-an-optimizer"],
)
def test_unsupported_optimizer_is_named(make_optimizer, class_name):
    with pytest.raises(TypeError, match=class_name):
        de.DynamicEmbeddingOptimizer(make_optimizer())


def test_get_eager_trainable_by_name_in_graph_mode():
    with tf.Graph().as_default():
        var = de.Variable(tf.int64, tf.float32, dim=2, name="graph_emb")
        with pytest.raises(RuntimeError, match="eager"):
            var.get_eager_trainable_by_name("user")


# ----------------------------------------------------------------------------------------
# 7. Record mode (the views of ParameterServerStrategy) without a cluster
# ----------------------------------------------------------------------------------------


def test_records_apply_inside_a_cond_branch_of_the_lookups_function(monkeypatch):
    _record_mode(monkeypatch)
    var = ones_variable("records_cond")
    optimizer = de.DynamicEmbeddingOptimizer(K3.SGD(0.5))

    @tf.function
    def step(apply):
        with tf.GradientTape() as tape:
            emb, view = de.embedding_lookup(var, ids([4, 4, 6]), name="u", return_trainable=True)
            loss = tf.reduce_sum(emb)
        grad = tape.gradient(loss, view)

        def update():
            optimizer.apply_gradients([(grad, view)])
            return tf.constant(True)

        return tf.cond(apply, update, lambda: tf.constant(False))

    step(tf.constant(False))
    np.testing.assert_array_equal(rows_of(var, [4, 6]), [[1.0, 1.0], [1.0, 1.0]])
    step(tf.constant(True))
    np.testing.assert_array_equal(rows_of(var, [4, 6]), [[0.0, 0.0], [0.5, 0.5]])
    assert rows_of_trainable(var, "u").records


def test_records_applied_in_another_function_is_a_clear_error(monkeypatch):
    _record_mode(monkeypatch)
    var = ones_variable("records_elsewhere")
    optimizer = de.DynamicEmbeddingOptimizer(K3.SGD(0.5))

    @tf.function
    def gradient():
        with tf.GradientTape() as tape:
            emb, view = de.embedding_lookup(var, ids([1]), name="u", return_trainable=True)
            loss = tf.reduce_sum(emb)
        return tape.gradient(loss, view)

    grad = gradient()
    view = var.get_trainable_by_name("u")
    with pytest.raises(ValueError, match="same tf.function"):
        tf.function(lambda: optimizer.apply_gradients([(grad, view)]))()
    np.testing.assert_array_equal(rows_of(var, [1]), [[1.0, 1.0]])


def rows_of_trainable(var, name):
    return trainable_module.rows_of(var.get_trainable_by_name(name))
