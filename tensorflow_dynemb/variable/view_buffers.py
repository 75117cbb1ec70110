"""Where a trainable view's variables live, and how they are made (variable/trainable.py).

A view's buffers hold one replica's (or one worker's) rows of one step: plain local
resource variables, outside any `tf.distribute` strategy's variable creator, placed
with the replica (eager, `tf.function`) or with the lookup's ids (a TF1 graph, where
device functions such as `replica_device_setter` would otherwise put them on a
parameter server). Under ParameterServerStrategy the view is a never-written token.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import tensorflow as tf

from tensorflow_dynemb.persistence.checkpoint import in_tf1_graph

__all__ = ["in_tf1_graph", "make_buffer", "local_placement", "maybe_device", "outside_strategy", "token"]


def token(initial_rows: tf.Tensor, params, name: str):
    """Record mode's trainable variable: `[0, dim]`, never written, on the device of
    the variable's first shard (a parameter server; every worker reads it each step, 0
    bytes), outside the strategy's variable creator (nothing to aggregate). Its shape
    is fully defined: a worker deserialising a remote handle whose shape has an unknown
    dimension aborts (TF 2.21, `RemoteMgr::DeserializeRemoteTensorHandle`)."""
    with tf.device(params.tables[0].resource_handle.device), outside_strategy():
        return tf.Variable(initial_rows, trainable=True, name=name)


def maybe_device(device: Optional[str]):
    return tf.device(device) if device else contextlib.nullcontext()


def outside_strategy():
    """Under a `tf.distribute` strategy, creates the buffers as plain local variables
    instead of the strategy's (mirrored, or on a parameter server): they hold what one
    replica looked up in one step, and the optimizer wrapper combines the replicas'
    gradients by key itself (see `SparseApplier`). Without a strategy: no change."""
    if not tf.distribute.has_strategy():
        return contextlib.nullcontext()
    from tensorflow.python.ops import resource_variable_ops

    def local_creator(next_creator, **kwargs):
        del next_creator  # the strategy's creator; a ResourceVariable is made directly
        kwargs.pop("use_resource", None)
        kwargs.pop("synchronization", None)
        kwargs.pop("aggregation", None)
        kwargs.pop("expected_shape", None)
        kwargs.pop("experimental_enable_variable_lifting", None)
        return resource_variable_ops.ResourceVariable(**kwargs)

    return tf.variable_creator_scope(local_creator)


def local_placement(anchor: tf.Tensor):
    """Where the buffers of a TF1 graph go: with `anchor`, the lookup's ids (or an
    ordinary op made under the caller's device scope). The buffers hold one step of one
    worker, so they must live where the lookup is computed: device functions such as
    `replica_device_setter` would otherwise put them, like every variable, on a
    parameter server, where the workers of a cluster (whose graphs name them alike)
    would share, and race on, one buffer. Elsewhere (eager, `tf.function`): no change."""
    if not in_tf1_graph():
        return contextlib.nullcontext()
    return tf.compat.v1.colocate_with(anchor.op)


def make_buffer(initial: tf.Tensor, name: str, trainable: bool, local: bool):
    """A resource variable whose first dimension changes with every assignment.

    With `local` (in a TF1 graph) it is a local variable
    (`LOCAL_VARIABLES`, and `TRAINABLE_VARIABLES` for the rows, so that
    `minimize(loss)` finds them): each worker initialises its own (`local_init_op`),
    the chief does not wait for the other workers' buffers, and checkpoints do not
    hold them (they carry no state between steps)."""
    shape = tf.TensorShape([None]).concatenate(initial.shape[1:])
    collections = None
    if local:
        collections = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        if trainable:
            collections.append(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    return tf.compat.v1.Variable(
        initial,
        trainable=trainable,
        name=name,
        use_resource=True,
        shape=shape,
        collections=collections,
    )
