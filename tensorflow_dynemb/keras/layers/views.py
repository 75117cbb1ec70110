"""Which trainable views an embedding layer lists among its weights, and where.

A layer's training lookups read through its variable's trainable view (a `tf.Variable`
of shape `[None, dim]`, variable/trainable.py). Keras collects a model's trainable
weights from its layers (keras/_compat.py `ViewWeights`), and a step can only use the
view where the lookup's rows are: the layer lists it

- in a graph that looked it up (or a `tf.cond` / `tf.while_loop` body of it);
- in a graph that reads it through a function it calls: a `call` decorated with
  `@tf.function`, a nested helper; such a graph captures the view's handle, also when
  it reuses a trace made for another caller;
- eagerly, until an optimizer step consumes the rows an eager lookup, or a traced
  lookup under a tape, wrote.

Elsewhere (building an optimizer, `model.summary()`, saving) it lists nothing: the
table has no fixed shape to count or to allocate optimizer slots for. The mixin also
switches the calling model's plain optimizer to `de.DynamicEmbeddingOptimizer`.
"""

from __future__ import annotations

from typing import List

import tensorflow as tf

from tensorflow_dynemb.keras._compat import outside_stateless_scope
from tensorflow_dynemb.training.optimizer import DynamicEmbeddingOptimizer, wrapped
from tensorflow_dynemb.variable.trainable import replica_key, rows_of

__all__ = ["ListedViews"]


class ListedViews:
    """Mixin of `Embedding`: `_note_view` records a lookup's view, `_listed_views` says
    which views to list here; `self._step` holds the state (see `Embedding.__init__`)."""

    def _note_view(self, view: tf.Variable) -> None:
        """Records where `view` was looked up, for `_listed_views`."""
        if tf.executing_eagerly():
            self._step.eager_views = [view]
            return
        graph = tf.compat.v1.get_default_graph()
        replica = replica_key()  # the replicas of a tf.distribute strategy trace one graph
        self._step.traced_views[replica] = view
        while True:
            self._step.graph_views.setdefault(graph, {})[replica] = [view]
            # A lookup inside a tf.cond / tf.while_loop body serves the enclosing graph.
            if not getattr(graph, "is_control_flow_graph", False):
                break
            graph = graph.outer_graph

    def _listed_views(self) -> List[tf.Variable]:
        """The trainable views to list among the layer's weights here (see the module
        docstring): those looked up in the current graph, or eagerly those whose rows
        no optimizer step has consumed yet."""
        if not self.trainable:
            return []
        replica = replica_key()
        if tf.executing_eagerly():
            # Also a view a traced function looked up (a decorated `call` of an eager
            # step) whose rows no optimizer step has consumed yet.
            traced = self._step.traced_views.get(replica)
            candidates = self._step.eager_views + ([traced] if traced is not None else [])
            return [v for v in _distinct(candidates) if _has_pending_rows(v)]
        graph = tf.compat.v1.get_default_graph()
        views = self._step.graph_views.get(graph, {}).get(replica)
        if views:
            return list(views)
        # Looked up in a function this graph calls (a `@tf.function` `call`, a helper
        # function of a custom step): the lookup ran in that function's graph, and, as
        # that function's trace may be reused by several traces of the caller, the
        # caller is told by what it captures: a graph that reads the view, directly or
        # through any function it calls, captures the view's handle.
        view = self._step.traced_views.get(replica)
        if view is None or not _captures(graph, view):
            return []
        if self._step.latest_trace_symbolic:
            raise ValueError(
                f"Layer {self.name!r} is trained through a tf.function (a `call` decorated "
                "with @tf.function) whose only trace is the one Keras 3 made to build the "
                "model symbolically, in a stateless scope; Keras reuses that trace for "
                "training, where it does not train correctly (stock layers get no "
                "gradients there). Build the model by calling it on a batch of data "
                "(`model(batch)`) before fit / evaluate / predict, or remove the "
                "@tf.function decorator (Keras compiles `call` anyway)."
            )
        return [view]

    def _wrap_model_optimizer(self) -> None:
        """Switches the calling model's plain Keras optimizer to
        `de.DynamicEmbeddingOptimizer(optimizer)` (see the module docstring)."""
        model = self._calling_model()
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None or wrapped(optimizer) is not None:
            return
        # Out of any function being traced: the wrapper creates variables.
        with tf.init_scope(), outside_stateless_scope():
            model.optimizer = DynamicEmbeddingOptimizer(optimizer)


def _distinct(variables: List[tf.Variable]) -> List[tf.Variable]:
    seen = set()
    return [v for v in variables if not (id(v) in seen or seen.add(id(v)))]


def _captures(graph, variable: tf.Variable) -> bool:
    """Whether the function graph `graph` reads `variable` (captures its handle)."""
    handle = variable.handle
    return any(t is handle for t in getattr(graph, "external_captures", ()))


def _has_pending_rows(view: tf.Variable) -> bool:
    """Whether lookups wrote rows into `view` that no optimizer step consumed."""
    return rows_of(view).pending
