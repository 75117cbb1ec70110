"""The fused optimizer step (`DynembTableApplyRule`, `SparseRule.fused`): the slot-state
table updates its rows in place and returns the new parameter rows, bit for bit what
`SparseRule.apply` computes with TF ops; the training wrapper takes it where it can.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.keras._compat import IS_KERAS3
from tensorflow_dynemb.training import applier as optimizer_module
from tensorflow_dynemb.training.rules import get_rule

sys.path.insert(0, os.path.dirname(__file__))
import test_optimizer_rules as rule_cases  # noqa: E402

# The optimizer cases (tests/test_optimizer_rules.py) whose rule has a fused form.
FUSED_CASES = {
    "keras-sgd-momentum", "keras-sgd-nesterov-weight-decay", "keras-sgd-piecewise-schedule",
    "keras-adam", "keras-adamw", "keras-adagrad",
    "tf_keras-sgd-momentum", "tf_keras-sgd-nesterov-weight-decay",
    "tf_keras-sgd-piecewise-schedule", "tf_keras-adam", "tf_keras-adamw", "tf_keras-adagrad",
    "tf_keras-adam-adaptive-epsilon",
    "legacy-sgd-nesterov", "legacy-sgd-momentum-decay", "legacy-adam", "legacy-adagrad",
    "tf_legacy_keras-sgd-nesterov", "tf_legacy_keras-sgd-momentum-decay",
    "tf_legacy_keras-adam", "tf_legacy_keras-adagrad",
    "tf1-momentum", "tf1-momentum-nesterov", "tf1-adam",
    # Adam with amsgrad, Adamax and Nadam in both Keras; RMSprop and Adadelta in Keras 3
    # (tf_keras spells them with rsqrt and (1 - rho) * g * g, which round differently).
    "keras-adam-amsgrad-schedule", "keras-adamw-amsgrad", "tf_keras-adam-amsgrad-schedule",
    "tf_keras-adamw-amsgrad", "keras-adamax", "tf_keras-adamax", "keras-nadam",
    "keras-nadam-weight-decay", "tf_keras-nadam", "tf_keras-nadam-weight-decay",
    "keras-rmsprop", "keras-rmsprop-momentum", "keras-rmsprop-centered",
    "keras-rmsprop-centered-momentum", "keras-adadelta",
}
STEPS = 4


def state_table(rule, dim, dtype):
    """A slot state as slots.py makes it: absent keys read the slots' initial values."""
    return de.HashTable(tf.int64, dtype, default_value=initial_state(rule, dim, dtype))


def initial_state(rule, dim, dtype):
    return tf.constant([spec.initial for spec in rule.slots for _ in range(dim)], dtype)


def split(rows, rule, dim):
    return {spec.name: rows[:, i * dim : (i + 1) * dim] for i, spec in enumerate(rule.slots)}


@pytest.mark.parametrize("case", rule_cases.CASES, ids=rule_cases.case_id)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=lambda d: d.name)
def test_fused_step_equals_rule_bit_for_bit(case, dtype):
    rule = get_rule(rule_cases.new_optimizer(case))
    values = rule.step_values(tf.constant(1.0))
    fused = rule.fused(values, dtype)
    if rule_cases.case_id(case) not in FUSED_CASES:
        assert fused is None
        return
    assert fused is not None
    dim = 5  # not a multiple of a vector width: TF's tail elements count too
    rng = np.random.RandomState(7)
    keys = tf.constant([3, 11, 12, 40, 41, 7], tf.int64)
    table = state_table(rule, dim, dtype)
    initial = initial_state(rule, dim, dtype)
    rows = tf.constant(rng.uniform(-1, 1, (6, dim)), dtype)
    # Keys 40 and 41 are stored before the first step; the others start from `initial`.
    table.insert(keys[3:5], tf.constant(rng.uniform(0.1, 1, (2, len(rule.slots) * dim)), dtype))
    slots = split(table.lookup(keys), rule, dim)
    for step in range(1, STEPS + 1):
        values = rule.step_values(tf.constant(float(step)))
        grad = tf.constant(rng.uniform(-1, 1, (6, dim)), dtype)
        want_rows, want_slots = rule.apply(rows, grad, slots, values)
        fused = rule.fused(values, dtype)
        got_rows = table._apply_rule(
            keys, rows, grad, initial, tf.stack(fused.coefficients), fused.rule,
            fused.weight_decay,
        )
        np.testing.assert_array_equal(got_rows.numpy(), want_rows.numpy(), f"rows, step {step}")
        got_slots = split(table.lookup(keys), rule, dim)
        for name in want_slots:
            np.testing.assert_array_equal(
                got_slots[name].numpy(), want_slots[name].numpy(), f"slot {name}, step {step}"
            )
        rows, slots = want_rows, want_slots


def test_no_fused_form_for_half_precision():
    rule = get_rule(tf.keras.optimizers.Adam())
    values = rule.step_values(tf.constant(1.0))
    assert rule.fused(values, tf.float16) is None and rule.fused(values, tf.bfloat16) is None
    assert rule.fused(values, tf.float32).rule == "keras_adam"


def apply_op(table, keys, rows, grads, coefficients, rule="keras_momentum", weight_decay=False):
    initial = tf.zeros(table.value_shape, table.value_dtype)
    return table._apply_rule(keys, rows, grads, initial, coefficients, rule, weight_decay)


def test_duplicate_keys_apply_in_order_and_absent_keys_start_from_initial():
    table = de.HashTable(tf.int64, tf.float32, default_value=[0.0])
    keys = tf.constant([5, 5, 6], tf.int64)
    ones = tf.ones([3, 1])
    # TF1 momentum with momentum 1: the accumulator sums the gradients of its key.
    new = apply_op(table, keys, ones, ones, tf.constant([1.0, 1.0, 1.0]), rule="momentum")
    np.testing.assert_array_equal(new.numpy(), [[0.0], [-1.0], [0.0]])
    np.testing.assert_array_equal(table.lookup(keys).numpy(), [[2.0], [2.0], [1.0]])
    assert int(table.size()) == 2


def test_weight_decay_comes_first():
    table = de.HashTable(tf.int64, tf.float64, default_value=[0.0])
    rows = tf.constant([[10.0]], tf.float64)
    grads = tf.constant([[2.0]], tf.float64)
    # (weight_decay, lr) then (lr, momentum): w - w * 0.1 * 0.5, then m = -g * 0.25.
    new = apply_op(table, tf.constant([1], tf.int64), rows, grads,
                   tf.constant([0.1, 0.5, 0.25, 0.9], tf.float64), weight_decay=True)
    np.testing.assert_array_equal(new.numpy(), [[10.0 - 10.0 * 0.1 * 0.5 - 2.0 * 0.25]])


def test_errors_name_the_argument():
    table = de.HashTable(tf.int64, tf.float32, default_value=[0.0, 0.0])
    keys = tf.constant([1, 2], tf.int64)
    rows = tf.ones([2, 1])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="coefficients"):
        apply_op(table, keys, rows, rows, tf.constant([1.0]), rule="keras_adam")
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="grads"):
        apply_op(table, keys, rows, tf.ones([2, 2]), tf.ones([4]), rule="keras_adam")
    with pytest.raises(tf.errors.InvalidArgumentError, match="table's dim must be 1, got 2"):
        apply_op(table, keys, rows, rows, tf.ones([2]), rule="keras_momentum")
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rule"):
        apply_op(table, keys, rows, rows, tf.ones([2]), rule="rmsprop")
    bounded = de.HkvHashTable(tf.int64, tf.float32, default_value=[0.0], init_capacity=16,
                              max_capacity=16)
    with pytest.raises(tf.errors.FailedPreconditionError, match="unbounded"):
        apply_op(bounded, keys, rows, rows, tf.ones([2]))
    assert int(table.size()) == 0 and int(bounded.size()) == 0


def test_inside_tf_function():
    # (TF1 graphs run the op through the wrappers: tests/test_training.py.)
    @tf.function
    def step(table, keys, rows):
        return apply_op(table, keys, rows, rows, tf.constant([1.0, 1.0]))

    table = de.HashTable(tf.int64, tf.float32, default_value=[0.0])
    for _ in range(2):
        out = step(table, tf.constant([1, 2], tf.int64), tf.ones([2, 1]))
    # Step 2: m = 1 * (-1) - 1 = -2, w = 1 + m.
    np.testing.assert_array_equal(out.numpy(), [[-1.0], [-1.0]])


# ---------------------------------------------------------------------------------------
# Through the training wrapper: fused and unfused training end in the same bits
# ---------------------------------------------------------------------------------------


def train(make_optimizer, shards, fused, steps=3):
    tf.keras.utils.set_random_seed(1)
    emb = de.Variable(tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * shards,
                      initializer=tf.keras.initializers.RandomNormal(0.0, 0.1, seed=3))
    optimizer = de.DynamicEmbeddingOptimizer(make_optimizer())
    ids = tf.constant([[1, 2, 3], [2, 2, 10**12], [7, 1, 5]], tf.int64)
    calls = []
    original = optimizer_module.SparseApplier._fused_step

    def fused_step(self, state, dtype, values):
        step = original(self, state, dtype, values) if fused else None
        calls.append(step is not None)
        return step

    optimizer_module.SparseApplier._fused_step = fused_step
    try:
        for _ in range(steps):
            with tf.GradientTape() as tape:
                rows, trainable = de.embedding_lookup(emb, ids, return_trainable=True)
                loss = tf.reduce_sum(tf.sin(rows) * tf.range(1.0, 4.0))
            optimizer.apply_gradients([(tape.gradient(loss, trainable), trainable)])
    finally:
        optimizer_module.SparseApplier._fused_step = original
    assert calls == [fused] * steps
    keys = tf.range(0, 12, dtype=tf.int64)
    slots = [view.lookup(keys).numpy() for view in emb.slot_variables]
    return emb.lookup(keys).numpy(), slots, int(emb.size()), int(emb.slot_variables[0].size())


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda: tf.keras.optimizers.Adam(0.05),
        lambda: tf.keras.optimizers.AdamW(0.05, weight_decay=0.1),
        lambda: tf.keras.optimizers.Adagrad(0.1),
        lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
        lambda: tf.compat.v1.train.AdamOptimizer(0.05),
        lambda: tf.keras.optimizers.Adam(0.05, amsgrad=True),
        lambda: tf.keras.optimizers.Adamax(0.05),
        lambda: tf.keras.optimizers.Nadam(0.05),
        pytest.param(lambda: tf.keras.optimizers.RMSprop(0.05, momentum=0.5, centered=True),
                     marks=pytest.mark.skipif(not IS_KERAS3, reason="tf_keras' RMSprop is unfused")),
        pytest.param(lambda: tf.keras.optimizers.Adadelta(0.5),
                     marks=pytest.mark.skipif(not IS_KERAS3, reason="tf_keras' Adadelta is unfused")),
    ],
    ids=["adam", "adamw", "adagrad", "nesterov", "tf1-adam", "amsgrad", "adamax", "nadam",
         "rmsprop-centered-momentum", "adadelta"],
)
def test_training_fused_equals_unfused(make_optimizer, shards):
    fused = train(make_optimizer, shards, fused=True)
    unfused = train(make_optimizer, shards, fused=False)
    np.testing.assert_array_equal(fused[0], unfused[0])
    for got, want in zip(fused[1], unfused[1]):
        np.testing.assert_array_equal(got, want)
    assert fused[2:] == unfused[2:]
