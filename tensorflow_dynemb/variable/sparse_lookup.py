"""`embedding_lookup_sparse` and `safe_embedding_lookup_sparse` on a `de.Variable` (see
lookup.py's docstring): sparse or ragged ids become segments, whose looked-up rows are
combined (summed, averaged or `sqrtn`-scaled) per row of the ids."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from tensorflow_dynemb._convert import TensorLike, convert
from tensorflow_dynemb.variable.lookup import _as_variable, _check_options, _unique_rows, _view_name
from tensorflow_dynemb.variable.variable import Variable

__all__ = ["embedding_lookup_sparse", "safe_embedding_lookup_sparse"]

SparseIds = Union[tf.SparseTensor, tf.RaggedTensor]

# ---------------------------------------------------------------------------------------
# Sparse ids as segments, and the segment combine
# ---------------------------------------------------------------------------------------


class _Segments(NamedTuple):
    """Sparse ids flattened: output row `segment_ids[i]` receives `ids[i]`."""

    ids: tf.Tensor  # [n] keys
    segment_ids: tf.Tensor  # [n] int32/int64 output rows
    weights: Optional[tf.Tensor]  # [n] floating weights, or None for all ones
    num_segments: tf.Tensor  # scalar: the number of output rows

    def keep(self, mask: tf.Tensor) -> "_Segments":
        """Only the entries where `mask` is true."""
        return _Segments(
            tf.boolean_mask(self.ids, mask),
            tf.boolean_mask(self.segment_ids, mask),
            None if self.weights is None else tf.boolean_mask(self.weights, mask),
            self.num_segments,
        )


def _check_ragged(value: tf.RaggedTensor, arg: str) -> None:
    if value.shape.rank != 2:
        raise ValueError(
            f"`{arg}` must be a 2-D RaggedTensor ([rows, (ids)]), got one of shape {value.shape}."
        )


def _weight_values(sp_ids: SparseIds, sp_weights: Any, ids_arg: str, arg: str):
    """The `[n]` values of `sp_weights` (None or the same structure as `sp_ids`)."""
    if sp_weights is None:
        return None
    if type(sp_weights) is not type(sp_ids):
        raise TypeError(
            f"`{arg}` must be None or a {type(sp_ids).__name__} like `{ids_arg}`, "
            f"got {type(sp_weights).__name__}."
        )
    if isinstance(sp_weights, tf.RaggedTensor):
        _check_ragged(sp_weights, arg)
    values = sp_weights.values
    if not values.dtype.is_floating:
        raise TypeError(f"`{arg}` must hold floating-point weights, got {values.dtype.name}.")
    if not values.shape.is_compatible_with(sp_ids.values.shape):
        raise ValueError(
            f"`{arg}` must have one weight per id of `{ids_arg}`: got {values.shape[0]} "
            f"weights for {sp_ids.values.shape[0]} ids."
        )
    return values


def _segments(
    params: Variable,
    sp_ids: Any,
    sp_weights: Any,
    ids_arg: str,
    weights_arg: str,
    rows_over_all_but_last: bool,
) -> _Segments:
    """`sp_ids` / `sp_weights` as segments, validated before any op is built.

    A SparseTensor's output row is its first index (`tf.nn.embedding_lookup_sparse`),
    or with `rows_over_all_but_last` its indices but the last, in row-major order
    (`tf.nn.safe_embedding_lookup_sparse` on ids of rank > 2). A RaggedTensor must be
    2-D; its output rows are its rows.
    """
    if not isinstance(sp_ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(
            f"`{ids_arg}` must be a tf.SparseTensor or a 2-D tf.RaggedTensor, "
            f"got {type(sp_ids).__name__}: {sp_ids!r:.200}"
        )
    if isinstance(sp_ids, tf.RaggedTensor):
        _check_ragged(sp_ids, ids_arg)
    ids = convert(sp_ids.values, params.key_dtype, ids_arg)
    weights = _weight_values(sp_ids, sp_weights, ids_arg, weights_arg)

    if isinstance(sp_ids, tf.RaggedTensor):
        return _Segments(ids, sp_ids.value_rowids(), weights, sp_ids.nrows())
    if rows_over_all_but_last:
        shape = sp_ids.dense_shape
        rows = tf.reduce_prod(shape[:-1])
        sp_ids = tf.sparse.reshape(sp_ids, tf.stack([rows, shape[-1]]))
        return _Segments(ids, sp_ids.indices[:, 0], weights, rows)
    return _Segments(ids, sp_ids.indices[:, 0], weights, sp_ids.dense_shape[0])


def _combine(
    params: Variable,
    segments: _Segments,
    combiner: str,
    max_norm: Any,
    return_trainable: bool,
    name: str,
) -> Tuple[tf.Tensor, Any]:
    """`[num_segments, dim]`: per segment, its rows times their weights, combined.

    "sum": the weighted sum; "mean": divided by the sum of the weights; "sqrtn":
    divided by the square root of the sum of the squared weights. A segment without
    ids (or whose divisor is 0) is zeros. float16 / bfloat16 rows are combined in
    float32, as `tf.nn.embedding_lookup_sparse` does.
    """
    rows, trainable = _unique_rows(params, segments.ids, max_norm, return_trainable, name)
    compute_dtype = tf.float32 if rows.dtype in (tf.float16, tf.bfloat16) else rows.dtype
    rows = tf.cast(rows, compute_dtype)
    if segments.weights is None:
        weights = tf.ones(tf.shape(segments.ids), compute_dtype)
    else:
        weights = tf.cast(segments.weights, compute_dtype)

    def segment_sum(data: tf.Tensor) -> tf.Tensor:
        return tf.math.unsorted_segment_sum(data, segments.segment_ids, segments.num_segments)

    combined = segment_sum(rows * weights[:, tf.newaxis])
    if combiner == "mean":
        combined = tf.math.divide_no_nan(combined, segment_sum(weights)[:, tf.newaxis])
    elif combiner == "sqrtn":
        norm = tf.sqrt(segment_sum(tf.square(weights)))
        combined = tf.math.divide_no_nan(combined, norm[:, tf.newaxis])
    combined = tf.cast(combined, params.value_dtype)
    combined.set_shape([None, params.dim])
    return combined, trainable


def _prune_non_positive_weights(segments: _Segments) -> _Segments:
    """Drops the entries of weight <= 0, as `tf.nn.safe_embedding_lookup_sparse` does.

    Unlike tf.nn, no id is pruned for its value: a dense table's negative *indices* are
    invalid, but every key of a hash table is valid, and hashed feature ids are often
    negative (TFRA keeps them too).
    """
    if segments.weights is None:
        return segments
    return segments.keep(segments.weights > 0)


def _fill_empty_rows(segments: _Segments, default_id: tf.Tensor) -> _Segments:
    """Gives every segment without ids the one id `default_id` (weight 1)."""
    counts = tf.math.unsorted_segment_sum(
        tf.ones_like(segments.segment_ids), segments.segment_ids, segments.num_segments
    )
    empty = tf.cast(tf.where(tf.equal(counts, 0))[:, 0], segments.segment_ids.dtype)
    num_empty = tf.shape(empty)[0]
    weights = segments.weights
    if weights is not None:
        weights = tf.concat([weights, tf.ones([num_empty], weights.dtype)], 0)
    return _Segments(
        tf.concat([segments.ids, tf.fill([num_empty], default_id)], 0),
        tf.concat([segments.segment_ids, empty], 0),
        weights,
        segments.num_segments,
    )



def embedding_lookup_sparse(
    params: Variable,
    sp_ids: SparseIds,
    sp_weights: Optional[SparseIds],
    partition_strategy: Optional[str] = None,
    name: Optional[str] = None,
    combiner: str = "mean",
    max_norm: Optional[float] = None,
    return_trainable: bool = False,
):
    """One combined row per row of `sp_ids`, as `tf.nn.embedding_lookup_sparse`.

    Output row `r` combines the rows of the ids in row `r` of `sp_ids`, each times its
    weight: "sum" is the weighted sum, "mean" that sum divided by the sum of the
    weights, "sqrtn" divided by the square root of the sum of the squared weights.
    A row without ids is zeros. Unlike `tf.nn.embedding_lookup_sparse`, whose result
    ends at the last row that has an id, the result always has one row per row of
    `sp_ids` (`dense_shape[0]`, or `nrows()`). A SparseTensor of rank > 2 combines
    all ids of the same first index, as in `tf.nn`; its indices need not be ordered.

    Args:
      params: a `de.Variable` (or a list holding one) of a floating value dtype.
      sp_ids: a `tf.SparseTensor` (`[rows, ...]`) or 2-D `tf.RaggedTensor` of keys of
        `params.key_dtype`.
      sp_weights: None (every weight 1) or the same kind of tensor as `sp_ids` with one
        floating weight per id.
      partition_strategy: ignored (the variable routes keys to its shards itself).
      name: a name for the operation.
      combiner: "mean" (default), "sum" or "sqrtn".
      max_norm: if not None, each row is clipped to this L2 norm before combining.
      return_trainable: also return the trainable view of the rows (a `tf.Variable`
        to hand to an optimizer; see the module docstring).

    Returns:
      A `[rows, params.dim]` tensor of `params.value_dtype`.

    Raises:
      TypeError: `params` is not a `de.Variable` or not floating, `sp_ids` is neither a
        SparseTensor nor a RaggedTensor or holds keys of another dtype, `sp_weights`
        is not None nor like `sp_ids` or not floating.
      ValueError: an unknown `combiner`, a RaggedTensor that is not 2-D, weights that do
        not match the ids, or `max_norm` <= 0.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> v = de.Variable(tf.int64, tf.float32, dim=2)
    >>> v.upsert([7, 8], [[1.0, 2.0], [3.0, 6.0]])
    >>> ids = tf.ragged.constant([[7, 8], [], [8]], dtype=tf.int64)
    >>> de.embedding_lookup_sparse(v, ids, None, combiner="mean").numpy()
    array([[2., 4.],
           [0., 0.],
           [3., 6.]], dtype=float32)
    """
    del partition_strategy  # ignored, see Args
    trainable_name = _view_name(params, name or "embedding_lookup_sparse")
    params = _as_variable(params, "params")
    _check_options(params, max_norm, combiner)
    with tf.name_scope(name or "embedding_lookup_sparse"):
        segments = _segments(
            params, sp_ids, sp_weights, "sp_ids", "sp_weights", rows_over_all_but_last=False
        )
        result, trainable = _combine(
            params, segments, combiner, max_norm, return_trainable, trainable_name
        )
    return (result, trainable) if return_trainable else result


def safe_embedding_lookup_sparse(
    embedding_weights: Variable,
    sparse_ids: SparseIds,
    sparse_weights: Optional[SparseIds] = None,
    combiner: str = "mean",
    default_id: Optional[TensorLike] = None,
    name: Optional[str] = None,
    partition_strategy: Optional[str] = "div",
    max_norm: Optional[float] = None,
    return_trainable: bool = False,
):
    """`embedding_lookup_sparse` that skips non-positive weights and fills empty rows,
    as `tf.nn.safe_embedding_lookup_sparse`.

    Pruned before combining, unless `combiner` is "sum": ids whose weight is <= 0, as
    `tf.nn` does. Every id is a valid key, negative ones included (tf.nn prunes
    negative *indices* of a dense table; a hash table reserves no key). A row left
    without ids is the row of `default_id` (clipped by `max_norm`), or zeros when
    `default_id` is None. A SparseTensor may have any rank >= 1: ids are combined along
    the last dimension, so the result has shape `dense_shape[:-1] + [dim]`.

    Args:
      embedding_weights: a `de.Variable` (or a list holding one) of a floating value
        dtype.
      sparse_ids: a `tf.SparseTensor` of any rank, or a 2-D `tf.RaggedTensor`, of keys
        of `embedding_weights.key_dtype`.
      sparse_weights: None (every weight 1) or the same kind of tensor as `sparse_ids`
        with one floating weight per id.
      combiner: "mean" (default), "sum" or "sqrtn".
      default_id: a scalar key whose row fills empty rows; None: zeros.
      name: a name for the operation.
      partition_strategy: ignored (the variable routes keys to its shards itself).
      max_norm: if not None, each row is clipped to this L2 norm before combining.
      return_trainable: also return the trainable view of the rows (a `tf.Variable`
        to hand to an optimizer; see the module docstring).

    Returns:
      A tensor of shape `sparse_ids.dense_shape[:-1] + [dim]` (RaggedTensor:
      `[nrows, dim]`) and dtype `embedding_weights.value_dtype`.

    Raises:
      TypeError: as `embedding_lookup_sparse`, or `default_id` of another dtype.
      ValueError: as `embedding_lookup_sparse`, or a `default_id` that is not a scalar.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> v = de.Variable(tf.int64, tf.float32, dim=1)
    >>> v.upsert([0, 5, -3], [[10.0], [4.0], [2.0]])
    >>> indices = [[0, 0], [0, 1], [1, 0]]
    >>> ids = tf.SparseTensor(indices, tf.constant([5, -3, 5], tf.int64), dense_shape=[3, 2])
    >>> weights = tf.SparseTensor(indices, [1.0, 1.0, 0.0], dense_shape=[3, 2])
    >>> de.safe_embedding_lookup_sparse(v, ids, weights, default_id=0).numpy()
    array([[ 3.],
           [10.],
           [10.]], dtype=float32)
    """
    del partition_strategy  # ignored, see Args
    trainable_name = _view_name(embedding_weights, name or "safe_embedding_lookup_sparse")
    params = _as_variable(embedding_weights, "embedding_weights")
    _check_options(params, max_norm, combiner)
    with tf.name_scope(name or "safe_embedding_lookup_sparse"):
        if default_id is not None:
            default_id = convert(default_id, params.key_dtype, "default_id")
            if default_id.shape.rank != 0:
                raise ValueError(
                    f"`default_id` must be a scalar key, got shape {default_id.shape}."
                )
        segments = _segments(
            params,
            sparse_ids,
            sparse_weights,
            "sparse_ids",
            "sparse_weights",
            rows_over_all_but_last=True,
        )
        if combiner != "sum":
            segments = _prune_non_positive_weights(segments)
        if default_id is not None:
            segments = _fill_empty_rows(segments, default_id)
        result, trainable = _combine(
            params, segments, combiner, max_norm, return_trainable, trainable_name
        )
        if isinstance(sparse_ids, tf.SparseTensor):
            dim = tf.constant([params.dim], tf.int64)
            result = tf.reshape(result, tf.concat([sparse_ids.dense_shape[:-1], dim], 0))
            if sparse_ids.shape.rank is not None:
                result.set_shape(sparse_ids.shape[:-1].concatenate([params.dim]))
    return (result, trainable) if return_trainable else result
