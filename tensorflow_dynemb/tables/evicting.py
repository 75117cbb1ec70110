"""Table ops that return what they evicted: `EvictingOps`, a mixin of `_DynembTable`
(base.py).

A bounded table (`HkvHashTable` with `max_capacity`) makes room for new keys by evicting
its lowest-ranked entries; `insert_and_evict` and `accum_and_evict` are `insert` and
`accum` that return those entries (and the new keys turned away), for callers that keep
them elsewhere (a second-tier store, a log). An unbounded table returns empty tensors.
The input conversion is the plain ops' (`_insert_inputs`, `_accum_inputs` in base.py).
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb._convert import TensorLike


class EvictingOps:
    """`insert_and_evict` and `accum_and_evict` of `_DynembTable`."""

    def insert_and_evict(
        self,
        keys: TensorLike,
        values: TensorLike,
        scores: Optional[TensorLike] = None,
        name: Optional[str] = None,
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """`insert`, returning what it evicted to stay within `max_capacity`.

        When the table is full, each new key evicts the entry with the lowest score in
        the table (among equal scores, the one written longest ago), or, if its own
        score is lower than every stored score, is itself not inserted. Both are
        returned. Below `max_capacity` nothing is evicted. An unbounded `HashTable`
        never evicts and returns empty tensors.

        Args:
          keys: keys of any shape, of the table's key dtype.
          values: values of shape `keys.shape + value_shape`.
          scores: optional int64 scores of shape `keys.shape` (as for `insert`).
          name: a name for the operation.

        Returns:
          `(evicted_keys [m], evicted_values [m] + value_shape, evicted_scores int64
          [m])`, `m <= keys.size`, in unspecified order: the stored entries the batch
          evicted (with the values and scores they had) and the new keys it turned
          away (with the values and scores they were given).

        Raises:
          The same errors as `insert`.

        Example:

        >>> import tensorflow as tf
        >>> import tensorflow_dynemb as de
        >>> table = de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=2,
        ...                         max_capacity=2, evict_strategy="customized")
        >>> table.insert([1, 2], [1.0, 2.0], scores=[10, 20])
        >>> keys, values, scores = table.insert_and_evict([3], [3.0], scores=[30])
        >>> keys.numpy(), values.numpy(), scores.numpy()
        (array([1]), array([1.], dtype=float32), array([10]))
        """
        keys, values, scores = self._insert_inputs(keys, values, scores)
        with tf.name_scope(name or f"{self._name}_insert_and_evict"), self._placement():
            evicted = _ops.ops.dynemb_table_insert_and_evict(
                self.resource_handle, keys, values, scores
            )
        return tuple(evicted)

    def accum_and_evict(
        self,
        keys: TensorLike,
        values_or_deltas: TensorLike,
        exists: TensorLike,
        name: Optional[str] = None,
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """`accum`, returning what it evicted to stay within `max_capacity`.

        Only the keys `accum` inserts (not `exists` and absent) need room. When the
        table is full, each of them evicts the entry with the lowest score in the table
        (among equal scores, the one written longest ago), or, if its own score is lower
        than every stored score, is itself not inserted, exactly as in
        `insert_and_evict`. Both are returned. Below `max_capacity` nothing is evicted.
        An unbounded `HashTable` never evicts and returns empty tensors.

        Args:
          keys: keys of any shape, of the table's key dtype.
          values_or_deltas: `keys.shape + value_shape`, of the table's value dtype.
          exists: bool tensor of `keys.shape` (as for `accum`).
          name: a name for the operation.

        Returns:
          `(evicted_keys [m], evicted_values [m] + value_shape, evicted_scores int64
          [m])`, `m <= keys.size`, in unspecified order: the stored entries the batch
          evicted (with the values and scores they had, including deltas this batch
          added before evicting them) and the new keys it turned away (with the value
          they would have been inserted with).

        Raises:
          The same errors as `accum`.

        Example:

        >>> import tensorflow as tf
        >>> import tensorflow_dynemb as de
        >>> table = de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=2,
        ...                         max_capacity=2, evict_strategy="lru")
        >>> table.insert([1], [1.0])
        >>> table.insert([2], [2.0])
        >>> keys, values, _ = table.accum_and_evict([3], [3.0], exists=[False])
        >>> keys.numpy(), values.numpy()
        (array([1]), array([1.], dtype=float32))
        """
        keys, values_or_deltas, exists = self._accum_inputs(keys, values_or_deltas, exists)
        with tf.name_scope(name or f"{self._name}_accum_and_evict"), self._placement():
            evicted = _ops.ops.dynemb_table_accum_and_evict(
                self.resource_handle, keys, values_or_deltas, exists
            )
        return tuple(evicted)
