"""Lookups through a `ShadowVariable` (TFRA's `de.shadow_ops.embedding_lookup*`).

They build no state of their own (the shadow was made with the model), so they can be
traced by `tf.function` as often as needed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import tensorflow as tf

from tensorflow_dynemb._convert import TensorLike, convert
from tensorflow_dynemb.shadow_ops.shadow_variable import ShadowVariable, _clip

__all__ = ["embedding_lookup", "embedding_lookup_unique", "embedding_lookup_unique_base"]


def embedding_lookup(
    shadow: ShadowVariable,
    ids: TensorLike,
    partition_strategy: Optional[str] = None,
    name: Optional[str] = None,
    validate_indices: Any = None,
) -> Union[tf.Tensor, tf.RaggedTensor]:
    """The rows of `ids` in `shadow.params`, read through `shadow` so that
    `de.DynamicEmbeddingOptimizer` can train them (see `ShadowVariable`).

    Keys missing from the variable read its initializer and are not inserted (the
    optimizer step inserts the keys it updates).

    Args:
      shadow: a `de.shadow_ops.ShadowVariable`.
      ids: keys of any shape, of `shadow.params.key_dtype` (a tensor, anything
        convertible, or a `tf.RaggedTensor`).
      partition_strategy: ignored, for `tf.nn.embedding_lookup`'s signature.
      name: a name for the operation.
      validate_indices: ignored, as in `tf.nn.embedding_lookup`.

    Returns:
      `ids.shape + [dim]` rows of `shadow.params.value_dtype` (ragged for ragged
      `ids`), clipped by the shadow's `max_norm`.

    Raises:
      TypeError: `shadow` is not a ShadowVariable, or `ids` of another dtype than the
        variable's keys.
      NotImplementedError: called by the replicas of a `tf.distribute` strategy with
        several replicas.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> params = de.Variable(tf.int64, tf.float32, dim=2, initializer=0.5)
    >>> params.upsert([1], [[1.0, 2.0]])
    >>> shadow = de.shadow_ops.ShadowVariable(params)
    >>> de.shadow_ops.embedding_lookup(shadow, tf.constant([[1, 2]], tf.int64)).numpy()
    array([[[1. , 2. ],
            [0.5, 0.5]]], dtype=float32)
    """
    del partition_strategy, validate_indices  # see Args
    if not isinstance(shadow, ShadowVariable):
        raise TypeError(
            f"`shadow` must be a de.shadow_ops.ShadowVariable, got "
            f"{type(shadow).__name__}: {shadow!r:.200}"
        )
    with tf.name_scope(name or "shadow_embedding_lookup"):
        if isinstance(ids, tf.RaggedTensor):
            return ids.with_flat_values(embedding_lookup(shadow, ids.flat_values))
        ids = convert(ids, shadow.params.key_dtype, "ids")
        rows = shadow._lookup(tf.reshape(ids, [-1]))
        rows = tf.reshape(rows, tf.concat([tf.shape(ids), [shadow.params.dim]], 0))
        rows.set_shape(ids.shape.concatenate([shadow.params.dim]))
        return _clip(rows, shadow.max_norm)


def embedding_lookup_unique_base(
    ids: Union[TensorLike, tf.RaggedTensor],
    embedding_size: int,
    lookup_function: Callable[[tf.Tensor], tf.Tensor],
    with_unique: bool = True,
    name: Optional[str] = None,
) -> Union[tf.Tensor, tf.RaggedTensor]:
    """`lookup_function`'s rows of `ids` of any shape, looking each distinct id up once
    (`with_unique`), in the shape `ids.shape + [embedding_size]`.

    Args:
      ids: ids of any shape, or a `tf.RaggedTensor`.
      embedding_size: the size of a row.
      lookup_function: `fn(1-D ids) -> [n, embedding_size] rows`.
      with_unique: look each distinct id up once (`tf.unique`) and gather the rows
        back; False: look every id up.
      name: a name for the operation.

    Returns:
      The rows, `ids.shape + [embedding_size]` (ragged like a ragged `ids`).

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> table = tf.constant([[0.0], [10.0], [20.0]])
    >>> de.shadow_ops.embedding_lookup_unique_base(
    ...     tf.constant([[2, 1], [2, 2]]), 1, lambda i: tf.gather(table, i)).numpy()[..., 0]
    array([[20., 10.],
           [20., 20.]], dtype=float32)
    """
    with tf.name_scope(name or "embedding_lookup_unique"):
        if isinstance(ids, tf.RaggedTensor):
            flat = ids.flat_values
            rows = embedding_lookup_unique_base(flat, embedding_size, lookup_function, with_unique)
            return ids.with_flat_values(rows)
        ids = tf.convert_to_tensor(ids)
        flat = tf.reshape(ids, [-1])
        if with_unique:
            unique_ids, index = tf.unique(flat)
            rows = tf.gather(lookup_function(unique_ids), index)
        else:
            rows = lookup_function(flat)
        shape = tf.concat([tf.shape(ids), [embedding_size]], 0)
        rows = tf.reshape(rows, shape)
        if isinstance(embedding_size, int):
            rows.set_shape(ids.shape.concatenate([embedding_size]))
        return rows


def embedding_lookup_unique(
    shadow: ShadowVariable,
    ids: Union[TensorLike, tf.RaggedTensor],
    embedding_size: int,
    with_unique: bool = True,
    name: Optional[str] = None,
) -> Union[tf.Tensor, tf.RaggedTensor]:
    """`embedding_lookup(shadow, ids)` for ids of any shape or ragged, each distinct id
    looked up once with `with_unique` (see `embedding_lookup_unique_base`).

    Args:
      shadow: a `de.shadow_ops.ShadowVariable`.
      ids: keys of `shadow.params.key_dtype`, any shape, or a `tf.RaggedTensor`.
      embedding_size: the size of a row; must be `shadow.params.dim`.
      with_unique: look each distinct id up once.
      name: a name for the operation.

    Returns:
      The rows, `ids.shape + [embedding_size]` (ragged like a ragged `ids`).

    Raises:
      ValueError: `embedding_size` is not the variable's dim.
      TypeError: as `embedding_lookup`.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> params = de.Variable(tf.int64, tf.float32, dim=1, initializer=0.0)
    >>> params.upsert([7], [[7.0]])
    >>> shadow = de.shadow_ops.ShadowVariable(params)
    >>> ids = tf.ragged.constant([[7, 7], [1]], dtype=tf.int64)
    >>> de.shadow_ops.embedding_lookup_unique(shadow, ids, 1).to_list()
    [[[7.0], [7.0]], [[0.0]]]
    """
    if not isinstance(shadow, ShadowVariable):
        raise TypeError(
            f"`shadow` must be a de.shadow_ops.ShadowVariable, got "
            f"{type(shadow).__name__}: {shadow!r:.200}"
        )
    if isinstance(embedding_size, int) and embedding_size != shadow.params.dim:
        raise ValueError(
            f"`embedding_size` must be the dim of the shadow's de.Variable "
            f"({shadow.params.dim}), got {embedding_size}."
        )
    return embedding_lookup_unique_base(
        ids, embedding_size, lambda flat: embedding_lookup(shadow, flat), with_unique, name
    )
