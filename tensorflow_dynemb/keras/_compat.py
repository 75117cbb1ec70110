"""The Keras the layers are built on, and the two framework hooks they need.

`de.keras.layers` follow `tf.keras`: Keras 3 on TF >= 2.16, or `tf_keras` (Keras 2)
when `TF_USE_LEGACY_KERAS=1` is set before TensorFlow is imported. `tf.keras` is fixed
for the life of the process, so the choice is made once, here, at import.

The two differences the layers care about live in two mixins, defined per Keras:

- how a layer lists its trainable view among the model's weights (`ViewWeights`):
  Keras 3 collects `layer.variables` / `layer.weights` from sublayers, tf_keras collects
  `layer.trainable_weights`;
- how a layer finds the model that is calling it (`CallerTracking`), so that a model
  compiled with a plain optimizer can be switched to `de.DynamicEmbeddingOptimizer`
  (see `layers.py`). Neither Keras has a public API for this: Keras 3 keeps the
  outermost layer of the current call in its call context (`entry_layer`); tf_keras'
  call context names only the innermost layer, so the layer reads it in `__call__`,
  just before its own call replaces it, which gives the layer that called it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, List, Optional

import tensorflow as tf

from tensorflow_dynemb.persistence.checkpoint import Untracked

Layer = tf.keras.layers.Layer

# tf.keras is tf_keras exactly when TF_USE_LEGACY_KERAS is set.
IS_KERAS3 = not Layer.__module__.startswith("tf_keras")

if IS_KERAS3:
    import keras as keras_module
    from keras.src.backend.common import global_state as _keras3_global_state
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope as _in_symbolic_scope
else:
    import tf_keras as keras_module
    from tf_keras.src.engine import base_layer_utils as _tf_keras_layer_utils

__all__ = [
    "IS_KERAS3",
    "Layer",
    "keras_module",
    "CallerTracking",
    "Untracked",
    "ViewWeights",
    "computing_output_spec",
    "in_stateless_build",
    "leave_symbolic_build",
    "outside_stateless_scope",
]


@contextlib.contextmanager
def outside_stateless_scope():
    """Leaves Keras 3's stateless scope (its symbolic build, `compute_output_spec`)
    for the duration: Keras variables cannot be created in it, and the optimizer
    wrapper a layer installs in a model's first trace has some (a `tf.function` `call`
    creates variables in its first trace only, which may be that build's)."""
    if not IS_KERAS3:
        yield
        return
    scope = _keras3_global_state.get_global_attribute("stateless_scope")
    _keras3_global_state.set_global_attribute("stateless_scope", None)
    try:
        yield
    finally:
        _keras3_global_state.set_global_attribute("stateless_scope", scope)


def leave_symbolic_build() -> bool:
    """Ends Keras 3's symbolic build (its stateless and symbolic scopes) for the rest of
    the `compute_output_spec` it is in, if no Keras variable was created in it yet;
    returns whether it did. Keras restores its own scopes when that call ends.

    Why: a model whose `call` is a `tf.function` is first traced inside that build,
    where Keras variables are created uninitialised and read as their initial values
    (constants). The trace is cached and reused for training, which then would not
    train those layers. Left early, the layers the trace builds after this point get
    real variables, read as variables."""
    if _keras3_global_state.get_global_attribute("uninitialized_variables"):
        return False
    _keras3_global_state.set_global_attribute("stateless_scope", None)
    _keras3_global_state.set_global_attribute("symbolic_scope", None)
    # Still computing specs only, for `computing_output_spec`: the function graphs being
    # traced. Not the outermost graph (eager's global graph, which has no outer_graph):
    # marked, every later eager call would count as a spec computation, and float ids
    # would be turned into zeros there instead of refused.
    graph = tf.compat.v1.get_default_graph()
    while hasattr(graph, "outer_graph"):
        _left_builds.add(graph)
        graph = graph.outer_graph
    return True


# The graphs of symbolic builds left by `leave_symbolic_build`.
_left_builds: "weakref.WeakSet" = weakref.WeakSet()


def in_stateless_build() -> bool:
    """Whether Keras 3 variables created or read here are stand-ins (its stateless
    scope, during a symbolic build that `leave_symbolic_build` did not end)."""
    return IS_KERAS3 and _keras3_global_state.get_global_attribute("stateless_scope") is not None


def computing_output_spec() -> bool:
    """Whether Keras 3 is only computing output shapes and dtypes (its symbolic build
    of a model, `compute_output_spec`, also after `leave_symbolic_build`): nothing
    traced there runs."""
    if not IS_KERAS3:
        return False
    if _in_symbolic_scope():
        return True
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if graph in _left_builds:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def _merged(variables: List[Any], extra: List[Any]) -> List[Any]:
    """`variables` followed by the members of `extra` not already in it."""
    seen = {id(v) for v in variables}
    return list(variables) + [v for v in extra if id(v) not in seen]


if IS_KERAS3:

    class ViewWeights:
        """Adds `self._listed_views()` to what Keras 3 collects from a layer: its
        `variables` and `weights` (`trainable_weights` and `trainable_variables`
        filter these; a `Model` gathers them from every sublayer)."""

        @property
        def variables(self):
            return _merged(super().variables, self._listed_views())

        @property
        def weights(self):
            return _merged(super().weights, self._listed_views())

    class CallerTracking:
        """Finds the model a layer is called by (Keras 3)."""

        def _calling_model(self) -> Optional[Any]:
            """The outermost layer of the current call (the model `fit` calls), or None
            when this layer was called directly."""
            context = _keras3_global_state.get_global_attribute("current_call_ctx")
            entry = getattr(context, "entry_layer", None)
            return None if entry is self else entry

else:

    class ViewWeights:
        """Adds `self._listed_views()` to what tf_keras collects from a layer: its
        `trainable_weights` (`weights`, `variables` and `trainable_variables` derive from
        it, and a `Model` gathers `trainable_variables` from every sublayer)."""

        @property
        def trainable_weights(self):
            return _merged(super().trainable_weights, self._listed_views())

    # Per thread: id(layer) -> the layers that called it, innermost call last.
    _callers = threading.local()

    class CallerTracking:
        """Finds the model a layer is called by (tf_keras)."""

        def __call__(self, *args, **kwargs):
            # Read before `super().__call__` enters this layer's own call context.
            stacks = _callers.__dict__.setdefault("stacks", {})
            stack = stacks.setdefault(id(self), [])
            stack.append(_tf_keras_layer_utils.call_context().layer)
            try:
                return super().__call__(*args, **kwargs)
            finally:
                stack.pop()
                if not stack:
                    del stacks[id(self)]

        def _calling_model(self) -> Optional[Any]:
            """The layer (usually the model) whose call called this layer, or None."""
            stack = _callers.__dict__.get("stacks", {}).get(id(self))
            return stack[-1] if stack else None
