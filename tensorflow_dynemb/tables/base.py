"""The shared implementation of every dynamic-embedding table: `_DynembTable`.

The public classes (`HashTable` in hash_table.py, `HkvHashTable` in hkv.py) are thin:
they only choose the attributes the table is created with. Every method lives here,
in `TableContent` (content.py: the whole content at once, files, checkpoints) and in
`EvictingOps` (evicting.py: the ops that return what they evicted): it
converts its inputs and calls one generated op (see `cc/ops/table_ops.cc`). Semantics
that must be the same in eager mode, inside `tf.function` and in TF1 graph mode live
in the ops, not here.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf

from tensorflow_dynemb import _export_context, _ops
from tensorflow_dynemb.persistence.checkpoint import (
    CKPT_KEYS,
    CKPT_SCORES,
    CKPT_VALUES,
    in_tf1_graph,
    register_for_tf1_saver,
)
from tensorflow_dynemb.persistence.tf1_saver import TF1SaverHooks
from tensorflow_dynemb.tables.content import TableContent
from tensorflow_dynemb.tables.evicting import EvictingOps
from tensorflow_dynemb.tables.xla import refuse_xla
from tensorflow_dynemb._convert import (
    KEY_DTYPES,
    VALUE_DTYPES,
    DTypeLike,
    TensorLike,
    as_dtype,
    check_shape,
    convert,
    convert_scores,
)


class _DynembTable(
    TableContent, EvictingOps, TF1SaverHooks, tf.saved_model.experimental.TrackableResource
):
    """Base class of every dynamic-embedding table: its methods live here and in its
    mixins (module docstring).

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

    # -- a TF1 Saver given the table in `var_list` (persistence/tf1_saver.py) -----------------

    def _tf1_saver_name(self) -> str:
        # The op name, as `register_for_tf1_saver` names it (graph-unique).
        return self._resource_handle.op.name if in_tf1_graph() else self._name

    def _tf1_saver_tensors(self) -> Dict[str, tf.Tensor]:
        # Also with `checkpoint=False`: a de.Variable's shard tables are made so (the
        # variable checkpoints their content), and listing a table asks to save it.
        keys, values, scores = self.export_with_scores(name=f"{self._name}_checkpoint_export")
        return {CKPT_KEYS: keys, CKPT_VALUES: values, CKPT_SCORES: scores}

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
        return _ops.ops.dynemb_hash_table(
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
        other ops with the table's resource input. Every table op is built under it,
        so it is also where an op that XLA would fail to compile is refused."""
        refuse_xla(self._name)
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
        """The converted inputs of `insert` / `insert_and_evict`, their shapes checked
        here, where they are known, before the op checks them; scores `[0]` mean
        "assigned by the table"."""
        keys = convert(keys, self._key_dtype, "keys")
        values = convert(values, self._value_dtype, "values")
        self._check_rows(keys, values, "values")
        if scores is not None:
            scores = convert_scores(scores)
            check_shape(scores, keys.shape, "scores", "keys.shape")
        else:
            scores = self._default_scores(keys)
        scores = tf.zeros([0], tf.int64) if scores is None else scores
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
            return _ops.ops.dynemb_table_insert(self.resource_handle, keys, values, scores)

    def lookup(
        self,
        keys: TensorLike,
        dynamic_default_values: Optional[TensorLike] = None,
        return_exists: bool = False,
        name: Optional[str] = None,
    ):
        """Looks up `keys`; missing keys get the default.

        In an `HkvHashTable` with an LRU strategy a lookup refreshes the found keys'
        scores, except when it is read-only: built in inference mode
        (`de.enable_inference_mode()`) or traced for a SavedModel.

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
            # A read-only lookup (serving, inference mode) leaves LRU scores alone.
            values, exists = _ops.ops.dynemb_table_find(
                self.resource_handle, keys, defaults,
                update_scores=not _export_context.read_only(),
            )
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
            return _ops.ops.dynemb_table_accum(
                self.resource_handle, keys, values_or_deltas, exists
            )

    def _accum_inputs(
        self, keys: TensorLike, values_or_deltas: TensorLike, exists: TensorLike
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The converted inputs of `accum` / `accum_and_evict`."""
        keys = convert(keys, self._key_dtype, "keys")
        values_or_deltas = convert(values_or_deltas, self._value_dtype, "values_or_deltas")
        self._check_rows(keys, values_or_deltas, "values_or_deltas")
        exists = convert(exists, tf.bool, "exists")
        check_shape(exists, keys.shape, "exists", "keys.shape")
        return keys, values_or_deltas, exists

    def _apply_rule(self, keys, rows, grads, initial, coefficients, rule: str,
                    weight_decay: bool) -> tf.Tensor:
        """`DynembTableApplyRule` on this table as a slot state (`Variable._apply_rule`):
        updates the state rows of the 1-D `keys` in place (`initial` for absent keys)
        by `rule` and returns the new parameter rows. Unbounded CPU tables only."""
        with tf.name_scope(f"{self._name}_apply_rule"), self._placement():
            return _ops.ops.dynemb_table_apply_rule(
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
            return _ops.ops.dynemb_table_remove(self.resource_handle, keys)

    def clear(self, name: Optional[str] = None):
        """Removes every key and releases the memory.

        Args:
          name: a name for the operation.

        Returns:
          The clear operation (None when executing eagerly).
        """
        with tf.name_scope(name or f"{self._name}_clear"), self._placement():
            return _ops.ops.dynemb_table_clear(self.resource_handle)

    def size(self, name: Optional[str] = None) -> tf.Tensor:
        """The number of keys in the table.

        Args:
          name: a name for the operation.

        Returns:
          An int64 scalar tensor.
        """
        with tf.name_scope(name or f"{self._name}_size"), self._placement():
            return _ops.ops.dynemb_table_size(self.resource_handle)

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
            return _ops.ops.dynemb_table_stats(self.resource_handle)._asdict()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} name={self._table_name!r} key_dtype={self._key_dtype.name} "
            f"value_dtype={self._value_dtype.name} value_shape={self._value_shape}>"
        )

