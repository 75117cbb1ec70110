"""How a `de.Variable` is split into shards: which shard a key goes to
(`default_partition_fn`), what table each shard is (`kv_creator`) and which device
each shard table lives on (`table_devices`)."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb._convert import KEY_DTYPES, TensorLike
from tensorflow_dynemb.persistence.file_saver import FileSystemSaver, check_saver
from tensorflow_dynemb.tables import HashTable, HkvHashTable, HkvHashTableConfig

__all__ = [
    "default_partition_fn",
    "HashTableCreator",
    "CuckooHashTableCreator",
    "HkvHashTableCreator",
]

Partitioner = Callable[[tf.Tensor, int], tf.Tensor]

# The no-GPU-kernels note is about the installation, not a variable: said once.
_said_no_gpu_kernels = False


def _device_spec(device: str) -> Optional[tf.DeviceSpec]:
    try:
        return tf.DeviceSpec.from_string(device)
    except ValueError:
        return None  # a malformed name: TF reports it where the table is placed


def _is_gpu(device: str) -> bool:
    spec = _device_spec(device)
    return spec is not None and (spec.device_type or "").upper() == "GPU"


def _cpu_of(device: str) -> str:
    """The CPU of `device`'s job, replica and task ("/CPU:0" for a local device)."""
    spec = _device_spec(device)
    if spec.job is None and spec.replica is None and spec.task is None:
        return "/CPU:0"
    return spec.replace(device_type="CPU", device_index=0).to_string()


def table_devices(
    devices: Sequence[str], key_dtype: tf.dtypes.DType
) -> Tuple[List[str], Optional[str]]:
    """Where the shard tables of a variable go, and why, when that is not `devices`.

    GPU tables take int32 and int64 keys only: a string-keyed shard asked for on a GPU
    goes to the CPU of that device's job and task instead, with a message. int32 /
    int64 shards stay where asked; if the op library was built without its GPU
    kernels (docs/gpu.md), TF's soft device placement runs them on the CPU, and the
    message (once per process) says so.

    Args:
      devices: the devices asked for, one per shard.
      key_dtype: the variable's key dtype.

    Returns:
      `(placed, message)`: the device of each shard, and a message for the user, or
      None when every shard is where asked and will run there.

    Example:

    >>> from tensorflow_dynemb.variable.sharding import table_devices
    >>> table_devices(["/GPU:0", "/job:ps/task:1/GPU:0"], tf.string)[0]
    ['/CPU:0', '/job:ps/task:1/device:CPU:0']
    """
    global _said_no_gpu_kernels
    gpus = [d for d in devices if _is_gpu(d)]
    if not gpus:
        return list(devices), None
    if key_dtype == tf.string:
        placed = [_cpu_of(d) if _is_gpu(d) else d for d in devices]
        return placed, (
            f"string keys have no GPU tables: the shards asked for on {gpus} are placed "
            f"on {[_cpu_of(d) for d in gpus]} instead."
        )
    if not _ops.gpu_kernels_built() and not _said_no_gpu_kernels:
        _said_no_gpu_kernels = True
        return list(devices), (
            f"tensorflow_dynemb was built without its GPU kernels, so the tables asked for "
            f"on {gpus} run where TensorFlow's soft device placement puts them (the CPU); "
            "where soft placement is off (TF1 sessions by default), TensorFlow cannot "
            "place them. Rebuild with DYNEMB_CUDA=1 for GPU tables (docs/gpu.md)."
        )
    return list(devices), None


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

    Args:
      config: accepted for TFRA (its `CuckooHashTableConfig` holds nothing).
      saver: a `de.FileSystemSaver`: checkpoints keep the variable's content in its
        own files (persistence/file_saver.py); None: inside the checkpoint.
    """

    def __init__(self, config=None, saver: Optional[FileSystemSaver] = None):
        self.config = config
        self.saver = check_saver(saver)

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
      saver: as for `HashTableCreator`.
    """

    def __init__(
        self, config: Optional[HkvHashTableConfig] = None, saver: Optional[FileSystemSaver] = None
    ):
        if config is not None and not isinstance(config, HkvHashTableConfig):
            raise TypeError(f"`config` must be a de.HkvHashTableConfig or None, got {config!r}.")
        self.config = config or HkvHashTableConfig()
        self.saver = check_saver(saver)

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
