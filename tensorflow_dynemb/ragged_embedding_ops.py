"""`de.ragged_embedding_ops`: TFRA's namespace of sparse lookups over `tf.RaggedTensor`
ids (`embedding_lookup_sparse`, `safe_embedding_lookup_sparse`).

TFRA added these beside its `SparseTensor` lookups; `de.embedding_lookup_sparse` and
`de.safe_embedding_lookup_sparse` take 2-D `RaggedTensor` ids themselves (rows are
the ragged rows), so these functions are those, with TFRA's argument order for this
namespace (`embedding_lookup_sparse`'s fourth argument is `name`).
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from tensorflow_dynemb.variable import sparse_lookup

__all__ = ["embedding_lookup_sparse", "safe_embedding_lookup_sparse"]


def embedding_lookup_sparse(
    params: Any,
    sp_ids: tf.RaggedTensor,
    sp_weights: Optional[tf.RaggedTensor],
    name: str = "embedding_lookup_sparse",
    combiner: str = "mean",
) -> tf.Tensor:
    """`de.embedding_lookup_sparse(params, sp_ids, sp_weights, name=name,
    combiner=combiner)`: one combined row per row of the ragged `sp_ids`.

    Args:
      params: a `de.Variable`, or a trainable view of one (a
        `de.shadow_ops.ShadowVariable`).
      sp_ids: a 2-D `tf.RaggedTensor` of keys (a `tf.SparseTensor` works too).
      sp_weights: None (every weight 1) or a RaggedTensor of weights like `sp_ids`.
      name: a name for the operation.
      combiner: "mean" (default), "sum" or "sqrtn".

    Returns:
      A `[rows, dim]` tensor; a row without ids is zeros.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> v = de.Variable(tf.int64, tf.float32, dim=1)
    >>> v.upsert([1, 2], [[2.0], [4.0]])
    >>> ids = tf.ragged.constant([[1, 2], [2]], dtype=tf.int64)
    >>> de.ragged_embedding_ops.embedding_lookup_sparse(v, ids, None).numpy().tolist()
    [[3.0], [4.0]]
    """
    return sparse_lookup.embedding_lookup_sparse(
        params, sp_ids, sp_weights, name=name, combiner=combiner
    )


def safe_embedding_lookup_sparse(
    embedding_weights: Any,
    sparse_ids: tf.RaggedTensor,
    sparse_weights: Optional[tf.RaggedTensor] = None,
    combiner: str = "mean",
    default_id: Optional[Any] = None,
    name: Optional[str] = None,
) -> tf.Tensor:
    """`de.safe_embedding_lookup_sparse` with TFRA's arguments of this namespace: ids
    of non-positive weight are dropped (unless `combiner` is "sum"), and a row left
    without ids is the row of `default_id` (zeros when it is None).

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> v = de.Variable(tf.int64, tf.float32, dim=1)
    >>> v.upsert([0, 1], [[9.0], [2.0]])
    >>> ids = tf.ragged.constant([[1], []], dtype=tf.int64)
    >>> de.ragged_embedding_ops.safe_embedding_lookup_sparse(v, ids, default_id=0).numpy()
    array([[2.],
           [9.]], dtype=float32)
    """
    return sparse_lookup.safe_embedding_lookup_sparse(
        embedding_weights,
        sparse_ids,
        sparse_weights,
        combiner=combiner,
        default_id=default_id,
        name=name,
    )
