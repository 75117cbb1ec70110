"""`CoalescedEmbedding`: one table for several features, their ids kept apart (RecIS's
coalesced tables; the keys are built by `de.feature_keys`, variable/coalesce.py).

Every feature's ids are looked up in one call: one deduplication and one table lookup
per step for all of them, instead of one per feature, and one table to size, shard,
restrict and save. See embedding.py for what every layer shares (training through the
wrapped optimizer, saving).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tensorflow_dynemb._convert import check_int
from tensorflow_dynemb.keras.layers.embedding import Embedding, _register
from tensorflow_dynemb.variable.coalesce import coalesced_key_dtype, feature_keys

__all__ = ["CoalescedEmbedding"]


@_register
class CoalescedEmbedding(Embedding):
    """The rows of `num_features` features' ids from one table, each feature's ids
    kept apart (the same id in two features has two rows).

    Called on a list of `num_features` id tensors (any shapes), returns the list of
    their rows, `ids[i].shape + [embedding_size]`. `key_dtype` is the ids' dtype; the
    table's keys are int64 for integer ids and strings for string ids (see
    `de.feature_keys` for the encoding, and the id range int64 ids must fit in).
    Every other argument is `Embedding`'s.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> user = tf.keras.Input(shape=(1,), dtype="int64")
    >>> items = tf.keras.Input(shape=(3,), dtype="int64")
    >>> layer = de.keras.layers.CoalescedEmbedding(4, num_features=2, name="ids")
    >>> user_rows, item_rows = layer([user, items])
    >>> item_rows.shape
    (None, 3, 4)
    """

    def __init__(self, embedding_size: int, num_features: int, key_dtype: Any = tf.int64,
                 **kwargs):
        self.num_features = check_int(num_features, "num_features", 1)
        self.id_dtype = tf.as_dtype(key_dtype)
        super().__init__(embedding_size, key_dtype=coalesced_key_dtype(self.id_dtype), **kwargs)

    def call(self, ids, training=None):
        ids = list(ids) if isinstance(ids, (list, tuple)) else [ids]
        if len(ids) != self.num_features:
            raise ValueError(
                f"{type(self).__name__} {self.name!r} takes a list of num_features="
                f"{self.num_features} id tensors, got {len(ids)}."
            )
        keys = []
        for feature, feature_ids in enumerate(ids):
            if tf.as_dtype(feature_ids.dtype) != self.id_dtype:
                raise TypeError(
                    f"Feature {feature} of {self.name!r}: ids must be {self.id_dtype.name} "
                    f"(`key_dtype`), got {tf.as_dtype(feature_ids.dtype).name}."
                )
            keys.append(feature_keys(feature_ids, feature, self.num_features))
        flat = tf.concat([tf.reshape(k, [-1]) for k in keys], 0)
        rows = self._rows(flat, training)
        parts = tf.split(rows, [tf.size(k) for k in keys], num=len(keys))
        out = []
        for part, feature_ids in zip(parts, ids):
            shaped = tf.reshape(part, tf.concat([tf.shape(feature_ids), [self.embedding_size]], 0))
            shaped.set_shape(feature_ids.shape.concatenate([self.embedding_size]))
            out.append(shaped)
        return out

    def compute_output_shape(self, input_shape):
        return [tuple(tf.TensorShape(s).as_list()) + (self.embedding_size,) for s in input_shape]

    def get_config(self):
        config = super().get_config()
        config.update({"num_features": self.num_features, "key_dtype": self.id_dtype.name})
        return config
