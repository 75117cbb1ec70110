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
from tensorflow_dynemb.persistence import files, identity
from tensorflow_dynemb.persistence.checkpoint import (
    CKPT_KEYS,
    CKPT_SCORES,
    CKPT_VALUES,
    CheckpointTables,
)
from tensorflow_dynemb._convert import TensorLike, check_shape, convert, convert_scores


class TableContent:
    """The whole-content methods of a table (see the module docstring)."""

    def _check_rows(self, keys: tf.Tensor, values: tf.Tensor, arg: str) -> None:
        """`values` must be `keys.shape + value_shape` (checked where the shapes are
        known, before the op checks them at run time)."""
        check_shape(values, keys.shape.concatenate(self._value_shape), arg,
                    "keys.shape + value_shape")

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
        _restore: bool = False,
    ):
        """Replaces the whole content of the table with `keys` and `values`.

        Args:
          keys: keys of any shape.
          values: `keys.shape + value_shape`.
          scores: optional int64 scores of `keys.shape` (e.g. from
            `export_with_scores`); by default the table assigns them as an insert does.
          name: a name for the operation.
          _restore: (checkpoint and SavedModel restores) a Redis table whose config says
            `"table_store_mode": 2` where the table is created is left as it is.

        Returns:
          The import operation (None when executing eagerly).
        """
        keys = convert(keys, self._key_dtype, "keys")
        values = convert(values, self._value_dtype, "values")
        self._check_rows(keys, values, "values")
        if scores is not None:
            scores = convert_scores(scores)
            check_shape(scores, keys.shape, "scores", "keys.shape")
        scores = tf.zeros([0], tf.int64) if scores is None else scores
        with tf.name_scope(name or f"{self._name}_import"), self._placement():
            return _ops.ops.dynemb_table_import(
                self.resource_handle, keys, values, scores, restore=_restore
            )

    def _file_name(self, file_name: Optional[str]) -> str:
        file_name = f"{self._table_name}.dynemb" if file_name is None else os.fsdecode(file_name)
        if not file_name or "/" in file_name:
            raise ValueError(f"`file_name` must be a file name without '/', got {file_name!r}.")
        return file_name

    def save_to_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        file_name: Optional[str] = None,
        dirpath_env: Optional[str] = files.DEFAULT_DIRPATH_ENV,
        append_to_file: bool = False,
        buffer_size: Optional[int] = None,
        name: Optional[str] = None,
        *,
        chunk_rows: Optional[int] = None,
        sync: bool = True,
    ):
        """Streams the table to the file `dirpath/file_name`, in chunks.

        The table is never copied whole: memory stays O(chunk_rows). The file is
        written aside, synced and renamed into place, so its name always holds a whole
        save (a save killed midway leaves the previous file; the next save deletes what
        it left). Every block of the file is checksummed (table file format 2,
        `cc/core/table_io.h`). The op creates the directory if needed; any
        `tf.io.gfile` file system works, `file://` paths included.

        Args:
          dirpath: the directory.
          file_name: the file name; default `<table name>.dynemb`.
          dirpath_env: an environment variable whose value, when set and not empty,
            is used instead of `dirpath` (TFRA's argument; default `TFRA_SAVED_KV`;
            None: ignore the environment).
          append_to_file: must be False: a save always writes a whole new file.
          buffer_size: entries per chunk (TFRA's name for `chunk_rows`).
          name: a name for the operation.
          chunk_rows: entries per chunk (default 65536).
          sync: sync the file and its directory to the storage before returning, so
            that the machine stopping cannot lose the save either (local files are
            then written with direct I/O). False: through the page cache, as before
            manifests: a killed process still leaves a whole file, a machine that
            stops may not.

        Returns:
          The save operation (None when executing eagerly).

        Raises:
          ValueError: `append_to_file=True`, or a bad `file_name` or chunk size.

        Example:

        >>> import tensorflow_dynemb as de
        >>> t = de.HashTable(tf.int64, tf.float32, [0.0])
        >>> t.insert([1, 2], [[1.0], [2.0]])
        >>> t.save_to_file_system("/tmp/dynemb_doc", "t.dynemb")
        """
        files.refuse_append(append_to_file)
        rows = files.chunk_rows_of(chunk_rows, buffer_size)
        dirpath = files.resolve_dirpath(dirpath, dirpath_env)
        file_name = self._file_name(file_name)
        with tf.name_scope(name or f"{self._name}_save_to_file"):
            entry = files.save_table_file(self, dirpath, file_name, rows, sync=sync)
        return None if tf.executing_eagerly() else entry.op

    def load_from_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        file_name: Optional[str] = None,
        dirpath_env: Optional[str] = files.DEFAULT_DIRPATH_ENV,
        load_entire_dir: bool = False,
        buffer_size: Optional[int] = None,
        name: Optional[str] = None,
        *,
        chunk_rows: Optional[int] = None,
        clear: bool = True,
        in_place: bool = False,
    ):
        """Streams a file written by `save_to_file_system` into the table.

        Every check is made before the table changes: the file's checksums, its row
        count, the key and value dtypes and dim (an error names both). With `clear`
        (the default) the rows are loaded into a new table aside, which then takes
        the place of the old content: a load that fails, for any reason, leaves the
        table as it was. That holds the old and the new content at once until the
        load is complete; `in_place=True` needs memory for one of them instead (the
        file is checked, then read again into the cleared table: if the storage
        fails or memory runs out in that second pass, the table holds part of the
        file, and the error says so). Files of the previous format (version 1,
        without checksums) load too.

        Args:
          dirpath: the directory.
          file_name: the file name; default `<table name>.dynemb`.
          dirpath_env: an environment variable whose value, when set and not empty,
            is used instead of `dirpath` (TFRA's argument; None: ignore it).
          load_entire_dir: load every save in `dirpath` whose name starts with
            `file_name` (up to its `_mht_` part, as TFRA): the shard files of a
            variable's saves, all into this table (needs a Python `dirpath`).
          buffer_size: entries per chunk (TFRA's name for `chunk_rows`).
          name: a name for the operation.
          chunk_rows: entries per chunk (default 65536).
          clear: replace the table's content (default); if False, the file's entries
            are upserted into it (after every file is checked).
          in_place: see above.

        Returns:
          The load operation (None when executing eagerly).

        Raises:
          tf.errors.DataLossError: a damaged or truncated file (the error names the
            file and the byte offset).
          tf.errors.InvalidArgumentError: a file of other dtypes or another dim.
          tf.errors.NotFoundError: no such file.
        """
        rows = files.chunk_rows_of(chunk_rows, buffer_size)
        dirpath = files.resolve_dirpath(dirpath, dirpath_env)
        file_name = self._file_name(file_name)
        if load_entire_dir:
            stem = file_name.split("_mht_")[0]
            if stem == file_name and stem.endswith(".dynemb"):
                stem = stem[: -len(".dynemb")]
            directory = files.python_dir(dirpath, "load_entire_dir=True")
            manifests, paths = files.directory_saves(directory, stem)
        else:
            manifests, paths = [], [files.join(dirpath, file_name)]
        with tf.name_scope(name or f"{self._name}_load_from_file"):
            ops = files.load_tables(
                [self],
                manifest_paths=manifests,
                filepaths=paths,
                files_are_fallback=False,
                chunk_rows=rows,
                partitioner="default",
                clear=clear,
                in_place=in_place,
            )
        return None if tf.executing_eagerly() else tf.group(*ops)

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
        elif save_type == "savedmodel":
            identity.add_name_function(self, self.name, children)
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
            _restore=True,
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

