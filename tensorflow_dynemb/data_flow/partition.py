"""Splitting a tensor into partitions and interleaving partitions back: TFRA's
`de.data_flow` functions, as TensorFlow's `DynamicPartition` / `DynamicStitch` (see
`de.data_flow`'s docstring). Both are differentiable through TensorFlow's registered
gradients (with respect to `data`; indices and partitions have none)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

__all__ = ["dynamic_partition", "dynamic_stitch"]


def dynamic_partition(
    data: Any, partitions: Any, num_partitions: int, name: Optional[str] = None
) -> List[tf.Tensor]:
    """Splits `data` into `num_partitions` tensors by `partitions`, as
    `tf.dynamic_partition`: output `i` holds, in order, the slices `data[j...]` whose
    `partitions[j...]` is `i`.

    Args:
      data: a tensor whose leading dimensions have `partitions`' shape.
      partitions: int32 partition numbers in `[0, num_partitions)`, any shape that
        prefixes `data`'s (a scalar puts all of `data` into one partition).
      num_partitions: the number of outputs (>= 1).
      name: a name for the operation.

    Returns:
      A list of `num_partitions` tensors.

    Raises:
      ValueError: `partitions`' shape is not a prefix of `data`'s (graph
        construction).
      tf.errors.InvalidArgumentError: a partition number outside
        `[0, num_partitions)` ("partitions[i] = p is not in [0, n)").

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> parts = de.data_flow.dynamic_partition([10, 20, 30, 40], [1, 0, 1, 1], 2)
    >>> [p.numpy().tolist() for p in parts]
    [[20], [10, 30, 40]]
    """
    return tf.dynamic_partition(data, partitions, num_partitions, name=name)


def dynamic_stitch(
    indices: Sequence[Any], data: Sequence[Any], use_fast: bool = True, name: Optional[str] = None
) -> tf.Tensor:
    """Interleaves `data` into one tensor by `indices`, as `tf.dynamic_stitch`:
    `merged[indices[m][i...]] = data[m][i...]`; where an index repeats, the value that
    comes last in the order of `indices` wins.

    Args:
      indices: a list of int32 tensors.
      data: a list of tensors, `data[m]` of shape `indices[m].shape + element shape`.
      use_fast: TFRA's choice between two GPU kernels of the same operation. Accepted
        for compatibility: TensorFlow's kernel (on CPU and GPU) serves both values.
      name: a name for the operation.

    Returns:
      A tensor of shape `[max(indices) + 1] + element shape`.

    Raises:
      TypeError: `use_fast` is not a bool.
      ValueError: shapes of `indices` and `data` that do not match (graph
        construction).

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> de.data_flow.dynamic_stitch([[0, 2], [1]], [[10, 30], [20]]).numpy()
    array([10, 20, 30], dtype=int32)
    """
    if not isinstance(use_fast, bool):
        raise TypeError(f"`use_fast` must be True or False, got {use_fast!r}.")
    return tf.dynamic_stitch(indices, data, name=name)
