"""Embedding layers that reduce the looked-up rows: `SquashedEmbedding` (one row per
example) and `FieldWiseEmbedding` (one row per field of an example). See embedding.py
for what every layer shares."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import tensorflow as tf

from tensorflow_dynemb.keras import _config
from tensorflow_dynemb.keras.layers.embedding import Embedding, _register

__all__ = ["SquashedEmbedding", "FieldWiseEmbedding"]


@_register
class SquashedEmbedding(Embedding):
    """`Embedding` rows reduced to one row per example by `combiner`.

    For ids of shape `[batch, s1, ..., sn]` the output is `[batch, embedding_size]`: the
    rows of each example reduced over all their id axes; a 1-D `[n]` input is one
    example, reduced to `[embedding_size]`. `combiner` names a `tf.math.reduce_*`
    function: "sum" (default), "mean", "max", "min", "prod", "std", ...

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> layer = de.keras.layers.SquashedEmbedding(3, initializer=1.0, combiner="sum")
    >>> layer(tf.constant([[1, 2], [3, 3]], tf.int64)).numpy()
    array([[2., 2., 2.],
           [2., 2., 2.]], dtype=float32)
    """

    @staticmethod
    def _check_combiner(combiner: Any) -> None:
        _reduce_fn(combiner)

    def call(self, ids, training=None):
        rows = self._rows(ids, training)
        reduce = _reduce_fn(self.combiner)
        if rows.shape.rank == 2:  # one example of ids
            return reduce(rows, axis=0)
        return reduce(rows, axis=list(range(1, rows.shape.rank - 1)))

    def compute_output_shape(self, input_shape):
        shape = tf.TensorShape(input_shape).as_list()
        return (self.embedding_size,) if len(shape) == 1 else (shape[0], self.embedding_size)


@_register
class FieldWiseEmbedding(Embedding):
    """`Embedding` rows of each example reduced per field.

    `slot_map_fn(ids)` maps each id of the `[batch, n]` ids to its field in
    `[0, nslots)`; the rows of the ids of one field of one example are combined by
    `combiner` ("sum", "mean" or "sqrtn"; a field without ids is zeros). Output:
    `[batch, nslots, embedding_size]`.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> layer = de.keras.layers.FieldWiseEmbedding(
    ...     2, nslots=3, slot_map_fn=lambda ids: ids % 3, initializer=1.0)
    >>> layer(tf.constant([[23, 12, 0]], tf.int64)).numpy()
    array([[[2., 2.],
            [0., 0.],
            [1., 1.]]], dtype=float32)
    """

    def __init__(
        self,
        embedding_size: int,
        nslots: int,
        slot_map_fn: Optional[Callable] = None,
        key_dtype: Any = tf.int64,
        value_dtype: Any = tf.float32,
        combiner: str = "sum",
        initializer: Any = None,
        devices: Optional[List[str]] = None,
        name: Optional[str] = None,
        with_unique: bool = True,
        **kwargs,
    ):
        """Args as `Embedding`'s, and:

          nslots: the number of fields (>= 1).
          slot_map_fn: `fn(ids) -> fields`, element-wise, of the ids' shape. To save the
            layer in a Keras file, register it with
            `tf.keras.saving.register_keras_serializable()`.

        Raises:
          ValueError: `slot_map_fn` is not callable, `nslots` < 1, or `combiner` is not
            "sum", "mean" or "sqrtn".
        """
        if not callable(slot_map_fn):
            raise ValueError(f"`slot_map_fn` must be callable, got {slot_map_fn!r}.")
        try:
            nslots = int(nslots)
        except (TypeError, ValueError):
            raise TypeError(f"`nslots` must be convertible to int, got {nslots!r}.") from None
        if nslots < 1:
            raise ValueError(f"`nslots` must be >= 1, got {nslots}.")
        super().__init__(
            embedding_size,
            key_dtype=key_dtype,
            value_dtype=value_dtype,
            combiner=combiner,
            initializer=initializer,
            devices=devices,
            name=name,
            with_unique=with_unique,
            **kwargs,
        )
        self.nslots = nslots
        self.slot_map_fn = slot_map_fn

    @staticmethod
    def _check_combiner(combiner: Any) -> None:
        _segment_fn(combiner)

    def call(self, ids, training=None):
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank != 2:
            raise ValueError(
                f"FieldWiseEmbedding takes ids of shape [batch, n], got shape {ids.shape}."
            )
        rows = self._rows(tf.reshape(ids, [-1]), training)
        batch = tf.shape(ids, out_type=tf.int64)[0]
        fields = tf.cast(tf.reshape(self.slot_map_fn(ids), [-1]), tf.int64)
        # Output row of each id: its example's first row plus its field.
        example = tf.repeat(tf.range(batch), tf.shape(ids, out_type=tf.int64)[1])
        segments = example * self.nslots + fields
        pooled = _segment_fn(self.combiner)(rows, segments, batch * self.nslots)
        return tf.reshape(pooled, [-1, self.nslots, self.embedding_size])

    def compute_output_shape(self, input_shape):
        batch = tf.TensorShape(input_shape).as_list()[0]
        return (batch, self.nslots, self.embedding_size)

    def get_config(self):
        config = super().get_config()
        config["nslots"] = self.nslots
        config["slot_map_fn"] = _config.function_to_config(self.slot_map_fn)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["slot_map_fn"] = _config.function_from_config(
            config.get("slot_map_fn"), "slot_map_fn"
        )
        return super().from_config(config)


def _reduce_fn(combiner: Any) -> Callable:
    """`tf.math.reduce_<combiner>` (TFRA's SquashedEmbedding combiners)."""
    fn = getattr(tf.math, f"reduce_{combiner}", None) if isinstance(combiner, str) else None
    if not callable(fn):
        raise ValueError(
            f"`combiner` must name a tf.math.reduce_* function (\"sum\", \"mean\", \"max\", "
            f"\"min\", \"prod\", \"std\", ...), got {combiner!r}."
        )
    return fn


_SEGMENT_FNS = {
    "sum": tf.math.unsorted_segment_sum,
    "mean": tf.math.unsorted_segment_mean,
    "sqrtn": tf.math.unsorted_segment_sqrt_n,
    "sqrt_n": tf.math.unsorted_segment_sqrt_n,
}


def _segment_fn(combiner: Any) -> Callable:
    """The segment reduction of FieldWiseEmbedding's `combiner`."""
    fn = _SEGMENT_FNS.get(combiner) if isinstance(combiner, str) else None
    if fn is None:
        raise ValueError(
            f"`combiner` of FieldWiseEmbedding must be \"sum\", \"mean\" or \"sqrtn\", "
            f"got {combiner!r}."
        )
    return fn
