"""A `de.Variable`'s content as a whole: export, streaming to and from files (files.py)
and the checkpoint hooks. A mixin of `Variable` (variable.py).

Checkpoints hold the variable's content, not its shards: `_serialize_to_tensors`
concatenates every shard and `_restore_from_tensors` routes the keys with the restoring
variable's own partitioner. So a checkpoint restores into any number of shards.
"""

from __future__ import annotations

import copy
import os
from typing import Dict, Optional, Tuple, Union

import tensorflow as tf

from tensorflow_dynemb.distribute import checkpoint as _slices
from tensorflow_dynemb.persistence.checkpoint import (
    CKPT_KEYS,
    CKPT_SCORES,
    CKPT_VALUES,
    CheckpointTables,
    Untracked,
)
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

    def _file_prefix(self, file_name: Optional[str]) -> str:
        return file_name or self.name.replace("/", "_")

    def save_to_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        file_name: Optional[str] = None,
        chunk_rows: int = 65536,
        name: Optional[str] = None,
    ):
        """Streams every shard to `dirpath/<file_name>-<i>-of-<n>.dynemb`.

        No shard is copied whole in memory. Files of an earlier save of this variable
        with another number of shards are removed first (when `dirpath` is a Python
        path), so that a later load reads one consistent set.

        Args:
          dirpath: the directory (the save op creates it if needed).
          file_name: the file prefix; default the variable's name.
          chunk_rows: entries per chunk.
          name: a name for the operation.

        Returns:
          The save operation (None when executing eagerly).
        """
        with tf.name_scope(name or f"{self._unique_name}_save_to_file"):
            return self._group(
                variable_files.save(self, dirpath, self._file_prefix(file_name), chunk_rows)
            )

    def load_from_file_system(
        self,
        dirpath: Union[str, os.PathLike, tf.Tensor],
        file_name: Optional[str] = None,
        chunk_rows: int = 65536,
        clear: bool = True,
        name: Optional[str] = None,
    ):
        """Streams files written by `save_to_file_system` into the variable.

        The files may come from a variable with another number of shards: each shard
        then reads every file and keeps the keys `default_partition_fn` routes to it
        (which needs this variable to use `default_partition_fn`). With as many files
        as shards, file `i` loads into shard `i` directly.

        Args:
          dirpath: the directory.
          file_name: the file prefix; default the variable's name.
          chunk_rows: entries per chunk.
          clear: replace the content (default); if False, upsert into it.
          name: a name for the operation.

        Returns:
          The load operation (None when executing eagerly).

        Raises:
          ValueError: no files, an incomplete or mixed set of files, or a resharding
            load with a custom partitioner.
        """
        with tf.name_scope(name or f"{self._unique_name}_load_from_file"):
            prefix = self._file_prefix(file_name)
            return self._group(variable_files.load(self, dirpath, prefix, chunk_rows, clear))

    # -- checkpointing (public Trackable hooks) --------------------------------------------

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # Checkpoints hold the content through _serialize_to_tensors, not per shard: a
        # restore into another number of shards must find no shard tables to match.
        # SavedModels still see the tables, whose resources their functions capture.
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "checkpoint":
            children.pop("_tables", None)
            children.pop("_trainables", None)
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
                table.import_(k, v, s, name=f"{self._unique_name}_checkpoint_restore")
                for table, (k, v, s) in zip(self._tables, shards)
            ]
        )

