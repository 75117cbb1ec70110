"""The trainable view of a `de.Variable`: the rows one lookup read in a training step.

A hash table cannot be differentiated, and its size is not known in advance, so a
training lookup goes through a `TrainableRows`:

1. the lookup looks each distinct id up once and stores, in three ordinary TF variables,
   the distinct ids (`ids`), whether each was stored (`exists`) and their rows
   (`variable`, shape `[None, dim]`, trainable);
2. its output is `variable.sparse_read(index)`, so the gradient of the loss with respect
   to `variable` is an `IndexedSlices` whose indices are positions in `ids`;
3. `de.DynamicEmbeddingOptimizer` recognises `variable` (through `rows_of`), maps the
   gradient's indices back to keys, updates those keys' rows and optimizer slots in the
   hash tables, and marks the buffer consumed.

`variable` is what users hand to optimizers and tapes (TFRA's `get_trainable_by_name`,
`return_trainable=True`); it is never read for its own sake.

Several lookups through one `TrainableRows` before the optimizer step (a Keras layer
shared by two features) append to the buffer instead of overwriting it, so every lookup's
gradient still maps to the right keys:
- eager: lookups append until the optimizer consumes the buffer;
- inside a `tf.function` (or a TF1 graph): the first lookup of a trace overwrites the
  buffer, later lookups in the same trace append.
Eager lookups made while no `tf.GradientTape` records (evaluation, inference) bypass
the buffer and read the tables directly, so they neither cost a copy nor grow it.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Optional, Tuple

import tensorflow as tf

try:  # Public API has no "is a tape recording?"; fall back to "maybe" without it.
    from tensorflow.python.eager.record import could_possibly_record as _tape_may_record
except ImportError:  # pragma: no cover - present in every supported TF (2.16-2.21)
    def _tape_may_record() -> bool:
        return True

__all__ = ["TrainableRows", "rows_of", "tape_may_record", "replica_key"]

# The attribute of a trainable `tf.Variable` that points back to its TrainableRows.
_OWNER_ATTR = "_dynemb_trainable_rows"


def tape_may_record() -> bool:
    """Whether an eager lookup may be differentiated (a gradient tape is active)."""
    return _tape_may_record()


def replica_key() -> Optional[int]:
    """The replica of a `tf.distribute` strategy whose step this code builds (each
    replica has its own views), or None outside a strategy's replica context."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    context = tf.distribute.get_replica_context()
    replica = getattr(context, "_replica_id_in_sync_group", None)
    if isinstance(replica, int):
        return replica
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:
        raise NotImplementedError(
            "Training de.Variables needs a strategy whose replica ids are known while "
            f"tracing (MirroredStrategy, ParameterServerStrategy); got {context.strategy!r}."
        )
    return int(replica)


def _replica_device(replica: Optional[int]) -> Optional[str]:
    """The device of `replica` of the current strategy (its views live there)."""
    if replica is None or not tf.distribute.has_strategy():
        return None
    devices = tf.distribute.get_strategy().extended.worker_devices
    if len(devices) > replica and len(devices) == tf.distribute.get_strategy().num_replicas_in_sync:
        return devices[replica]
    return None


def rows_of(variable) -> Optional["TrainableRows"]:
    """The `TrainableRows` whose trainable variable is `variable`, or None for any other
    variable (dense variables, Keras variables)."""
    return getattr(variable, _OWNER_ATTR, None)


class TrainableRows:
    """The rows of `params` read by the lookups called `name` since the last optimizer
    step, held in TF variables so that gradients can reach them.

    Attributes:
      params: the `de.Variable`.
      name: the lookup name (TFRA's "trainable name").
      variable: the trainable `tf.Variable` of shape `[None, dim]`; pass it to an
        optimizer or a tape.
      ids: the distinct keys whose rows `variable` holds, in row order.
      exists: whether each key was stored in `params` when it was looked up.
    """

    def __init__(self, params, name: str, replica: Optional[int] = None):
        if not params.value_dtype.is_floating:
            raise TypeError(
                f"Training needs a floating-point value_dtype, but de.Variable "
                f"{params.name!r} holds {params.value_dtype.name}."
            )
        _refuse_parameter_server_strategy(params)
        self.params = params
        self.name = name
        # The tf.distribute replica whose lookups use these buffers (None: no strategy).
        self.replica = replica
        suffix = "" if replica is None else f"_replica_{replica}"
        scope = f"{params._unique_name}/TrainableWrapper_{_scope_name(name)}{suffix}"
        device = _replica_device(replica)
        # Created outside any tf.function being traced (like optimizer slots), so that
        # a lookup first traced inside a function still owns long-lived variables.
        with tf.init_scope(), tf.name_scope(scope), _maybe_device(device):
            initial_rows = tf.zeros([0, params.dim], params.value_dtype)
            # In a TF1 graph the buffers are local variables (see _buffer); they need
            # no initialisation: every read of a step follows a write of that step.
            local = _in_tf1_graph()
            with _local_placement(initial_rows), _outside_strategy():
                self.variable = _buffer(initial_rows, "rows", True, local)
                self.ids = _buffer(tf.zeros([0], params.key_dtype), "ids", False, local)
                self.exists = _buffer(tf.zeros([0], tf.bool), "exists", False, local)
        setattr(self.variable, _OWNER_ATTR, self)
        # Keras 3 reads these from every trainable weight (its own Variables have them).
        self.variable.regularizer = None
        if not hasattr(self.variable, "constraint"):
            self.variable.constraint = None
        # Append-or-overwrite state (see the module docstring), and how many lookups
        # the buffer holds (eagerly, or in `_last_graph`): with one, its ids are
        # distinct, which lets the optimizer skip re-deduplicating them.
        self._pending_eager = False
        self._eager_lookups = 0
        self._last_graph: Optional[weakref.ref] = None
        self._previous_writes = []
        self._graph_lookups = 0

    @property
    def pending(self) -> bool:
        """Whether eager lookups wrote rows that no optimizer step consumed yet."""
        return self._pending_eager

    # -- the lookup side -------------------------------------------------------------------

    def read(self, flat_ids: tf.Tensor) -> tf.Tensor:
        """The `[n, dim]` rows of the 1-D `flat_ids`, differentiable through `variable`."""
        unique_ids, index = tf.unique(flat_ids)
        rows, exists = self.params.lookup(unique_ids, return_exists=True)
        if self._appends():
            # In a TF1 graph, after the previous lookup's writes (nothing else orders
            # them, and the buffers may not be initialised before the first write).
            with tf.control_dependencies(_ops_of(self._previous_writes)):
                offset = tf.shape(self.ids.read_value(), out_type=index.dtype)[0]
                writes = [
                    self.ids.assign(tf.concat([self.ids.read_value(), unique_ids], 0)),
                    self.exists.assign(tf.concat([self.exists.read_value(), exists], 0)),
                    self.variable.assign(tf.concat([self.variable.read_value(), rows], 0)),
                ]
            index = index + offset
        else:
            writes = [
                self.ids.assign(unique_ids),
                self.exists.assign(exists),
                self.variable.assign(rows),
            ]
        with tf.control_dependencies(_ops_of(writes)):
            # The gradient's indices are this tensor: `consume` then reads the buffers
            # after these writes also when the gradient's values do not depend on the
            # rows (a loss linear in them), which a TF1 graph would not order otherwise.
            index = tf.identity(index)
            self._previous_writes = writes
            if _in_tf1_graph():
                # Not `sparse_read`: its gradient reads the variable's shape, unordered,
                # possibly before the first write of a local buffer initialised by
                # nothing but a `local_init_op`. This gradient takes the shape of the
                # read, which follows the writes.
                return tf.gather(self.variable.read_value(), index)
            return self.variable.sparse_read(index)

    def _appends(self) -> bool:
        """Whether this lookup appends to the buffer (True) or overwrites it; records
        the lookup for the next call's decision."""
        if tf.executing_eagerly():
            appends = self._pending_eager
            self._pending_eager = True
            self._eager_lookups = self._eager_lookups + 1 if appends else 1
            return appends
        graph = tf.compat.v1.get_default_graph()
        appends = self._last_graph is not None and self._last_graph() is graph
        self._last_graph = weakref.ref(graph)
        self._graph_lookups = self._graph_lookups + 1 if appends else 1
        return appends

    def holds_one_lookup(self) -> bool:
        """Whether the buffer, as the current graph (or eager context) sees it, was
        written by exactly one lookup, so that its `ids` are distinct."""
        if tf.executing_eagerly():
            return self._pending_eager and self._eager_lookups == 1
        graph = tf.compat.v1.get_default_graph()
        return (
            self._last_graph is not None
            and self._last_graph() is graph
            and self._graph_lookups == 1
        )

    # -- the optimizer side ----------------------------------------------------------------

    def consume(self, gradient) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """The keys, old rows, existence and gradient rows behind `gradient` (the
        gradient of `variable`), one entry per gradient row (keys may repeat), and marks
        the buffer consumed (an eager lookup after this overwrites it)."""
        if isinstance(gradient, tf.IndexedSlices):
            values, index = gradient.values, gradient.indices
        else:  # a dense gradient: one row per buffer row
            values = tf.convert_to_tensor(gradient)
            index = tf.range(tf.shape(values)[0])
        # Read the buffer after the forward pass wrote it (TF1 graphs order nothing else).
        with tf.control_dependencies([values, index]):
            keys = tf.gather(self.ids.read_value(), index)
            old_rows = tf.gather(self.variable.read_value(), index)
            exists = tf.gather(self.exists.read_value(), index)
        if tf.executing_eagerly():
            self._pending_eager = False
        return keys, old_rows, exists, values

    def consume_distinct(self, gradient: tf.IndexedSlices):
        """`consume` for a buffer of distinct ids (`holds_one_lookup()`): the buffer's
        keys, rows and existence as they are, the gradient summed per buffer row
        (`[rows, dim]`), and the buffer rows each gradient row adds to (`[n]`)."""
        values, index = gradient.values, gradient.indices
        with tf.control_dependencies([values, index]):
            keys = self.ids.read_value()
            old_rows = self.variable.read_value()
            exists = self.exists.read_value()
        count = tf.shape(keys, out_type=index.dtype)[0]
        grad = tf.math.unsorted_segment_sum(values, index, count)
        if tf.executing_eagerly():
            self._pending_eager = False
        return keys, old_rows, exists, grad, index

    def __repr__(self) -> str:
        return f"<de.TrainableRows of {self.params.name!r} name={self.name!r}>"


def _scope_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name) or "lookup"


def _refuse_parameter_server_strategy(params) -> None:
    """ParameterServerStrategy runs one function trace on every worker, concurrently;
    the view's buffers would be one set of variables (on the coordinator) that all
    workers write in the same step, so keys would be lost or updated twice. Refused
    until views need no per-step state (see docs/scaling.md)."""
    if not tf.distribute.has_strategy():
        return
    strategy = tf.distribute.get_strategy()
    if "ParameterServerStrategy" in type(strategy).__name__:
        raise NotImplementedError(
            f"Training de.Variable {params.name!r} under {type(strategy).__name__} is not "
            "supported yet: its workers would share one trainable view and race on it. "
            "Use TF1 between-graph training (tf.compat.v1.train.replica_device_setter + "
            "MonitoredTrainingSession, tables on /job:ps devices) or MirroredStrategy; "
            "see docs/scaling.md."
        )


def _maybe_device(device: Optional[str]):
    return tf.device(device) if device else contextlib.nullcontext()


def _outside_strategy():
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


def _in_tf1_graph() -> bool:
    return not tf.executing_eagerly() and not tf.inside_function()


def _local_placement(anchor: tf.Tensor):
    """Where the buffers of a TF1 graph go: with `anchor`, an ordinary op made under
    the caller's device scope. The buffers hold one step of one worker, so they must
    live where the lookup is computed: device functions such as
    `replica_device_setter` would otherwise put them, like every variable, on a
    parameter server, where the workers of a cluster (whose graphs name them alike)
    would share, and race on, one buffer. Elsewhere (eager, `tf.function`): no change."""
    if not _in_tf1_graph():
        return contextlib.nullcontext()
    return tf.compat.v1.colocate_with(anchor.op)


def _buffer(initial: tf.Tensor, name: str, trainable: bool, local: bool):
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


def _ops_of(writes):
    """The assign results to order the read after (eager assigns return variables)."""
    return [] if tf.executing_eagerly() else writes
