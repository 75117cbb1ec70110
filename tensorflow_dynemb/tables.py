"""Dynamic-embedding hash tables: `HashTable` (unbounded) and `HkvHashTable` (bounded).

Both public classes are thin: they only choose the attributes the table is created with.
Every method lives in one base class, `_DynembTable`, which converts its inputs and calls
one generated op (see `cc/ops/table_ops.cc`). Semantics that must be the same in eager
mode, inside `tf.function` and in TF1 graph mode live in the ops, not here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import os
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _export_context, _ops
from tensorflow_dynemb.checkpoint import (
    CKPT_KEYS,
    CKPT_SCORES,
    CKPT_VALUES,
    CheckpointTables,
    in_tf1_graph,
    register_for_tf1_saver,
)
from tensorflow_dynemb._convert import (
    KEY_DTYPES,
    VALUE_DTYPES,
    DTypeLike,
    TensorLike,
    as_dtype,
    check_int,
    convert,
    convert_scores,
)

__all__ = [
    "HashTable",
    "CuckooHashTable",
    "HkvHashTable",
    "HkvHashTableConfig",
    "HkvEvictStrategy",
]

KHkvHashTableInitCapacity = 1024 * 1024
KHkvHashTableMaxCapacity = 1024 * 1024
KHkvHashTableMaxHbmForValuesByBytes = 1024 * 1024 * 1024


def _gen_ops():
    """The generated op wrappers (loaded by `_ops` on first use)."""
    return _ops.ops


# ---------------------------------------------------------------------------------------
# The shared implementation
# ---------------------------------------------------------------------------------------


class _DynembTable(tf.saved_model.experimental.TrackableResource):
    """Base class of every dynamic-embedding table: all methods live here.

    Subclasses only decide the creation attributes (`_table_attrs`) they pass to the
    `DynembHashTable` op, and optionally the scores an insert without `scores` uses
    (`_default_scores`).
    """

    def __init__(
        self,
        key_dtype: DTypeLike,
        value_dtype: DTypeLike,
        default_value: TensorLike,
        name: str,
        checkpoint: bool,
        device: str,
        shared_name: Optional[str],
        table_attrs: Dict[str, Any],
    ):
        self._key_dtype = as_dtype(key_dtype, "key_dtype", KEY_DTYPES)
        self._value_dtype = as_dtype(value_dtype, "value_dtype", VALUE_DTYPES)
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a non-empty string, got {name!r}.")
        self._name = name
        self._checkpoint = bool(checkpoint)
        self._device = device or ""
        self._shared_name = shared_name
        self._table_attrs = dict(table_attrs)
        # Eager tables are anonymous: a ref-counted handle frees the table with the last
        # reference. Graph tables (TF1, or created inside a tf.function) live in the
        # resource manager like tf.lookup.experimental.MutableHashTable's.
        self._anonymous = tf.executing_eagerly() and not shared_name

        with self._placement():
            self._default_value = convert(default_value, self._value_dtype, "default_value")
        shape = self._default_value.shape
        if shape.rank not in (0, 1):
            raise ValueError(
                "`default_value` must be a scalar or a [dim] vector, "
                f"got a tensor of shape {shape}."
            )
        if shape.rank == 1 and shape[0] < 1:
            raise ValueError(
                f"`default_value` must have at least one element (dim >= 1), got shape {shape}."
            )
        self._value_shape = shape

        super().__init__(device=self._device)
        with self._placement():
            self._resource_handle = self._create_resource()
        if tf.executing_eagerly():
            self._table_name = self._name
        else:
            self._table_name = self._resource_handle.op.name.split("/")[-1]

        if self._checkpoint and in_tf1_graph():
            # Named by the (graph-unique) op name.
            register_for_tf1_saver(self, self._resource_handle.op.name)

    # -- resource ------------------------------------------------------------------------

    def _create_resource(self) -> tf.Tensor:
        # An eager table recreated in a graph (the TF1-style graph tf.saved_model.save
        # writes for TF Serving) must not be anonymous there: each run of an anonymous
        # handle op would make a new, empty table.
        anonymous = self._anonymous and not in_tf1_graph()
        # Shared by node name when checkpointed (as tf.lookup's tables are), and always
        # in a TF1 graph: there, the graphs of a cluster's workers name a table on a
        # parameter server alike, and must all reach that one table (between-graph
        # replication), as they reach one tf.Variable of that name. A local session has
        # its own resources, so nothing else is shared by it.
        use_node_name_sharing = (
            not anonymous and not self._shared_name and (self._checkpoint or in_tf1_graph())
        )
        attrs = dict(self._table_attrs)
        if _export_context.in_saved_model_save():
            # A SavedModel serves: its lookups must not change scores (docs/serving.md).
            attrs["find_updates_scores"] = False
        return _gen_ops().dynemb_hash_table(
            shared_name=self._shared_name or "",
            use_node_name_sharing=use_node_name_sharing,
            anonymous=anonymous,
            key_dtype=self._key_dtype,
            value_dtype=self._value_dtype,
            value_shape=self._value_shape,
            name=self._name,
            **attrs,
        )

    def _placement(self):
        """`tf.device(device)` when the table was given one; the placer colocates the
        other ops with the table's resource input."""
        return tf.device(self._device) if self._device else contextlib.nullcontext()

    # -- properties ----------------------------------------------------------------------

    @property
    def key_dtype(self) -> tf.dtypes.DType:
        """The table key dtype."""
        return self._key_dtype

    @property
    def value_dtype(self) -> tf.dtypes.DType:
        """The table value dtype."""
        return self._value_dtype

    @property
    def name(self) -> str:
        """The name of the table (in graph mode, the unique name of its creation op)."""
        return self._table_name

    @property
    def dim(self) -> int:
        """Elements per value row: 1 for a scalar `default_value`, else its length."""
        return int(self._value_shape.num_elements())

    @property
    def value_shape(self) -> tf.TensorShape:
        """Shape of one value: `[]` for a scalar default, `[dim]` otherwise."""
        return self._value_shape

    @property
    def default_value(self) -> tf.Tensor:
        """The value missing keys read when `lookup` gets no `dynamic_default_values`."""
        return self._default_value

    # -- methods -------------------------------------------------------------------------

    def _default_scores(self, keys: tf.Tensor) -> Optional[tf.Tensor]:
        """Scores for an insert called without `scores` (None: the table assigns them)."""
        del keys
        return None

    def _insert_inputs(
        self, keys: TensorLike, values: TensorLike, scores: Optional[TensorLike]
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The converted inputs of `insert` / `insert_and_evict`; scores `[0]` means
        "assigned by the table"."""
        keys = convert(keys, self._key_dtype, "keys")
        values = convert(values, self._value_dtype, "values")
        if scores is None:
            scores = self._default_scores(keys)
        scores = tf.zeros([0], tf.int64) if scores is None else convert_scores(scores)
        return keys, values, scores

    def insert(
        self,
        keys: TensorLike,
        values: TensorLike,
        scores: Optional[TensorLike] = None,
        name: Optional[str] = None,
    ):
        """Upserts: new keys are inserted, existing keys overwritten.

        Duplicate keys in one batch behave as if the rows were inserted in order (the
        last one wins). In a full `HkvHashTable`, new keys evict the lowest-score
        entries (see `insert_and_evict`).

        Args:
          keys: keys of any shape, of the table's key dtype.
          values: values of shape `keys.shape + value_shape`, of the table's value dtype.
          scores: optional int64 scores of shape `keys.shape` that set each key's score
            explicitly; by default the table's eviction strategy assigns them.
          name: a name for the operation.

        Returns:
          The insert operation (None when executing eagerly).

        Raises:
          TypeError: `keys`, `values` or `scores` have the wrong dtype.
          tf.errors.InvalidArgumentError / ValueError: `values` or `scores` have the
            wrong shape (the message contains "Expected shape").
          ValueError: a CUSTOMIZED `HkvHashTable` without `gen_scores_fn` got no
            `scores`.
        """
        keys, values, scores = self._insert_inputs(keys, values, scores)
        with tf.name_scope(name or f"{self._name}_insert"), self._placement():
            return _gen_ops().dynemb_table_insert(self.resource_handle, keys, values, scores)

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
            evicted = _gen_ops().dynemb_table_insert_and_evict(
                self.resource_handle, keys, values, scores
            )
        return tuple(evicted)

    def lookup(
        self,
        keys: TensorLike,
        dynamic_default_values: Optional[TensorLike] = None,
        return_exists: bool = False,
        name: Optional[str] = None,
    ):
        """Looks up `keys`; missing keys get the default.

        Args:
          keys: keys of any shape, of the table's key dtype.
          dynamic_default_values: values for missing keys, either one row
            (`value_shape`) or one row per key (`keys.shape + value_shape`). Default:
            the table's `default_value`.
          return_exists: also return a bool tensor of `keys.shape` saying which keys
            were found.
          name: a name for the operation.

        Returns:
          `values` of shape `keys.shape + value_shape`, or `(values, exists)` with
          `return_exists`.

        Raises:
          TypeError: `keys` or `dynamic_default_values` have the wrong dtype.
        """
        keys = convert(keys, self._key_dtype, "keys")
        if dynamic_default_values is None:
            defaults = self._default_value
        else:
            defaults = convert(
                dynamic_default_values, self._value_dtype, "dynamic_default_values"
            )
        stand_in = _export_context.frozen(self)
        if stand_in is not None:  # a static export: stock ops in place of the table
            values, exists = stand_in.find(keys, defaults)
            return (values, exists) if return_exists else values
        with tf.name_scope(name or f"{self._name}_lookup"), self._placement():
            values, exists = _gen_ops().dynemb_table_find(self.resource_handle, keys, defaults)
        return (values, exists) if return_exists else values

    def __getitem__(self, keys: TensorLike) -> tf.Tensor:
        """`lookup(keys)`."""
        return self.lookup(keys)

    def accum(
        self,
        keys: TensorLike,
        values_or_deltas: TensorLike,
        exists: TensorLike,
        name: Optional[str] = None,
    ):
        """Accumulates deltas into present keys and inserts absent ones.

        Per key: `exists` and the key is present -> value += delta; not `exists` and the
        key is absent -> insert the value; otherwise (the key was inserted or removed
        since `exists` was computed) nothing changes. A batch behaves as if its rows were
        applied in order, so deltas for a duplicated key add up. For bool values "+=" is
        a logical or.

        Args:
          keys: keys of any shape, of the table's key dtype.
          values_or_deltas: `keys.shape + value_shape`, of the table's value dtype.
          exists: bool tensor of `keys.shape`, usually from `lookup(...,
            return_exists=True)`.
          name: a name for the operation.

        Returns:
          The accum operation (None when executing eagerly).

        Raises:
          TypeError: an argument has the wrong dtype.
        """
        keys, values_or_deltas, exists = self._accum_inputs(keys, values_or_deltas, exists)
        with tf.name_scope(name or f"{self._name}_accum"), self._placement():
            return _gen_ops().dynemb_table_accum(
                self.resource_handle, keys, values_or_deltas, exists
            )

    def _accum_inputs(
        self, keys: TensorLike, values_or_deltas: TensorLike, exists: TensorLike
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The converted inputs of `accum` / `accum_and_evict`."""
        keys = convert(keys, self._key_dtype, "keys")
        values_or_deltas = convert(values_or_deltas, self._value_dtype, "values_or_deltas")
        exists = convert(exists, tf.bool, "exists")
        return keys, values_or_deltas, exists

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
            evicted = _gen_ops().dynemb_table_accum_and_evict(
                self.resource_handle, keys, values_or_deltas, exists
            )
        return tuple(evicted)

    def _apply_rule(self, keys, rows, grads, initial, coefficients, rule: str,
                    weight_decay: bool) -> tf.Tensor:
        """`DynembTableApplyRule` on this table as a slot state (`Variable._apply_rule`):
        updates the state rows of the 1-D `keys` in place (`initial` for absent keys)
        by `rule` and returns the new parameter rows. Unbounded CPU tables only."""
        with tf.name_scope(f"{self._name}_apply_rule"), self._placement():
            return _gen_ops().dynemb_table_apply_rule(
                self.resource_handle, keys, rows, grads, initial, coefficients,
                rule=rule, weight_decay=weight_decay,
            )

    def remove(self, keys: TensorLike, name: Optional[str] = None):
        """Removes `keys` (any shape); absent keys are ignored.

        Args:
          keys: keys of any shape, of the table's key dtype.
          name: a name for the operation.

        Returns:
          The remove operation (None when executing eagerly).

        Raises:
          TypeError: `keys` have the wrong dtype.
        """
        keys = convert(keys, self._key_dtype, "keys")
        with tf.name_scope(name or f"{self._name}_remove"), self._placement():
            return _gen_ops().dynemb_table_remove(self.resource_handle, keys)

    def clear(self, name: Optional[str] = None):
        """Removes every key and releases the memory.

        Args:
          name: a name for the operation.

        Returns:
          The clear operation (None when executing eagerly).
        """
        with tf.name_scope(name or f"{self._name}_clear"), self._placement():
            return _gen_ops().dynemb_table_clear(self.resource_handle)

    def size(self, name: Optional[str] = None) -> tf.Tensor:
        """The number of keys in the table.

        Args:
          name: a name for the operation.

        Returns:
          An int64 scalar tensor.
        """
        with tf.name_scope(name or f"{self._name}_size"), self._placement():
            return _gen_ops().dynemb_table_size(self.resource_handle)

    def stats(self, name: Optional[str] = None) -> Dict[str, tf.Tensor]:
        """Scalars describing the table.

        Args:
          name: a name for the operation.

        Returns:
          A dict of scalar tensors: `size`; `capacity` (keys the table holds before
          it grows; an `HkvHashTable`'s grows up to `max_capacity`); `max_capacity`
          (0 for a `HashTable`); `load_factor` (float32, `size / capacity`); and
          counters since the table was created (`clear` does not reset them):
          `inserts` (rows that created a key), `lookups` (keys looked up), `misses`
          (keys looked up and absent), `evictions` (what `insert_and_evict` and
          `accum_and_evict` return: entries evicted and new keys turned away, also by
          `insert` and `accum`).
          All int64 but `load_factor`.
        """
        with tf.name_scope(name or f"{self._name}_stats"), self._placement():
            return _gen_ops().dynemb_table_stats(self.resource_handle)._asdict()

    def export_with_scores(self, name: Optional[str] = None):
        """Every entry, in unspecified order, with its score.

        Args:
          name: a name for the operation.

        Returns:
          `(keys [n], values [n] + value_shape, scores int64 [n])` (a namedtuple).
        """
        return self._export(True, name)

    def export(self, name: Optional[str] = None) -> Tuple[tf.Tensor, tf.Tensor]:
        """Every entry, in unspecified order.

        Args:
          name: a name for the operation.

        Returns:
          `(keys [n], values [n] + value_shape)`.
        """
        keys, values, _ = self._export(False, name)
        return keys, values

    def _export(self, with_scores: bool, name: Optional[str]):
        # Without scores the op never copies them (8 bytes a key of fresh memory).
        with tf.name_scope(name or f"{self._name}_export"), self._placement():
            return _gen_ops().dynemb_table_export(
                self.resource_handle, Tkey=self._key_dtype, Tvalue=self._value_dtype,
                with_scores=with_scores,
            )

    def import_(
        self,
        keys: TensorLike,
        values: TensorLike,
        scores: Optional[TensorLike] = None,
        name: Optional[str] = None,
    ):
        """Replaces the whole content of the table with `keys` and `values`.

        Args:
          keys: keys of any shape.
          values: `keys.shape + value_shape`.
          scores: optional int64 scores of `keys.shape` (e.g. from
            `export_with_scores`); by default the table assigns them as an insert does.
          name: a name for the operation.

        Returns:
          The import operation (None when executing eagerly).
        """
        keys = convert(keys, self._key_dtype, "keys")
        values = convert(values, self._value_dtype, "values")
        scores = tf.zeros([0], tf.int64) if scores is None else convert_scores(scores)
        with tf.name_scope(name or f"{self._name}_import"), self._placement():
            return _gen_ops().dynemb_table_import(self.resource_handle, keys, values, scores)

    def _file_path(self, dirpath: Any, file_name: Optional[str]):
        file_name = file_name or f"{self._table_name}.dynemb"
        if tf.is_tensor(dirpath):
            if not hasattr(dirpath, "numpy"):
                # A symbolic directory: the file is joined in the graph.
                return tf.strings.join([dirpath, file_name], separator="/")
            dirpath = dirpath.numpy()
        return tf.io.gfile.join(os.fsdecode(dirpath), file_name)

    def save_to_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        file_name: Optional[str] = None,
        chunk_rows: int = 65536,
        name: Optional[str] = None,
    ):
        """Streams the table to `dirpath/file_name` in chunks of `chunk_rows` entries.

        The table is never copied whole: memory stays O(chunk_rows). The op creates
        the directory if needed (any `tf.io.gfile` file system works).

        Args:
          dirpath: the directory.
          file_name: the file name; default `<table name>.dynemb`.
          chunk_rows: entries per chunk.
          name: a name for the operation.

        Returns:
          The save operation (None when executing eagerly).
        """
        chunk_rows = check_int(chunk_rows, "chunk_rows", 1)
        path = self._file_path(dirpath, file_name)
        with tf.name_scope(name or f"{self._name}_save_to_file"), self._placement():
            return _gen_ops().dynemb_table_save_to_file(
                self.resource_handle, path, chunk_rows=chunk_rows
            )

    def load_from_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        file_name: Optional[str] = None,
        chunk_rows: int = 65536,
        clear: bool = True,
        name: Optional[str] = None,
    ):
        """Streams a file written by `save_to_file_system` into the table.

        Args:
          dirpath: the directory.
          file_name: the file name; default `<table name>.dynemb`.
          chunk_rows: entries per chunk.
          clear: replace the table's content (default); if False, the file's entries
            are upserted into it.
          name: a name for the operation.

        Returns:
          The load operation (None when executing eagerly).
        """
        path = self._file_path(dirpath, file_name)
        return self._load_files(path, chunk_rows, clear, name=name)

    def _load_files(
        self,
        paths: Any,
        chunk_rows: int,
        clear: bool,
        num_shards: int = 1,
        shard_index: int = 0,
        name: Optional[str] = None,
    ):
        """Loads table files (one path or a vector of them); with `num_shards` > 1 only
        the keys `default_partition_fn` sends to `shard_index`."""
        chunk_rows = check_int(chunk_rows, "chunk_rows", 1)
        with tf.name_scope(name or f"{self._name}_load_from_file"), self._placement():
            return _gen_ops().dynemb_table_load_from_file(
                self.resource_handle,
                paths,
                chunk_rows=chunk_rows,
                clear_first=bool(clear),
                num_shards=num_shards,
                shard_index=shard_index,
            )

    # -- checkpointing (public Trackable hooks) --------------------------------------------

    def _set_owner(self, variable: Optional[Any]) -> None:
        """Records the `de.Variable` this table is a shard of, which SavedModels that
        reach the table must also hold (see `_trackable_children`); None: no such
        variable (a standalone table, or an optimizer slot's shard)."""
        self._owner = weakref.ref(variable) if variable is not None else None

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # A shard table saves no content: its de.Variable does (`checkpoint=False`
        # here). An export whose root reaches the shard table without the variable
        # must still hold the variable, or it serves an empty table: Keras 3's
        # `model.export` saves only the model's tf.Variables and the
        # TrackableResources under the model, not the modules between them. So in a
        # SavedModel the table lists its variable as a child.
        children = super()._trackable_children(save_type, **kwargs)
        owner_ref = getattr(self, "_owner", None)
        owner = owner_ref() if owner_ref is not None else None
        if save_type == "savedmodel" and owner is not None:
            children["_variable"] = owner
        return children

    def _checkpoint_tables(self):
        """For tf.train.Checkpoint's streaming saver (checkpoint.py): this table, with
        its scores; None with `checkpoint=False`."""
        return CheckpointTables([self], with_scores=True) if self._checkpoint else None

    def _serialize_to_tensors(self) -> Dict[str, tf.Tensor]:
        if not self._checkpoint:
            return {}  # `checkpoint=False`: checkpoints carry nothing for this table
        keys, values, scores = self.export_with_scores(name=f"{self._name}_checkpoint_export")
        return {CKPT_KEYS: keys, CKPT_VALUES: values, CKPT_SCORES: scores}

    def _restore_from_tensors(self, restored_tensors: Dict[str, tf.Tensor]):
        if not restored_tensors:
            return None
        scores = restored_tensors.get(CKPT_SCORES)
        return self.import_(
            restored_tensors[CKPT_KEYS],
            restored_tensors[CKPT_VALUES],
            scores,
            name=f"{self._name}_checkpoint_restore",
        )

    def _copy_trackable_to_cpu(self, object_map):
        """For asynchronous checkpoints: a CPU copy holding the same entries."""
        if self not in object_map:
            new = copy.copy(self)
            new._device = "/CPU:0"
            new._resource_device = "/CPU:0"
            new._anonymous = True  # a private table, even if `self` is shared by name
            new._shared_name = None
            with tf.device("/CPU:0"):
                new._resource_handle = new._create_resource()
            object_map[self] = new
        object_map[self]._restore_from_tensors(self._serialize_to_tensors())

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} name={self._table_name!r} key_dtype={self._key_dtype.name} "
            f"value_dtype={self._value_dtype.name} value_shape={self._value_shape}>"
        )


# ---------------------------------------------------------------------------------------
# Public tables
# ---------------------------------------------------------------------------------------


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
            ),
        )


CuckooHashTable = HashTable


class HkvEvictStrategy(enum.IntEnum):
    """How an `HkvHashTable` scores keys; the lowest score is evicted first.

    LRU: a logical clock advanced by each insert or lookup batch that touches the key.
    LFU: how often the key was inserted or accumulated.
    EPOCHLRU / EPOCHLFU: the epoch (advanced every `step_per_epoch` insert calls) in the
    high 32 bits, LRU / LFU in the low bits.
    CUSTOMIZED: given by the caller: `insert` needs `scores=` or the config's
    `gen_scores_fn(keys)` (else `ValueError`). `accum` takes no scores: a key it
    inserts gets 0, a key it updates keeps its score.
    """

    LRU = 0
    LFU = 1
    EPOCHLRU = 2
    EPOCHLFU = 3
    CUSTOMIZED = 4

    @property
    def op_value(self) -> str:
        """The `evict_strategy` attribute of the `DynembHashTable` op."""
        return {0: "lru", 1: "lfu", 2: "epoch_lru", 3: "epoch_lfu", 4: "customized"}[
            int(self)
        ]

    @classmethod
    def coerce(cls, value: Any, arg: str = "evict_strategy") -> "HkvEvictStrategy":
        """An `HkvEvictStrategy` from a member, its int value or its name (any case,
        with or without underscores: "epoch_lru", "EPOCHLRU")."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.replace("_", "").upper()
            if key in cls.__members__:
                return cls[key]
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if int(value) in {int(m) for m in cls}:
                return cls(int(value))
        raise ValueError(
            f"`{arg}` must be one of de.HkvEvictStrategy.{{{', '.join(cls.__members__)}}}, "
            f"got {value!r}."
        )


@dataclasses.dataclass
class HkvHashTableConfig:
    """Configuration of an `HkvHashTable` (its values override the table's arguments).

    Attributes:
      init_capacity: keys to reserve room for up front (>= 1).
      max_capacity: the most keys the table holds (>= init_capacity).
      max_hbm_for_values: device-memory budget for values on GPU, in bytes; ignored on
        CPU.
      evict_strategy: an `HkvEvictStrategy`.
      step_per_epoch: insert calls per epoch for the EPOCH* strategies (0: never
        advance).
      gen_scores_fn: for CUSTOMIZED, `fn(keys) -> int64 scores of keys.shape`, called by
        `insert` when it gets no `scores`.
      reserved_key_start_bit: accepted for TFRA compatibility and ignored: no key value
        is reserved in this implementation.
    """

    init_capacity: int = KHkvHashTableInitCapacity
    max_capacity: int = KHkvHashTableMaxCapacity
    max_hbm_for_values: int = KHkvHashTableMaxHbmForValuesByBytes
    evict_strategy: HkvEvictStrategy = HkvEvictStrategy.LRU
    step_per_epoch: int = 0
    gen_scores_fn: Optional[Callable[[tf.Tensor], TensorLike]] = None
    reserved_key_start_bit: int = 0

    def __post_init__(self):
        self.init_capacity = check_int(
            self.init_capacity, "HkvHashTableConfig.init_capacity", 1
        )
        self.max_capacity = check_int(self.max_capacity, "HkvHashTableConfig.max_capacity", 1)
        if self.init_capacity > self.max_capacity:
            raise ValueError(
                "`HkvHashTableConfig.init_capacity` must be <= `max_capacity`, got "
                f"init_capacity={self.init_capacity}, max_capacity={self.max_capacity}."
            )
        self.max_hbm_for_values = check_int(
            self.max_hbm_for_values, "HkvHashTableConfig.max_hbm_for_values", 0
        )
        self.step_per_epoch = check_int(
            self.step_per_epoch, "HkvHashTableConfig.step_per_epoch", 0
        )
        self.evict_strategy = HkvEvictStrategy.coerce(
            self.evict_strategy, "HkvHashTableConfig.evict_strategy"
        )
        if self.gen_scores_fn is not None and not callable(self.gen_scores_fn):
            raise TypeError(
                "`HkvHashTableConfig.gen_scores_fn` must be callable or None, "
                f"got {self.gen_scores_fn!r}."
            )


class HkvHashTable(_DynembTable):
    """A bounded hash table with cache semantics (HierarchicalKV's API, on CPU too).

    It holds at most `max_capacity` keys. Below that, nothing is evicted; when full,
    each new key (from `insert`, `insert_and_evict`, `accum`, `accum_and_evict` or
    `import_`) evicts the entry with the lowest score in the table, scored by
    `config.evict_strategy` (see `HkvEvictStrategy`; among equal scores, the entry
    written longest ago), or is itself not inserted if its own score is lower still.
    `insert_and_evict` and `accum_and_evict` return what was evicted. Every entry
    carries an int64 score, which `export_with_scores`, `import_` and checkpoints
    carry along, so a restored table goes on evicting as the saved one would have.
    Otherwise it behaves exactly like `HashTable`.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> config = de.HkvHashTableConfig(
    ...     init_capacity=1024, max_capacity=4096,
    ...     evict_strategy=de.HkvEvictStrategy.CUSTOMIZED)
    >>> table = de.HkvHashTable(tf.int64, tf.float32, default_value=-1.0, config=config)
    >>> table.insert([7, 8], [0.5, 0.25], scores=[100, 200])
    >>> table.lookup([8, 9]).numpy()
    array([ 0.25, -1.  ], dtype=float32)
    >>> sorted(table.export_with_scores()[2].numpy().tolist())
    [100, 200]
    """

    def __init__(
        self,
        key_dtype: DTypeLike,
        value_dtype: DTypeLike,
        default_value: TensorLike,
        name: str = "HkvHashTable",
        checkpoint: bool = True,
        init_capacity: int = KHkvHashTableInitCapacity,
        max_capacity: int = KHkvHashTableMaxCapacity,
        max_hbm_for_values: int = KHkvHashTableMaxHbmForValuesByBytes,
        config: Optional[HkvHashTableConfig] = None,
        device: str = "",
        shared_name: Optional[str] = None,
        evict_strategy: Any = HkvEvictStrategy.LRU,
        step_per_epoch: int = 0,
        gen_scores_fn: Optional[Callable[[tf.Tensor], TensorLike]] = None,
    ):
        """Creates an empty table.

        Args:
          key_dtype: the key dtype: `tf.int32`, `tf.int64` or `tf.string`.
          value_dtype: the value dtype.
          default_value: what missing keys read: a scalar or a `[dim]` vector.
          name: a name for the table (and its ops).
          checkpoint: whether checkpoints save and restore the content (with scores).
          init_capacity: keys to reserve room for up front (>= 1).
          max_capacity: the most keys the table holds (>= init_capacity).
          max_hbm_for_values: device-memory budget for values on GPU, in bytes (the
            rows beyond it live in pinned host memory the GPU reads over the bus);
            ignored on CPU.
          config: an `HkvHashTableConfig`; when given, its fields override
            `init_capacity`, `max_capacity`, `max_hbm_for_values`, `evict_strategy`,
            `step_per_epoch` and `gen_scores_fn` (as in TFRA).
          device: where to place the table and its ops (default: TF's placer); see
            `HashTable`.
          shared_name: share the table by this name (default: not shared). Dtypes,
            value shape, `max_capacity`, `evict_strategy` and `step_per_epoch` must
            match the existing table's (`init_capacity` may differ), or the op raises
            `InvalidArgumentError`.
          evict_strategy: used when no `config` is given.
          step_per_epoch: used when no `config` is given.
          gen_scores_fn: used when no `config` is given.

        Raises:
          TypeError: an unsupported dtype, or a non-integer capacity.
          ValueError: a capacity < 1, `init_capacity > max_capacity`, an unknown
            eviction strategy, or a bad `default_value`.
        """
        if config is not None:
            if not isinstance(config, HkvHashTableConfig):
                raise TypeError(
                    f"`config` must be a de.HkvHashTableConfig or None, got {config!r}."
                )
            init_capacity = config.init_capacity
            max_capacity = config.max_capacity
            max_hbm_for_values = config.max_hbm_for_values
            evict_strategy = config.evict_strategy
            step_per_epoch = config.step_per_epoch
            gen_scores_fn = config.gen_scores_fn
        init_capacity = check_int(init_capacity, "init_capacity", 1)
        max_capacity = check_int(max_capacity, "max_capacity", 1)
        if init_capacity > max_capacity:
            raise ValueError(
                "`init_capacity` must be <= `max_capacity`, got "
                f"init_capacity={init_capacity}, max_capacity={max_capacity}."
            )
        self._max_hbm_for_values = check_int(max_hbm_for_values, "max_hbm_for_values", 0)
        strategy = HkvEvictStrategy.coerce(evict_strategy)
        step_per_epoch = check_int(step_per_epoch, "step_per_epoch", 0)
        if gen_scores_fn is not None and not callable(gen_scores_fn):
            raise TypeError(f"`gen_scores_fn` must be callable or None, got {gen_scores_fn!r}.")
        self._evict_strategy = strategy
        self._gen_scores_fn = gen_scores_fn
        self._init_capacity = init_capacity
        self._max_capacity = max_capacity
        self._step_per_epoch = step_per_epoch
        super().__init__(
            key_dtype,
            value_dtype,
            default_value,
            name=name,
            checkpoint=checkpoint,
            device=device,
            shared_name=shared_name,
            table_attrs=dict(
                init_capacity=init_capacity,
                max_capacity=max_capacity,
                evict_strategy=strategy.op_value,
                step_per_epoch=step_per_epoch,
                find_updates_scores=strategy
                in (HkvEvictStrategy.LRU, HkvEvictStrategy.EPOCHLRU),
                max_hbm_for_values=self._max_hbm_for_values,
            ),
        )

    @property
    def evict_strategy(self) -> HkvEvictStrategy:
        return self._evict_strategy

    @property
    def init_capacity(self) -> int:
        return self._init_capacity

    @property
    def max_capacity(self) -> int:
        return self._max_capacity

    @property
    def max_hbm_for_values(self) -> int:
        return self._max_hbm_for_values

    def _default_scores(self, keys: tf.Tensor) -> Optional[tf.Tensor]:
        if self._evict_strategy != HkvEvictStrategy.CUSTOMIZED:
            return None
        if self._gen_scores_fn is None:
            # Without scores every new key would get 0: the lowest, first to go.
            raise ValueError(
                f"HkvHashTable {self._name!r} uses evict_strategy CUSTOMIZED, which needs "
                "scores= or gen_scores_fn: insert got scores=None and the table has no "
                "gen_scores_fn."
            )
        return convert_scores(self._gen_scores_fn(keys), "scores returned by gen_scores_fn")
