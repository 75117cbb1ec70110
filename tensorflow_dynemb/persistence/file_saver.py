"""`de.FileSystemSaver`: checkpoints that keep a variable's content in its own files.

Given to a table creator (`de.HashTableCreator(saver=de.FileSystemSaver())`), it makes
`tf.train.Checkpoint` and TF1's `tf.compat.v1.train.Saver` save the variable as a
generation of table files (persistence/files.py) in the directory
`TFRADynamicEmbedding` beside the checkpoint (TFRA's name), or in `save_path`, instead
of inside the checkpoint's bundle; the bundle holds only the save id of those files.
A restore loads the generation with that id, into any number of shards, all or
nothing. So restoring a checkpoint whose files a later save replaced is an error
naming both saves, never the newer embeddings beside the older dense weights.

How each checkpointing API reaches it:
- `tf.train.Checkpoint` (eager, `tf.function`): the streaming saver registered in
  checkpoint.py; every variable of one checkpoint save shares one save id.
- TF1 `Saver` (and `MonitoredTrainingSession`, Estimator): `FileSystemSaveable`, which
  the variable gives the Saver (`_gather_saveables_for_checkpoint`). It finds the
  checkpoint's path as the Saver's filename tensor (`<saver scope>/Const`, the name
  TF1's Saver has kept for compatibility since TF 1.0).
- SavedModels keep the content inside (`_serialize_to_tensors`): a SavedModel must be
  whole on its own.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tensorflow_dynemb.persistence import files

# The directory beside a checkpoint that holds its variables' files (TFRA's name).
FOLDER = "TFRADynamicEmbedding"
# The checkpoint key, relative to the variable's, of the save id of its files.
CKPT_SAVE_ID = "-file_system_save_id"

try:  # the TF1 Saver's base class; every supported TF has it here
    from tensorflow.python.training.saving import saveable_object as _saveable_object
except ImportError:  # pragma: no cover
    _saveable_object = None


class FileSystemSaverConfig:
    """What a `FileSystemSaver` was given (TFRA's class of the same name).

    Args:
      proc_size: processes that each hold a part of the variables (Horovod); None
        with `proc_rank` None: one.
      proc_rank: this process's rank in [0, proc_size).
      save_path: the directory of the files; default `TFRADynamicEmbedding` beside
        the checkpoint.
      buffer_size: entries per chunk read or written.
    """

    def __init__(
        self,
        proc_size: Optional[int] = None,
        proc_rank: Optional[int] = None,
        save_path: Optional[str] = None,
        buffer_size: int = 4096,
    ):
        if (proc_size is None) != (proc_rank is None):
            raise TypeError(
                "`proc_size` and `proc_rank` must both be integers or both None, got "
                f"proc_size={proc_size!r}, proc_rank={proc_rank!r}."
            )
        self.proc_size, self.proc_rank = files.check_procs(proc_size, proc_rank)
        if save_path is not None and not isinstance(save_path, str):
            raise TypeError(f"`save_path` must be a string or None, got {save_path!r}.")
        self.save_path = save_path
        self.buffer_size = files.chunk_rows_of(None, buffer_size)


class FileSystemSaver:
    """Saves a `de.Variable`'s content in checkpoints as its own files (see the module
    docstring): pass it to the variable's table creator.

    Args:
      proc_size: processes that each hold a part of the variables (Horovod); each
        process's files are named with its rank (`<name>_rank<r>_size<s>`).
      proc_rank: this process's rank.
      save_path: the directory of the files; default `TFRADynamicEmbedding` beside the
        checkpoint.
      buffer_size: entries per chunk read or written.

    Example:

    >>> import tensorflow_dynemb as de
    >>> emb = de.Variable(dim=8, name="user_emb",
    ...                   kv_creator=de.HashTableCreator(saver=de.FileSystemSaver()))
    >>> path = tf.train.Checkpoint(emb=emb).write("/tmp/dynemb_doc/ckpt")
    """

    def __init__(
        self,
        proc_size: Optional[int] = None,
        proc_rank: Optional[int] = None,
        save_path: Optional[str] = None,
        buffer_size: int = 4096,
    ):
        self.config = FileSystemSaverConfig(proc_size, proc_rank, save_path, buffer_size)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"FileSystemSaver(proc_size={c.proc_size}, proc_rank={c.proc_rank}, "
            f"save_path={c.save_path!r}, buffer_size={c.buffer_size})"
        )


def check_saver(saver) -> Optional[FileSystemSaver]:
    """`saver` if it is None or a `FileSystemSaver` (a table creator's argument)."""
    if saver is not None and not isinstance(saver, FileSystemSaver):
        raise TypeError(f"`saver` must be a de.FileSystemSaver or None, got {saver!r}.")
    return saver


def folder_beside(checkpoint_prefix: tf.Tensor) -> tf.Tensor:
    """`<directory of checkpoint_prefix>/TFRADynamicEmbedding`, in the graph."""
    with tf.device("/CPU:0"):
        directory = tf.strings.regex_replace(checkpoint_prefix, "(^|/)[^/]*$", "")
        directory = tf.where(tf.equal(directory, ""), ".", directory)
        return tf.strings.join([directory, FOLDER], separator="/")


def _tf1_saver_filename() -> tf.Tensor:
    """The filename tensor of the TF1 Saver being built around the caller."""
    graph = tf.compat.v1.get_default_graph()
    parts = graph.get_name_scope().split("/")
    for i in range(len(parts), 0, -1):
        try:
            tensor = graph.get_tensor_by_name("/".join(parts[:i]) + "/Const:0")
        except (KeyError, ValueError):
            continue
        if tensor.op.type == "PlaceholderWithDefault" and tensor.dtype == tf.string:
            return tensor
    raise ValueError(
        "de.FileSystemSaver found no checkpoint path: a variable with a FileSystemSaver "
        "is saved by tf.train.Checkpoint or tf.compat.v1.train.Saver; elsewhere pass "
        "FileSystemSaver(save_path=...)."
    )


if _saveable_object is not None:

    class FileSystemSaveable(_saveable_object.SaveableObject):
        """A variable with a `FileSystemSaver`, for TF1's Saver: saving writes its
        files and puts their save id in the checkpoint; restoring loads the files of
        that save id."""

        def __init__(self, variable, name: Optional[str] = None):
            name = name or variable._unique_name
            spec = _saveable_object.SaveSpec(
                self._save, "", name + CKPT_SAVE_ID, dtype=tf.string, device="/CPU:0"
            )
            super().__init__(variable, [spec], name)
            self._variable = variable

        def _folder(self) -> tf.Tensor:
            return folder_beside(_tf1_saver_filename())

        def _save(self) -> tf.Tensor:
            return self._variable._save_files_for_checkpoint(files.new_save_id(), self._folder())

        def restore(self, restored_tensors, restored_shapes):
            del restored_shapes
            ops = self._variable._load_files_for_checkpoint(restored_tensors[0], self._folder())
            return tf.group(*ops)
