"""training.rules: each rule, applied to all rows, reproduces the optimizer's own update.

The decisive check trains a dense [6, dim] variable for 5 steps with the optimizer's
own `apply_gradients`, with gradients nonzero in every row (so dense and lazy
updates coincide), and runs the rule on the same rows from the same start, with
slot rows starting at `SlotSpec.initial`, comparing every step.  Each optimizer
runs with a fresh instance for the dense training and another for the rule, so
the rule cannot rely on the optimizer having been built.
"""

from __future__ import annotations

import types
from typing import Callable, NamedTuple

import numpy as np
import pytest
import tensorflow as tf

from tensorflow_dynemb.training import rules as optimizer_rules
from tensorflow_dynemb.training.rules.base import _nadam_momentum_product

get_rule = optimizer_rules.get_rule

STEPS = 5
ROWS = 6
RTOL, ATOL = 1e-5, 1e-6


# ----------------------------------------------------------------------------------------
# Optimizer families and cases
# ----------------------------------------------------------------------------------------


def family_module(family):
    """The module whose `optimizers` (or, for TF1, `train`) namespace a case uses."""
    if family == "keras":
        keras = pytest.importorskip("keras")
        if not keras.__version__.startswith("3"):
            pytest.skip("Keras 3 is not installed")
        return keras.optimizers
    if family == "tf_keras":
        return pytest.importorskip("tf_keras").optimizers
    if family == "legacy":
        return pytest.importorskip("tf_keras").optimizers.legacy
    if family == "tf_legacy_keras":
        return tf_legacy_keras_optimizers()
    assert family == "tf1"
    return tf.compat.v1.train


def tf_legacy_keras_optimizers():
    """The OptimizerV2 classes of the Keras inside TensorFlow (`tensorflow.python.keras`,
    which TFRA's tests use) as one namespace, like `tf_keras.optimizers.legacy`."""
    optimizer_v2 = pytest.importorskip("tensorflow.python.keras.optimizer_v2")
    from tensorflow.python.keras.optimizer_v2 import (  # noqa: PLC0415
        adadelta, adagrad, adam, adamax, ftrl, gradient_descent, nadam, rmsprop,
    )

    return types.SimpleNamespace(
        SGD=gradient_descent.SGD, Adam=adam.Adam, NonFusedAdam=adam.NonFusedAdam,
        Adagrad=adagrad.Adagrad, RMSprop=rmsprop.RMSprop, Adadelta=adadelta.Adadelta,
        Adamax=adamax.Adamax, Nadam=nadam.Nadam, Ftrl=ftrl.Ftrl,
        schedules=optimizer_v2.learning_rate_schedule,
    )


class Case(NamedTuple):
    family: str
    name: str
    make: Callable  # family module -> optimizer


def case_id(case):
    return f"{case.family}-{case.name}"


# Keras 3 and tf_keras take the same arguments.
KERAS_LIKE = [
    ("sgd", lambda o: o.SGD(0.1)),
    ("sgd-momentum", lambda o: o.SGD(0.1, momentum=0.9)),
    (
        "sgd-nesterov-weight-decay",
        lambda o: o.SGD(0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
    ),
    (
        "sgd-piecewise-schedule",
        lambda o: o.SGD(
            o.schedules.PiecewiseConstantDecay([2, 3], [0.1, 0.05, 0.01]), momentum=0.5
        ),
    ),
    ("adam", lambda o: o.Adam(0.1)),
    (
        "adam-amsgrad-schedule",
        lambda o: o.Adam(o.schedules.ExponentialDecay(0.1, 2, 0.5), amsgrad=True),
    ),
    ("adamw", lambda o: o.AdamW(0.1, weight_decay=0.05)),
    ("adamw-amsgrad", lambda o: o.AdamW(0.1, weight_decay=0.05, amsgrad=True, beta_2=0.99)),
    ("adagrad", lambda o: o.Adagrad(0.1, initial_accumulator_value=0.5, epsilon=1e-3)),
    ("rmsprop", lambda o: o.RMSprop(0.1)),
    ("rmsprop-momentum", lambda o: o.RMSprop(0.1, momentum=0.5)),
    ("rmsprop-centered", lambda o: o.RMSprop(0.1, centered=True)),
    ("rmsprop-centered-momentum", lambda o: o.RMSprop(0.1, rho=0.8, momentum=0.5, centered=True)),
    ("adadelta", lambda o: o.Adadelta(1.0, rho=0.9, epsilon=1e-4)),
    ("adamax", lambda o: o.Adamax(0.1)),
    ("nadam", lambda o: o.Nadam(0.1)),
    ("nadam-weight-decay", lambda o: o.Nadam(0.05, beta_1=0.8, weight_decay=0.1)),
    ("ftrl", lambda o: o.Ftrl(0.1)),
    (
        "ftrl-all-args",
        lambda o: o.Ftrl(
            0.1, learning_rate_power=-0.7, initial_accumulator_value=0.2,
            l1_regularization_strength=0.01, l2_regularization_strength=0.02,
            l2_shrinkage_regularization_strength=0.03, beta=0.1,
        ),
    ),
]

LEGACY = [
    ("sgd", lambda o: o.SGD(0.1)),
    ("sgd-nesterov", lambda o: o.SGD(0.1, momentum=0.9, nesterov=True)),
    ("sgd-momentum-decay", lambda o: o.SGD(0.1, momentum=0.9, decay=0.1)),
    ("adam", lambda o: o.Adam(0.1)),
    ("adam-amsgrad-schedule", lambda o: o.Adam(
        pytest.importorskip("tf_keras").optimizers.schedules.ExponentialDecay(0.1, 2, 0.5),
        amsgrad=True,
    )),
    ("adagrad", lambda o: o.Adagrad(0.1, initial_accumulator_value=0.5)),
    ("rmsprop", lambda o: o.RMSprop(0.1)),
    ("rmsprop-centered", lambda o: o.RMSprop(0.1, centered=True)),
    ("rmsprop-momentum", lambda o: o.RMSprop(0.1, momentum=0.5)),
    ("rmsprop-centered-momentum", lambda o: o.RMSprop(0.1, rho=0.8, momentum=0.5, centered=True)),
    ("adadelta", lambda o: o.Adadelta(1.0)),
    ("adamax", lambda o: o.Adamax(0.1)),
    ("nadam", lambda o: o.Nadam(0.1)),
    ("nadam-schedule-decay-0", lambda o: o.Nadam(0.1, schedule_decay=0.0)),
    ("ftrl", lambda o: o.Ftrl(0.1)),
    (
        "ftrl-all-args",
        lambda o: o.Ftrl(
            0.1, learning_rate_power=-0.7, initial_accumulator_value=0.2,
            l1_regularization_strength=0.01, l2_regularization_strength=0.02,
            l2_shrinkage_regularization_strength=0.03, beta=0.1,
        ),
    ),
]

# The Keras inside TensorFlow: tf_keras' legacy optimizers are a copy of these.
TF_LEGACY_KERAS = [
    (name, make) for name, make in LEGACY if name != "adam-amsgrad-schedule"
] + [
    ("adam-amsgrad-schedule", lambda o: o.Adam(
        o.schedules.ExponentialDecay(0.1, 2, 0.5), amsgrad=True)),
]

TF1 = [
    ("gradient-descent-callable-lr", lambda o: o.GradientDescentOptimizer(lambda: 0.1)),
    ("momentum", lambda o: o.MomentumOptimizer(0.1, 0.9)),
    ("momentum-nesterov", lambda o: o.MomentumOptimizer(0.1, 0.9, use_nesterov=True)),
    ("adam", lambda o: o.AdamOptimizer(0.1)),
    ("adagrad", lambda o: o.AdagradOptimizer(0.1)),
    ("adadelta", lambda o: o.AdadeltaOptimizer(1.0)),
    ("rmsprop", lambda o: o.RMSPropOptimizer(0.1)),
    ("rmsprop-centered-momentum", lambda o: o.RMSPropOptimizer(0.1, momentum=0.5, centered=True)),
    ("ftrl", lambda o: o.FtrlOptimizer(0.1)),
    (
        "ftrl-all-args",
        lambda o: o.FtrlOptimizer(
            0.1, learning_rate_power=-0.7, initial_accumulator_value=0.2,
            l1_regularization_strength=0.01, l2_regularization_strength=0.02,
            l2_shrinkage_regularization_strength=0.03, beta=0.1,
        ),
    ),
    ("proximal-adagrad", lambda o: o.ProximalAdagradOptimizer(
        0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02)),
    (
        "proximal-adagrad-l2",
        lambda o: o.ProximalAdagradOptimizer(0.1, l2_regularization_strength=0.02),
    ),
    ("proximal-gradient-descent", lambda o: o.ProximalGradientDescentOptimizer(
        0.1, l1_regularization_strength=0.01, l2_regularization_strength=0.02)),
    (
        "proximal-gradient-descent-l2",
        lambda o: o.ProximalGradientDescentOptimizer(0.1, l2_regularization_strength=0.02),
    ),
    # AdagradDA's step is its global_step + 1 (here 3 in every step).
    ("adagrad-da", lambda o: o.AdagradDAOptimizer(
        0.1, tf.constant(2, tf.int64), initial_gradient_squared_accumulator_value=0.2,
        l1_regularization_strength=0.01, l2_regularization_strength=0.02)),
    ("adagrad-da-l2", lambda o: o.AdagradDAOptimizer(
        0.1, tf.constant(2, tf.int64), l2_regularization_strength=0.02)),
]

CASES = (
    [Case("keras", name, make) for name, make in KERAS_LIKE]
    + [Case("tf_keras", name, make) for name, make in KERAS_LIKE]
    + [
        Case(
            "tf_keras", "adam-adaptive-epsilon",
            lambda o: o.Adam(0.1, adaptive_epsilon=True, epsilon=1e-3),
        )
    ]
    + [Case("legacy", name, make) for name, make in LEGACY]
    + [Case("tf_legacy_keras", name, make) for name, make in TF_LEGACY_KERAS]
    + [Case("tf1", name, make) for name, make in TF1]
)


def new_optimizer(case):
    return case.make(family_module(case.family))


# ----------------------------------------------------------------------------------------
# Dense training and rule runs
# ----------------------------------------------------------------------------------------


def make_data(dim, seed=0):
    """Start rows and STEPS gradients, nonzero in every row (|g| >= 0.1)."""
    rng = np.random.RandomState(seed + dim)
    init = rng.uniform(-1.0, 1.0, (ROWS, dim))
    grads = [
        rng.uniform(0.1, 1.0, (ROWS, dim)) * rng.choice([-1.0, 1.0], (ROWS, dim))
        for _ in range(STEPS)
    ]
    return init, grads


def train_dense(optimizer, init, grads, dtype, sparse=False):
    """The variable after each step of `optimizer.apply_gradients` (eager)."""
    var = tf.Variable(tf.constant(init, dtype))
    out = []
    for grad in grads:
        grad = tf.constant(grad, dtype)
        if sparse:
            # All rows, as IndexedSlices: exercises the optimizers' sparse paths.
            grad = tf.IndexedSlices(grad, tf.range(ROWS), tf.constant(init.shape))
        optimizer.apply_gradients([(grad, var)])
        out.append(var.numpy())
    return out


def initial_slots(rule, shape, dtype):
    return {slot.name: tf.fill(shape, tf.constant(slot.initial, dtype)) for slot in rule.slots}


def run_rule(rule, init, grads, dtype):
    """The rows after each step of the rule, on all rows."""
    rows = tf.constant(init, dtype)
    slots = initial_slots(rule, rows.shape, dtype)
    out = []
    for step, grad in enumerate(grads, start=1):
        values = rule.step_values(tf.constant(step, tf.float32))
        rows, slots = rule.apply(rows, tf.constant(grad, dtype), slots, values)
        assert rows.dtype == dtype and set(slots) == {slot.name for slot in rule.slots}
        out.append(rows.numpy())
    return out


def assert_trajectories_close(actual, expected, what):
    for step, (a, e) in enumerate(zip(actual, expected), start=1):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=f"{what}, step {step}")


def check_case(case, dim, dtype, sparse=False):
    init, grads = make_data(dim)
    dense = train_dense(new_optimizer(case), init, grads, dtype, sparse)
    rule = get_rule(new_optimizer(case))
    assert_trajectories_close(
        run_rule(rule, init, grads, dtype), dense,
        f"{case_id(case)} dim={dim} {dtype.name} {'sparse' if sparse else 'dense'} gradients",
    )


# ----------------------------------------------------------------------------------------
# The decisive check
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_rule_matches_optimizer(case):
    # tf_keras and the TF1/legacy kernels have separate sparse (IndexedSlices)
    # paths, which are what an embedding's gradient takes: check both.
    gradient_kinds = [False] if case.family == "keras" else [False, True]
    for dim in (1, 4):
        for sparse in gradient_kinds:
            check_case(case, dim, tf.float32, sparse)


FLOAT64_CASES = [
    case for case in CASES
    if case_id(case) in {
        "keras-adam", "keras-nadam-weight-decay", "keras-sgd-nesterov-weight-decay",
        "keras-ftrl-all-args", "tf_keras-adamw", "tf_keras-nadam", "legacy-adam",
        "legacy-nadam", "legacy-ftrl-all-args", "tf1-adam", "tf1-rmsprop-centered-momentum",
    }
]


@pytest.mark.parametrize("case", FLOAT64_CASES, ids=case_id)
def test_rule_matches_optimizer_float64(case):
    # Float64 variables see some hyperparameters rounded to float32 (tf.cast of
    # a Python float), others not: the rules must round the same ones.
    check_case(case, 4, tf.float64)


def test_nonfused_legacy_adam():
    legacy_adam = pytest.importorskip("tf_keras.src.optimizers.legacy.adam")
    case = Case("legacy", "nonfused-adam", lambda o: legacy_adam.NonFusedAdam(0.1, amsgrad=True))
    check_case(case, 4, tf.float32)


def test_nonfused_tf_legacy_keras_adam():
    """TF's own NonFusedAdam, on its sparse path (an embedding's gradient): its dense
    path divides by sqrt(v) - epsilon, a bug its tf_keras copy fixed."""
    case = Case("tf_legacy_keras", "nonfused-adam", lambda o: o.NonFusedAdam(0.1, amsgrad=True))
    for dim in (1, 4):
        check_case(case, dim, tf.float32, sparse=True)


def test_many_steps_nadam_product():
    """Nadam's momentum-schedule product is a closed form: check it over 300 steps."""
    keras = pytest.importorskip("keras")
    optimizer = keras.optimizers.Nadam(0.01, beta_1=0.99)
    # float64, so that Keras' own running product carries little round-off.
    var = tf.Variable(tf.ones([1], tf.float64))
    for _ in range(300):
        optimizer.apply_gradients([(tf.ones([1], tf.float64), var)])
    rule = get_rule(keras.optimizers.Nadam(0.01, beta_1=0.99))
    product = rule.step_values(tf.constant(300.0))["u_product"]
    np.testing.assert_allclose(product.numpy(), optimizer._u_product.numpy(), rtol=1e-10)

    for decay in (0.004, 0.0):
        expected = np.prod([0.9 * (1 - 0.5 * 0.96 ** (decay * i)) for i in range(1, 301)])
        actual = _nadam_momentum_product(0.9, decay, tf.constant(300.0))
        np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-12)


# ----------------------------------------------------------------------------------------
# Graph modes
# ----------------------------------------------------------------------------------------


GRAPH_CASES = [
    case for case in CASES
    if case_id(case) in {
        "keras-nadam-weight-decay", "keras-adam-amsgrad-schedule", "tf_keras-adamw",
        "legacy-nadam", "legacy-sgd-momentum-decay", "tf1-adam", "tf1-ftrl-all-args",
    }
]


def run_rule_in_session(case, init, grads, train_dense_too):
    """Builds the rule (and, if asked, the optimizer's own training) in a TF1 graph,
    with step, rows, gradient and slot rows fed, and runs STEPS steps in a Session."""
    dim = init.shape[1]
    graph = tf.Graph()
    with graph.as_default():
        var = tf.Variable(init.astype(np.float32))
        grad = tf.compat.v1.placeholder(tf.float32, [ROWS, dim])
        train = new_optimizer(case).apply_gradients([(grad, var)]) if train_dense_too else None
        rule = get_rule(new_optimizer(case))
        step = tf.compat.v1.placeholder(tf.float32, [])
        rows = tf.compat.v1.placeholder(tf.float32, [ROWS, dim])
        slots = {
            slot.name: tf.compat.v1.placeholder(tf.float32, [ROWS, dim]) for slot in rule.slots
        }
        update = rule.apply(rows, grad, slots, rule.step_values(step))
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            rows_now = init.astype(np.float32)
            slots_now = {
                slot.name: np.full(init.shape, slot.initial, np.float32) for slot in rule.slots
            }
            by_rule, by_optimizer = [], []
            for i, grad_now in enumerate(grads, start=1):
                feed = {step: float(i), rows: rows_now, grad: grad_now}
                feed.update({slots[name]: value for name, value in slots_now.items()})
                rows_now, slots_now = session.run(update, feed)
                by_rule.append(rows_now)
                if train is not None:
                    session.run(train, {grad: grad_now})
                    by_optimizer.append(session.run(var))
    return by_rule, by_optimizer


@pytest.mark.parametrize("case", GRAPH_CASES, ids=case_id)
def test_rule_in_tf1_graph(case):
    """TF1 graph mode: step values and updates are graph tensors run by a Session.

    TF1 and legacy Keras optimizers train in that graph too and are compared
    directly; Keras 3 / tf_keras optimizers do not train in TF1 graphs, so their
    rule is compared with its eager run (itself checked against eager training).
    """
    family_module(case.family)  # skips if the family is missing
    init, grads = make_data(4)
    dense_in_graph = case.family in ("legacy", "tf1")
    by_rule, by_optimizer = run_rule_in_session(case, init, grads, dense_in_graph)
    if dense_in_graph:
        expected = by_optimizer
    else:
        expected = run_rule(get_rule(new_optimizer(case)), init, grads, tf.float32)
    assert_trajectories_close(by_rule, expected, f"{case_id(case)} in a TF1 graph")


@pytest.mark.parametrize("case", GRAPH_CASES, ids=case_id)
def test_rule_in_tf_function(case):
    init, grads = make_data(4)
    rule = get_rule(new_optimizer(case))

    @tf.function
    def step_fn(step, rows, grad, slots):
        return rule.apply(rows, grad, slots, rule.step_values(step))

    rows = tf.constant(init, tf.float32)
    slots = initial_slots(rule, rows.shape, tf.float32)
    by_function = []
    for i, grad in enumerate(grads, start=1):
        step = tf.constant(i, tf.float32)
        rows, slots = step_fn(step, rows, tf.constant(grad, tf.float32), slots)
        by_function.append(rows.numpy())
    expected = train_dense(new_optimizer(case), init, grads, tf.float32)
    assert_trajectories_close(by_function, expected, f"{case_id(case)} in tf.function")


# ----------------------------------------------------------------------------------------
# Other behaviour
# ----------------------------------------------------------------------------------------


def test_rule_leaves_optimizer_untouched():
    keras = pytest.importorskip("keras")
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5))
    rule = get_rule(optimizer)
    init, grads = make_data(4)
    run_rule(rule, init, grads, tf.float32)
    assert not optimizer.built
    assert int(optimizer.iterations.numpy()) == 0

    tf1_optimizer = tf.compat.v1.train.AdamOptimizer(0.1)
    run_rule(get_rule(tf1_optimizer), init, grads, tf.float32)
    assert tf1_optimizer.variables() == []


def test_half_precision_rows_computed_in_float32():
    keras = pytest.importorskip("keras")
    rule = get_rule(keras.optimizers.Adam(0.1))
    init, grads = make_data(4)
    for dtype in (tf.float16, tf.bfloat16):
        rows = tf.constant(init, dtype)
        slots = initial_slots(rule, rows.shape, dtype)
        grad = tf.constant(grads[0], dtype)
        new_rows, new_slots = rule.apply(rows, grad, slots, rule.step_values(1.0))
        assert new_rows.dtype == dtype and all(s.dtype == dtype for s in new_slots.values())
        reference, _ = rule.apply(
            tf.cast(rows, tf.float32), tf.cast(grad, tf.float32),
            initial_slots(rule, rows.shape, tf.float32), rule.step_values(1.0),
        )
        np.testing.assert_array_equal(new_rows.numpy(), tf.cast(reference, dtype).numpy())


def test_weight_decay_can_be_skipped_per_variable():
    keras = pytest.importorskip("keras")
    init, grads = make_data(4)
    with_decay = get_rule(keras.optimizers.AdamW(0.1, weight_decay=0.5))
    without = get_rule(keras.optimizers.Adam(0.1))
    values = with_decay.step_values(1.0)
    rows = tf.constant(init, tf.float32)
    slots = initial_slots(without, rows.shape, tf.float32)
    skipped, _ = with_decay.apply(rows, grads[0], slots, values, use_weight_decay=False)
    plain, _ = without.apply(rows, grads[0], slots, without.step_values(1.0))
    np.testing.assert_array_equal(skipped.numpy(), plain.numpy())


def test_slot_specs():
    keras = pytest.importorskip("keras")
    assert get_rule(keras.optimizers.SGD(0.1)).slots == ()
    assert get_rule(keras.optimizers.Adam(amsgrad=True)).slots == (
        optimizer_rules.SlotSpec("m", 0.0), optimizer_rules.SlotSpec("v", 0.0),
        optimizer_rules.SlotSpec("vhat", 0.0),
    )
    assert get_rule(keras.optimizers.Adagrad(initial_accumulator_value=0.3)).slots[0].initial == 0.3
    rmsprop = get_rule(tf.compat.v1.train.RMSPropOptimizer(0.1))
    assert [tuple(slot) for slot in rmsprop.slots] == [("rms", 1.0), ("momentum", 0.0)]


def test_missing_slot_rows():
    rule = get_rule(tf.compat.v1.train.AdamOptimizer(0.1))
    with pytest.raises(KeyError, match="'v'"):
        rows = tf.zeros([2, 3])
        rule.apply(rows, tf.ones([2, 3]), {"m": tf.zeros([2, 3])}, rule.step_values(1.0))


class OwnOptimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer of the user's own, which no rule reproduces."""

    def __init__(self):
        super().__init__(use_locking=False, name="Own")


def test_unsupported_optimizer():
    keras = pytest.importorskip("keras")
    with pytest.raises(TypeError, match=r"keras\.src\.optimizers\.lion\.Lion.*Supported:.*Adam"):
        get_rule(keras.optimizers.Lion())
    with pytest.raises(TypeError, match="OwnOptimizer"):
        get_rule(OwnOptimizer())
    with pytest.raises(TypeError, match="builtins.object"):
        get_rule(object())


def test_unsupported_options():
    keras = pytest.importorskip("keras")
    with pytest.raises(ValueError, match="use_ema"):
        get_rule(keras.optimizers.Adam(use_ema=True))
    # Gradient accumulation is the wrapper's (training/accumulation.py), not the rule's.
    get_rule(keras.optimizers.SGD(gradient_accumulation_steps=2))
    tf_keras = pytest.importorskip("tf_keras")
    with pytest.raises(ValueError, match="use_ema"):
        get_rule(tf_keras.optimizers.Adam(use_ema=True))
