"""Sparse segment sums, empty-row filling and reshapes of `SparseTensor`s: TFRA's
`de.math` functions, as TensorFlow's ops (see `de.math`'s docstring).

Each function keeps TFRA's signature (`name` before `num_segments`, unlike
`tf.sparse.segment_sum`) and calls the TensorFlow op, whose registered gradient
(`SparseSegmentSum`, `SparseFillEmptyRows`) makes the result differentiable with
respect to `data` / `sp_input.values` and `default_value`.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import tensorflow as tf

__all__ = ["sparse_segment_sum", "sparse_fill_empty_rows", "sparse_reshape"]


def sparse_segment_sum(
    data: Any,
    indices: Any,
    segment_ids: Any,
    name: Optional[str] = None,
    num_segments: Optional[Any] = None,
) -> tf.Tensor:
    """Sums the rows `data[indices[i]]` into output row `segment_ids[i]`, as
    `tf.sparse.segment_sum`.

    Args:
      data: the rows, a tensor of rank >= 1.
      indices: 1-D int32 / int64 indices into the first dimension of `data`.
      segment_ids: 1-D int32 / int64 output rows, sorted, as many as `indices`.
      name: a name for the operation.
      num_segments: the number of output rows; default `segment_ids[-1] + 1`.

    Returns:
      `data`'s shape with the first dimension replaced by the number of segments.

    Raises:
      ValueError / tf.errors.InvalidArgumentError: `indices` and `segment_ids` of
        different lengths, or indices out of range.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> data = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    >>> de.math.sparse_segment_sum(data, [0, 2, 1], [0, 0, 2]).numpy()
    array([[6., 8.],
           [0., 0.],
           [3., 4.]], dtype=float32)
    """
    return tf.sparse.segment_sum(
        data, indices, segment_ids, num_segments=num_segments, name=name
    )


def sparse_fill_empty_rows(
    sp_input: Any, default_value: Any, name: Optional[str] = None
) -> Tuple[tf.SparseTensor, tf.Tensor]:
    """Gives every empty row of the 2-D `sp_input` one entry `default_value` in its
    column 0, as `tf.sparse.fill_empty_rows`.

    Args:
      sp_input: a `tf.SparseTensor` (or `tf.compat.v1.SparseTensorValue`) of shape
        `[N, M]`.
      default_value: a scalar of `sp_input`'s dtype.
      name: a name for the operation.

    Returns:
      `(output, empty_row_indicator)`: the filled `SparseTensor` (indices in row-major
      order) and a `[N]` bool tensor, true for the rows that were empty.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> sp = tf.SparseTensor([[0, 1], [2, 0]], [5, 7], dense_shape=[3, 2])
    >>> out, empty = de.math.sparse_fill_empty_rows(sp, -1)
    >>> tf.sparse.to_dense(out).numpy().tolist(), empty.numpy().tolist()
    ([[0, 5], [-1, 0], [7, 0]], [False, True, False])
    """
    return tf.sparse.fill_empty_rows(sp_input, default_value, name=name)


def sparse_reshape(sp_input: Any, shape: Any, name: Optional[str] = None) -> tf.SparseTensor:
    """The same entries of `sp_input` under the dense shape `shape` (row-major, one
    dimension may be -1), as `tf.sparse.reshape`.

    Args:
      sp_input: a `tf.SparseTensor`.
      shape: a 1-D int64 tensor (or list), the new dense shape.
      name: a name for the operation.

    Returns:
      A `tf.SparseTensor` of dense shape `shape` holding the same values.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> sp = tf.SparseTensor([[0, 1], [1, 2]], [1.0, 2.0], dense_shape=[2, 3])
    >>> de.math.sparse_reshape(sp, [3, 2]).indices.numpy().tolist()
    [[0, 1], [2, 1]]
    """
    return tf.sparse.reshape(sp_input, shape, name=name)
