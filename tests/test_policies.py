"""Restrict policies, feature admission, and slot consistency of bounded variables."""

from __future__ import annotations

from typing import Dict, List

import keras
import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de

DEVICES = {1: ["/CPU:0"], 3: ["/CPU:0", "/CPU:1", "/CPU:2"]}


def train_step(var, optimizer, ids: List[int], name: str = "feature") -> None:
    """One step of loss = sum(rows) over `ids` (each occurrence counts)."""
    ids = tf.constant(ids, var.key_dtype)
    with tf.GradientTape() as tape:
        rows, trainable = de.embedding_lookup(var, ids, name=name, return_trainable=True)
        loss = tf.reduce_sum(rows)
    grads = tape.gradient(loss, [trainable])
    optimizer.apply_gradients(zip(grads, [trainable]))


def content(var) -> Dict[int, np.ndarray]:
    keys, values = var.export()
    return {int(k): v for k, v in zip(keys.numpy(), values.numpy())}


# ---------------------------------------------------------------------------------------
# Restrict
# ---------------------------------------------------------------------------------------


def trained_variable(policy, shards: int, steps: int = 6, **policy_kwargs):
    """Step s trains ids 0..s and a one-off id 100+s: id i is trained steps-i times."""
    if policy_kwargs:
        policy_cls = policy
        policy = lambda var: policy_cls(var, **policy_kwargs)  # noqa: E731
    var = de.Variable(dim=2, devices=DEVICES[shards], restrict_policy=policy, initializer=1.0)
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    for s in range(steps):
        train_step(var, optimizer, list(range(s + 1)) + [100 + s])
    return var, optimizer


@pytest.mark.parametrize("shards", [1, 3])
def test_frequency_restrict_keeps_the_most_frequent_globally(shards):
    var, optimizer = trained_variable(de.FrequencyRestrictPolicy, shards)
    status = {k: int(v[0]) for k, v in content(var.restrict_policy.status).items()}
    assert status == {**{i: 6 - i for i in range(6)}, **{100 + s: 1 for s in range(6)}}
    assert len(var.get_slot_variables(optimizer)) == 2

    var.restrict(4)  # ids 0..3 were trained 6, 5, 4, 3 times: kept, wherever they live
    assert sorted(content(var)) == [0, 1, 2, 3]
    for slot in var.get_slot_variables(optimizer):
        assert sorted(content(slot)) == [0, 1, 2, 3]
    assert sorted(content(var.restrict_policy.status)) == [0, 1, 2, 3]


@pytest.mark.parametrize("shards", [1, 3])
def test_timestamp_restrict_keeps_the_most_recent(shards):
    var, optimizer = trained_variable(de.TimestampRestrictPolicy, shards, use_step=True)
    status = {k: int(v[0]) for k, v in content(var.restrict_policy.status).items()}
    assert status[0] == 6 and status[100] == 1 and status[105] == 6
    var.restrict(3, trigger=5)
    # Trained in the last step: ids 0..5 and 105; ranked by step, ties arbitrary.
    kept = sorted(content(var))
    assert len(kept) == 3 and set(kept) <= {0, 1, 2, 3, 4, 5, 105}
    for slot in var.slot_variables:
        assert sorted(content(slot)) == kept


def test_wall_clock_timestamps_rank_later_steps_higher():
    var, _ = trained_variable(de.TimestampRestrictPolicy, 1, steps=3)
    status = {k: int(v[0]) for k, v in content(var.restrict_policy.status).items()}
    assert status[100] <= status[101] <= status[102]
    assert abs(status[102] / 1e6 - __import__("time").time()) < 600  # microseconds


def test_restrict_below_trigger_changes_nothing_and_bad_arguments_raise():
    var, _ = trained_variable(de.FrequencyRestrictPolicy, 1)
    before = content(var)
    var.restrict(5, trigger=len(before))
    assert sorted(content(var)) == sorted(before)
    with pytest.raises(ValueError, match="`trigger` must be >= `num_reserved`"):
        var.restrict(5, trigger=4)
    with pytest.raises(ValueError, match="num_reserved"):
        var.restrict(-1)
    assert de.Variable(dim=1).restrict(1) is None  # no policy


def test_keys_without_status_rank_lowest():
    var, _ = trained_variable(de.FrequencyRestrictPolicy, 1, steps=2)
    var.upsert(tf.constant([7, 8], tf.int64), tf.ones([2, 2]))  # never trained
    var.restrict(3)
    assert 7 not in content(var) and 8 not in content(var)


def test_restrict_in_tf_function():
    var, optimizer = trained_variable(de.FrequencyRestrictPolicy, 3)

    @tf.function
    def restrict():
        return var.restrict(2)

    restrict()
    assert sorted(content(var)) == [0, 1]
    assert all(sorted(content(s)) == [0, 1] for s in var.slot_variables)


def test_restrict_status_is_checkpointed(tmp_path):
    var, _ = trained_variable(de.FrequencyRestrictPolicy, 3)
    path = tf.train.Checkpoint(var=var).save(str(tmp_path / "ckpt"))
    restored = de.Variable(dim=2, devices=DEVICES[1], restrict_policy=de.FrequencyRestrictPolicy)
    tf.train.Checkpoint(var=restored).restore(path).assert_consumed()
    want = {k: int(v[0]) for k, v in content(var.restrict_policy.status).items()}
    got = {k: int(v[0]) for k, v in content(restored.restrict_policy.status).items()}
    assert got == want


# ---------------------------------------------------------------------------------------
# Admission
# ---------------------------------------------------------------------------------------


def test_admission_needs_min_count_occurrences():
    var = de.Variable(dim=1, admit_policy=de.FrequencyAdmitPolicy(3), initializer=1.0)
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    train_step(var, optimizer, [1, 1, 2])  # 1 seen twice, 2 once
    assert content(var) == {}
    assert var.lookup(tf.constant([1], tf.int64)).numpy().tolist() == [[1.0]]
    train_step(var, optimizer, [1, 2])  # 1: third time -> admitted and trained once
    assert {k: v.tolist() for k, v in content(var).items()} == {1: [0.5]}
    train_step(var, optimizer, [2, 1])  # 2 admitted; 1 keeps training
    assert {k: v.tolist() for k, v in content(var).items()} == {1: [0.0], 2: [0.5]}
    # Admitted ids leave the counting table.
    assert content(var._admit.counts) == {}


def test_admission_counts_every_occurrence_through_embedding_lookup_unique():
    # The unique lookup (what Keras layers use by default) counts like the plain one.
    var = de.Variable(dim=1, admit_policy=de.FrequencyAdmitPolicy(3), initializer=1.0)
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    for ids in ([1, 1, 2], [1, 2]):
        ids = tf.constant(ids, tf.int64)
        with tf.GradientTape() as tape:
            rows, trainable = de.embedding_lookup_unique(var, ids, name="u", return_trainable=True)
            loss = tf.reduce_sum(rows)
        optimizer.apply_gradients(zip(tape.gradient(loss, [trainable]), [trainable]))
    assert {k: v.tolist() for k, v in content(var).items()} == {1: [0.5]}


def test_admission_with_one_admits_everything_and_counts_are_bounded():
    var = de.Variable(dim=1, admit_policy=de.FrequencyAdmitPolicy(1))
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.SGD(0.5))
    train_step(var, optimizer, [1, 2, 3])
    assert sorted(content(var)) == [1, 2, 3]

    bounded = de.Variable(
        dim=1, devices=DEVICES[3], admit_policy=de.FrequencyAdmitPolicy(5, max_tracked=30)
    )
    train_step(bounded, optimizer, list(range(1000)))
    counts = bounded._admit.counts
    assert content(bounded) == {}
    assert 0 < int(counts.size()) <= 30  # at most max_tracked ids, split over 3 shards
    assert int(counts.stats()["max_capacity"]) == 30


def test_admit_policy_errors():
    with pytest.raises(ValueError, match="min_count"):
        de.FrequencyAdmitPolicy(0)
    with pytest.raises(TypeError, match="admit_policy"):
        de.Variable(dim=1, admit_policy=3)


# ---------------------------------------------------------------------------------------
# Bounded variables keep their slots consistent
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bp_v2", [False, True], ids=["upsert", "bp_v2"])
@pytest.mark.parametrize("shards", [1, 3])
def test_evicted_keys_lose_their_slot_rows(shards, bp_v2):
    """Whether the write-back upserts or (bp_v2) accumulates, what it evicts leaves
    the slots and the restrict status too."""
    config = de.HkvHashTableConfig(init_capacity=4, max_capacity=4, evict_strategy="lru")
    var = de.Variable(
        dim=2,
        devices=DEVICES[shards],
        kv_creator=de.HkvHashTableCreator(config),
        restrict_policy=de.FrequencyRestrictPolicy,
        initializer=1.0,
        bp_v2=bp_v2,
    )
    optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1))
    for step in range(8):
        train_step(var, optimizer, list(range(10 * step, 10 * step + 6)))
    keys = sorted(content(var))
    assert len(keys) <= 4 * shards
    for slot in var.get_slot_variables(optimizer):
        assert sorted(content(slot)) == keys
    assert sorted(content(var.restrict_policy.status)) == keys

    # An evicted key comes back with fresh rows everywhere: its Adam slots restart
    # from zero (m = (1 - beta_1) * g, v = (1 - beta_2) * g^2 with g = 1).
    evicted = 0
    assert evicted not in keys
    train_step(var, optimizer, [evicted])
    assert evicted in content(var)  # LRU: the newest key stays
    slots = {slot.name.rsplit("/", 1)[-1]: content(slot) for slot in var.slot_variables}
    np.testing.assert_allclose(slots["m"][evicted], [0.1, 0.1], rtol=1e-5)
    np.testing.assert_allclose(slots["v"][evicted], [0.001, 0.001], rtol=1e-5)


def test_training_status_and_restrict_in_a_tf1_graph():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = de.Variable(dim=2, devices=DEVICES[3], restrict_policy=de.FrequencyRestrictPolicy)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows, trainable = de.embedding_lookup(var, ids, return_trainable=True)
        optimizer = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
        train = optimizer.minimize(tf.reduce_sum(rows), var_list=[trainable])
        restrict = var.restrict(2)
        size = var.size()
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in ([1, 2, 3], [1, 2], [1, 4]):
            sess.run(train, {ids: batch})
        assert sess.run(size) == 4
        sess.run(restrict)
        keys, _ = sess.run(var.export())
        assert sorted(keys.tolist()) == [1, 2]
        slot_keys = [sorted(sess.run(s.export())[0].tolist()) for s in var.slot_variables]
        assert slot_keys == [[1, 2]]


def test_keras_layer_admits_ids_under_fit():
    ids = tf.keras.Input(shape=(None,), dtype="int64")
    layer = de.keras.layers.Embedding(
        2, name="admitted", initializer=0.5, admit_policy=de.FrequencyAdmitPolicy(2)
    )
    pooled = tf.keras.layers.GlobalAveragePooling1D()(layer(ids))
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(pooled))
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.array([[1, 2, 2]], np.int64), np.ones([1, 1]), verbose=0)  # 2 seen twice
    assert sorted(content(layer.params)) == [2]
    model.fit(np.array([[1, 3]], np.int64), np.ones([1, 1]), verbose=0)  # 1 seen twice now
    assert sorted(content(layer.params)) == [1, 2]
    # Id 3, seen once, still reads the initializer and has no optimizer slot rows.
    np.testing.assert_allclose(layer.params.lookup(tf.constant([3], tf.int64)), [[0.5, 0.5]])
    assert all(3 not in content(slot) for slot in layer.params.slot_variables)


def test_tfra_status_names_and_apply_update_of_ids_alone():
    """TFRA's `freq_var` / `tstp_var` are the status, and `apply_update(ids)` records
    the ids (its tests call it without a step)."""
    var = de.Variable(tf.int64, tf.float32, dim=2, restrict_policy=de.FrequencyRestrictPolicy)
    policy = var.restrict_policy
    assert policy.freq_var is policy.status
    policy.apply_update(tf.constant([0, 1, 2], tf.int64))
    policy.apply_update(tf.constant([1, 2, 3], tf.int64))
    keys, counts = policy.freq_var.export()
    assert dict(zip(keys.numpy().tolist(), counts[:, 0].numpy().tolist())) == {0: 1, 1: 2, 2: 2, 3: 1}

    timed = de.Variable(tf.int64, tf.float32, dim=2, restrict_policy=de.TimestampRestrictPolicy)
    assert timed.restrict_policy.tstp_var is timed.restrict_policy.status
    timed.restrict_policy.apply_update(tf.constant([5], tf.int64))
    assert int(timed.restrict_policy.tstp_var.size()) == 1
