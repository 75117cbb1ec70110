"""A table's content as a whole: export and import, streaming to and from files, and
the checkpoint hooks. A mixin of `_DynembTable` (base.py), which provides the handle,
the dtypes, `_name` and `_placement()`."""

from __future__ import annotations

import copy
import os
import weakref
from typing import Any, Dict, Optional, Tuple, Union

import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb.persistence.checkpoint import (
    CKPT_KEYS,
    CKPT_SCORES,
    CKPT_VALUES,
    CheckpointTables,
)
from tensorflow_dynemb._convert import TensorLike, check_int, convert, convert_scores


class TableContent:
    """The whole-content methods of a table (see the module docstring)."""

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
            return _ops.ops.dynemb_table_export(
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
            return _ops.ops.dynemb_table_import(self.resource_handle, keys, values, scores)

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
            return _ops.ops.dynemb_table_save_to_file(
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
            return _ops.ops.dynemb_table_load_from_file(
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
        """For tf.train.Checkpoint's streaming saver (persistence/checkpoint.py): this table, with
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

