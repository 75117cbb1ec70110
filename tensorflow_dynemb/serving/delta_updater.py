"""`de.serving.DeltaUpdater`: keeps a served model current with the generations a
`de.DeltaExporter` writes, without reloading it.

`apply()` (or the `apply_deltas` function, which a SavedModel can export as a
signature) runs one op, `DynembApplyDeltas`: it applies the directory's generations
the model has not applied yet, in order, each checked whole before any table changes,
and returns how many it applied. Tables are updated under their locks while other
threads serve (a lookup sees each row before or after, never torn); dense variables
are assigned after the tables. The state (base id, base serial, sequence) lives in
three variables of the updater, so an updater saved with a model keeps it.

Two ways to get one:
- at serving time, from the loaded SavedModel: `DeltaUpdater(loaded, directory)`
  finds the model's variables and tables by the names the exporter wrote (kept in the
  SavedModel, `persistence/identity.py`) and its dense variables by object path (or,
  in a Keras `model.export` archive, by their index in `model.variables`);
- at export time, from the live model: `DeltaUpdater(model)` uses the exporter's own
  identities; save it with the model and export `updater.apply_deltas` as a signature
  for servers that call signatures.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb.serving import delta_items


class DeltaUpdater(tf.Module):
    """Applies the generations of a delta directory to a served model.

    Args:
      model: the model to keep current: a loaded SavedModel (`tf.saved_model.load`,
        after `import tensorflow_dynemb`), or, at export time, the live model the
        `de.DeltaExporter` writes (then save the updater with the model).
      directory: the exporter's directory, for `apply()`; `apply_deltas` takes it as
        its argument instead. With a loaded SavedModel, the directory must already
        hold a generation: its manifest says which objects of the model to update.
      include_slots: as the exporter's (export-time updaters only).
      name: the module's name.

    Example (the exporter's example directory, served by a model that holds `emb`):

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> served = de.Variable(tf.int64, tf.float32, dim=2, name="emb")
    >>> updater = de.serving.DeltaUpdater(served, "/tmp/dynemb_doc_deltas")
    >>> updater.apply()  # the base and the delta
    2
    >>> served.lookup([2]).numpy()
    array([[3., 3.]], dtype=float32)
    """

    def __init__(self, model: Any, directory: Optional[Any] = None, *,
                 include_slots: bool = False, name: str = "delta_updater"):
        super().__init__(name=name)
        if directory is not None and not isinstance(directory, (str, bytes, os.PathLike)):
            raise TypeError(f"`directory` must be a path or None, got {directory!r}.")
        self._directory = None if directory is None else os.fsdecode(directory)
        # In a plain holder: the model owns these, and tf.Module would otherwise list
        # the model's variables among the updater's.
        self._served = _Served(*self._items(model, include_slots))
        with tf.init_scope():
            self.base_id = tf.Variable("", dtype=tf.string, trainable=False, name="base_id")
            self.base_serial = tf.Variable(-1, dtype=tf.int64, trainable=False, name="base_serial")
            self.sequence = tf.Variable(-1, dtype=tf.int64, trainable=False, name="sequence")
        self.apply_deltas = tf.function(
            self._apply_deltas,
            input_signature=[tf.TensorSpec([], tf.string, name="directory")],
            autograph=False,
        )

    def _items(self, model, include_slots) -> Tuple[List[Tuple[str, List[Any]]], List[Tuple[str, Any]]]:
        """`(tables, dense)`: (identity, shard tables) and (identity, tf.Variable) pairs."""
        try:
            tables, dense = delta_items.collect(model, include_slots=include_slots)
            return ([(t.identity, t.tables) for t in tables],
                    [(d.identity, d.variable) for d in dense])
        except ValueError:
            pass  # no de.Variable or table object: a loaded SavedModel
        if self._directory is None:
            raise ValueError(
                "`directory` is needed to update a loaded SavedModel: its generations say "
                "which objects of the model they update.")
        with tf.device("/CPU:0"):
            _, _, sequence, _, lines = _ops.ops.dynemb_delta_state(self._directory)
        if int(sequence) < 0:
            raise ValueError(
                f"`directory` {self._directory!r} holds no generation yet: make the updater "
                "once the exporter has written its base.")
        return delta_items.resolve_loaded(model, [line.decode() for line in lines.numpy()])

    def _apply_deltas(self, directory, max_generations: int = 0):
        """Applies the generations of `directory` the model lacks; returns
        `{"applied": int64 scalar}` (for a signature)."""
        served = self._served
        tables = [t for _, shards in served.tables for t in shards]
        dense = [v for _, v in served.dense]
        with tf.device("/CPU:0"):
            base_id, serial, sequence, applied, values = _ops.ops.dynemb_apply_deltas(
                directory,
                self.base_id.read_value(),
                self.base_serial.read_value(),
                self.sequence.read_value(),
                [t.resource_handle for t in tables],
                [v.read_value() for v in dense],
                table_identities=[identity for identity, _ in served.tables],
                table_shards=[len(shards) for _, shards in served.tables],
                dense_identities=[identity for identity, _ in served.dense],
                max_generations=max_generations,
            )
            ops = [self.base_id.assign(base_id), self.base_serial.assign(serial),
                   self.sequence.assign(sequence)]

        def assign_dense():
            with tf.control_dependencies([v.assign(x) for v, x in zip(dense, values)]):
                return tf.identity(applied)

        if dense:
            applied = tf.cond(applied > 0, assign_dense, lambda: tf.identity(applied))
        with tf.control_dependencies(ops):
            return {"applied": tf.identity(applied)}

    def apply(self, max_generations: int = 0) -> int:
        """Applies the generations of the updater's directory that the model has not
        applied, in order, and returns how many it applied (0 when it is current).

        Args:
          max_generations: apply at most this many (0: all).

        Raises:
          ValueError: the updater was made without `directory`.
          tf.errors.FailedPreconditionError: the directory's deltas are for another base
            than the model holds, or the directory is behind the model, or it names a
            table or dense variable the model lacks.
          tf.errors.DataLossError: a sequence is missing (a gap), or a file is damaged.
        """
        if self._directory is None:
            raise ValueError("this DeltaUpdater has no `directory`: call apply_deltas(directory).")
        if max_generations:
            result = self._apply_deltas(tf.constant(self._directory), int(max_generations))
        else:
            result = self.apply_deltas(tf.constant(self._directory))
        return int(result["applied"])


class _Served:
    """What an updater updates: (identity, shard tables) and (identity, tf.Variable)."""

    def __init__(self, tables: List[Tuple[str, List[Any]]], dense: List[Tuple[str, Any]]):
        self.tables = tables
        self.dense = dense
