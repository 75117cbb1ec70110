"""Which worker of a `tf.distribute.MultiWorkerMirroredStrategy` cluster this process is,
and the strategy's collective machinery that the exchanges reuse.

A `WorkerGroup` is fixed when a model-parallel `de.Variable` is created: how many
workers hold a slice (`num_workers`), which slice this worker holds (`rank`), and the
device its table lives on. `rank` is the worker's place in the strategy's collective
group, which is also the order of `replica_id_in_sync_group` and of the chunks of an
all-to-all: the chief first (when the cluster has one), then `worker` tasks by index
(TF's `multi_worker_util.id_in_cluster`, computed here from the public cluster resolver).

Private TensorFlow API, read in one place (`_launcher`), identical in TF 2.16 - 2.21:
`strategy.extended._cross_device_ops._launchers[i]`, the `CollectiveReplicaLauncher`
of the local replica `i`. The exchanges take from it
- the group key of the strategy's own all-reduces (same devices, same size);
- `_next_instance_key()`: a fresh instance key *per call* of the traced function
  (captured with `capture_call_time_value`), from the strategy's own counter, so that our
  collectives never collide with the strategy's, and a function retraced on one worker
  only (another batch shape) does not shift the keys of the others;
- `_get_ordering_token()`: the resource that orders every collective on the device in
  program order (TF's auto control dependencies), so all workers launch the strategy's
  all-reduces and our all-to-alls in the same order.
A missing attribute raises one error naming the TF version (see `_launcher`).
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

import tensorflow as tf

__all__ = [
    "WorkerGroup",
    "current_group",
    "collective_timeout",
    "TIMEOUT_ENV",
    "DEFAULT_TIMEOUT_SECONDS",
]

# The environment variable that sets the exchanges' collective timeout (seconds).
TIMEOUT_ENV = "DYNEMB_COLLECTIVE_TIMEOUT_SECONDS"
# Without it (and without a timeout in the strategy's CommunicationOptions): long enough
# for a slow step or a checkpoint on one worker, short enough that a hung worker ends
# the job instead of holding the cluster.
DEFAULT_TIMEOUT_SECONDS = 600.0


class WorkerGroup(NamedTuple):
    """The workers that share a model-parallel variable, seen from one of them.

    Attributes:
      num_workers: how many workers hold a slice (the variable's number of shards).
      rank: this worker's slice (shard) index, its rank in the collectives.
      device: the device of this worker's table (its replica's device).
      strategy: the `MultiWorkerMirroredStrategy`.
    """

    num_workers: int
    rank: int
    device: str
    strategy: Any

    def launcher(self):
        """The strategy's collective launcher of this worker's replica (see the module
        docstring)."""
        return _launcher(self.strategy)


def _is_multi_worker(strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def _rank(resolver) -> int:
    """This task's place in the collective group (TF's `id_in_cluster`): the chief is 0,
    `worker` task i is i (+1 when the cluster has a chief)."""
    cluster = resolver.cluster_spec().as_dict()
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    if task_type == "chief":
        return 0
    if task_type == "worker":
        return task_id + (1 if "chief" in cluster else 0)
    raise ValueError(
        f"A model-parallel de.Variable lives on the chief and workers of a "
        f"MultiWorkerMirroredStrategy cluster, but this task is {task_type!r} "
        f"(task_id {task_id}); create it on the training tasks only."
    )


def current_group() -> Optional[WorkerGroup]:
    """The `WorkerGroup` of the current `MultiWorkerMirroredStrategy` scope when it spans
    more than one worker; None otherwise (no strategy, another strategy, one worker).

    Raises:
      NotImplementedError: the strategy has several replicas per worker (model-parallel
        tables hold one slice per worker process).
    """
    if not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    if not _is_multi_worker(strategy):
        return None
    local_devices = tuple(strategy.extended.worker_devices)
    if len(local_devices) != 1:
        raise NotImplementedError(
            "Model-parallel de.Variables need one replica per worker process under "
            f"MultiWorkerMirroredStrategy, but this worker has {len(local_devices)} "
            f"({list(local_devices)}); run one process per device (e.g. one per GPU)."
        )
    num_workers = strategy.num_replicas_in_sync
    if num_workers <= 1:
        return None
    # The device without its job and task: this worker's own (its default), and what a
    # SavedModel of the tables records, so that it loads in a process of another job.
    device = tf.DeviceSpec.from_string(local_devices[0]).replace(job=None, replica=None, task=None)
    return WorkerGroup(num_workers, _rank(strategy.cluster_resolver), device.to_string(), strategy)


def in_replica_context_of(group: WorkerGroup) -> bool:
    """Whether ops built now run once per worker in a step of `group`'s strategy
    (inside `strategy.run`), where every worker builds the same collectives.

    Raises:
      ValueError: inside `strategy.run` of another MultiWorkerMirroredStrategy (the
        variable's slices belong to the one it was made under).
    """
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return False
    context = tf.distribute.get_replica_context()
    if context is None:
        return False
    if context.strategy is not group.strategy and _is_multi_worker(context.strategy):
        raise ValueError(
            "A model-parallel de.Variable is looked up inside strategy.run of another "
            "MultiWorkerMirroredStrategy than the one it was made under; make the "
            "variables (and Keras models) under the strategy that runs the steps."
        )
    return context.strategy is group.strategy


def _launcher(strategy):
    try:
        (launcher,) = strategy.extended._cross_device_ops._launchers
        launcher._group_key, launcher._group_size
        launcher._next_instance_key, launcher._get_ordering_token
    except (AttributeError, ValueError) as error:  # pragma: no cover - TF 2.16-2.21 have it
        raise NotImplementedError(
            "tensorflow_dynemb's multi-worker exchange reuses the collective launcher of "
            "MultiWorkerMirroredStrategy (extended._cross_device_ops._launchers), which "
            f"TensorFlow {tf.__version__} does not have as TF 2.16-2.21 do: {error}"
        ) from None
    return launcher


def collective_timeout(group: WorkerGroup) -> float:
    """Seconds an exchange waits for the other workers before it fails with a
    `DeadlineExceededError` (and TF aborts every pending collective of the process).

    `DYNEMB_COLLECTIVE_TIMEOUT_SECONDS` if set; else the strategy's
    `CommunicationOptions(timeout_seconds=...)` if it has one; else 600.

    Raises:
      ValueError: the environment variable is not a positive number.
    """
    value = os.environ.get(TIMEOUT_ENV)
    if value is not None:
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(
                f"{TIMEOUT_ENV} must be a positive number of seconds, got {value!r}."
            )
        return seconds
    options = getattr(group.launcher(), "_options", None)
    seconds = getattr(options, "timeout_seconds", None)
    return float(seconds) if seconds else DEFAULT_TIMEOUT_SECONDS
