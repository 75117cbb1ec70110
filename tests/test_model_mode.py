"""TFRA's model mode: `de.enable_inference_mode()` makes the lookups built from then on
read-only (no trainable-view writes, no LRU score refresh); training mode is the
default and `de.enable_train_mode()` restores it."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de


@pytest.fixture(autouse=True)
def train_mode_after():
    yield
    de.enable_train_mode()


def test_mode_switches_and_reports():
    assert de.get_model_mode() == de.ModelMode.TRAIN == "train"
    de.enable_inference_mode()
    assert de.get_model_mode() == de.ModelMode.INFERENCE == "inference"
    assert de.ModelMode.CURRENT_SETTING == "inference"
    de.enable_train_mode()
    assert de.get_model_mode() == "train"


def _lru_table():
    table = de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=8, max_capacity=8,
                            evict_strategy=de.HkvEvictStrategy.LRU)
    table.insert([1, 2, 3], [1.0, 2.0, 3.0])
    table.insert([4], [4.0])  # advances the clock past keys 1..3
    return table


def _scores(table):
    keys, _, scores = table.export_with_scores()
    return dict(zip(keys.numpy().tolist(), scores.numpy().tolist()))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_inference_lookups_leave_lru_scores_alone(traced):
    table = _lru_table()
    before = _scores(table)
    lookup = tf.function(table.lookup) if traced else table.lookup

    de.enable_inference_mode()
    np.testing.assert_array_equal(lookup(tf.constant([1, 9], tf.int64)).numpy(), [1.0, 0.0])
    assert _scores(table) == before

    de.enable_train_mode()
    lookup = tf.function(table.lookup) if traced else table.lookup
    lookup(tf.constant([1], tf.int64))
    after = _scores(table)
    assert after[1] > before[1] and after[2] == before[2]


def test_inference_mode_in_a_tf1_graph_reads_without_refreshing_scores():
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        table = de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=8, max_capacity=8)
        sess.run(table.insert(tf.constant([1, 2], tf.int64), tf.constant([1.0, 2.0])))
        sess.run(table.insert(tf.constant([3], tf.int64), tf.constant([3.0])))
        de.enable_inference_mode()
        read = table.lookup(tf.constant([1], tf.int64))
        de.enable_train_mode()
        export = table.export_with_scores()
        before = sess.run(export)
        assert sess.run(read).tolist() == [1.0]
        after = sess.run(export)
        np.testing.assert_array_equal(before[2], after[2])


def test_inference_lookup_does_not_go_through_the_trainable_view():
    var = de.Variable(tf.int64, tf.float32, dim=2, initializer=0.5)
    ids = tf.constant([3, 4, 3], tf.int64)
    for mode, connected in ((de.enable_train_mode, True), (de.enable_inference_mode, False)):
        mode()
        with tf.GradientTape() as tape:
            rows, view = de.embedding_lookup(var, ids, name="mode_view", return_trainable=True)
            loss = tf.reduce_sum(rows)
        np.testing.assert_array_equal(rows.numpy(), np.full([3, 2], 0.5, np.float32))
        assert view is var.get_trainable_by_name("mode_view")
        assert (tape.gradient(loss, view) is not None) == connected
        # Nothing is inserted in either mode.
        assert int(var.size()) == 0
        de.enable_train_mode()
        var.get_trainable_by_name("mode_view").assign(tf.zeros([0, 2]))


def test_training_and_inference_graphs_predict_alike():
    """TFRA's check: the same rows through a TF1 training graph built in each mode."""
    preds = {}
    init_rows = np.random.RandomState(0).rand(100, 8).astype(np.float32)
    for mode in (de.enable_train_mode, de.enable_inference_mode):
        with tf.Graph().as_default():
            mode()
            emb = de.get_variable("mode_numbers", dim=8, devices=["/CPU:0"] * 2,
                                  initializer=tf.compat.v1.random_normal_initializer(0.0, 0.001))
            w = tf.Variable(1.0, name="w")
            tf.compat.v1.train.create_global_step()
            init = emb.upsert(tf.range(100, dtype=tf.int64), init_rows)
            rows, _ = de.embedding_lookup([emb], tf.constant([0, 1, 2, 3, 4], tf.int64),
                                          return_trainable=True, name="mode_lookup")
            pred = (rows + 1.0) * w
            opt = de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdagradOptimizer(0.1))
            opt.minimize(pred * pred)
            with tf.compat.v1.train.MonitoredTrainingSession(is_chief=True) as sess:
                sess.run(init)
                preds[de.get_model_mode()] = sess.run(pred)
        de.enable_train_mode()
    np.testing.assert_array_equal(preds["train"], preds["inference"])
    np.testing.assert_allclose(preds["train"], init_rows[:5] + 1.0, rtol=1e-6)


def test_keras_layer_in_inference_mode_reads_the_table():
    layer = de.keras.layers.Embedding(3, initializer=0.25, name="mode_layer")
    ids = tf.constant([[1, 2]], tf.int64)
    de.enable_inference_mode()
    with tf.GradientTape() as tape:
        out = layer(ids, training=True)
    np.testing.assert_array_equal(out.numpy(), np.full([1, 2, 3], 0.25, np.float32))
    # No trainable view was written, so a step has nothing to train.
    assert not layer.trainable_weights
    assert int(layer.params.size()) == 0
    del tape
