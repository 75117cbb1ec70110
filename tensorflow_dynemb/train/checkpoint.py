"""`de.train.DECheckpoint` (alias `de.train.Checkpoint`): TFRA's checkpoint class.

TFRA needed a `tf.train.Checkpoint` subclass to write tables kept in files by its
`FileSystemSaver` next to the checkpoint, and to split that work between Horovod
ranks. Here every table and `de.Variable` saves its content through
`tf.train.Checkpoint` itself (streamed into the checkpoint's files, see
persistence/checkpoint.py), and a variable's checkpoint restores into any number of
shards, so `DECheckpoint` adds nothing to `tf.train.Checkpoint`: it is the same class
under TFRA's name, for code that constructs it.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["DECheckpoint", "Checkpoint"]


class DECheckpoint(tf.train.Checkpoint):
    """`tf.train.Checkpoint`, under TFRA's name (see the module docstring).

    Takes `tf.train.Checkpoint`'s arguments (`root`, and trackables as keyword
    arguments) and has its methods (`save`, `write`, `restore`, `read`); works with
    `tf.train.CheckpointManager`.

    Example:

    >>> import tempfile
    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> module = tf.Module()
    >>> module.emb = de.Variable(tf.int64, tf.float32, dim=1, devices=["/CPU:0"] * 2)
    >>> module.emb.upsert([1, 2, 3], [[1.0], [2.0], [3.0]])
    >>> folder = tempfile.TemporaryDirectory()
    >>> path = de.train.DECheckpoint(module).save(folder.name + "/ckpt")
    >>> restored = tf.Module()
    >>> restored.emb = de.Variable(tf.int64, tf.float32, dim=1)   # one shard, not two
    >>> _ = de.train.DECheckpoint(restored).restore(path)
    >>> restored.emb.lookup([3, 1]).numpy().tolist()
    [[3.0], [1.0]]
    >>> folder.cleanup()
    """


Checkpoint = DECheckpoint
