"""Frozen tables: stock TF objects holding an exported table or `de.Variable` (see
static_export.py)."""

from __future__ import annotations

import math
import re
from typing import List, Optional, Tuple

import tensorflow as tf

from tensorflow_dynemb.variable.initializers import _KeyedRandomRows
from tensorflow_dynemb.variable.variable import Variable
from tensorflow_dynemb.serving.keyed_random import keyed_random_rows

__all__ = ["FrozenTable", "FrozenVariable", "MAX_SHARD_BYTES"]

# The most bytes one row variable of a frozen table holds; larger tables are split
# into several (read with `tf.nn.embedding_lookup`'s "div" strategy). Far below the
# 2 GiB limit of a single graph constant or proto, and small enough to place.
MAX_SHARD_BYTES = 1 << 30


# ---------------------------------------------------------------------------------------
# Frozen tables: stock TF objects holding an exported table
# ---------------------------------------------------------------------------------------


def _identifier(name: str) -> str:
    """`name` as a valid tf.Module / op name (letters, digits, underscores)."""
    cleaned = re.sub(r"\W", "_", name)
    return cleaned if cleaned[:1].isalpha() else f"t_{cleaned}"


def _shard_sizes(num_rows: int, row_bytes: int, max_bytes: int) -> List[int]:
    """Row counts of the variables holding `num_rows` rows: each at most `max_bytes`
    (at least one row), split as `np.array_split` does (the first `num_rows % shards`
    get one row more), which is the layout `tf.nn.embedding_lookup`'s default "div"
    strategy reads."""
    rows_per_shard = max(1, max_bytes // max(1, row_bytes))
    shards = max(1, math.ceil(num_rows / rows_per_shard))
    base, extra = divmod(num_rows, shards)
    return [base + 1 if i < extra else base for i in range(shards)]


def _index_dtype(key_dtype: tf.dtypes.DType) -> tf.dtypes.DType:
    # The stock hash table has no int32 -> int64 kernel: int32 keys are widened.
    return tf.int64 if key_dtype == tf.int32 else key_dtype


def _index_keys(keys: tf.Tensor) -> tf.Tensor:
    return tf.cast(keys, tf.int64) if keys.dtype == tf.int32 else keys


class FrozenTable(tf.Module):
    """A table's entries in stock TF objects: `index` maps each key to its row number,
    `shards` hold the rows (`[rows] + value_shape`, split by `MAX_SHARD_BYTES`).

    Lookups only read: concurrent calls are safe and see the same entries forever.
    """

    def __init__(self, keys: tf.Tensor, values: tf.Tensor, default_value: tf.Tensor,
                 name: str):
        """Freezes `keys` `[n]` and their `values` `[n] + value_shape`.

        Args:
          keys: the exported keys (unique).
          values: their rows.
          default_value: what missing keys read when `find` gets no defaults
            (`value_shape`).
          name: a name for the module and its objects.
        """
        super().__init__(name=_identifier(name))
        num_rows = int(keys.shape[0])
        self._value_shape = values.shape[1:]
        self.default_value = tf.constant(default_value)
        self.index = tf.lookup.experimental.MutableHashTable(
            _index_dtype(keys.dtype), tf.int64, default_value=-1, name=f"{self.name}_index"
        )
        self.index.insert(_index_keys(keys), tf.range(num_rows, dtype=tf.int64))
        row_bytes = self._value_shape.num_elements() * values.dtype.size
        self.shards = []
        start = 0
        for i, size in enumerate(_shard_sizes(num_rows, row_bytes, MAX_SHARD_BYTES)):
            if size == 0:  # an empty table: no rows to read
                break
            self.shards.append(
                tf.Variable(values[start:start + size], trainable=False,
                            name=f"{self.name}_rows_{i}")
            )
            start += size

    def find(self, keys: tf.Tensor, defaults: Optional[tf.Tensor] = None
             ) -> Tuple[tf.Tensor, tf.Tensor]:
        """`(values, exists)` of `keys` (any shape), as `DynembTableFind` gives them.

        Args:
          keys: keys of the frozen key dtype.
          defaults: what missing keys read: one row (`value_shape`) or one per key
            (`keys.shape + value_shape`); default `default_value`.
        """
        defaults = self.default_value if defaults is None else defaults
        value_shape = tf.constant(self._value_shape.as_list(), tf.int32)
        out_shape = tf.concat([tf.shape(keys), value_shape], 0)
        if not self.shards:
            values = tf.broadcast_to(defaults, out_shape)
            return values, tf.zeros(tf.shape(keys), tf.bool)
        index = self.index.lookup(_index_keys(keys))
        exists = index >= 0
        rows = tf.nn.embedding_lookup(self.shards, tf.maximum(index, 0))
        # `exists` broadcast over the value axes.
        mask = tf.reshape(exists, tf.concat(
            [tf.shape(exists), tf.ones([self._value_shape.rank], tf.int32)], 0))
        return tf.where(mask, rows, defaults), exists


class FrozenVariable(tf.Module):
    """A `de.Variable`'s entries in stock TF objects (one `FrozenTable` for all its
    shards, so no partition op is needed), with its initializer's rows for missing
    keys (see the module docstring)."""

    def __init__(self, variable: Variable, name: str):
        super().__init__(name=_identifier(name))
        keys, values = variable.export()
        initializer = variable.initializer
        self.table = FrozenTable(keys, values, initializer.default_row, name=f"{self.name}_rows")
        self._keyed = initializer if isinstance(initializer, _KeyedRandomRows) else None
        self._dim = variable.dim
        self._value_dtype = variable.value_dtype

    def find(self, flat_keys: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """`([n, dim] rows, [n] exists)` of the 1-D `flat_keys`, as `Variable.lookup`."""
        values, exists = self.table.find(flat_keys)
        if self._keyed is not None:
            missing = tf.where(tf.logical_not(exists))
            rows = keyed_random_rows(
                tf.gather_nd(flat_keys, missing),
                dim=self._dim,
                seed=self._keyed.seed,
                distribution=self._keyed.distribution,
                a=self._keyed.params[0],
                b=self._keyed.params[1],
                dtype=self._value_dtype,
            )
            values = tf.tensor_scatter_nd_update(values, missing, rows)
        return values, exists
