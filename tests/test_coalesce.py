"""Coalesced tables: several features in one de.Variable with their ids kept apart
(`de.feature_keys`, `de.keras.layers.CoalescedEmbedding`)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de


@pytest.mark.parametrize("num_features", [1, 2, 3, 26, 1000])
def test_int64_keys_round_trip_and_stay_apart(num_features):
    bits = 64 - max(1, (num_features - 1).bit_length())
    ids = tf.constant([0, 1, -1, 12345, 2 ** (bits - 1) - 1, -(2 ** (bits - 1))], tf.int64)
    all_keys = []
    for feature in sorted({0, num_features // 2, num_features - 1}):
        keys = de.feature_keys(ids, feature, num_features)
        assert keys.dtype == tf.int64 and keys.shape == ids.shape
        features, back = de.split_feature_keys(keys, num_features, tf.int64)
        assert features.numpy().tolist() == [feature] * 6
        assert back.numpy().tolist() == ids.numpy().tolist()
        all_keys += keys.numpy().tolist()
    assert len(set(all_keys)) == len(all_keys)  # no (feature, id) pair shares a key


def test_int32_and_string_keys_are_exact():
    ids = tf.constant([[0, -1], [2**31 - 1, -(2**31)]], tf.int32)
    keys = de.feature_keys(ids, 5, 6)
    assert keys.dtype == tf.int64 and keys.shape == [2, 2]
    features, back = de.split_feature_keys(keys, 6, tf.int32)
    np.testing.assert_array_equal(back.numpy(), ids.numpy())
    np.testing.assert_array_equal(features.numpy(), np.full([2, 2], 5))

    words = tf.constant([b"", b"abc", b"\x00\x01\xff"])
    keys = de.feature_keys(words, 70000, 70001)
    features, back = de.split_feature_keys(keys, 70001, tf.string)
    assert back.numpy().tolist() == words.numpy().tolist()
    assert features.numpy().tolist() == [70000] * 3
    other = de.feature_keys(words, 1, 70001)
    assert not set(keys.numpy().tolist()) & set(other.numpy().tolist())


def test_ids_that_do_not_fit_fail_instead_of_sharing_rows():
    too_big = tf.constant([3, 2**62], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1: an id does not fit"):
        de.feature_keys(too_big, 1, 3)
    traced = tf.function(lambda ids: de.feature_keys(ids, 0, 3))
    with pytest.raises(tf.errors.InvalidArgumentError, match="4611686018427387904"):
        traced(too_big)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"`feature` must be in \[0, num_features\)"):
        de.feature_keys([1], 2, 2)
    with pytest.raises(ValueError, match="`num_features` must be >= 1"):
        de.feature_keys([1], 0, 0)
    with pytest.raises(TypeError, match="int32, int64 or string"):
        de.feature_keys(tf.constant([1.0]), 0, 1)
    with pytest.raises(TypeError, match="`keys` of int32 ids must be int64"):
        de.split_feature_keys(tf.constant([1], tf.int32), 2, tf.int32)


def _models(initializer=0.1):
    """The same model twice: one table per feature, and one coalesced table."""
    user = tf.keras.Input(shape=(1,), dtype="int64")
    items = tf.keras.Input(shape=(2,), dtype="int64")

    def head(user_rows, item_rows):
        x = tf.keras.layers.Concatenate(axis=1)([user_rows, item_rows])
        out = tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")(
            tf.keras.layers.Flatten()(x)
        )
        return tf.keras.Model([user, items], out)

    separate = head(
        de.keras.layers.Embedding(3, initializer=initializer, name="user")(user),
        de.keras.layers.Embedding(3, initializer=initializer, name="item")(items),
    )
    layer = de.keras.layers.CoalescedEmbedding(3, num_features=2, initializer=initializer,
                                               name="coalesced")
    coalesced = head(*layer([user, items]))
    return separate, coalesced, layer


def test_coalesced_layer_trains_like_one_table_per_feature():
    separate, coalesced, layer = _models()
    users = np.array([[7], [8], [7], [9]], np.int64)
    items = np.array([[7, 1], [2, 7], [1, 1], [8, 9]], np.int64)  # id 7 in both features
    labels = np.array([[1.0], [0.0], [1.0], [0.5]], np.float32)
    for model in (separate, coalesced):
        model.compile(optimizer=tf.keras.optimizers.Adam(0.1), loss="mse")
        model.fit([users, items], labels, batch_size=2, epochs=3, shuffle=False, verbose=0)
    np.testing.assert_allclose(coalesced.predict([users, items], verbose=0),
                               separate.predict([users, items], verbose=0), rtol=1e-6)
    user_table = separate.get_layer("user").params
    item_table = separate.get_layer("item").params
    assert int(layer.params.size()) == int(user_table.size()) + int(item_table.size()) == 3 + 5
    seven = tf.constant([7], tf.int64)
    np.testing.assert_allclose(
        de.embedding_lookup(layer.params, de.feature_keys(seven, 0, 2)).numpy(),
        user_table.lookup(seven).numpy(), rtol=1e-6)
    np.testing.assert_allclose(
        de.embedding_lookup(layer.params, de.feature_keys(seven, 1, 2)).numpy(),
        item_table.lookup(seven).numpy(), rtol=1e-6)


def test_coalesced_layer_saves_and_loads(tmp_path):
    _, coalesced, _ = _models()
    coalesced.compile(optimizer="adam", loss="mse")
    x = [np.array([[7]], np.int64), np.array([[7, 3]], np.int64)]
    coalesced.fit(x, np.ones([1, 1], np.float32), verbose=0)
    path = str(tmp_path / "coalesced.keras")
    coalesced.save(path)
    loaded = tf.keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), coalesced.predict(x, verbose=0))
    assert loaded.get_layer("coalesced").num_features == 2


def test_coalesced_layer_checks_its_inputs():
    layer = de.keras.layers.CoalescedEmbedding(2, num_features=2)
    with pytest.raises(ValueError, match="num_features=2 id tensors, got 1"):
        layer([tf.constant([1], tf.int64)])
    with pytest.raises(TypeError, match="Feature 1 .*must be int64"):
        layer([tf.constant([1], tf.int64), tf.constant([1], tf.int32)])
