"""Embedding lookups on a `de.Variable`: `tf.nn.embedding_lookup*` over hash tables.

Four functions, named and behaving as their `tf.nn` (and TFRA) counterparts, with a
`de.Variable` in place of a dense embedding matrix and keys of the variable's
`key_dtype` in place of row indices:

- `embedding_lookup(params, ids)`: the rows of `ids` (any shape);
- `embedding_lookup_unique(params, ids)`: the same, looking each distinct id up once;
- `embedding_lookup_sparse(params, sp_ids, sp_weights, combiner)`: one combined
  (summed, averaged or `sqrtn`-scaled) row per row of a 2-D `tf.SparseTensor` or
  `tf.RaggedTensor` of ids;
- `safe_embedding_lookup_sparse(...)`: the same after pruning non-positive weights,
  with a `default_id` for rows left empty and ids of any rank (negative ids are valid
  keys, as in TFRA).

Keys missing from the variable read its initializer (and are not inserted). `max_norm`
clips each looked-up row to that L2 norm before combining, as `tf.nn` does.
`partition_strategy` and `validate_indices` are accepted for compatibility and ignored:
a `de.Variable` routes keys to its shards itself, and any key may be looked up.

Every function fetches rows through `_lookup_rows`, the one place that hands out a
trainable view of the rows: with `return_trainable=True` a function returns
`(result, trainable)`, where `trainable` is the `tf.Variable` that tapes and
`de.DynamicEmbeddingOptimizer` train (TFRA's TrainableWrapper). Lookups of a trainable
variable in a TF1 graph, in a `tf.function`, or eagerly under a `tf.GradientTape` read
through that view even without `return_trainable`; `name` names it (default: the
function's name), and `params.get_trainable_by_name(name)` returns it.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple, Union

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _export_context
from tensorflow_dynemb._convert import TensorLike, convert
from tensorflow_dynemb.trainable import tape_may_record
from tensorflow_dynemb.variable import Variable

__all__ = [
    "embedding_lookup",
    "embedding_lookup_unique",
    "embedding_lookup_sparse",
    "safe_embedding_lookup_sparse",
]

COMBINERS = ("sum", "mean", "sqrtn")

SparseIds = Union[tf.SparseTensor, tf.RaggedTensor]


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def _as_variable(params: Any, arg: str) -> Variable:
    """`params` as a `de.Variable`; a list or tuple of one variable is accepted (TFRA)."""
    if isinstance(params, (list, tuple)) and len(params) == 1:
        params = params[0]
    if not isinstance(params, Variable):
        raise TypeError(
            f"`{arg}` must be a de.Variable (or a list holding exactly one), "
            f"got {type(params).__name__}: {params!r:.200}"
        )
    return params


def _check_options(params: Variable, max_norm: Any, combiner: Optional[str] = None) -> None:
    """Checks `max_norm` and `combiner` against `params` before any op is built."""
    if max_norm is not None:
        if not params.value_dtype.is_floating:
            raise TypeError(
                f"`max_norm` needs a floating-point value_dtype, but de.Variable "
                f"{params.name!r} holds {params.value_dtype.name}."
            )
        if isinstance(max_norm, (int, float, np.number)) and not max_norm > 0:
            raise ValueError(f"`max_norm` must be > 0 (or None), got {max_norm!r}.")
    if combiner is not None:
        if combiner not in COMBINERS:
            raise ValueError(f"`combiner` must be one of {list(COMBINERS)}, got {combiner!r}.")
        if not params.value_dtype.is_floating:
            raise TypeError(
                f"combining rows needs a floating-point value_dtype, but de.Variable "
                f"{params.name!r} holds {params.value_dtype.name}."
            )


# ---------------------------------------------------------------------------------------
# Row fetch: the single place rows are read from the variable
# ---------------------------------------------------------------------------------------


def _lookup_rows(
    params: Variable, ids: tf.Tensor, return_trainable: bool, name: str
) -> Tuple[tf.Tensor, Any]:
    """The rows of `ids` (any shape): `(ids.shape + [dim] tensor, trainable or None)`.

    Every lookup function reads its rows here and nowhere else. A lookup that may be
    trained reads through the variable's `TrainableRows` called `name` (see
    `trainable.py`), whose trainable variable is returned for `return_trainable=True`
    and is what `de.DynamicEmbeddingOptimizer` updates the table through.

    A trace for serving (`tf.saved_model.save`, `de.export_static_saved_model`) reads
    the tables directly, even when the caller asks for the view (returned, unused):
    every read through the view writes its buffers, which concurrent serving calls
    would race on, and a SavedModel must not change anything.
    """
    if _export_context.read_only():
        trainable = params._trainable_rows(name).variable if return_trainable else None
        return params.lookup(ids), trainable
    if not (return_trainable or _may_train(params)):
        return params.lookup(ids), None
    trainable = params._trainable_rows(name)
    rows = trainable.read(tf.reshape(ids, [-1]))
    rows = tf.reshape(rows, tf.concat([tf.shape(ids), [params.dim]], 0))
    rows.set_shape(ids.shape.concatenate([params.dim]))
    return rows, trainable.variable


def _may_train(params: Variable) -> bool:
    """Whether a lookup of `params` may be differentiated: a trainable floating-point
    variable, looked up in a TF1 graph, in a `tf.function`, or eagerly under a tape."""
    if not params.trainable or not params.value_dtype.is_floating:
        return False
    return tape_may_record() if tf.executing_eagerly() else True


def _clip(rows: tf.Tensor, max_norm: Any) -> tf.Tensor:
    """Each row (last axis) clipped to L2 norm `max_norm`, as `tf.nn.embedding_lookup`."""
    if max_norm is None:
        return rows
    return tf.clip_by_norm(rows, max_norm, axes=[-1])


def _unique_rows(
    params: Variable, flat_ids: tf.Tensor, max_norm: Any, return_trainable: bool, name: str
) -> Tuple[tf.Tensor, Any]:
    """`[n, dim]` rows of the 1-D `flat_ids`, each distinct id looked up once."""
    if return_trainable or _may_train(params):
        # The trainable view looks each distinct id up once itself: a tf.unique here
        # would be repeated there, and its gather's gradient densified by one more
        # segment sum. The view keeps one gradient entry per occurrence, which
        # admission counts.
        rows, trainable = _lookup_rows(params, flat_ids, return_trainable, name)
        return _clip(rows, max_norm), trainable
    unique_ids, index = tf.unique(flat_ids)
    rows, trainable = _lookup_rows(params, unique_ids, return_trainable, name)
    return tf.gather(_clip(rows, max_norm), index), trainable


def _map_ids(
    params: Variable, ids: Any, rows_of: Callable[[tf.Tensor], Tuple[tf.Tensor, Any]]
) -> Tuple[Union[tf.Tensor, tf.RaggedTensor], Any]:
    """`rows_of(ids)` for dense `ids`; for a RaggedTensor, the rows of its flat values
    in the same ragged structure (`ids.shape + [dim]`), as `tf.nn.embedding_lookup`."""
    if isinstance(ids, tf.SparseTensor):
        raise TypeError(
            "`ids` must be a dense tensor or a RaggedTensor, got a SparseTensor; combine "
            "sparse ids with de.embedding_lookup_sparse."
        )
    if isinstance(ids, tf.RaggedTensor):
        rows, trainable = rows_of(convert(ids.flat_values, params.key_dtype, "ids"))
        return ids.with_flat_values(rows), trainable
    return rows_of(convert(ids, params.key_dtype, "ids"))


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


# ---------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------


def embedding_lookup(
    params: Variable,
    ids: TensorLike,
    partition_strategy: Optional[str] = None,
    name: Optional[str] = None,
    validate_indices: Any = None,
    max_norm: Optional[float] = None,
    return_trainable: bool = False,
):
    """The rows of `ids` in `params`, as `tf.nn.embedding_lookup` on a dense table.

    Keys missing from `params` read its initializer and are not inserted.

    Args:
      params: a `de.Variable` (or a list holding one).
      ids: keys of any shape, of `params.key_dtype`: a tensor (or anything
        convertible) or a `tf.RaggedTensor`.
      partition_strategy: ignored (the variable routes keys to its shards itself);
        accepted for compatibility with `tf.nn.embedding_lookup` and TFRA.
      name: a name for the operation.
      validate_indices: ignored, as in `tf.nn.embedding_lookup`.
      max_norm: if not None, each row is clipped to this L2 norm.
      return_trainable: also return the trainable view of the rows (a `tf.Variable`
        to hand to an optimizer; see the module docstring).

    Returns:
      A tensor of shape `ids.shape + [params.dim]` and dtype `params.value_dtype`
      (a RaggedTensor for ragged `ids`).

    Raises:
      TypeError: `params` is not a `de.Variable`, `ids` is a SparseTensor or has
        another dtype than `params.key_dtype`, or `max_norm` is given for a
        non-floating variable.
      ValueError: `max_norm` <= 0.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> v = de.Variable(tf.int64, tf.float32, dim=2, initializer=-1.0)
    >>> v.upsert([10, 20], [[1.0, 2.0], [3.0, 4.0]])
    >>> de.embedding_lookup(v, tf.constant([[20, 30], [10, 10]], tf.int64)).numpy()
    array([[[ 3.,  4.],
            [-1., -1.]],
    <BLANKLINE>
           [[ 1.,  2.],
            [ 1.,  2.]]], dtype=float32)
    """
    del partition_strategy, validate_indices  # see Args
    params = _as_variable(params, "params")
    _check_options(params, max_norm)

    def rows_of(dense_ids: tf.Tensor):
        rows, trainable = _lookup_rows(params, dense_ids, return_trainable, trainable_name)
        return _clip(rows, max_norm), trainable

    trainable_name = name or "embedding_lookup"
    with tf.name_scope(name or "embedding_lookup"):
        result, trainable = _map_ids(params, ids, rows_of)
    return (result, trainable) if return_trainable else result


def embedding_lookup_unique(
    params: Variable,
    ids: TensorLike,
    partition_strategy: Optional[str] = None,
    name: Optional[str] = None,
    validate_indices: Any = None,
    max_norm: Optional[float] = None,
    return_trainable: bool = False,
):
    """`embedding_lookup` that looks each distinct id up once (`tf.unique`) and gathers
    the rows back: cheaper when `ids` repeats keys. Same arguments, result and errors.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> v = de.Variable(tf.string, tf.float32, dim=1)
    >>> v.upsert(["a", "b"], [[1.0], [2.0]])
    >>> de.embedding_lookup_unique(v, ["b", "a", "b"]).numpy()
    array([[2.],
           [1.],
           [2.]], dtype=float32)
    """
    del partition_strategy, validate_indices  # ignored, see embedding_lookup
    params = _as_variable(params, "params")
    _check_options(params, max_norm)

    def rows_of(dense_ids: tf.Tensor):
        flat = tf.reshape(dense_ids, [-1])
        rows, trainable = _unique_rows(params, flat, max_norm, return_trainable, trainable_name)
        rows = tf.reshape(rows, tf.concat([tf.shape(dense_ids), [params.dim]], 0))
        rows.set_shape(dense_ids.shape.concatenate([params.dim]))
        return rows, trainable

    trainable_name = name or "embedding_lookup_unique"
    with tf.name_scope(name or "embedding_lookup_unique"):
        result, trainable = _map_ids(params, ids, rows_of)
    return (result, trainable) if return_trainable else result


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
    params = _as_variable(params, "params")
    _check_options(params, max_norm, combiner)
    trainable_name = name or "embedding_lookup_sparse"
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
    params = _as_variable(embedding_weights, "embedding_weights")
    _check_options(params, max_norm, combiner)
    trainable_name = name or "safe_embedding_lookup_sparse"
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
