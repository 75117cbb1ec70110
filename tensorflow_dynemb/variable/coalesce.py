"""Coalesced tables: several features in one `de.Variable`, their ids kept apart.

RecIS coalesces the tables of features that share a row size into one physical table,
so that a step looks all of them up with one call. Here the features share one
`de.Variable`; each feature's ids become keys that carry the feature's index, so the
same id in two features has two rows:

- int32 ids: `key = feature << 32 | (id as uint32)` in an int64 table. Exact for every
  int32 id and up to 2**31 features.
- int64 ids: the top `feature_bits` bits of the key hold the feature index (the
  fewest bits that count `num_features`), the other `64 - feature_bits` the id, which
  must fit in them as a signed number (`[-2**(63 - feature_bits), 2**(63 -
  feature_bits))`): an id outside that range fails with InvalidArgumentError naming
  the feature, instead of sharing a row with another id. Hash wider ids into that
  range first (`tf.bitwise.bitwise_and` of a hash), knowing that two ids may then meet.
- string ids: a 4-byte big-endian feature index in front of the id's bytes, in a
  string table. Exact for every id.

`split_feature_keys` inverts the encoding (for exports and inspection). Feature
indices are part of the keys: keep each feature's index stable across model versions.

Example:

>>> import tensorflow as tf
>>> import tensorflow_dynemb as de
>>> emb = de.Variable(tf.int64, tf.float32, dim=2, initializer=0.0)
>>> user = de.feature_keys(tf.constant([7, 8], tf.int64), feature=0, num_features=2)
>>> item = de.feature_keys(tf.constant([7], tf.int64), feature=1, num_features=2)
>>> emb.upsert(user, [[1.0, 1.0], [2.0, 2.0]])
>>> de.embedding_lookup(emb, item).numpy()  # item 7 is not user 7
array([[0., 0.]], dtype=float32)
>>> features, ids = de.split_feature_keys(user, num_features=2, id_dtype=tf.int64)
>>> features.numpy().tolist(), ids.numpy().tolist()
([0, 0], [7, 8])
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf

from tensorflow_dynemb._convert import TensorLike, check_int

__all__ = ["feature_keys", "split_feature_keys", "coalesced_key_dtype"]

_FEATURE_PREFIX_BYTES = 4


def _feature_bits(num_features: int) -> int:
    """The fewest bits that hold every feature index (at least 1)."""
    return max(1, (num_features - 1).bit_length())


def _check_feature(feature: int, num_features: int) -> Tuple[int, int]:
    num_features = check_int(num_features, "num_features", 1)
    feature = check_int(feature, "feature", 0)
    if feature >= num_features:
        raise ValueError(
            f"`feature` must be in [0, num_features) = [0, {num_features}), got {feature}."
        )
    return feature, num_features


def coalesced_key_dtype(id_dtype: tf.dtypes.DType) -> tf.dtypes.DType:
    """The key dtype of the table that holds coalesced ids of `id_dtype`: int64 for
    integer ids, string for string ids."""
    id_dtype = tf.as_dtype(id_dtype)
    if id_dtype in (tf.int32, tf.int64):
        return tf.int64
    if id_dtype == tf.string:
        return tf.string
    raise TypeError(f"`ids` must be int32, int64 or string, got {id_dtype.name}.")


def _prefix(feature: int) -> bytes:
    return feature.to_bytes(_FEATURE_PREFIX_BYTES, "big")


def feature_keys(ids: TensorLike, feature: int, num_features: int) -> tf.Tensor:
    """The keys of feature `feature`'s `ids` (any shape) in a table coalescing
    `num_features` features (see the module docstring).

    Args:
      ids: int32, int64 or string ids of any shape.
      feature: this feature's index, in `[0, num_features)`.
      num_features: how many features share the table (fixes the int64 layout).

    Returns:
      Keys of `ids.shape`: int64 for integer ids, string for string ids.

    Raises:
      TypeError / ValueError: a bad dtype, `feature` or `num_features`.
      tf.errors.InvalidArgumentError: an int64 id that does not fit beside the
        feature index (at run time, naming the feature).
    """
    feature, num_features = _check_feature(feature, num_features)
    ids = tf.convert_to_tensor(ids)
    coalesced_key_dtype(ids.dtype)  # checks the dtype
    with tf.name_scope(f"feature_keys_{feature}"):
        if ids.dtype == tf.string:
            return tf.strings.join([tf.constant(_prefix(feature)), ids])
        if ids.dtype == tf.int32:
            low = tf.bitwise.bitwise_and(tf.cast(ids, tf.int64), 0xFFFFFFFF)
            return tf.bitwise.bitwise_or(tf.constant(feature << 32, tf.int64), low)
        bits = 64 - _feature_bits(num_features)
        limit = 1 << (bits - 1)
        fits = tf.logical_and(ids >= -limit, ids < limit)
        check = tf.debugging.Assert(
            tf.reduce_all(fits),
            [
                f"feature {feature}: an id does not fit in the {bits} bits a table of "
                f"{num_features} coalesced features keeps for ids (signed range "
                f"[-2**{bits - 1}, 2**{bits - 1})); hash ids into that range first. "
                "First ids out of range:",
                tf.boolean_mask(ids, tf.logical_not(fits)),
            ],
            summarize=5,
        )
        with tf.control_dependencies([check]):
            low = tf.bitwise.bitwise_and(ids, tf.constant((1 << bits) - 1, tf.int64))
        # The feature index in the top bits, as a signed int64.
        high = feature << bits
        high = high - (1 << 64) if high >= 1 << 63 else high
        return tf.bitwise.bitwise_or(tf.constant(high, tf.int64), low)


def split_feature_keys(
    keys: TensorLike, num_features: int, id_dtype: tf.dtypes.DType = tf.int64
) -> Tuple[tf.Tensor, tf.Tensor]:
    """`(feature indices int32, ids of id_dtype)` of keys made by `feature_keys`.

    Args:
      keys: int64 or string keys of any shape.
      num_features: as given to `feature_keys`.
      id_dtype: the dtype of the original ids (int32, int64 or string).
    """
    num_features = check_int(num_features, "num_features", 1)
    keys = tf.convert_to_tensor(keys)
    id_dtype = tf.as_dtype(id_dtype)
    if keys.dtype != coalesced_key_dtype(id_dtype):
        raise TypeError(
            f"`keys` of {id_dtype.name} ids must be {coalesced_key_dtype(id_dtype).name}, "
            f"got {keys.dtype.name}."
        )
    if id_dtype == tf.string:
        prefix = tf.strings.substr(keys, 0, _FEATURE_PREFIX_BYTES)
        raw = tf.io.decode_raw(prefix, tf.uint8, fixed_length=_FEATURE_PREFIX_BYTES)
        weights = tf.constant([1 << 24, 1 << 16, 1 << 8, 1], tf.int32)
        features = tf.reduce_sum(tf.cast(raw, tf.int32) * weights, axis=-1)
        return features, tf.strings.substr(keys, _FEATURE_PREFIX_BYTES, -1)
    if id_dtype == tf.int32:
        features = tf.cast(tf.bitwise.right_shift(keys, 32), tf.int32)
        return features, tf.cast(tf.cast(keys, tf.uint32), tf.int32)
    bits = 64 - _feature_bits(num_features)
    features = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(keys, bits), (1 << (64 - bits)) - 1
    )
    # Sign-extend the id from its `bits` bits.
    ids = tf.bitwise.right_shift(tf.bitwise.left_shift(keys, 64 - bits), 64 - bits)
    return tf.cast(features, tf.int32), ids
