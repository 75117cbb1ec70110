"""The trainable view of a `de.Variable`: the rows one lookup read in a training step.

A hash table cannot be differentiated, and its size is not known in advance, so a
training lookup goes through a `TrainableRows`:

1. the lookup looks each distinct id up once and stores, in three ordinary TF variables,
   the distinct ids (`ids`), whether each was stored (`exists`) and their rows
   (`variable`, shape `[None, dim]`, trainable);
2. its output is `variable.sparse_read(index)` (`step_ops.gather_rows`: the same read
   and gradient on a faster CPU kernel), so the gradient of the loss with respect to
   `variable` is an `IndexedSlices` whose indices are positions in `ids`;
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
A lookup traced under a tape in a function that an eager step calls also sets a flag
variable that the optimizer step clears (`pending`), so that the eager step knows the
buffer holds rows to train.

A `de.shadow_ops.ShadowVariable` is a view whose buffers a model holds: its subclass
of `TrainableRows` (shadow_ops) adopts them (`_create_buffers`), reads its rows buffer
(`_read_rows`) and re-reads the rows after the optimizer step (`after_step`).

Under `tf.distribute.experimental.ParameterServerStrategy` the view keeps no state
between ops: the coordinator traces a step once and every worker runs that trace at
the same time, so buffers (variables) would be one set that all workers write. There
`variable` is a token (shape `[0, dim]`, on the first shard's parameter server, never
written) and each lookup's output is a `tf.custom_gradient` whose gradient with respect
to the token is an `IndexedSlices` indexing the lookup's own tensors (distinct ids,
`exists`, rows), which `TrainableRows` records for the optimizer step of the same
trace (`StepRecord`, step_record.py; the record of the latest traced graph is kept;
a lookup in a function the step calls sends its keys with its gradient instead). Every worker then works on its own tensors and
shares nothing but the tables. The lookup and the optimizer step must be in one
function (Keras' `train_step`, a `ClusterCoordinator`-scheduled step), as that
strategy requires anyway.
"""

from __future__ import annotations

import weakref
from typing import Any, List, Optional, Tuple

import tensorflow as tf

from tensorflow_dynemb.variable import step_ops
from tensorflow_dynemb.variable.view_buffers import (
    make_buffer,
    in_tf1_graph,
    local_placement,
    maybe_device,
    outside_strategy,
    token,
)
from tensorflow_dynemb.variable.step_record import (
    StepRecord,
    called_by_a_function,
    gather_with_keyed_gradient,
    gather_with_token_gradient,
    under_parameter_server_strategy,
    within,
)

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
    step, held in TF variables so that gradients can reach them (or, under a
    ParameterServerStrategy, recorded per traced graph: see the module docstring).

    Attributes:
      params: the `de.Variable`.
      name: the lookup name (TFRA's "trainable name").
      variable: the trainable `tf.Variable` of shape `[None, dim]` (record mode: a
        `[0, dim]` token); pass it to an optimizer or a tape.
      ids: the distinct keys whose rows `variable` holds, in row order (None when the
        view records tensors instead).
      exists: whether each key was stored in `params` when it was looked up (None when
        the view records tensors instead).
    """

    def __init__(self, params, name: str, replica: Optional[int] = None, ids=None):
        if not params.value_dtype.is_floating:
            raise TypeError(
                f"Training needs a floating-point value_dtype, but de.Variable "
                f"{params.name!r} holds {params.value_dtype.name}."
            )
        self.params = params
        self.name = name
        # The tf.distribute replica whose lookups use these buffers (None: no strategy).
        self.replica = replica
        # Whether lookups record their tensors instead of writing buffers.
        self.records = under_parameter_server_strategy()
        # Named as TFRA's TrainableWrapper: `<variable scope>/<name>/<name>` (graph-unique
        # in a TF1 graph: `.../<name>_1` for another variable's view of that name), a
        # replica's `<name>/replica_<i>`.
        variable_name = _scope_name(name) + ("" if replica is None else f"/replica_{replica}")
        variable_scope = tf.compat.v1.get_variable_scope().name
        scope = f"{variable_scope}/{_scope_name(name)}/" if variable_scope else f"{_scope_name(name)}/"
        device = _replica_device(replica)
        # Created outside any tf.function being traced (like optimizer slots), so that
        # a lookup first traced inside a function still owns long-lived variables.
        with tf.init_scope(), tf.name_scope(scope):
            initial_rows = tf.zeros([0, params.dim], params.value_dtype)
            if self.records:
                self.ids = self.exists = None
                self.variable = token(initial_rows, params, variable_name)
            else:
                self._create_buffers(initial_rows, device, variable_name, ids)
            self._unconsumed = self._unconsumed_flag(device, variable_name)
        setattr(self.variable, _OWNER_ATTR, self)
        # TFRA's TrainableWrapper has this method; code writes looked-up rows back by it.
        self.variable.update_op = self.update_op
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
        # Record mode: the lookups' tensors of the latest traced graph (only one is
        # kept: its tensors hold the graph alive), and of the pending eager step.
        self._graph_record: Optional[Tuple[weakref.ref, StepRecord]] = None
        self._eager_record: Optional[StepRecord] = None
        # Record mode: whether a lookup was traced in a function called by another
        # (its gradient carries keys: `_read_keyed`).
        self._keyed_lookups = False
        # Whether a traced function has written the buffers (see `_unconsumed_flag`).
        self._traced_writes = False

    def _unconsumed_flag(self, device: Optional[str], name: str):
        """A bool variable that a traced lookup sets and an optimizer step clears, or
        None where no eager code needs to know (TF1 graphs, record mode).

        An eager step may call a `tf.function` that looks ids up (a model whose `call`
        is decorated, run with `run_eagerly=True`; an eager loop around a traced
        forward pass): no Python of the lookup runs then, so only the function itself
        can say that the buffers hold rows for the eager step to train (`pending`)."""
        if self.records or in_tf1_graph():
            return None
        with maybe_device(device), outside_strategy():
            return tf.Variable(False, trainable=False, name=f"{name}_unconsumed")

    def _create_buffers(self, initial_rows: tf.Tensor, device: Optional[str], name: str, ids) -> None:
        # In a TF1 graph the buffers are local variables (see view_buffers.make_buffer);
        # they need no initialisation: every read of a step follows a write of that step. They
        # are colocated with the lookup's ids, as TFRA's TrainableWrapper is.
        local = in_tf1_graph()
        anchor = ids if ids is not None else initial_rows
        with maybe_device(device), local_placement(anchor), outside_strategy():
            self.variable = make_buffer(initial_rows, name, True, local)
            self.ids = make_buffer(tf.zeros([0], self.params.key_dtype), f"{name}_ids", False, local)
            self.exists = make_buffer(tf.zeros([0], tf.bool), f"{name}_exists", False, local)

    def _read_rows(self) -> tf.Tensor:
        """The rows buffer as the lookups wrote it. (A ShadowVariable's view overrides
        it: that variable's `read_value()` reads the table first, as TFRA's does.)"""
        return self.variable.read_value()

    @property
    def pending(self) -> bool:
        """Whether lookups wrote rows that no optimizer step consumed yet: eager
        lookups, or (read eagerly) lookups of a traced function an eager step called."""
        if self._pending_eager:
            return True
        return self._traced_writes and bool(self._unconsumed.numpy())

    # -- the lookup side -------------------------------------------------------------------

    def read(self, flat_ids: tf.Tensor) -> tf.Tensor:
        """The `[n, dim]` rows of the 1-D `flat_ids`, differentiable through `variable`."""
        unique_ids, index = step_ops.unique(flat_ids)
        rows, exists = self.params.lookup(unique_ids, return_exists=True)
        if self.records and called_by_a_function():
            return self._read_keyed(flat_ids, rows, index)
        if self.records:
            return self._read_recorded(unique_ids, exists, rows, index)
        return self._buffered_read(
            index, [(self.ids, unique_ids), (self.exists, exists), (self.variable, rows)]
        )

    def _buffered_read(self, index: tf.Tensor, contents) -> tf.Tensor:
        """Writes `contents` (`(buffer, tensor)` pairs, the rows buffer `variable` among
        them) into the buffers, appending or overwriting (see the module docstring), and
        returns `variable.sparse_read(index)` (`step_ops.gather_rows`; `index` shifted past
        earlier lookups)."""
        if self._appends():
            # In a TF1 graph, after the previous lookup's writes (nothing else orders
            # them, and the buffers may not be initialised before the first write).
            with tf.control_dependencies(_ops_of(self._previous_writes)):
                offset = tf.shape(self.ids.read_value(), out_type=index.dtype)[0]
                writes = [
                    buffer.assign(tf.concat([self._read_buffer(buffer), tensor], 0))
                    for buffer, tensor in contents
                ]
            index = index + offset
        else:
            writes = [buffer.assign(tensor) for buffer, tensor in contents]
        if self._unconsumed is not None and not tf.executing_eagerly() and tape_may_record():
            # Traced under a tape (the eager step's, or the function's own): the rows
            # are for an optimizer step. A trace that no tape records (a training-mode
            # call for outputs) leaves nothing pending.
            self._traced_writes = True
            writes.append(self._unconsumed.assign(True))
        with tf.control_dependencies(_ops_of(writes)):
            # The gradient's indices are this tensor: `consume` then reads the buffers
            # after these writes also when the gradient's values do not depend on the
            # rows (a loss linear in them), which a TF1 graph would not order otherwise.
            index = tf.identity(index)
            self._previous_writes = writes
            if in_tf1_graph():
                # Not `sparse_read`: its gradient reads the variable's shape, unordered,
                # possibly before the first write of a local buffer initialised by
                # nothing but a `local_init_op`. This gradient takes the shape of the
                # read, which follows the writes.
                return tf.gather(self._read_rows(), index)
            return step_ops.gather_rows(self.variable, index)

    def _read_buffer(self, buffer) -> tf.Tensor:
        return self._read_rows() if buffer is self.variable else buffer.read_value()

    def _read_recorded(self, unique_ids, exists, rows, index) -> tf.Tensor:
        """Record mode: `rows[index]`, whose gradient with respect to the token indexes
        this step's record, to which the lookup's tensors are appended."""
        if self._appends():
            record = self._record_here()
        else:
            record = StepRecord()
            if tf.executing_eagerly():
                self._eager_record = record
            else:
                self._graph_record = (weakref.ref(tf.compat.v1.get_default_graph()), record)
        positions = record.append(unique_ids, exists, rows, index)
        return gather_with_token_gradient(self.variable, rows, index, positions, record.size)

    def _read_keyed(self, flat_ids, rows, index) -> tf.Tensor:
        """Record mode, in a function that another function calls (a `call` decorated
        with `@tf.function` in a Keras `train_step`): the optimizer step is in the
        caller, which cannot use this function's tensors, so the gradient carries the
        keys themselves (see `step_record.gather_with_keyed_gradient`)."""
        if not (self.params.key_dtype.is_integer):
            raise TypeError(
                f"Under ParameterServerStrategy, trainable view {self.name!r} of "
                f"de.Variable {self.params.name!r} (keys {self.params.key_dtype.name}) is "
                "looked up in a tf.function called by the training step (e.g. a `call` "
                "decorated with @tf.function); that needs integer keys. Remove the "
                "decorator, so that the lookup is traced in the step itself."
            )
        self._keyed_lookups = True
        return gather_with_keyed_gradient(self.variable, rows, index, flat_ids)

    def _gradient_is_keyed(self) -> bool:
        """Record mode: whether the gradient applied here carries keys (the lookups
        were in a function the step calls) rather than positions in a record."""
        return self._keyed_lookups and self._positional_record_here() is None

    def _positional_record_here(self) -> Optional["StepRecord"]:
        if tf.executing_eagerly():
            return self._eager_record
        recorded_graph, record = self._graph_record or (None, None)
        if recorded_graph is None or not within(
            tf.compat.v1.get_default_graph(), recorded_graph()
        ):
            return None
        return record

    def _consume_keyed(self, gradient) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """`consume` of a keyed gradient: its keys, and their rows and existence read
        from the table now (a missing key reads its initial row again: the same row
        for constant and key-seeded random initializers)."""
        keys = tf.cast(gradient.indices, self.params.key_dtype)
        unique_keys, index = step_ops.unique(keys)
        rows, exists = self.params.lookup(unique_keys, return_exists=True)
        return keys, tf.gather(rows, index), tf.gather(exists, index), gradient.values

    def _record_here(self) -> "StepRecord":
        """The record of the step being built: eagerly the pending one; in a graph, the
        one of this graph or of a graph enclosing it (a tf.cond branch may apply
        gradients of lookups made outside it)."""
        record = self._positional_record_here()
        if record is None:
            raise ValueError(
                f"The gradient of trainable view {self.name!r} of de.Variable "
                f"{self.params.name!r} is applied where no lookup of it ran. Under "
                "ParameterServerStrategy the lookup and the optimizer step must be in "
                "the same tf.function (a Keras train_step, or the step a "
                "ClusterCoordinator schedules), and the lookup outside tf.cond / "
                "tf.while_loop bodies."
            )
        return record

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
        if self.records:
            return not self._gradient_is_keyed() and self._record_here().lookups == 1
        if tf.executing_eagerly():
            return self._pending_eager and self._eager_lookups == 1
        graph = tf.compat.v1.get_default_graph()
        return (
            self._last_graph is not None
            and self._last_graph() is graph
            and self._graph_lookups == 1
        )

    def update_op(self, v0: Optional[tf.Tensor] = None):
        """TFRA's `TrainableWrapper.update_op()`: writes the view's rows as they are (as
        the last lookup read them, or as assigned since) to `params` under the ids the
        lookup read, and updates `params`' restrict-policy status of those ids.

        Args:
          v0: for a `bp_v2` variable, the rows before (the view adds `rows - v0` by
            `accum`); ignored otherwise.

        Returns:
          The operation (None when executing eagerly).

        Raises:
          ValueError: a `bp_v2` variable without `v0`.
          RuntimeError: a view that records tensors (ParameterServerStrategy) and has
            no rows between steps.
        """
        if self.records:
            raise RuntimeError(
                f"update_op() of trainable view {self.name!r}: under ParameterServerStrategy "
                "the view holds no rows between ops; de.DynamicEmbeddingOptimizer writes them."
            )
        ids, rows, exists = (v.read_value() for v in (self.ids, self.variable, self.exists))
        if self.params.bp_v2:
            if v0 is None:
                raise ValueError(
                    f"update_op() of trainable view {self.name!r}: de.Variable "
                    f"{self.params.name!r} has bp_v2=True, which adds deltas: pass `v0`, "
                    "the rows before, got None."
                )
            writes = [self.params.accum(ids, v0, rows, exists)]
        else:
            writes = [self.params.upsert(ids, rows)]
        policy = self.params.restrict_policy
        if policy is not None:
            writes.append(policy.apply_update(ids))
        return None if tf.executing_eagerly() else tf.group(*writes)

    # -- the optimizer side ----------------------------------------------------------------

    def consume(self, gradient) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """The keys, old rows, existence and gradient rows behind `gradient` (the
        gradient of `variable`), one entry per gradient row (keys may repeat), and marks
        the buffer consumed (an eager lookup after this overwrites it)."""
        if self.records and self._gradient_is_keyed():
            return self._consume_keyed(gradient)
        if isinstance(gradient, tf.IndexedSlices):
            values, index = gradient.values, gradient.indices
        else:  # a dense gradient: one row per buffer row
            values = tf.convert_to_tensor(gradient)
            index = tf.range(tf.shape(values)[0])
        keys, old_rows, exists = self._contents(values, index)
        keys, old_rows, exists = (tf.gather(t, index) for t in (keys, old_rows, exists))
        self._mark_consumed()
        return keys, old_rows, exists, values

    def consume_distinct(self, gradient: tf.IndexedSlices):
        """`consume` for a buffer of distinct ids (`holds_one_lookup()`): the buffer's
        keys, rows and existence as they are, the gradient summed per buffer row
        (`[rows, dim]`), and how many gradient rows each buffer row received."""
        values, index = gradient.values, gradient.indices
        keys, old_rows, exists = self._contents(values, index)
        count = tf.size(keys, out_type=index.dtype)  # 1-D keys: one op, not Shape + slice
        grad, counts = step_ops.segment_sum_with_counts(values, index, count)
        self._mark_consumed()
        return keys, old_rows, exists, grad, counts

    def _contents(self, values, index) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The distinct keys, rows and existence the step's lookups read."""
        if self.records:
            return self._record_here().tensors()
        # Read the buffer after the forward pass wrote it (TF1 graphs order nothing else).
        with tf.control_dependencies([values, index]):
            return self.ids.read_value(), self._read_rows(), self.exists.read_value()

    def _mark_consumed(self) -> None:
        if tf.executing_eagerly():
            self._pending_eager = False
        if self._traced_writes:
            # Inside a function, the automatic control dependencies run this assign.
            self._unconsumed.assign(False)

    def after_step(self) -> List[Any]:
        """Called by the optimizer once it has written this view's rows back to the
        table; returns the ops it adds (none here: the buffer is not read again before
        the next lookup overwrites it). A `de.shadow_ops.ShadowVariable`'s view re-reads
        its rows, so that its value shows the trained rows, as TFRA's does."""
        return []

    def __repr__(self) -> str:
        return f"<de.TrainableRows of {self.params.name!r} name={self.name!r}>"


def _scope_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name) or "lookup"


def _ops_of(writes):
    """The assign results to order the read after (eager assigns return variables)."""
    return [] if tf.executing_eagerly() else writes
