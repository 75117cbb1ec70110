"""Record mode of a trainable view: under `tf.distribute.experimental.ParameterServerStrategy`.

There every worker runs the same traced step at once, so a view cannot keep buffers
(variables) between ops: the workers would share, and race on, one set. Instead each
lookup's output is a `tf.custom_gradient` whose gradient with respect to a never-written
token variable is an `IndexedSlices` indexing the lookup's own tensors (distinct ids,
`exists`, rows), which a `StepRecord` keeps for the optimizer step of the same trace.
`variable/trainable.py` uses it; see its module docstring.
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf

__all__ = [
    "StepRecord",
    "called_by_a_function",
    "gather_with_keyed_gradient",
    "gather_with_token_gradient",
    "under_parameter_server_strategy",
    "within",
]

# The largest int64: the row count of a keyed gradient's dense shape (any key fits).
_ANY_KEY = 2**63 - 1


class StepRecord:
    """Record mode: the tensors the lookups of one view made in one step (one traced
    graph, or eagerly until an optimizer step consumes them)."""

    def __init__(self):
        self.ids, self.exists, self.rows = [], [], []
        self.size = None  # rows recorded so far (a scalar tensor once a lookup is in)

    @property
    def lookups(self) -> int:
        return len(self.ids)

    def append(self, ids, exists, rows, index) -> tf.Tensor:
        """Adds one lookup's distinct ids, existence and rows; returns `index` shifted
        to positions in the whole record."""
        count = tf.shape(ids, out_type=index.dtype)[0]
        positions = index if self.size is None else index + self.size
        self.size = count if self.size is None else self.size + count
        self.ids.append(ids)
        self.exists.append(exists)
        self.rows.append(rows)
        return positions

    def tensors(self) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """`(ids, rows, exists)` of every recorded lookup, concatenated."""
        if self.lookups == 1:
            return self.ids[0], self.rows[0], self.exists[0]
        return tf.concat(self.ids, 0), tf.concat(self.rows, 0), tf.concat(self.exists, 0)


def gather_with_token_gradient(token, rows, index, positions, size):
    """`tf.gather(rows, index)`, whose gradient with respect to `token` is the
    `IndexedSlices` `(upstream, positions)` over a `[size, dim]` record (`positions`:
    `index` shifted to this lookup's place in the record; the rows themselves, read
    from a table, have no gradient)."""

    @tf.custom_gradient
    def gather(token_value, rows):
        del token_value  # read only so that the tape links the output to the token

        def grad(upstream):
            dense_shape = tf.stack([tf.cast(size, tf.int64), tf.shape(rows, out_type=tf.int64)[1]])
            return tf.IndexedSlices(upstream, positions, dense_shape), None

        return tf.gather(rows, index), grad

    return gather(token, rows)


def gather_with_keyed_gradient(token, rows, index, flat_ids):
    """`tf.gather(rows, index)`, whose gradient with respect to `token` is the
    `IndexedSlices` `(upstream, flat_ids)`: one gradient row per id looked up, indexed by
    the id itself (as int64), for an optimizer step traced in another function than the
    lookup (a function's tensors cannot be used outside it; its gradient's can)."""

    @tf.custom_gradient
    def gather(token_value, rows):
        del token_value  # read only so that the tape links the output to the token

        def grad(upstream):
            keys = tf.cast(flat_ids, tf.int64)
            dense_shape = tf.stack([tf.constant(_ANY_KEY, tf.int64), tf.shape(rows, out_type=tf.int64)[1]])
            return tf.IndexedSlices(upstream, keys, dense_shape), None

        return tf.gather(rows, index), grad

    return gather(token, rows)


def called_by_a_function() -> bool:
    """Whether the graph being built is (in) a function traced while another function
    is traced: a `tf.function` called from a `tf.function`, not a `tf.cond` /
    `tf.while_loop` body of the caller's own graph."""
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "is_control_flow_graph", False):
        graph = graph.outer_graph
    outer = getattr(graph, "outer_graph", None)
    return outer is not None and hasattr(outer, "outer_graph")


def within(graph, outer) -> bool:
    """Whether `graph` is `outer` or a graph nested in it (a tf.cond / tf.while_loop
    body)."""
    while graph is not None:
        if graph is outer:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def under_parameter_server_strategy() -> bool:
    """Whether views are made under a ParameterServerStrategy (record mode)."""
    if not tf.distribute.has_strategy():
        return False
    return "ParameterServerStrategy" in type(tf.distribute.get_strategy()).__name__
