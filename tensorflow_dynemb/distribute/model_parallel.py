"""Lookups of a model-parallel `de.Variable`: ids travel to the worker that owns them,
rows come back, and gradients follow the rows back to their owner.

Under `MultiWorkerMirroredStrategy` a variable made without `devices` holds on worker
`i` the rows of the ids its partitioner assigns to shard `i` (`de.default_partition_fn`
by default), in one local table. Every lookup built inside `strategy.run` is an
exchange, run by every worker in the same step (collectives.py):

    requester (every worker)                      owner (every worker)
    ids -> distinct ids, occurrences
        -> destination = partitioner(id, W)
        --- all-gather counts; all-to-all ids ---> received ids (every sender's)
                                                   -> distinct received ids
                                                   -> local table lookup (+ exists)
                                                   -> the owner's trainable view
                                                      holds these rows (training)
        <-- all-to-all rows ---------------------- view.sparse_read(received position)
    rows of the batch = gather(answers, position)

Training (`ModelParallelRows`, the owner-side trainable view): the view's buffers hold
the rows of the ids this worker *received*, deduplicated across senders, and the rows
every requester gets are read from it. The answer all-to-all's gradient is the reverse
all-to-all (collectives.py), so the view's gradient on the owner is the sum, per id, of
every worker's gradient: the optimizer wrapper applies the rule to the owner's rows and
slots once, locally, with no further merge (applier.py skips its cross-replica merge
for these views), exactly as one process would for the global batch. The owner also
receives how often each sender saw each id, so that admission counts every occurrence.

Read-only lookups (evaluation, prediction: `Variable.lookup` inside `strategy.run`)
make the same exchange without a view: the owner answers from its table and sends
`exists` along with the rows.
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf

from tensorflow_dynemb.distribute.cluster import WorkerGroup
from tensorflow_dynemb.distribute.collectives import Exchange, gather_rows
from tensorflow_dynemb.variable import step_ops
from tensorflow_dynemb.variable.trainable import TrainableRows
from tensorflow_dynemb.variable.view_buffers import make_buffer, outside_strategy

__all__ = [
    "ModelParallelRows",
    "exchange_find",
    "destinations",
    "global_top_k",
    "total_over_workers",
]


def destinations(params, keys: tf.Tensor) -> tf.Tensor:
    """The worker that owns each of the 1-D `keys`: `partitioner(keys, W)`, int32."""
    group: WorkerGroup = params.worker_group
    shards = tf.convert_to_tensor(params.partition_fn(keys, group.num_workers))
    if not shards.dtype.is_integer:
        raise TypeError(
            f"`partitioner` must return integer shard ids, got dtype {shards.dtype.name}."
        )
    return tf.cast(shards, tf.int32)


def _check_keys(params) -> None:
    if params.key_dtype == tf.string:
        raise NotImplementedError(
            f"de.Variable {params.name!r}: string keys cannot be exchanged between "
            "workers yet (TF's all-to-all takes numbers only); hash them to int64 first "
            "(tf.strings.to_hash_bucket_fast) or give the variable `devices`."
        )


def _requests(params, flat_ids: tf.Tensor, name: str):
    """This worker's distinct ids, their positions in `flat_ids`, their occurrences and
    the exchange that takes them to their owners."""
    _check_keys(params)
    unique_ids, index = step_ops.unique(flat_ids)
    occurrences = tf.math.unsorted_segment_sum(
        tf.ones_like(index), index, tf.size(unique_ids, out_type=index.dtype)
    )
    exchange = Exchange(params.worker_group, destinations(params, unique_ids), name=name)
    return unique_ids, index, occurrences, exchange


def exchange_find(params, flat_ids: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """`([n, dim] rows, [n] exists)` of the 1-D `flat_ids`, answered by their owners;
    nothing is inserted. Every worker must run it in the same step."""
    unique_ids, index, _, exchange = _requests(params, flat_ids, f"{params._unique_name}_lookup")
    received = exchange.forward(unique_ids, name="ids")
    rows, exists = params._find(received)
    # One answer per id: the row, and `exists` as one more column (of the row's dtype,
    # or int32 for bool rows, which TF's all-to-all does not take).
    wire = tf.int32 if params.value_dtype == tf.bool else params.value_dtype
    answers = tf.concat([tf.cast(rows, wire), tf.cast(exists, wire)[:, tf.newaxis]], 1)
    answers = tf.stop_gradient(exchange.backward(answers, name="rows"))
    rows = tf.cast(answers[:, : params.dim], params.value_dtype)
    exists = tf.cast(answers[:, params.dim], tf.bool)
    return tf.gather(rows, index), tf.gather(exists, index)


class ModelParallelRows(TrainableRows):
    """The trainable view of a model-parallel variable on one worker: its buffers hold
    the rows of the ids this worker owns that the step's lookups (of every worker)
    asked for, and `occurrences`, how often the batches of all workers held each."""

    # The applier sums this view's gradient per buffer row and takes the counts from
    # `occurrences` (consume_distinct), also when several lookups share the buffer.
    sums_per_row = True

    def _create_buffers(self, initial_rows: tf.Tensor, device, name: str, ids) -> None:
        super()._create_buffers(initial_rows, device, name, ids)
        with outside_strategy():
            self.occurrences = make_buffer(
                tf.zeros([0], tf.int32), f"{name}_occurrences", False, False
            )

    def read(self, flat_ids: tf.Tensor) -> tf.Tensor:
        params = self.params
        unique_ids, index, occurrences, exchange = _requests(
            params, flat_ids, f"{params._unique_name}_{self.name}"
        )
        # Ids and their occurrences travel together: one all-to-all.
        request = tf.stack([unique_ids, tf.cast(occurrences, unique_ids.dtype)], 1)
        received = exchange.forward(request, name="ids")
        owner_ids, owner_index = step_ops.unique(received[:, 0])
        owner_occurrences = tf.math.unsorted_segment_sum(
            tf.cast(received[:, 1], tf.int32),
            owner_index,
            tf.size(owner_ids, out_type=owner_index.dtype),
        )
        rows, exists = params._find(owner_ids)
        served = self._buffered_read(
            owner_index,
            [
                (self.ids, owner_ids),
                (self.exists, exists),
                (self.variable, rows),
                (self.occurrences, owner_occurrences),
            ],
        )
        answers = exchange.backward(served, name="rows")
        return tf.gather(answers, index)

    def consume_distinct(self, gradient):
        """`TrainableRows.consume_distinct`, with every worker's occurrences of each
        id as its count (the gradient has one row per sender, not per occurrence)."""
        if not isinstance(gradient, tf.IndexedSlices):
            values = tf.convert_to_tensor(gradient)
            gradient = tf.IndexedSlices(values, tf.range(tf.shape(values)[0]))
        keys, old_rows, exists, grad, _ = super().consume_distinct(gradient)
        with tf.control_dependencies([gradient.values, gradient.indices]):
            counts = self.occurrences.read_value()
        return keys, old_rows, exists, grad, counts


# ---------------------------------------------------------------------------------------
# Whole-variable quantities of a model-parallel variable (restrict, statistics)
# ---------------------------------------------------------------------------------------


def total_over_workers(group: WorkerGroup, value: tf.Tensor, name: str) -> tf.Tensor:
    """The sum over the workers of a scalar `value` (every worker must call it)."""
    value = tf.convert_to_tensor(value)
    return tf.reduce_sum(gather_rows(group, value[tf.newaxis], name=name))


def _ranked(keys: tf.Tensor, rank: tf.Tensor) -> tf.Tensor:
    """The order of entries by `rank` descending, then key ascending (a total order:
    keys are distinct), as positions."""
    by_key = tf.argsort(keys, stable=True)
    by_rank = tf.argsort(tf.gather(rank, by_key), direction="DESCENDING", stable=True)
    return tf.gather(by_key, by_rank)


def global_top_k(group: WorkerGroup, keys: tf.Tensor, rank: tf.Tensor, k: int, name: str):
    """Which of this worker's `keys` (distinct across workers) are among the `k`
    highest-ranked of every worker's, by `rank` (int64) descending, then key ascending.

    Each worker sends its own `k` best candidates; every worker finds the `k`-th of all
    candidates the same way and keeps its keys that rank at least as high.

    Returns:
      A bool mask of `keys`.
    """
    order = _ranked(keys, rank)[:k]
    candidates_keys = gather_rows(group, tf.gather(keys, order), name=f"{name}_keys")
    candidates_rank = gather_rows(group, tf.gather(rank, order), name=f"{name}_ranks")
    if k == 0:
        return tf.zeros(tf.shape(keys), tf.bool)
    best = _ranked(candidates_keys, candidates_rank)
    enough = tf.size(best) > k  # otherwise every key stays
    # The k-th candidate (with a stand-in when there are none, unused then).
    last = tf.concat([best, [0]], 0)[tf.maximum(tf.minimum(k, tf.size(best)) - 1, 0)]
    threshold_rank = tf.concat([candidates_rank, tf.zeros([1], rank.dtype)], 0)[last]
    threshold_key = tf.concat([candidates_keys, tf.zeros([1], keys.dtype)], 0)[last]
    above = tf.logical_or(
        rank > threshold_rank, tf.logical_and(tf.equal(rank, threshold_rank), keys <= threshold_key)
    )
    return tf.logical_or(above, tf.logical_not(enough))
