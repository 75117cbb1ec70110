"""Restrict policies of a `de.Variable` (API.md §5).

Restrict policies keep a per-key status in their own `de.Variable` (sharded like the
variable it watches) and rank keys by it when `var.restrict(num_reserved)` shrinks the
variable:

- `TimestampRestrictPolicy`: the time (microseconds since the epoch, or the
  optimizer's step with `use_step=True`) a key was last trained; restrict keeps the
  most recent;
- `FrequencyRestrictPolicy`: how many training steps updated the key; restrict keeps
  the most frequent.

The status is updated by `de.DynamicEmbeddingOptimizer` in the same call that writes
the step's rows back, and is checkpointed with the variable. A restriction ranks every
key of every shard together (a global top-k, not `num_reserved / shards` per shard) and
removes the others from the variable, from every optimizer slot of the variable and
from the status. A model-parallel variable (MultiWorkerMirroredStrategy) ranks every
worker's keys together too: every worker must call `restrict` (as `RestrictCallback`
does), and ties are broken by key.

Admission policies are in admit.py.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tensorflow_dynemb._convert import check_int
from tensorflow_dynemb.distribute import model_parallel

__all__ = [
    "RestrictPolicy",
    "TimestampRestrictPolicy",
    "FrequencyRestrictPolicy",
]


def _status_variable(var, suffix: str, kv_creator=None):
    """A per-key int64 count or time, sharded like `var`."""
    return var.companion(suffix, value_dtype=tf.int64, dim=1, initializer=0, kv_creator=kv_creator)


# ---------------------------------------------------------------------------------------
# Restrict
# ---------------------------------------------------------------------------------------


class RestrictPolicy(tf.Module):
    """A per-key status and a global ranking by it; subclasses say what the status is.

    Made by the variable: `de.Variable(..., restrict_policy=de.TimestampRestrictPolicy)`
    calls `TimestampRestrictPolicy(variable)`.
    """

    _STATUS_NAME = "status"

    def __init__(self, var):
        super().__init__(name=f"{type(self).__name__}")
        self._var = var
        with tf.init_scope():
            self._status = _status_variable(var, self._STATUS_NAME)

    @property
    def variable(self):
        return self._var

    @property
    def status(self):
        """The `de.Variable` (int64, dim 1) holding each key's status."""
        return self._status

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # The watched variable is its own checkpoint entry; following it from here would
        # make a cycle in the object graph.
        children = super()._trackable_children(save_type, **kwargs)
        children.pop("_var", None)
        return children

    def status_values(self, keys: tf.Tensor, old: tf.Tensor, local_step: tf.Tensor):
        """The new status (`[n, 1]` int64) of `keys`, trained in the step `local_step`,
        whose status was `old` (0 for keys without one)."""
        raise NotImplementedError

    def apply_update(self, keys: tf.Tensor, local_step: Optional[tf.Tensor] = None):
        """Records that `keys` (1-D, distinct) were trained in step `local_step`.

        Returns:
          The update operation (None when executing eagerly).
        """
        if local_step is None:
            local_step = tf.constant(0.0)
        old = self._status.lookup(keys)
        new = self.status_values(keys, old, local_step)
        return self._status.upsert(keys, new)

    def apply_restriction(self, num_reserved: int, trigger: Optional[int] = None, name=None):
        """Keeps the `num_reserved` highest-ranked keys of the variable, when it holds
        more than `trigger` (default `num_reserved`) keys, and removes the rest from the
        variable, its optimizer slots and the status.

        Keys without a status (stored by `upsert`, never trained) rank lowest; among
        equal statuses, the ranking is deterministic but unspecified.

        Returns:
          The restrict operation (None when executing eagerly).

        Raises:
          ValueError: `num_reserved` < 0 or `trigger` < `num_reserved`.
        """
        num_reserved = check_int(num_reserved, "num_reserved", 0)
        trigger = num_reserved if trigger is None else check_int(trigger, "trigger", 0)
        if trigger < num_reserved:
            raise ValueError(
                f"`trigger` must be >= `num_reserved` ({num_reserved}), got {trigger}."
            )
        with tf.name_scope(name or f"{self._var._unique_name}_restrict"):
            size = self._var.size()
            group = self._var.worker_group
            if group is not None:  # a model-parallel variable: every worker's keys count
                size = model_parallel.total_over_workers(group, size, name="restrict_size")
            if tf.executing_eagerly():
                if int(size) > trigger:
                    self._restrict(num_reserved)
                return None
            return tf.cond(
                size > trigger,
                lambda: self._restrict_op(num_reserved),
                lambda: tf.no_op(),
            )

    def _restrict_op(self, num_reserved: int):
        ops = self._restrict(num_reserved)
        with tf.control_dependencies(ops):
            return tf.no_op()

    def _restrict(self, num_reserved: int):
        keys, _ = self._var.export()
        rank, exists = self._status.lookup(keys, return_exists=True)
        # Keys without a status rank below every key with one.
        rank = tf.where(exists, rank[:, 0], tf.int64.min)
        group = self._var.worker_group
        if group is not None:
            # A model-parallel variable: the top num_reserved of every worker's keys
            # (each worker holds other keys), ties broken by key.
            keep = model_parallel.global_top_k(group, keys, rank, num_reserved, "restrict")
            dropped = tf.logical_not(keep)
        else:
            count = tf.minimum(tf.size(keys), num_reserved)
            _, keep = tf.math.top_k(rank, k=count, sorted=False)
            dropped = tf.ones(tf.shape(keys), tf.bool)
            dropped = tf.tensor_scatter_nd_update(
                dropped, keep[:, tf.newaxis], tf.zeros(tf.shape(keep), tf.bool)
            )
        removed = self._var.remove_everywhere(tf.boolean_mask(keys, dropped))
        # Then the status of every key no longer in the variable: the dropped ones and
        # any removed by other means. (TF1 graphs order nothing by themselves.)
        with tf.control_dependencies(removed):
            status_keys, _ = self._status.export()
            in_var = self._var.lookup(status_keys, return_exists=True)[1]
            cleaned = self._status.remove(tf.boolean_mask(status_keys, tf.logical_not(in_var)))
        return [op for op in removed + [cleaned] if op is not None]


class TimestampRestrictPolicy(RestrictPolicy):
    """Ranks keys by when they were last trained; restrict keeps the most recent.

    Args:
      var: the watched `de.Variable` (passed by the variable itself).
      use_step: record the optimizer's step number instead of the wall-clock time in
        microseconds (deterministic, and the same on every worker).
    """

    _STATUS_NAME = "timestamp_status"

    def __init__(self, var, use_step: bool = False):
        self._use_step = bool(use_step)
        super().__init__(var)

    @property
    def tstp_var(self):
        """TFRA's name of `status`: each key's last training time."""
        return self._status

    def status_values(self, keys, old, local_step):
        if self._use_step:
            now = tf.cast(local_step, tf.int64)
        else:
            now = tf.cast(tf.timestamp() * 1e6, tf.int64)
        return tf.fill([tf.size(keys), 1], now)


class FrequencyRestrictPolicy(RestrictPolicy):
    """Ranks keys by how many training steps updated them; restrict keeps the most
    frequent."""

    _STATUS_NAME = "frequency_status"

    @property
    def freq_var(self):
        """TFRA's name of `status`: how many training steps updated each key."""
        return self._status

    def status_values(self, keys, old, local_step):
        return old + 1
