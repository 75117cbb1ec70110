"""Admission policies of a `de.Variable` (API.md §5).

`FrequencyAdmitPolicy(min_count)` gives an id a row only once training lookups have
seen it `min_count` times; until then it reads the initializer and is not updated. Its
counts live in a bounded table (`HkvHashTable`, least recently counted ids evicted
first), `max_tracked` ids per variable.
"""

from __future__ import annotations

import tensorflow as tf

from tensorflow_dynemb._convert import check_int
from tensorflow_dynemb.policies.restrict import _status_variable

__all__ = ["FrequencyAdmitPolicy"]


class FrequencyAdmitPolicy:
    """Admits an id into a variable once training lookups have seen it `min_count`
    times (each occurrence in a batch counts).

    Until then the id reads the initializer and its gradient is dropped. Ids already
    in the variable are always trained. The counts of ids not yet admitted are kept
    in a bounded table of `max_tracked` ids per variable (split over its shards); when
    it is full, the least recently counted ids are forgotten and start over, so an id
    seen rarely enough may be admitted later than `min_count`, never earlier. Memory:
    about 120 bytes per tracked id.

    Args:
      min_count: occurrences needed for a row (>= 1; 1 admits every id).
      max_tracked: ids whose counts are kept, per variable.
    """

    def __init__(self, min_count: int, max_tracked: int = 1 << 18):
        self.min_count = check_int(min_count, "min_count", 1)
        self.max_tracked = check_int(max_tracked, "max_tracked", 1)

    def bind(self, var) -> "AdmitState":
        """The per-variable state of this policy (created by the variable)."""
        return AdmitState(self, var)

    def __repr__(self) -> str:
        return f"FrequencyAdmitPolicy(min_count={self.min_count}, max_tracked={self.max_tracked})"


class AdmitState(tf.Module):
    """The counts of one variable's candidate ids (see `FrequencyAdmitPolicy`)."""

    def __init__(self, policy: FrequencyAdmitPolicy, var):
        from tensorflow_dynemb.variable.sharding import HkvHashTableCreator
        from tensorflow_dynemb.tables import HkvHashTableConfig

        super().__init__(name="FrequencyAdmitPolicy")
        self.policy = policy
        per_shard = max(1, -(-policy.max_tracked // var.shard_num))
        config = HkvHashTableConfig(
            init_capacity=min(per_shard, 1024), max_capacity=per_shard, evict_strategy="lru"
        )
        with tf.init_scope():
            self._counts = _status_variable(
                var, "admit_counts", kv_creator=HkvHashTableCreator(config)
            )

    @property
    def counts(self):
        """The `de.Variable` of candidate counts."""
        return self._counts

    def admit(self, keys: tf.Tensor, counts: tf.Tensor, exists: tf.Tensor):
        """Counts `counts` more occurrences of the distinct `keys`; returns `(admitted
        bool [n], count-update op)`: admitted = already stored or seen `min_count`
        times, this step included."""
        seen, _ = self._counts.lookup(keys, return_exists=True)
        total = seen[:, 0] + tf.cast(counts, tf.int64)
        admitted = tf.logical_or(exists, total >= self.policy.min_count)
        pending = tf.logical_not(admitted)
        update = self._counts.upsert(
            tf.boolean_mask(keys, pending), tf.boolean_mask(total, pending)[:, tf.newaxis]
        )
        with tf.control_dependencies([update] if update is not None else []):
            # Admitted ids no longer need a count.
            forget = self._counts.remove(tf.boolean_mask(keys, admitted))
        return admitted, [op for op in (update, forget) if op is not None]
