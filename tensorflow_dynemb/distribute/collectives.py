"""Variable-size all-to-all between the workers of a `WorkerGroup`, over TF's collectives.

TF's `CollectiveAllToAllV2` exchanges equal chunks: an input `[W, c, ...]` sends chunk
`j` to worker `j`, and chunk `i` of the output came from worker `i`. A lookup sends each
worker a different number of ids, so an `Exchange` first makes the sizes known to every
worker, then pads:

1. every worker counts the entries it sends to each worker (`[W]`) and the counts are
   all-gathered (`CollectiveGatherV2`, `[W, W]`: row = sender, column = receiver), so
   each worker knows what it will receive and the largest count `c` of all (the
   chunk: one collective for both, a few bytes);
2. entries are scattered into a `[W, c, ...]` buffer (entry `k` to worker `d` lands at
   `d * c + its rank among the entries for d`), exchanged, and the received entries
   are gathered out of the padding, sender by sender.

`forward` moves entries from senders to receivers; `backward` moves entries the other
way along the same route (owners answering requests). Each is the other's gradient: an
all-to-all of equal chunks is a permutation of the workers' buffers, whose adjoint is
the reverse all-to-all. So a loss on worker `w` that reads rows sent back by owners
sends, in the backward pass, its gradient to those owners, and every owner receives the
gradients of every worker's loss (the collectives run in all workers' backward passes).

Why V2 rather than V3: V2 takes the group and instance keys of the strategy's own
collectives (cluster.py), which also orders them with the strategy's all-reduces on the
device; V3 needs a communicator resource of its own group, initialised on every worker.
Both exist in TF 2.16 - 2.21 with the same signatures. An empty exchange (no worker sends
anything) still sends chunks of one padding entry, so every collective has a shape.
"""

from __future__ import annotations

import tensorflow as tf

from tensorflow_dynemb.distribute.cluster import WorkerGroup, collective_timeout

__all__ = ["Exchange", "all_gather", "gather_rows", "padded_bytes"]


def _collective_args(group: WorkerGroup):
    launcher = group.launcher()
    options = getattr(launcher, "_options", None)
    implementation = getattr(getattr(options, "implementation", None), "value", "auto")
    token = launcher._get_ordering_token()
    return dict(
        group_size=launcher._group_size,
        group_key=launcher._group_key,
        instance_key=launcher._next_instance_key(),
        ordering_token=[] if token is None else [token],
        communication_hint=str(implementation).lower(),
        timeout_seconds=collective_timeout(group),
    )


def all_gather(group: WorkerGroup, tensor: tf.Tensor, name: str) -> tf.Tensor:
    """`tensor` (the same shape on every worker) of every worker, concatenated along
    axis 0 in rank order."""
    with tf.device(group.device):
        return tf.raw_ops.CollectiveGatherV2(input=tensor, name=name, **_collective_args(group))


def _all_to_all(group: WorkerGroup, buffer: tf.Tensor, name: str) -> tf.Tensor:
    """`[W, c, ...]` -> `[W, c, ...]`: chunk `j` to worker `j`; differentiable for
    floating buffers (the gradient is the reverse all-to-all)."""

    def exchange(value):
        with tf.device(group.device):
            return tf.raw_ops.CollectiveAllToAllV2(
                input=value, name=name, **_collective_args(group)
            )

    if not buffer.dtype.is_floating:
        return exchange(buffer)

    @tf.custom_gradient
    def differentiable(value):
        def grad(upstream):
            return exchange(tf.convert_to_tensor(upstream))

        return exchange(value), grad

    return differentiable(buffer)


class Exchange:
    """The route of one exchange: which worker each entry goes to and where it lands.

    Args:
      group: the workers.
      destinations: int32 `[n]`, the worker each of this worker's `n` entries goes to,
        in `[0, group.num_workers)`.
      name: names the collectives (errors and profiles show it).

    Attributes:
      counts: int32 `[W, W]`, entries sent from worker (row) to worker (column).
      chunk: the padded chunk length (the largest count, at least 1).
    """

    def __init__(self, group: WorkerGroup, destinations: tf.Tensor, name: str):
        self.group = group
        self.name = name
        num = group.num_workers
        destinations = tf.convert_to_tensor(destinations, tf.int32)
        check = tf.debugging.assert_less(
            destinations,
            num,
            message=f"{name}: the partitioner returned a shard id >= the number of workers {num}",
        )
        with tf.control_dependencies([check]):
            destinations = tf.identity(destinations)
        sent = tf.math.bincount(destinations, minlength=num, maxlength=num, dtype=tf.int32)
        self.counts = all_gather(group, sent[tf.newaxis, :], name=f"{name}_counts")
        self.chunk = tf.maximum(tf.reduce_max(self.counts), 1)
        # Where each entry goes in the [W * chunk] send buffer: destination * chunk + its
        # place among the entries for that destination (a stable sort keeps batch order).
        order = tf.argsort(destinations, stable=True)
        sorted_destinations = tf.gather(destinations, order)
        starts = tf.cumsum(sent, exclusive=True)
        place = tf.range(tf.size(destinations)) - tf.gather(starts, sorted_destinations)
        slots = sorted_destinations * self.chunk + place
        self._send_slots = tf.scatter_nd(order[:, tf.newaxis], slots, tf.shape(destinations))
        # Where the received entries are in the [W * chunk] receive buffer, sender by sender.
        received = self.counts[:, group.rank]
        offsets = tf.range(num) * self.chunk
        self._recv_slots = tf.ragged.range(offsets, offsets + received).flat_values
        self.received = tf.reduce_sum(received)

    def _move(self, values: tf.Tensor, from_slots, to_slots, name: str) -> tf.Tensor:
        values = tf.convert_to_tensor(values)
        num = self.group.num_workers
        tail = tf.shape(values)[1:]
        padded = tf.scatter_nd(
            from_slots[:, tf.newaxis], values, tf.concat([[num * self.chunk], tail], 0)
        )
        buffer = tf.reshape(padded, tf.concat([[num, self.chunk], tail], 0))
        moved = _all_to_all(self.group, buffer, name=f"{self.name}_{name}")
        flat = tf.reshape(moved, tf.concat([[num * self.chunk], tail], 0))
        out = tf.gather(flat, to_slots)
        out.set_shape(tf.TensorShape([None]).concatenate(values.shape[1:]))
        return out

    def forward(self, values: tf.Tensor, name: str = "forward") -> tf.Tensor:
        """`[n, ...]` entries of this worker (one per destination entry) ->
        `[received, ...]` entries for this worker, sender by sender, in each sender's
        order."""
        return self._move(values, self._send_slots, self._recv_slots, name)

    def backward(self, values: tf.Tensor, name: str = "backward") -> tf.Tensor:
        """`[received, ...]` answers, one per entry `forward` delivered here -> `[n, ...]`:
        the answers to this worker's own entries, in their order."""
        return self._move(values, self._recv_slots, self._send_slots, name)


def padded_bytes(counts, row_bytes: int) -> int:
    """Bytes each worker sends over the network in one padded exchange of `row_bytes`
    entries described by the `[W, W]` `counts` (a NumPy array or nested list): `W - 1`
    chunks of `max(counts)` entries (its own chunk stays local). For benchmarks."""
    rows = [list(map(int, row)) for row in counts]
    chunk = max(1, max(max(row) for row in rows))
    return (len(rows) - 1) * chunk * int(row_bytes)


# Dtypes TF's collectives do not take, and what they travel as.
_WIRE = {tf.bool: tf.int32, tf.int8: tf.int32, tf.uint8: tf.int32, tf.int16: tf.int32}


def gather_rows(group: WorkerGroup, tensor: tf.Tensor, name: str) -> tf.Tensor:
    """Every worker's `[n_i, ...]` `tensor` (`n_i` may differ), concatenated along axis
    0 in rank order, on every worker: the sizes are all-gathered first, then each
    worker's rows are padded to the largest and all-gathered. Works eagerly too."""
    tensor = tf.convert_to_tensor(tensor)
    dtype = tensor.dtype
    wire = _WIRE.get(dtype, dtype)
    tensor = tf.cast(tensor, wire) if wire != dtype else tensor
    size = tf.shape(tensor)[0]
    sizes = all_gather(group, size[tf.newaxis], name=f"{name}_sizes")
    width = tf.maximum(tf.reduce_max(sizes), 1)
    # (The rank may be unknown while tracing: a table's export has no static shape.)
    padding = tf.concat(
        [[[0, width - size]], tf.zeros(tf.stack([tf.rank(tensor) - 1, 2]), tf.int32)], 0
    )
    gathered = all_gather(group, tf.pad(tensor, padding), name=name)
    starts = tf.range(group.num_workers) * width
    rows = tf.gather(gathered, tf.ragged.range(starts, starts + sizes).flat_values)
    return tf.cast(rows, dtype) if wire != dtype else rows
