"""How a `de.Variable` is split into shards: which shard a key goes to
(`default_partition_fn`) and what table each shard is (`kv_creator`)."""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb._convert import KEY_DTYPES, TensorLike
from tensorflow_dynemb.tables import HashTable, HkvHashTable, HkvHashTableConfig

__all__ = [
    "default_partition_fn",
    "HashTableCreator",
    "CuckooHashTableCreator",
    "HkvHashTableCreator",
]

Partitioner = Callable[[tf.Tensor, int], tf.Tensor]


def default_partition_fn(keys: TensorLike, shard_num: int) -> tf.Tensor:
    """The shard of each key: a stable hash, the same on every machine and TF build.

    int32 keys route like the int64 keys of the same value; string keys hash their
    bytes. The hash is independent of the one the tables use internally, so each
    shard's table fills evenly.

    Args:
      keys: int32, int64 or string keys of any shape.
      shard_num: the number of shards (>= 1).

    Returns:
      int32 shard ids in `[0, shard_num)`, of `keys.shape`.

    Example:

    >>> import tensorflow_dynemb as de
    >>> de.default_partition_fn(tf.constant([1, 2, 3], tf.int64), 2).shape
    TensorShape([3])
    """
    if not tf.is_tensor(keys):
        keys = tf.convert_to_tensor(keys)
    if keys.dtype not in KEY_DTYPES:
        raise TypeError(
            f"`keys` must be one of {[d.name for d in KEY_DTYPES]}, got {keys.dtype.name}."
        )
    return _ops.ops.dynemb_partition(keys, tf.cast(shard_num, tf.int32))


class HashTableCreator:
    """Creates the shards of a `de.Variable` as unbounded `de.HashTable`s (the default).

    `CuckooHashTableCreator` is an alias, for code written against TFRA.
    """

    def create(
        self,
        key_dtype: tf.dtypes.DType,
        value_dtype: tf.dtypes.DType,
        default_value: tf.Tensor,
        name: str,
        init_size: int,
        device: str,
        shared_name: Optional[str],
    ) -> HashTable:
        """One shard table."""
        return HashTable(
            key_dtype,
            value_dtype,
            default_value,
            name=name,
            checkpoint=False,  # the variable checkpoints its content, whatever the sharding
            init_size=init_size,
            device=device,
            shared_name=shared_name,
        )


CuckooHashTableCreator = HashTableCreator


class HkvHashTableCreator(HashTableCreator):
    """Creates the shards of a `de.Variable` as bounded `de.HkvHashTable`s.

    Each shard gets `config` (its capacities are per shard).

    Args:
      config: a `de.HkvHashTableConfig` (default: `HkvHashTableConfig()`).
    """

    def __init__(self, config: Optional[HkvHashTableConfig] = None):
        if config is not None and not isinstance(config, HkvHashTableConfig):
            raise TypeError(f"`config` must be a de.HkvHashTableConfig or None, got {config!r}.")
        self.config = config or HkvHashTableConfig()

    def create(self, key_dtype, value_dtype, default_value, name, init_size, device, shared_name):
        del init_size  # the config's init_capacity sizes the table
        return HkvHashTable(
            key_dtype,
            value_dtype,
            default_value,
            name=name,
            checkpoint=False,
            config=self.config,
            device=device,
            shared_name=shared_name,
        )
