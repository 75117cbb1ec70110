"""A `de.Variable`'s content as a whole: export, streaming to and from files (files.py)
and the checkpoint hooks. A mixin of `Variable` (variable.py).

Checkpoints hold the variable's content, not its shards: `_serialize_to_tensors`
concatenates every shard and `_restore_from_tensors` routes the keys with the restoring
variable's own partitioner. So a checkpoint restores into any number of shards.
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Dict, Optional, Sequence, Tuple, Union

import tensorflow as tf

from tensorflow_dynemb.distribute import checkpoint as _slices
from tensorflow_dynemb.persistence.checkpoint import (
    CKPT_KEYS,
    CKPT_SCORES,
    CKPT_VALUES,
    CheckpointTables,
    Untracked,
)
from tensorflow_dynemb.persistence import file_saver, files, identity
from tensorflow_dynemb.variable import files as variable_files
from tensorflow_dynemb.variable.sharding import default_partition_fn


class VariableContent:
    """Export, files and checkpoints of a `Variable`."""

    def export_with_scores(self, name: Optional[str] = None):
        """Every entry of every shard, with its score.

        Returns:
          `(keys [n], values [n, dim], scores int64 [n])`, order unspecified.
        """
        with tf.name_scope(name or f"{self._unique_name}_export"):
            return self._concat_shards([table.export_with_scores() for table in self._tables])

    def export(self, name: Optional[str] = None) -> Tuple[tf.Tensor, tf.Tensor]:
        """Every entry of every shard.

        Returns:
          `(keys [n], values [n, dim])`, order unspecified.
        """
        with tf.name_scope(name or f"{self._unique_name}_export"):
            return self._concat_shards([table.export() for table in self._tables])

    # -- streaming to files --------------------------------------------------------------

    def save_to_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        proc_size: Optional[int] = None,
        proc_rank: Optional[int] = None,
        file_name_list: Optional[Sequence[str]] = None,
        dirpath_env: Optional[str] = files.DEFAULT_DIRPATH_ENV,
        append_to_file: bool = False,
        buffer_size: Optional[int] = None,
        name: Optional[str] = None,
        *,
        file_name: Optional[str] = None,
        chunk_rows: Optional[int] = None,
        sync: bool = True,
    ):
        """Streams every shard to `dirpath` as one generation (TFRA's arguments).

        Shard `i` of `n` goes to `<prefix>-<i:05d>-of-<n:05d>.<save id>.dynemb`, every
        block checksummed, and the manifest `<prefix>.dynemb-manifest`, written last,
        commits them: a save killed at any moment leaves the previous save whole, and
        the next save deletes what it left, as each save deletes the files of the one
        it replaces. No shard is copied whole in memory. `<prefix>` is `file_name` (or
        the variable's name, `/` replaced by `_`), plus `_rank<r>_size<s>` with
        `proc_size` > 1. Only one save of a prefix may run at a time.

        Args:
          dirpath: the directory (created if needed; `file://` paths work).
          proc_size: processes that each hold a part of the variable (Horovod); None
            or 1: one.
          proc_rank: this process's rank in [0, proc_size).
          file_name_list: per shard, the name of its data file before
            `.<save id>.dynemb` (TFRA's argument); default as above.
          dirpath_env: an environment variable whose value, when set and not empty,
            is used instead of `dirpath` (TFRA's; default `TFRA_SAVED_KV`; None:
            ignore the environment).
          append_to_file: must be False (a save is always a whole new generation).
          buffer_size: entries per chunk (TFRA's name for `chunk_rows`).
          name: a name for the operation.
          file_name: the prefix (default the variable's name).
          chunk_rows: entries per chunk (default 65536).
          sync: sync every file and the directory to the storage around the
            manifest's rename, so that the machine stopping cannot lose or mix saves
            either (local files are then written with direct I/O). False: through the
            page cache, unsynced: a killed process still leaves one whole generation,
            a machine that stops may lose the newest save's files (a load then fails
            with a DataLossError rather than load a mix).

        Returns:
          The save operation (None when executing eagerly).

        Raises:
          ValueError: `append_to_file=True`, a bad `file_name_list`, `file_name` or
            chunk size, or a `proc_rank` outside [0, proc_size).
        """
        files.refuse_append(append_to_file)
        rows = files.chunk_rows_of(chunk_rows, buffer_size)
        proc_size, proc_rank = files.check_procs(proc_size, proc_rank)
        dirpath = files.resolve_dirpath(dirpath, dirpath_env)
        prefix = variable_files.prefix_of(self, file_name, proc_size, proc_rank)
        with tf.name_scope(name or f"{self._unique_name}_save_to_file"):
            committed = variable_files.save(
                self, dirpath, prefix, rows, stems=file_name_list, sync=sync
            )
        return None if tf.executing_eagerly() else committed.op

    def load_from_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        proc_size: Optional[int] = None,
        proc_rank: Optional[int] = None,
        file_name_list: Optional[Sequence[str]] = None,
        dirpath_env: Optional[str] = files.DEFAULT_DIRPATH_ENV,
        load_entire_dir: bool = False,
        buffer_size: Optional[int] = None,
        name: Optional[str] = None,
        *,
        file_name: Optional[str] = None,
        chunk_rows: Optional[int] = None,
        clear: bool = True,
        in_place: bool = False,
    ):
        """Streams a save of `save_to_file_system` into the variable, all or nothing.

        The manifest says which files make the save; each shard loads them aside,
        checking everything (checksums, sizes, save ids, shard numbers, dtypes, dim,
        each key's shard), and only when every shard has loaded without error do the
        new contents replace the old ones: a failed load leaves the variable as it
        was. That holds the old and the new content at once until the load is
        complete (nothing extra when the variable is empty, as at a restart);
        `in_place=True` needs memory for one of them: every file is checked first,
        then every shard is cleared and loaded again from the files, and if the
        storage fails or memory runs out in that pass the error says the variable
        holds part of the save. The save may come from a variable with another number
        of shards (each shard then reads every file and keeps the keys
        `default_partition_fn` routes to it, which needs that partitioner on both
        sides), or from a version of this package before manifests.

        Args:
          dirpath: the directory (`file://` paths work).
          proc_size: as in `save_to_file_system`.
          proc_rank: as in `save_to_file_system`: which process's save to load.
          file_name_list: accepted for TFRA; the manifest names the files, so it is
            not needed.
          dirpath_env: as in `save_to_file_system`.
          load_entire_dir: load every save in `dirpath` whose prefix starts with this
            variable's (every process's, with `proc_size` > 1); needs a Python
            `dirpath`.
          buffer_size: entries per chunk (TFRA's name for `chunk_rows`).
          name: a name for the operation.
          file_name: the prefix (default the variable's name).
          chunk_rows: entries per chunk (default 65536).
          clear: replace the content (default); if False, upsert into it (after
            every file is checked).
          in_place: see above.

        Returns:
          The load operation (None when executing eagerly).

        Raises:
          ValueError: no save of the prefix in `dirpath` (a Python path).
          tf.errors.DataLossError: a damaged file or manifest, files of two saves, a
            key in the shard file of another shard (the error names the file).
          tf.errors.InvalidArgumentError: another key or value dtype or dim, or a
            resharding load with a custom partitioner.
          tf.errors.NotFoundError: no save in a symbolic `dirpath`, or a file the
            manifest names is missing.
        """
        del file_name_list  # the manifest names the files
        rows = files.chunk_rows_of(chunk_rows, buffer_size)
        proc_size, proc_rank = files.check_procs(proc_size, proc_rank)
        dirpath = files.resolve_dirpath(dirpath, dirpath_env)
        if load_entire_dir:
            prefix = variable_files.prefix_of(self, file_name, 1, 0)
        else:
            prefix = variable_files.prefix_of(self, file_name, proc_size, proc_rank)
        with tf.name_scope(name or f"{self._unique_name}_load_from_file"):
            ops = variable_files.load(
                self, dirpath, prefix, rows, clear, in_place=in_place,
                load_entire_dir=load_entire_dir,
            )
        return self._group(ops)

    def load_from_file_system_with_restore_function(
        self, dirpath, proc_size=None, proc_rank=None, buffer_size=None
    ):
        """TFRA's resharding load: `load_from_file_system` reshards already."""
        return self.load_from_file_system(
            dirpath, proc_size=proc_size, proc_rank=proc_rank, buffer_size=buffer_size
        )

    # -- checkpoints through files (de.FileSystemSaver) ----------------------------------

    def _file_system_saver(self):
        """The creator's `de.FileSystemSaver` when checkpoints keep this variable's
        content in files (persistence/file_saver.py); None otherwise."""
        saver = getattr(self._kv_creator, "saver", None)
        return saver if self._checkpoint else None

    def _checkpoint_files(self, default_dir):
        """`(dirpath, prefix, chunk_rows)` of this variable's checkpoint files."""
        config = self._file_system_saver().config
        dirpath = config.save_path or default_dir
        prefix = variable_files.prefix_of(self, None, config.proc_size, config.proc_rank)
        return dirpath, prefix, config.buffer_size

    def _save_files_for_checkpoint(self, save_id: tf.Tensor, default_dir) -> tf.Tensor:
        """Saves the content as the generation `save_id`; returns the committed id, which
        the checkpoint records."""
        dirpath, prefix, rows = self._checkpoint_files(default_dir)
        with tf.name_scope(f"{self._unique_name}_checkpoint_files"):
            return variable_files.save(self, dirpath, prefix, rows, save_id=save_id)

    def _load_files_for_checkpoint(self, save_id, default_dir):
        """Loads the generation `save_id` (what the checkpoint recorded); returns the
        load operations (empty when executing eagerly)."""
        dirpath, prefix, rows = self._checkpoint_files(default_dir)
        with tf.name_scope(f"{self._unique_name}_checkpoint_files"):
            # A tensor: the files are found when the restore runs (a TF1 Saver
            # builds its restore ops before the first save).
            dirpath = tf.convert_to_tensor(dirpath, tf.string)
            return variable_files.load(self, dirpath, prefix, rows, clear=True,
                                       expected_save_id=save_id)

    def _gather_saveables_for_checkpoint(self):
        # TF1's Saver asks this first (tf.train.Checkpoint and SavedModels use
        # _serialize_to_tensors): with a FileSystemSaver, the content goes to files;
        # without, the content is saved under the variable's name (TF1SaverHooks, in
        # Variable's bases), as `Saver()` without `var_list` saves it.
        if self._file_system_saver() is None:
            return super()._gather_saveables_for_checkpoint()
        return {"file_system": functools.partial(file_saver.FileSystemSaveable, self)}

    # -- checkpointing (public Trackable hooks) --------------------------------------------

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # Checkpoints hold the content through _serialize_to_tensors, not per shard: a
        # restore into another number of shards must find no shard tables to match.
        # SavedModels still see the tables, whose resources their functions capture.
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "checkpoint":
            children.pop("_tables", None)
            children.pop("_trainables", None)
        elif save_type == "savedmodel":
            identity.add_name_function(self, self.name, children)
        return children

    def _deserialization_dependencies(self, children):
        # A SavedModel maps the shard tables into its graph before this variable
        # (see _export_to_saved_model_graph), and loads them first.
        del children
        return {f"_table_{i}": table for i, table in enumerate(self._tables)}

    def _export_to_saved_model_graph(self, object_map, tensor_map, options, **kwargs):
        # The graph a SavedModel holds for TF1-style loaders (TF Serving) saves and
        # restores this variable's content through a copy that uses the shard tables'
        # copies in that graph (made first, see _deserialization_dependencies).
        del tensor_map, options, kwargs
        mapped = copy.copy(self)
        # Set without tracking: the copy shares this variable's dependency records.
        mapped.__dict__["_tables"] = [object_map[table] for table in self._tables]
        # The copy's tables hold the whole content (gathered while saving): it is no
        # slice of a multi-worker variable.
        mapped.__dict__["_distribution"] = Untracked(group=None)
        object_map[self] = mapped
        return []

    def _checkpoint_tables(self):
        """For tf.train.Checkpoint's streaming saver (persistence/checkpoint.py): the shard tables,
        whose rows in shard order are the content `_serialize_to_tensors` exports,
        whether their scores are saved, and whether a restore may route keys to them
        itself (by `default_partition_fn`); None with `checkpoint=False`."""
        if not self._checkpoint:
            return None
        sliced = self.worker_group is not None
        return CheckpointTables(
            list(self._tables),
            with_scores=self._checkpoint_scores,
            # A model-parallel variable keeps only its keys of a whole content, which
            # the streaming restore op cannot filter (see `_owned`).
            routes_by_default=not sliced
            and (self.shard_num == 1 or self._partition_fn is default_partition_fn),
            sliced=sliced,
        )

    def _local_content(self, with_scores: bool) -> Tuple[tf.Tensor, ...]:
        """`(keys, values[, scores])` of this process's tables (a model-parallel
        variable's slice), exported on the CPU."""
        name = f"{self._unique_name}_checkpoint_export"
        with tf.device("/CPU:0"):
            if with_scores:
                return self.export_with_scores(name=name)
            return self.export(name=name)

    def _serialize_to_tensors(self) -> Dict[str, tf.Tensor]:
        if not self._checkpoint:
            return {}
        if self.worker_group is not None and tf.executing_eagerly():
            # A Keras weight file or a SavedModel's variables being written on every
            # worker: the whole content, gathered (tf.train.Checkpoint saves slices
            # instead). Traced (the save function a SavedModel keeps for its loaded
            # objects, which are single-process): the slice, with no collective.
            content = _slices.gather_content(self, self._checkpoint_scores)
        else:
            content = self._local_content(self._checkpoint_scores)
        return dict(zip([CKPT_KEYS, CKPT_VALUES, CKPT_SCORES], content))

    def _restore_from_tensors(self, restored_tensors: Dict[str, tf.Tensor]):
        if not restored_tensors:
            return None
        keys = restored_tensors[CKPT_KEYS]
        values = restored_tensors[CKPT_VALUES]
        scores = restored_tensors.get(CKPT_SCORES)  # absent: the table scores the keys
        message = (
            f"The checkpoint of de.Variable {self.name!r} holds rows of another dim than "
            f"the variable's dim {self._dim}"
        )
        if values.shape.rank is not None and values.shape[-1] is not None:
            if values.shape[-1] != self._dim:
                raise ValueError(f"{message}: checkpoint dim {values.shape[-1]}.")
        else:
            check = tf.debugging.assert_equal(tf.shape(values)[-1], self._dim, message=message)
            with tf.control_dependencies([check]):
                values = tf.identity(values)
        # A model-parallel variable keeps its own slice of the content (`_owned`).
        if scores is None:
            shards = [(k, v, None) for k, v in self._route(*self._owned(keys, values))[0]]
        else:
            shards, _ = self._route(*self._owned(keys, values, scores))
        return self._group(
            [
                table.import_(k, v, s, name=f"{self._unique_name}_checkpoint_restore",
                              _restore=True)
                for table, (k, v, s) in zip(self._tables, shards)
            ]
        )

