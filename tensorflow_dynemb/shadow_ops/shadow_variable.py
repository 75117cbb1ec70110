"""`ShadowVariable`: a trainable variable standing for the rows of a `de.Variable` that
a model holds (TFRA's `de.shadow_ops.ShadowVariable`).

A `de.Variable` cannot be differentiated; `de.embedding_lookup` reaches the optimizer
through a trainable view it creates on the fly (variable/trainable.py, `TrainableRows`).
A `tf.Module` or Keras model wants that view as an attribute, created once with the
model: that is a `ShadowVariable`. It is a resource variable of shape `[None, dim]`
whose value is the rows the last lookups through it read, and it *is* the rows buffer of
a `TrainableRows` (`_ShadowRows`, below), so everything downstream is the same machinery
as `de.embedding_lookup`'s: the gradient with respect to the shadow is an
`IndexedSlices` over its rows, and `de.DynamicEmbeddingOptimizer` maps it back to keys,
updates those rows and their optimizer slots in the table, and (`after_step`) re-reads
the rows, so that the shadow's value shows the trained rows as TFRA's does.

Its buffers: `ids` (the keys of the rows, 1-D), `exists` (whether each key was stored
when read) and the variable itself (the rows). Lookups that a gradient may be taken of
(inside a `tf.function`, or eagerly under a tape) append to them until the optimizer
step, so two lookups through one shadow in a step both train; any other eager lookup
replaces them (TFRA's shadow always replaces them), so that repeated inference calls
do not grow them. In inference mode (`de.enable_inference_mode()`) and in functions
traced for a SavedModel, lookups read the table and leave the shadow alone.

Checkpoints save the shadow's `params` (the table) and an empty buffer: the rows one
lookup read are no model state. Saving eagerly also empties the live buffer when no
training step is pending, as TFRA does, so the saved and the restored shadow look
alike; restoring empties it.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Tuple

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable import base as trackable_base

from tensorflow_dynemb import _export_context
from tensorflow_dynemb._convert import convert
from tensorflow_dynemb.variable.trainable import TrainableRows, rows_of, tape_may_record
from tensorflow_dynemb.variable.variable import Variable

__all__ = ["ShadowVariable", "DEResourceVariable", "trainable_wrapper_filter"]


class DEResourceVariable(resource_variable_ops.ResourceVariable):
    """A resource variable that holds a shadow's per-step state (its `ids` and
    `exists` buffers), never a model parameter: `de.trainable_wrapper_filter` sets it
    apart from dense variables, as TFRA's class of this name is set apart."""


class ShadowVariable(resource_variable_ops.ResourceVariable):
    """A trainable variable standing for the rows of `params` that lookups read.

    Look ids up with `de.shadow_ops.embedding_lookup(shadow, ids)` (or pass the shadow
    to `de.embedding_lookup*` / `de.safe_embedding_lookup_sparse`), hand the shadow to
    `de.DynamicEmbeddingOptimizer` (`var_list=[shadow]`, or as one of a `tf.Module`'s
    `trainable_variables`), and the optimizer updates the rows of the looked-up ids in
    `params`. Lookups work inside `tf.function`. See the module docstring.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> params = de.Variable(tf.int64, tf.float32, dim=2, initializer=1.0)
    >>> shadow = de.shadow_ops.ShadowVariable(params, name="user")
    >>> opt = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(0.5))
    >>> loss = lambda: tf.reduce_sum(de.shadow_ops.embedding_lookup(shadow, [3, 4]))
    >>> _ = opt.minimize(loss, var_list=[shadow])
    >>> params.lookup([3, 4, 5]).numpy()
    array([[0.5, 0.5],
           [0.5, 0.5],
           [1. , 1. ]], dtype=float32)

    Attributes:
      params: the `de.Variable`.
      ids: the keys whose rows the shadow holds (a 1-D `DEResourceVariable`).
      exists: whether each key was stored in `params` when read (1-D bool).
      max_norm: rows read are clipped to this L2 norm (None: not clipped).
    """

    def __init__(
        self,
        params: Variable,
        name: str = "ShadowVariable",
        max_norm: Optional[float] = None,
        trainable: bool = True,
        distribute_strategy: Optional[tf.distribute.Strategy] = None,
        **kwargs,
    ):
        """Creates an empty shadow of `params`.

        Args:
          params: the `de.Variable` whose rows the shadow stands for.
          name: the shadow's name, and the name of its trainable view in `params`
            (`params.get_trainable_by_name(name)` returns the shadow).
          max_norm: if not None, rows read are clipped to this L2 norm.
          trainable: whether optimizers train it (only a floating-point `params` can
            be trained).
          distribute_strategy: accepted for TFRA's signature; a shadow is one buffer,
            so it cannot be used by the replicas of a strategy with several (see
            `embedding_lookup`).
          **kwargs: `ids` / `exists`: 1-D resource variables of `params.key_dtype` /
            bool to use as those buffers; `collections`: ignored, as eager variables
            are added to no graph collection.

        Raises:
          NotImplementedError: not executing eagerly (as in TFRA), or under a
            ParameterServerStrategy.
          TypeError: `params` is not a `de.Variable`, `distribute_strategy` is not a
            `tf.distribute.Strategy`, an unknown keyword argument, or `ids` / `exists`
            buffers of the wrong kind.
        """
        if not tf.executing_eagerly():
            raise NotImplementedError(
                "de.shadow_ops.ShadowVariable is created eagerly only (as in TFRA); "
                "create it outside tf.function and TF1 graphs."
            )
        if not isinstance(params, Variable):
            raise TypeError(
                f"`params` must be a de.Variable, got {type(params).__name__}: {params!r:.200}"
            )
        if distribute_strategy is not None and not isinstance(
            distribute_strategy, tf.distribute.Strategy
        ):
            raise TypeError(
                f"`distribute_strategy` must be a tf.distribute.Strategy or None, got "
                f"{distribute_strategy!r}."
            )
        ids = kwargs.pop("ids", None)
        exists = kwargs.pop("exists", None)
        kwargs.pop("collections", None)
        if kwargs:
            raise TypeError(
                f"Unexpected keyword arguments {sorted(kwargs)}; ShadowVariable takes "
                "`ids`, `exists` and `collections`."
            )
        self.params = params
        self.max_norm = max_norm
        self._view_name = name
        super().__init__(
            initial_value=tf.zeros([0, params.dim], params.value_dtype),
            shape=tf.TensorShape([None, params.dim]),
            dtype=params.value_dtype,
            trainable=trainable,
            name=name,
        )
        self.ids = _buffer(ids, "ids", params.key_dtype, f"{name}-ids")
        self.exists = _buffer(exists, "exists", tf.bool, f"{name}-exists")
        # A checkpoint of a model that holds only the shadow still holds the table.
        self._track_trackable(params, name="params", overwrite=True)
        self._view: Optional[_ShadowRows] = None
        if trainable and params.value_dtype.is_floating:
            view = _ShadowRows(self)
            if view.records:
                raise NotImplementedError(
                    "de.shadow_ops.ShadowVariable does not work under a "
                    "ParameterServerStrategy (every worker would share its buffers); "
                    "use de.embedding_lookup or de.keras.layers there."
                )
            self._view = view
            params._adopt_view(view)

    # -- TFRA's API ---------------------------------------------------------------------------

    def read_value(self, do_prefetch: bool = True) -> tf.Tensor:
        """The rows of `ids`: with `do_prefetch` (default, as TFRA) read from `params`
        into the shadow first, else the rows the shadow holds; clipped by `max_norm`."""
        if do_prefetch:
            with tf.control_dependencies(self._prefetch()):
                value = self._buffer_value()
        else:
            value = self._buffer_value()
        return _clip(value, self.max_norm)

    def size(self) -> tf.Tensor:
        """The number of keys in `params`."""
        return self.params.size()

    def embedding_lookup(self, ids, name: Optional[str] = None, max_norm: Optional[float] = None):
        """`(de.shadow_ops.embedding_lookup(self, ids), self)` (TFRA's embedding-weights
        protocol); `max_norm`, when given, clips instead of the shadow's."""
        from tensorflow_dynemb.shadow_ops.lookup import embedding_lookup  # noqa: PLC0415 (a cycle)

        rows = embedding_lookup(self, ids, name=name)
        if max_norm is not None:
            rows = _clip(rows, max_norm)
        return rows, self

    def _reset_ids(self, ids) -> Any:
        """Sets the keys the next `read_value()` reads (TFRA's, used by its tests)."""
        flat = tf.reshape(convert(ids, self.params.key_dtype, "ids"), [-1])
        return self.ids.assign(flat, read_value=False)

    # -- lookups ------------------------------------------------------------------------------

    def _lookup(self, ids: tf.Tensor) -> tf.Tensor:
        """The unclipped `[n, dim]` rows of the 1-D keys `ids`, read through the
        shadow (see the module docstring)."""
        if _export_context.read_only():
            # Serving (TFRA's inference mode, or a SavedModel's functions) must not
            # write: concurrent calls would race on the buffers.
            return self.params.lookup(ids)
        _check_no_replicas()
        if self._view is not None:
            return self._view.read(ids)
        with tf.control_dependencies(_ops([self._reset_ids(ids)])):
            with tf.control_dependencies(self._prefetch()):
                return self._buffer_value()

    def _prefetch(self) -> List[Any]:
        """Reads the rows of `ids` from `params` into the shadow; returns the writes
        to order after (none eagerly)."""
        rows, exists = self.params.lookup(self.ids.read_value(), return_exists=True)
        return _ops(
            [self.exists.assign(exists, read_value=False), self.assign(rows, read_value=False)]
        )

    def _buffer_value(self) -> tf.Tensor:
        """The rows the shadow holds, unclipped and without reading `params`."""
        return super().read_value()

    def _clear(self) -> None:
        """Empties the buffers (see the module docstring)."""
        self.ids.assign(tf.zeros([0], self.params.key_dtype))
        self.exists.assign(tf.zeros([0], tf.bool))
        self.assign(tf.zeros([0, self.params.dim], self.params.value_dtype))
        if self._view is not None:
            self._view._mark_consumed()

    # -- checkpoints (see the module docstring) -----------------------------------------------

    def _serialize_to_tensors(self):
        if tf.executing_eagerly() and not (self._view is not None and self._view.pending):
            self._clear()
        with tf.device("/CPU:0"):
            empty = tf.zeros([0, self.params.dim], self.params.value_dtype)
        return {trackable_base.VARIABLE_VALUE_KEY: empty}

    def _restore_from_tensors(self, restored_tensors):
        # Whatever was saved, the restored shadow holds no rows: its ids must match its
        # rows, and a lookup fills both.
        del restored_tensors
        self._clear()

    def __repr__(self) -> str:
        # Not the value: reading it would fetch rows from `params` (TFRA's read_value).
        return (
            f"<de.shadow_ops.ShadowVariable {self._view_name!r} of de.Variable "
            f"{self.params.name!r} shape={self.shape} dtype={self.dtype.name}>"
        )


class _ShadowRows(TrainableRows):
    """The trainable view whose buffers are a `ShadowVariable`'s."""

    def __init__(self, shadow: ShadowVariable):
        self._shadow = shadow
        super().__init__(shadow.params, shadow._view_name)

    def _create_buffers(self, initial_rows, device, name, ids) -> None:
        del initial_rows, device, name, ids  # the shadow owns its buffers
        self.variable, self.ids, self.exists = self._shadow, self._shadow.ids, self._shadow.exists

    def _read_rows(self) -> tf.Tensor:
        return self._shadow._buffer_value()

    def read(self, flat_ids: tf.Tensor) -> tf.Tensor:
        if tf.executing_eagerly() and not tape_may_record() and not self.pending:
            rows = super().read(flat_ids)
            # No gradient can be taken of this lookup: it leaves no step pending, so
            # that the next lookup replaces the buffers instead of appending to them.
            self._mark_consumed()
            return rows
        return super().read(flat_ids)

    def after_step(self) -> List[Any]:
        # The shadow's value shows the rows as trained (TFRA's shadow is the buffer the
        # optimizer updates, then writes to the table).
        return self._shadow._prefetch()


def trainable_wrapper_filter(
    iterable_object_in: Iterable[Any], test_unaggregated_function=None
) -> Tuple[tuple, tuple]:
    """Splits items into `(others, trainable views)`, as TFRA's function of this name.

    Args:
      iterable_object_in: variables, or any items `test_unaggregated_function` takes
        (such as `(gradient, variable)` pairs).
      test_unaggregated_function: `fn(item) -> bool`, true for the items that go to the
        second tuple. Default: trainable views of `de.Variable`s (`ShadowVariable`s,
        the variables `return_trainable=True` and `get_trainable_by_name` return) and
        `DEResourceVariable`s.

    Returns:
      `(tuple of the other items, tuple of the selected items)`, each in input order.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> shadow = de.shadow_ops.ShadowVariable(de.Variable(dim=2), name="s")
    >>> dense = tf.Variable(1.0)
    >>> others, views = de.trainable_wrapper_filter([dense, shadow])
    >>> others[0] is dense, views[0] is shadow
    (True, True)
    """
    if test_unaggregated_function is None:
        test_unaggregated_function = _is_view_or_view_state
    selected, others = [], []
    for item in iterable_object_in:
        (selected if test_unaggregated_function(item) else others).append(item)
    return tuple(others), tuple(selected)


def _is_view_or_view_state(item: Any) -> bool:
    return rows_of(item) is not None or isinstance(item, DEResourceVariable)


def _buffer(given, arg: str, dtype: tf.dtypes.DType, name: str):
    """A 1-D buffer of `dtype`: `given` (checked), or a new empty one."""
    if given is None:
        return DEResourceVariable(
            tf.zeros([0], dtype), shape=tf.TensorShape([None]), trainable=False, name=name
        )
    if not isinstance(given, resource_variable_ops.BaseResourceVariable) or given.dtype != dtype:
        raise TypeError(
            f"`{arg}` must be a resource variable of dtype {dtype.name}, got {given!r:.200}."
        )
    if not given.shape.is_compatible_with([None]):
        raise TypeError(f"`{arg}` must be a 1-D variable (shape [None]), got shape {given.shape}.")
    return given


def _check_no_replicas() -> None:
    """A shadow is one buffer: the replicas of a synchronous strategy would race on it."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return
    if tf.distribute.get_replica_context().num_replicas_in_sync > 1:
        raise NotImplementedError(
            "A de.shadow_ops.ShadowVariable cannot be looked up by the replicas of a "
            "tf.distribute strategy with several replicas (they would share its buffers); "
            "use de.embedding_lookup or de.keras.layers, which keep one view per replica."
        )


def _clip(rows: tf.Tensor, max_norm: Optional[float]) -> tf.Tensor:
    """Each row (last axis) clipped to L2 norm `max_norm`, as `tf.nn.embedding_lookup`."""
    return rows if max_norm is None else tf.clip_by_norm(rows, max_norm, axes=[-1])


def _ops(writes: List[Any]) -> List[Any]:
    """The writes to order after (eager writes return None or a variable)."""
    return [] if tf.executing_eagerly() else [w for w in writes if w is not None]
