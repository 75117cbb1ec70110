"""`HashTable` (alias `CuckooHashTable`): the unbounded table."""

from __future__ import annotations

from typing import Optional

from tensorflow_dynemb.tables.base import _DynembTable
from tensorflow_dynemb._convert import DTypeLike, TensorLike, check_int

__all__ = ["HashTable", "CuckooHashTable"]


class HashTable(_DynembTable):
    """An unbounded hash table from keys to fixed-shape values; grows as keys arrive.

    Keys are `int32`, `int64` or `string` (every value is a valid key: `0`, `-1`, the
    extremes, `b""`); values are `float32`, `float64`, `float16`, `bfloat16`, `int8`,
    `int32`, `int64` or `bool`, of shape `[]` or `[dim]` as given by `default_value`.
    Works in eager mode, inside `tf.function` and in TF1 graph mode; saved by
    `tf.train.Checkpoint` and `tf.compat.v1.train.Saver` (keys, values and scores).

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> table = de.HashTable(tf.int64, tf.float32, default_value=[0.0, 0.0])
    >>> table.insert([1, 2], [[1.0, 1.5], [2.0, 2.5]])
    >>> table.lookup([2, 3]).numpy()
    array([[2. , 2.5],
           [0. , 0. ]], dtype=float32)
    >>> int(table.size())
    2

    `CuckooHashTable` is an alias, for code written against TFRA.
    """

    def __init__(
        self,
        key_dtype: DTypeLike,
        value_dtype: DTypeLike,
        default_value: TensorLike,
        name: str = "HashTable",
        checkpoint: bool = True,
        init_size: int = 0,
        device: str = "",
        shared_name: Optional[str] = None,
        track_changes: bool = True,
    ):
        """Creates an empty table.

        Args:
          key_dtype: the key dtype: `tf.int32`, `tf.int64` or `tf.string`.
          value_dtype: the value dtype.
          default_value: what missing keys read: a scalar or a `[dim]` vector. Its shape
            is the shape of every value.
          name: a name for the table (and its ops).
          checkpoint: whether checkpoints save and restore the content. In graph mode
            without `shared_name`, a checkpointed table is shared by its node name.
          init_size: keys to reserve room for up front.
          device: where to place the table and its ops (default: TF's placer). A GPU
            holds int32/int64-keyed tables when the op library has its GPU kernels
            (docs/gpu.md); string-keyed tables run on the CPU.
          shared_name: share the table with every other table of this name in the
            process (default: not shared; eager tables are anonymous). Dtypes and
            value shape must match the existing table's, or the op raises
            `InvalidArgumentError`.
          track_changes: keep a write stamp per key and the keys removed, so that a
            `de.DeltaExporter` writes only what changed (docs/online_learning.md).
            False saves 8 bytes per key and one atomic increment per write, and the
            exporter then writes the whole table each time.

        Raises:
          TypeError: an unsupported dtype, or `default_value` of another dtype.
          ValueError: `default_value` is not a scalar or non-empty vector, or
            `init_size` is negative.
        """
        init_size = check_int(init_size, "init_size", 0)
        super().__init__(
            key_dtype,
            value_dtype,
            default_value,
            name=name,
            checkpoint=checkpoint,
            device=device,
            shared_name=shared_name,
            table_attrs=dict(
                init_capacity=init_size,
                max_capacity=0,
                evict_strategy="lru",
                step_per_epoch=0,
                find_updates_scores=False,
                track_changes=bool(track_changes),
            ),
        )


CuckooHashTable = HashTable
