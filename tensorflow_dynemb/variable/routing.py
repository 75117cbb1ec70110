"""The per-key methods of a `de.Variable` and the routing they share: `RoutedOps`, a
mixin of `Variable` (variable.py), which provides the shard tables, the dtypes, `dim`,
the partitioner, the initializer and the model-parallel `worker_group`.

A key's shard is `partitioner(keys, num_shards)`. Every method routes keys with
`tf.dynamic_partition` (`_route`), calls the shard tables, and puts results back in key
order with `tf.dynamic_stitch`; a batch keeps its order within each shard, so duplicate
keys behave as in one table. A model-parallel variable's lookups inside `strategy.run`
ask the owners (distribute/model_parallel.py); its writes keep the keys this worker owns
(`_owned`).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import tensorflow as tf

from tensorflow_dynemb import _export_context
from tensorflow_dynemb._convert import (
    TensorLike,
    as_vector,
    check_shape,
    convert,
    flat_keyed,
    flat_rows,
    keyed_rows,
)
from tensorflow_dynemb.distribute import cluster as _cluster
from tensorflow_dynemb.distribute import model_parallel as _model_parallel
from tensorflow_dynemb.persistence.checkpoint import writing_saved_model

__all__ = ["RoutedOps"]


class RoutedOps:
    """Routing and the per-key methods (`lookup`, `upsert`, `accum`, `remove` and the
    evicting forms) of a `Variable`."""

    # -- routing -------------------------------------------------------------------------

    def _flat_keys(self, keys: TensorLike) -> tf.Tensor:
        return as_vector(convert(keys, self._key_dtype, "keys"))

    def _flat_rows(self, keys: tf.Tensor, values: TensorLike, arg: str) -> tf.Tensor:
        """`values` converted and checked to be `keys.shape + [dim]`, as `[n, dim]`."""
        return flat_rows(keys, values, self._dim, self._value_dtype, arg)

    def _insert_rows(self, keys: tf.Tensor, values: TensorLike) -> tf.Tensor:
        """`_flat_rows` of the `values` argument of `upsert` / `insert_and_evict`. Where
        1-D keys and the rows go to one table op as they are (one shard, not
        model-parallel: no partition or mask in between), the op checks the rows against
        the keys at run time itself, naming `values` as this check would: only the
        static check is made here (the optimizer's write-back of every step is such an
        upsert; the runtime check was ~10 ops of it)."""
        if keys.shape.rank == 1 and self.shard_num == 1 and self.worker_group is None:
            values = convert(values, self._value_dtype, "values")
            expected = keys.shape.concatenate([self._dim])
            check_shape(values, expected, "values", "keys.shape + [dim]")
            return values
        return self._flat_rows(keys, values, "values")

    def _shard_ids(self, flat_keys: tf.Tensor) -> tf.Tensor:
        ids = self._partition_fn(flat_keys, self.shard_num)
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise TypeError(
                f"`partitioner` must return integer shard ids, got dtype {ids.dtype.name}."
            )
        return tf.cast(ids, tf.int32) if ids.dtype != tf.int32 else ids

    def _route(self, flat_keys: tf.Tensor, *tensors: tf.Tensor):
        """Per shard: `(keys, *tensors)` of the keys routed there, in batch order, and
        the positions of those keys in the batch (for `dynamic_stitch`).

        A shard id outside `[0, num_shards)` fails in `tf.dynamic_partition` with an
        InvalidArgumentError before any table is touched.
        """
        n = self.shard_num
        if n == 1:
            return [(flat_keys, *tensors)], None
        ids = self._shard_ids(flat_keys)
        parts = [tf.dynamic_partition(t, ids, n) for t in (flat_keys, *tensors)]
        positions = tf.dynamic_partition(tf.range(tf.size(flat_keys)), ids, n)
        return [tuple(p[i] for p in parts) for i in range(n)], positions

    @staticmethod
    def _group(ops: List[Any]):
        if tf.executing_eagerly():
            return None
        ops = [op for op in ops if op is not None]
        return ops[0] if len(ops) == 1 else tf.group(*ops)  # one op needs no NoOp

    # -- per-key methods -----------------------------------------------------------------

    def lookup(self, keys: TensorLike, return_exists: bool = False, name: Optional[str] = None):
        """Rows of `keys`; missing keys read the initializer (and are not stored).

        Args:
          keys: keys of any shape, of `key_dtype`.
          return_exists: also return a bool tensor of `keys.shape`.
          name: a name for the operation.

        Returns:
          `values` of shape `keys.shape + [dim]`, or `(values, exists)`.

        Raises:
          TypeError: `keys` of another dtype.
          tf.errors.InvalidArgumentError: the partitioner returned an id out of range.
        """
        with tf.name_scope(name or f"{self._unique_name}_lookup"):
            keys = convert(keys, self._key_dtype, "keys")
            flat = as_vector(keys)
            stand_in = _export_context.frozen(self)
            if stand_in is not None:  # a static export: stock ops in place of the shards
                values, exists = stand_in.find(flat)
            elif self._exchanges():
                values, exists = _model_parallel.exchange_find(self, flat)
            else:
                values, exists = self._find(flat)
            # Every path gives `[n, dim]` rows and `[n]` exists: for 1-D keys, their shape.
            values = keyed_rows(values, keys, self._dim)
            if not return_exists:
                return values
            if keys.shape.rank != 1:
                exists = tf.reshape(exists, tf.shape(keys))
            exists.set_shape(keys.shape)
            return values, exists

    def _exchanges(self) -> bool:
        """Whether lookups built now ask the owners: a model-parallel variable inside
        `strategy.run` of its strategy (every worker runs the same step)."""
        group = self.worker_group
        return group is not None and _cluster.in_replica_context_of(group)

    def _owned(self, flat_keys: tf.Tensor, *tensors: tf.Tensor):
        """`(flat_keys, *tensors)` restricted to the keys this worker owns, for a
        model-parallel variable (the others belong in other workers' slices); as they
        are otherwise. Not while a SavedModel is written: the restore function it
        traces serves loaded, single-process copies, which hold every key."""
        if self.worker_group is None or writing_saved_model():
            return (flat_keys, *tensors)
        _model_parallel._check_keys(self)
        mine = tf.equal(_model_parallel.destinations(self, flat_keys), self.worker_group.rank)
        return tuple(tf.boolean_mask(t, mine) for t in (flat_keys, *tensors))

    def _find(self, flat: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """`([n, dim] rows, [n] exists)` of the 1-D keys `flat`, missing keys reading
        the initializer."""
        shards, positions = self._route(flat)
        found = []
        for table, (shard_keys,) in zip(self._tables, shards):
            found.append(table.lookup(shard_keys, return_exists=True))
        if positions is None:
            values, exists = found[0]
        else:
            values = tf.dynamic_stitch(positions, [v for v, _ in found])
            exists = tf.dynamic_stitch(positions, [e for _, e in found])
        if self._initializer.per_key:
            values = self._initializer.fill(values, exists, flat)
        return values, exists

    def _shards_to_write(self, keys: TensorLike, values: TensorLike):
        """Each shard's `(keys, rows)` of a write of `values` (`keys.shape + [dim]`) to
        `keys`: checked, converted and routed (this worker's keys only, for a
        model-parallel variable)."""
        keys = convert(keys, self._key_dtype, "keys")
        rows = self._insert_rows(keys, values)
        shards, _ = self._route(*self._owned(as_vector(keys), rows))
        return shards

    def upsert(self, keys: TensorLike, values: TensorLike, name: Optional[str] = None):
        """Inserts or overwrites `keys` with `values` (`keys.shape + [dim]`).

        Returns:
          The operation (None when executing eagerly).

        Raises:
          TypeError: `keys` or `values` of another dtype.
          tf.errors.InvalidArgumentError / ValueError: `values` of the wrong shape
            ("Expected shape"), or a partitioner id out of range.
        """
        with tf.name_scope(name or f"{self._unique_name}_upsert"):
            shards = self._shards_to_write(keys, values)
            return self._group(
                [table.insert(k, v) for table, (k, v) in zip(self._tables, shards)]
            )

    def accum(
        self,
        keys: TensorLike,
        old_values: TensorLike,
        new_values: TensorLike,
        exists: TensorLike,
        name: Optional[str] = None,
    ):
        """Adds `new_values - old_values` to keys that `exists`, inserts `new_values`
        for keys that do not (see the table's `accum` for races).

        Returns:
          The operation (None when executing eagerly).

        Raises:
          TypeError: an argument of another dtype.
          tf.errors.InvalidArgumentError / ValueError: a shape mismatch ("Expected shape").
        """
        with tf.name_scope(name or f"{self._unique_name}_accum"):
            shards = self._accum_shards(keys, old_values, new_values, exists)
            return self._group(
                [table.accum(k, d, e) for table, (k, d, e) in zip(self._tables, shards)]
            )

    def accum_and_evict(
        self,
        keys: TensorLike,
        old_values: TensorLike,
        new_values: TensorLike,
        exists: TensorLike,
        name: Optional[str] = None,
    ):
        """`accum`, returning the entries that bounded shard tables evicted to stay
        within their capacity (see `HkvHashTable.accum_and_evict`); empty for
        unbounded tables.

        Returns:
          `(evicted_keys [m], evicted_values [m, dim], evicted_scores int64 [m])`.

        Raises:
          The same errors as `accum`.
        """
        with tf.name_scope(name or f"{self._unique_name}_accum_and_evict"):
            shards = self._accum_shards(keys, old_values, new_values, exists)
            return self._concat_shards(
                [table.accum_and_evict(k, d, e) for table, (k, d, e) in zip(self._tables, shards)]
            )

    def _accum_shards(
        self, keys: TensorLike, old_values: TensorLike, new_values: TensorLike, exists: TensorLike
    ) -> List[Tuple[tf.Tensor, ...]]:
        """The (keys, deltas, exists) of `accum` routed to each shard table."""
        keys = convert(keys, self._key_dtype, "keys")
        old = self._flat_rows(keys, old_values, "old_values")
        new = self._flat_rows(keys, new_values, "new_values")
        # Checked before the flattening hides a [3, 1] `exists` for [3] keys.
        flat_exists = flat_keyed(keys, exists, tf.bool, "exists")
        if self._value_dtype == tf.bool:
            deltas = new  # bool "+=" is a logical or
        else:
            deltas = tf.where(flat_exists[:, tf.newaxis], new - old, new)
        shards, _ = self._route(*self._owned(as_vector(keys), deltas, flat_exists))
        return shards

    def remove(self, keys: TensorLike, name: Optional[str] = None):
        """Removes `keys` (any shape); absent keys are ignored.

        Returns:
          The operation (None when executing eagerly).
        """
        with tf.name_scope(name or f"{self._unique_name}_remove"):
            shards, _ = self._route(self._flat_keys(keys))
            return self._group([table.remove(k) for table, (k,) in zip(self._tables, shards)])

    def insert_and_evict(self, keys: TensorLike, values: TensorLike, name: Optional[str] = None):
        """`upsert`, returning the entries that bounded shard tables evicted to stay
        within their capacity (see `HkvHashTable.insert_and_evict`); empty for
        unbounded tables.

        Returns:
          `(evicted_keys [m], evicted_values [m, dim], evicted_scores int64 [m])`.
        """
        with tf.name_scope(name or f"{self._unique_name}_insert_and_evict"):
            shards = self._shards_to_write(keys, values)
            return self._concat_shards(
                [table.insert_and_evict(k, v) for table, (k, v) in zip(self._tables, shards)]
            )

    @staticmethod
    def _concat_shards(parts: List[Tuple[tf.Tensor, ...]]) -> Tuple[tf.Tensor, ...]:
        """Per-shard tuples of tensors (what each shard table exported or evicted) as one
        tuple, each tensor concatenated over the shards."""
        if len(parts) == 1:
            return tuple(parts[0])
        return tuple(tf.concat([p[i] for p in parts], 0) for i in range(len(parts[0])))
