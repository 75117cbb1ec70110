"""`de.Variable`: a dynamic embedding sharded over devices, one hash table per device.

A key's shard is `partitioner(keys, num_shards)` (`default_partition_fn`: a stable hash,
the same on every machine and TF build). Every per-key method routes keys with
`tf.dynamic_partition`, calls the shard tables, and puts results back in key order
with `tf.dynamic_stitch`; a batch keeps its order within each shard, so duplicate keys
behave as in one table.

Checkpoints hold the variable's content, not its shards: `_serialize_to_tensors`
concatenates every shard and `_restore_from_tensors` routes the keys with the restoring
variable's own partitioner. So a checkpoint restores into any number of shards.

Under `tf.distribute.MultiWorkerMirroredStrategy` with several workers, a variable made
in the strategy's scope without `devices` is model-parallel (`worker_group`): worker
`i`'s one local table holds the ids the partitioner assigns to shard `i` of
`num_workers`, and lookups inside `strategy.run` are exchanges with the owners
(distribute/model_parallel.py). Outside `strategy.run` its methods act on this worker's
slice: writes keep the keys this worker owns (so every worker may run the same one),
reads see its own keys only.

The class is split by concern: this module has creation, the properties and the
whole-variable operations (`clear`, `size`, `stats`, `restrict`); `RoutedOps`
(routing.py) the routing and the per-key methods (`lookup`, `upsert`, `accum`,
`remove` and their evicting forms); `VariableContent` (content.py) the whole content
(export, files, checkpoints); `TrainingState` (training_state.py) the trainable views
and the optimizer slots. `get_variable` is in get_variable.py.
"""

from __future__ import annotations

import re
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from tensorflow_dynemb._convert import (
    KEY_DTYPES,
    VALUE_DTYPES,
    DTypeLike,
    as_dtype,
    check_int,
)
from tensorflow_dynemb.persistence.checkpoint import (
    Untracked,
    in_tf1_graph,
    register_for_tf1_saver,
)
from tensorflow_dynemb.persistence.tf1_saver import TF1SaverHooks
from tensorflow_dynemb.distribute import cluster as _cluster
from tensorflow_dynemb.variable.content import VariableContent
from tensorflow_dynemb.variable.initializers import make_row_initializer
from tensorflow_dynemb.variable.routing import RoutedOps
from tensorflow_dynemb.variable.sharding import (
    HashTableCreator,
    Partitioner,
    default_partition_fn,
    table_devices,
)
from tensorflow_dynemb.variable.trainable import TrainableRows
from tensorflow_dynemb.variable.training_state import TrainingState

__all__ = ["Variable"]


def _module_name(name: str) -> str:
    """`name` as a valid Python identifier that also starts a valid TF name scope (a
    letter first): what `tf.Module`, op names and name scopes accept."""
    cleaned = re.sub(r"\W", "_", name)
    return cleaned if cleaned[:1].isalpha() else f"v_{cleaned}"


def _check_devices(devices: Any) -> List[str]:
    if devices is None:
        return ["/CPU:0"]
    if isinstance(devices, (str, tf.DeviceSpec)):
        devices = [devices]
    if not isinstance(devices, (list, tuple)) or not devices:
        raise ValueError(f"`devices` must be a non-empty list of device names, got {devices!r}.")
    out = []
    for device in devices:
        if isinstance(device, tf.DeviceSpec):
            device = device.to_string()
        if not isinstance(device, str):
            raise TypeError(f"`devices` must hold device name strings, got {device!r}.")
        out.append(device)
    return out


class Variable(RoutedOps, VariableContent, TF1SaverHooks, TrainingState, tf.Module):
    """A dynamic embedding: keys of any value map to `[dim]` rows, sharded over devices.

    Missing keys read `initializer` rows and are not stored. One table (made by
    `kv_creator`) lives on each device of `devices`; `partitioner` routes each key.
    Works in eager mode, inside `tf.function` and in TF1 graph mode; saved by
    `tf.train.Checkpoint` and `tf.compat.v1.train.Saver` as one content, so a
    checkpoint restores into a variable with any number of shards.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> v = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:0", "/CPU:0"],
    ...                 initializer=-1.0)
    >>> v.upsert([7, 8], [[1.0, 2.0], [3.0, 4.0]])
    >>> v.lookup([8, 9]).numpy()
    array([[ 3.,  4.],
           [-1., -1.]], dtype=float32)
    >>> int(v.size())
    2
    """

    def __init__(
        self,
        key_dtype: DTypeLike = tf.int64,
        value_dtype: DTypeLike = tf.float32,
        dim: int = 1,
        devices: Optional[Sequence[str]] = None,
        partitioner: Partitioner = default_partition_fn,
        shared_name: Optional[str] = None,
        name: str = "DynamicEmbedding_Variable",
        initializer: Any = None,
        trainable: bool = True,
        checkpoint: bool = True,
        init_size: int = 0,
        kv_creator: Optional[HashTableCreator] = None,
        restrict_policy: Optional[Callable[["Variable"], Any]] = None,
        bp_v2: bool = False,
        admit_policy: Any = None,
    ):
        """Creates an empty variable.

        Args:
          key_dtype: `tf.int64` (default), `tf.int32` or `tf.string`.
          value_dtype: the value dtype (default `tf.float32`).
          dim: elements per row (>= 1).
          devices: one shard per device (default `["/CPU:0"]`); remote devices such as
            `/job:ps/task:1/CPU:0` work too. Left None in the scope of a
            `MultiWorkerMirroredStrategy` with several workers: model-parallel, one
            slice per worker, on the worker's device (see the module docstring). GPU devices hold int32 / int64 keyed shards
            when the op library has its GPU kernels (docs/gpu.md); string-keyed shards
            asked for on a GPU go to that machine's CPU, and a shard asked for on a
            local device this process does not have (`/CPU:1` in a default process)
            goes to device 0 of its type or `/CPU:0`, each with a warning (see
            `tensorflow_dynemb.variable.sharding.table_devices`); `devices` then
            reports where the shards are.
          partitioner: `fn(keys, num_shards) -> int32 shard ids`; default
            `de.default_partition_fn`.
          shared_name: share the shard tables by name with other variables of this
            `shared_name` in the process (default: not shared).
          name: the variable's name.
          initializer: what missing keys read: a number, a list / ndarray / Tensor of
            shape `[dim]`, or a TF / Keras initializer (see `tensorflow_dynemb.variable.initializers`:
            random initializers draw one row per key from `(seed, key)`). Default 0.
          trainable: whether optimizers train it.
          checkpoint: whether checkpoints save and restore its content.
          init_size: keys to reserve room for, split evenly over the shards.
          kv_creator: `de.HashTableCreator()` (default) or `de.HkvHashTableCreator(config)`.
          restrict_policy: a policy class, instantiated as `restrict_policy(self)`.
          bp_v2: whether optimizers write back by adding deltas (`accum`) instead of
            overwriting rows.
          admit_policy: a `de.FrequencyAdmitPolicy`: training gives an id a row only
            once it has been seen `min_count` times.

        Raises:
          TypeError: an unsupported dtype, a non-integer `dim` / `init_size`, or an
            initializer of another dtype.
          ValueError: `dim` < 1, empty `devices`, or an initializer that is neither a
            scalar nor `[dim]`.
        """
        self._key_dtype = as_dtype(key_dtype, "key_dtype", KEY_DTYPES)
        self._value_dtype = as_dtype(value_dtype, "value_dtype", VALUE_DTYPES)
        self._dim = check_int(dim, "dim", 1)
        group = _cluster.current_group() if devices is None else None
        devices = _check_devices([group.device] if group is not None else devices)
        if not callable(partitioner):
            raise TypeError(f"`partitioner` must be callable, got {partitioner!r}.")
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a non-empty string, got {name!r}.")
        # Where the shards really go (string keys have no GPU tables, a device the
        # process lacks is replaced); `devices`, and every companion variable
        # (optimizer slots), use these.
        self._devices, placement_note = table_devices(devices, self._key_dtype)
        if placement_note:
            warnings.warn(f"de.Variable {name!r}: {placement_note}", UserWarning, stacklevel=2)
        init_size = check_int(init_size, "init_size", 0)
        kv_creator = kv_creator if kv_creator is not None else HashTableCreator()
        if not hasattr(kv_creator, "create"):
            raise TypeError(
                f"`kv_creator` must be a de.HashTableCreator or de.HkvHashTableCreator, "
                f"got {kv_creator!r}."
            )
        # Graph-unique in TF1 graphs (the Saver names the variable's content by it);
        # also the prefix of the shard tables' op names.
        unique_name = _module_name(name)
        if in_tf1_graph():
            # An op of that name reserves it, as TFRA's variable does: a meta graph
            # exports the SAVEABLE_OBJECTS collection as op names, and
            # `import_meta_graph` fails on a name that is no op of the graph. Before
            # tf.Module's name scope takes the name.
            with tf.control_dependencies(None):
                unique_name = tf.no_op(name=unique_name).name
        super().__init__(name=_module_name(name))
        self._unique_name = unique_name
        self._var_name = name
        # Model-parallel placement (distribute/cluster.py), held untracked: the group
        # holds the strategy, which is no part of the variable's state.
        self._distribution = Untracked(group=group)
        self._partition_fn = partitioner
        self._trainable = bool(trainable)
        # A Redis config with table_store_mode 2 keeps the rows out of checkpoints.
        self._checkpoint = bool(checkpoint) and getattr(
            kv_creator, "keeps_content_in_checkpoints", True)
        self._bp_v2 = bool(bp_v2)
        self._kv_creator = kv_creator
        self._initializer = make_row_initializer(initializer, self._dim, self._value_dtype)

        num_shards = len(self._devices)
        tables = []
        for i, device in enumerate(self._devices):
            suffix = f"_mht_{i + 1}of{num_shards}"
            with tf.device(device):
                tables.append(
                    kv_creator.create(
                        self._key_dtype,
                        self._value_dtype,
                        self._initializer.default_row,
                        name=self._unique_name + suffix,
                        init_size=init_size // num_shards,
                        device=device,
                        shared_name=shared_name + suffix if shared_name else None,
                    )
                )
        self._tables = tables
        for table in tables:
            table._set_owner(self)
        # The size ops of each TF1 graph, for calls once it is finalized (see `size`).
        self._size_ops = Untracked(by_graph=weakref.WeakKeyDictionary())
        # Trainable views by lookup name (see trainable.py); not part of checkpoints.
        self._trainables: Dict[str, TrainableRows] = {}
        # Optimizer slots of this variable: the slot state variables (they must lose
        # the keys it loses) and the views users see (training/slots.py); a plain holder,
        # because the optimizers' checkpoints, not this one, save the slots.
        self._slots = Untracked(states=[], views=[])
        # Whether checkpoints hold the entries' scores (slot states' scores mean nothing).
        self._checkpoint_scores = True
        self._restrict_policy = restrict_policy(self) if restrict_policy is not None else None
        if admit_policy is not None and not hasattr(admit_policy, "bind"):
            raise TypeError(
                f"`admit_policy` must be a de.FrequencyAdmitPolicy, got {admit_policy!r}."
            )
        self._admit = admit_policy.bind(self) if admit_policy is not None else None

        if self._checkpoint and in_tf1_graph():
            register_for_tf1_saver(self, self._unique_name)

    # -- a TF1 Saver given the variable in `var_list` (persistence/tf1_saver.py) ---------

    def _tf1_saver_name(self) -> str:
        # As `register_for_tf1_saver` names it for `Saver()` without `var_list`.
        return self._unique_name

    def _tf1_saver_tensors(self) -> Dict[str, tf.Tensor]:
        return self._serialize_to_tensors()

    # -- properties ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The variable's name, as given."""
        return getattr(self, "_var_name", None) or super().name

    @property
    def key_dtype(self) -> tf.dtypes.DType:
        return self._key_dtype

    @property
    def value_dtype(self) -> tf.dtypes.DType:
        return self._value_dtype

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def devices(self) -> List[str]:
        return list(self._devices)

    @property
    def tables(self) -> List[Any]:
        """The shard tables, one per device."""
        return list(self._tables)

    @property
    def shard_num(self) -> int:
        return len(self._tables)

    @property
    def partition_fn(self) -> Partitioner:
        return self._partition_fn

    @property
    def initializer(self):
        """The resolved initializer (`tensorflow_dynemb.variable.initializers.RowInitializer`)."""
        return self._initializer

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def bp_v2(self) -> bool:
        return self._bp_v2

    @property
    def kv_creator(self) -> HashTableCreator:
        return self._kv_creator

    @property
    def restrict_policy(self):
        return self._restrict_policy

    @property
    def admit_policy(self):
        """The `de.FrequencyAdmitPolicy` given, or None."""
        return None if self._admit is None else self._admit.policy

    @property
    def worker_group(self):
        """The `WorkerGroup` (`num_workers`, `rank`, `device`) of a model-parallel
        variable, or None (see the module docstring)."""
        return self._distribution.group

    @property
    def bounded(self) -> bool:
        """Whether the shard tables evict (`de.HkvHashTableCreator`)."""
        return any(hasattr(table, "max_capacity") for table in self._tables)

    # -- the whole variable --------------------------------------------------------------

    def clear(self, name: Optional[str] = None):
        """Removes every key from every shard.

        Returns:
          The operation (None when executing eagerly).
        """
        with tf.name_scope(name or f"{self._unique_name}_clear"):
            return self._group([table.clear() for table in self._tables])

    def size(self, index: Optional[int] = None, name: Optional[str] = None) -> tf.Tensor:
        """The number of keys in shard `index`, or in the whole variable.

        In a TF1 graph that is finalized (as `MonitoredTrainingSession` does), where no op
        can be added, it returns the size op built by the first call of the graph (as
        TFRA's variable does), which reads the size whenever it runs.

        Returns:
          An int64 scalar tensor.

        Raises:
          ValueError: `index` out of `[0, num_shards)`.
          RuntimeError: the TF1 graph is finalized and `size` was never called before.
        """
        if index is not None:
            index = check_int(index, "index", 0)
            if index >= self.shard_num:
                raise ValueError(
                    f"`index` must be in [0, {self.shard_num}) (the number of shards), "
                    f"got {index}."
                )
        if not in_tf1_graph():
            return self._size_op(index, name)
        graph = tf.compat.v1.get_default_graph()
        cache = self._size_ops.by_graph.setdefault(graph, {})
        if graph.finalized:
            if index not in cache:
                raise RuntimeError(
                    f"de.Variable {self.name!r}: size(index={index}) needs new ops, but the "
                    "graph is finalized (MonitoredTrainingSession finalizes it). Call "
                    f"size(index={index}) once before that; later calls return its op."
                )
            return cache[index]
        if index not in cache:
            # Out of any control dependency or control flow of this call: the op is
            # reused wherever a later call runs.
            with tf.control_dependencies(None):
                cache[index] = self._size_op(index, None)
        return self._size_op(index, name)

    def _size_op(self, index: Optional[int], name: Optional[str]) -> tf.Tensor:
        with tf.name_scope(name or f"{self._unique_name}_size"):
            if index is not None:
                return self._tables[index].size()
            return tf.add_n([table.size() for table in self._tables])

    def stats(self, name: Optional[str] = None) -> Dict[str, tf.Tensor]:
        """The shard tables' `stats()` summed over shards (see the table's `stats`);
        `load_factor` is the total size over the total capacity.

        Returns:
          A dict of scalar tensors: `size`, `capacity`, `max_capacity`, `load_factor`
          (float32), `inserts`, `lookups`, `misses`, `evictions`.
        """
        with tf.name_scope(name or f"{self._unique_name}_stats"):
            per_shard = [table.stats() for table in self._tables]
            total = {
                key: tf.add_n([shard[key] for shard in per_shard])
                for key in per_shard[0]
                if key != "load_factor"
            }
            total["load_factor"] = tf.math.divide_no_nan(
                tf.cast(total["size"], tf.float32), tf.cast(total["capacity"], tf.float32)
            )
            return total

    def restrict(self, num_reserved: int, **kwargs):
        """Shrinks the variable to `num_reserved` keys as its `restrict_policy` ranks them.

        Args:
          num_reserved: keys to keep.
          **kwargs: passed to the policy's `apply_restriction`.

        Returns:
          The restrict operation, or None when the variable has no policy.
        """
        if self._restrict_policy is None:
            return None
        return self._restrict_policy.apply_restriction(num_reserved, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<de.Variable name={self.name!r} key_dtype={self._key_dtype.name} "
            f"value_dtype={self._value_dtype.name} dim={self._dim} shards={self.shard_num}"
            + (
                ""
                if self.worker_group is None
                else f" slice={self.worker_group.rank}/{self.worker_group.num_workers}"
            )
            + ">"
        )
