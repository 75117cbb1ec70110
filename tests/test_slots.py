"""Optimizer slots: one slot state per variable (every slot's columns side by side),
seen through one `SlotView` per slot (tensorflow_dynemb/training/slots.py)."""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de

DIM = 3


def make_var(name="emb", shards=1, dtype=tf.int64):
    return de.Variable(
        dtype, tf.float32, dim=DIM, devices=["/CPU:0"] * shards, name=name, initializer=0.5
    )


def train_step(var, optimizer, ids, grad_scale=1.0):
    """One step of loss = grad_scale * sum(rows): every row's gradient is grad_scale."""
    ids = tf.constant(ids, var.key_dtype)
    with tf.GradientTape() as tape:
        rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
        loss = grad_scale * tf.reduce_sum(rows)
    grads = tape.gradient(loss, [trainable])
    optimizer.apply_gradients(zip(grads, [trainable]))


def content(slot):
    keys, values = slot.export()
    return {int(k): v.tolist() for k, v in zip(keys.numpy(), values.numpy())}


def test_adam_slots_share_one_state_in_column_order():
    var = make_var()
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1, beta_1=0.9, beta_2=0.99))
    train_step(var, optimizer, [1, 2, 2], grad_scale=2.0)
    m, v = var.get_slot_variables(optimizer)
    assert [m.name.rsplit("/", 1)[-1], v.name.rsplit("/", 1)[-1]] == ["m", "v"]
    assert m.state is v.state and var.slot_variables == [m, v]
    assert (m.dim, v.dim, m.state.dim) == (DIM, DIM, 2 * DIM)
    # Key 1 had gradient 2, key 2 (twice) gradient 4: m = 0.1 g, v = 0.01 g^2.
    np.testing.assert_allclose(m.lookup([1, 2]).numpy(), [[0.2] * DIM, [0.4] * DIM], rtol=1e-6)
    np.testing.assert_allclose(v.lookup([1, 2]).numpy(), [[0.04] * DIM, [0.16] * DIM], rtol=1e-5)
    state_rows = m.state.lookup([2]).numpy()[0]
    np.testing.assert_allclose(state_rows, [0.4] * DIM + [0.16] * DIM, rtol=1e-5)
    assert int(m.size()) == int(v.size()) == int(var.size()) == 2


def test_view_reads_initial_values_and_exists_for_absent_keys():
    var = make_var()
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25))
    train_step(var, optimizer, [4])
    (accumulator,) = var.get_slot_variables(optimizer)
    values, exists = accumulator.lookup([[4, 5]], return_exists=True)
    assert values.shape == (1, 2, DIM) and exists.numpy().tolist() == [[True, False]]
    np.testing.assert_allclose(values.numpy()[0, 1], [0.25] * DIM)
    np.testing.assert_allclose(values.numpy()[0, 0], [1.25] * DIM)


def test_view_upsert_writes_only_its_columns():
    var = make_var()
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    train_step(var, optimizer, [1])
    m, v = var.get_slot_variables(optimizer)
    v_before = v.lookup([1]).numpy()
    m.upsert([1, 7, 7], [[1.0] * DIM, [2.0] * DIM, [3.0] * DIM])  # the last row of 7 wins
    assert content(m) == {1: [1.0] * DIM, 7: [3.0] * DIM}
    np.testing.assert_array_equal(v.lookup([1]).numpy(), v_before)
    assert content(v)[7] == [0.0] * DIM  # the other slot starts from its initial value
    m.remove([7])
    assert sorted(content(v)) == [1]  # a key's slot rows leave together


def test_view_upsert_checks_shape_and_dtype():
    var = make_var()
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    train_step(var, optimizer, [1])
    m, _ = var.get_slot_variables(optimizer)
    before = m.state.export()
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected shape"):
        m.upsert([1], [[1.0] * (DIM + 1)])
    with pytest.raises(TypeError, match="values"):
        m.upsert([1], tf.constant([[1] * DIM], tf.int32))
    after = m.state.export()
    np.testing.assert_array_equal(before[1].numpy(), after[1].numpy())


def test_checkpoint_holds_slot_state_without_scores_and_reshards(tmp_path):
    var = make_var(shards=2)
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    for ids in ([1, 2, 3], [3, 4, 5, 6], [1, 6, 9]):
        train_step(var, optimizer, ids)
    prefix = tf.train.Checkpoint(emb=var, optimizer=optimizer).write(
        os.path.join(tmp_path, "ckpt")
    )
    shapes = dict(tf.train.list_variables(prefix))
    state = {n.rsplit("/", 1)[-1]: shape for n, shape in shapes.items() if "emb_m_v/" in n}
    assert state == {"-keys": [7], "-values": [7, 2 * DIM]}  # no scores
    assert shapes["emb/.ATTRIBUTES/-scores"] == [7]  # the parameter keeps them

    restored = make_var(shards=3)
    new_optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    status = tf.train.Checkpoint(emb=restored, optimizer=new_optimizer).read(prefix)
    new_optimizer._dynemb.slots_of(restored)  # what the first step does; restored then
    status.assert_existing_objects_matched()
    for old, new in zip(var.get_slot_variables(optimizer), restored.get_slot_variables(new_optimizer)):
        want, got = content(old), content(new)
        assert sorted(got) == sorted(want) == [1, 2, 3, 4, 5, 6, 9]
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_sgd_keeps_no_slot_state():
    var = make_var()
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.1))
    train_step(var, optimizer, [1])
    assert var.get_slot_variables(optimizer) == [] and var.slot_variables == []
    np.testing.assert_allclose(var.lookup([1]).numpy(), [[0.4] * DIM])
