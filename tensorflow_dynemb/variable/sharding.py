"""How a `de.Variable` is split into shards: which shard a key goes to
(`default_partition_fn`), what table each shard is (`kv_creator`) and which device
each shard table lives on (`table_devices`)."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

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
# A missing device is about the process, not a variable: said once per device.
_said_missing_devices = set()


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


def _local_devices() -> List[tf.DeviceSpec]:
    """The devices of this process (logical devices: what `tf.device` can name)."""
    return [tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices()]


def _is_local(spec: tf.DeviceSpec) -> bool:
    """Whether `spec` names a device of this process (no other job or task)."""
    return spec.job in (None, "localhost") and spec.replica in (None, 0) and spec.task in (None, 0)


def _missing_devices(devices: Sequence[str]) -> Dict[str, str]:
    """`{device: where its shard goes instead}` for each local device of `devices` that
    this process does not have.

    TF would place such a shard by soft placement, silently (the second of
    `["/CPU:0", "/CPU:1"]` lands on `/CPU:0` in a default process), so the shard goes
    explicitly to device 0 of the same type if the process has one, else to `/CPU:0`.
    `/CPU:0` always exists and remote devices (`/job:ps/task:1/...`) are the cluster's
    business, so neither is checked, and nothing is listed (no runtime set-up) unless a
    device needs it. While building a TF1 graph the session's config decides which
    devices exist (`device_count`), so nothing is checked there either.
    """
    checked = {}
    for device in devices:
        spec = _device_spec(device)
        if spec is None or not _is_local(spec) or spec.device_type is None:
            continue
        kind = spec.device_type.upper()
        index = spec.device_index or 0
        if (kind, index) != ("CPU", 0):
            checked[device] = (kind, index)
    if not checked or not tf.compat.v1.executing_eagerly_outside_functions():
        return {}
    present = {((d.device_type or "").upper(), d.device_index or 0) for d in _local_devices()}
    missing = {}
    for device, (kind, index) in checked.items():
        if (kind, index) not in present:
            missing[device] = f"/{kind}:0" if (kind, 0) in present else "/CPU:0"
    return missing


def table_devices(
    devices: Sequence[str], key_dtype: tf.dtypes.DType
) -> Tuple[List[str], Optional[str]]:
    """Where the shard tables of a variable go, and why, when that is not `devices`.

    A local device this process does not have (`/CPU:1` in a process with one logical
    CPU) is replaced by device 0 of its type, or `/CPU:0` (see `_missing_devices`), with
    a message naming both (once per process and device). GPU tables take int32 and
    int64 keys only: a string-keyed shard asked for on a GPU goes to the CPU of that
    device's job and task instead, with a message. int32 / int64 shards stay where
    asked; if the op library was built without its GPU kernels (docs/gpu.md), TF's soft
    device placement runs them on the CPU, and the message (once per process) says so.

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
    notes = []
    missing = _missing_devices(devices)
    if missing:
        devices = [missing.get(d, d) for d in devices]
    unsaid = {d: placed for d, placed in missing.items() if d not in _said_missing_devices}
    if unsaid:
        _said_missing_devices.update(unsaid)
        moved = ", ".join(f"{asked} -> {placed}" for asked, placed in unsaid.items())
        notes.append(
            f"this process has no device {sorted(unsaid)}, so those shards are placed "
            f"elsewhere ({moved}); `devices` reports where each shard is. List the "
            "process's devices with tf.config.list_logical_devices(), or make more with "
            "tf.config.set_logical_device_configuration() before TensorFlow starts."
        )
    gpus = [d for d in devices if _is_gpu(d)]
    if gpus and key_dtype == tf.string:
        devices = [_cpu_of(d) if _is_gpu(d) else d for d in devices]
        notes.append(
            f"string keys have no GPU tables: the shards asked for on {gpus} are placed "
            f"on {[_cpu_of(d) for d in gpus]} instead."
        )
    elif gpus and not _ops.gpu_kernels_built() and not _said_no_gpu_kernels:
        _said_no_gpu_kernels = True
        notes.append(
            f"tensorflow_dynemb was built without its GPU kernels, so the tables asked for "
            f"on {gpus} run where TensorFlow's soft device placement puts them (the CPU); "
            "where soft placement is off (TF1 sessions by default), TensorFlow cannot "
            "place them. Rebuild with DYNEMB_CUDA=1 for GPU tables (docs/gpu.md)."
        )
    return list(devices), " ".join(notes) or None


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
      track_changes: the shards' `track_changes` (`de.HashTable`): what a
        `de.DeltaExporter` needs to write only what changed.
    """

    def __init__(self, config=None, saver: Optional[FileSystemSaver] = None,
                 track_changes: bool = True):
        self.config = config
        self.saver = check_saver(saver)
        self.track_changes = bool(track_changes)

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
            track_changes=getattr(self, "track_changes", True),
        )


CuckooHashTableCreator = HashTableCreator


class HkvHashTableCreator(HashTableCreator):
    """Creates the shards of a `de.Variable` as bounded `de.HkvHashTable`s.

    Each shard gets `config` (its capacities are per shard).

    Args:
      config: a `de.HkvHashTableConfig` (default: `HkvHashTableConfig()`).
      saver: as for `HashTableCreator`.
      track_changes: as for `HashTableCreator`.
    """

    def __init__(
        self, config: Optional[HkvHashTableConfig] = None, saver: Optional[FileSystemSaver] = None,
        track_changes: bool = True,
    ):
        if config is not None and not isinstance(config, HkvHashTableConfig):
            raise TypeError(f"`config` must be a de.HkvHashTableConfig or None, got {config!r}.")
        self.config = config or HkvHashTableConfig()
        self.saver = check_saver(saver)
        self.track_changes = bool(track_changes)

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
            track_changes=getattr(self, "track_changes", True),
        )
