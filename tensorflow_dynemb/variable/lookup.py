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
`params` may also be a trainable view of a variable (a `de.shadow_ops.ShadowVariable`):
the lookup then reads the view's variable through that view, as if named like it.

Every function fetches rows through `_lookup_rows`, the one place that hands out a
trainable view of the rows: with `return_trainable=True` a function returns
`(result, trainable)`, where `trainable` is the `tf.Variable` that tapes and
`de.DynamicEmbeddingOptimizer` train (TFRA's TrainableWrapper). Lookups of a trainable
variable in a TF1 graph, in a `tf.function`, or eagerly under a `tf.GradientTape` read
through that view even without `return_trainable`; `name` names it (default: the
function's name), and `params.get_trainable_by_name(name)` returns it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _export_context
from tensorflow_dynemb._convert import TensorLike, as_vector, convert, keyed_rows
from tensorflow_dynemb.variable.trainable import rows_of as view_of
from tensorflow_dynemb.variable.trainable import tape_may_record
from tensorflow_dynemb.variable.variable import Variable

__all__ = [
    "embedding_lookup",
    "embedding_lookup_unique",
]

COMBINERS = ("sum", "mean", "sqrtn")


# ---------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------


def _single(params: Any) -> Any:
    """The one element of a list or tuple of one (TFRA accepts those), else `params`."""
    return params[0] if isinstance(params, (list, tuple)) and len(params) == 1 else params


def _as_variable(params: Any, arg: str) -> Variable:
    """`params` as a `de.Variable`; a list or tuple of one variable is accepted (TFRA),
    and so is a trainable view of one (a `de.shadow_ops.ShadowVariable`), which stands
    for its variable: the lookup reads through that view (`_view_name`)."""
    params = _single(params)
    view = view_of(params)
    if view is not None:
        return view.params
    if not isinstance(params, Variable):
        raise TypeError(
            f"`{arg}` must be a de.Variable (or a list holding exactly one), "
            f"got {type(params).__name__}: {params!r:.200}"
        )
    return params


def _view_name(params: Any, default: str) -> str:
    """The name of the trainable view a lookup of `params` reads through when it may be
    trained: the view's own when `params` is a view (so that a ShadowVariable's lookups
    fill its buffers), else `default`."""
    view = view_of(_single(params))
    return default if view is None else view.name


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
    would race on, and a SavedModel must not change anything. It still creates the view
    a live trace would use: a `tf.function` may create variables in its first trace
    only, and the save's trace is the first one of a function never called before it
    (docs/serving.md's example), so a view first made by a later live trace would fail
    that call.
    """
    if not (return_trainable or _may_train(params)):
        return params.lookup(ids), None
    trainable = params._trainable_rows(name, ids)
    if _export_context.read_only():
        return params.lookup(ids), trainable.variable if return_trainable else None
    rows = keyed_rows(trainable.read(as_vector(ids)), ids, params.dim)
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
    trainable_name = _view_name(params, name or "embedding_lookup")
    params = _as_variable(params, "params")
    _check_options(params, max_norm)

    def rows_of(dense_ids: tf.Tensor):
        rows, trainable = _lookup_rows(params, dense_ids, return_trainable, trainable_name)
        return _clip(rows, max_norm), trainable

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
    trainable_name = _view_name(params, name or "embedding_lookup_unique")
    params = _as_variable(params, "params")
    _check_options(params, max_norm)

    def rows_of(dense_ids: tf.Tensor):
        flat = as_vector(dense_ids)
        rows, trainable = _unique_rows(params, flat, max_norm, return_trainable, trainable_name)
        return keyed_rows(rows, dense_ids, params.dim), trainable

    with tf.name_scope(name or "embedding_lookup_unique"):
        result, trainable = _map_ids(params, ids, rows_of)
    return (result, trainable) if return_trainable else result


