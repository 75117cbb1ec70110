"""`de.DynamicEmbeddingOptimizer`: trains `de.Variable`s and dense variables together.

The wrapper is built by composition: it holds the user's optimizer (`inner_optimizer`)
and splits every `apply_gradients` call in two:

- dense variables (and Keras variables) go to the inner optimizer unchanged;
- the trainable views of `de.Variable`s (`TrainableRows.variable`, see `trainable.py`)
  are updated by `SparseApplier`: their gradient rows are mapped back to keys and summed
  per key (duplicate ids in a batch and several lookups of one variable add up), then
  the rows of only those keys, and the matching rows of the optimizer slots, are
  updated by the explicit rule for the inner optimizer (`optimizer_rules.py`) and
  written back (`upsert`, or `accum` with `bp_v2`). For the common rules (Adam, AdamW,
  Adagrad, SGD with momentum; `SparseRule.fused`) one op per shard reads, updates and
  writes the slot rows in place and returns the new rows (`DynembTableApplyRule`, the
  same arithmetic bit for bit); otherwise the slot rows are looked up, updated by TF
  ops and upserted.

Slots (Adam's `m`/`v`, Adagrad's accumulator, ...) live side by side in the rows of one
companion `de.Variable` per trained variable (its slot state: the parameter's devices,
partitioner and table creator; `slots.py`), created once and tracked by the wrapper, so
checkpoints of the optimizer hold them; users see each slot as a `SlotView`.

Gradient clipping (`clipnorm`, `global_clipnorm`, `clipvalue` of the inner Keras
optimizer) is applied once over all gradients, dense and sparse (summed per key) alike,
before either part is applied; the inner optimizer's own clipping then finds nothing
left to clip. The step number of the sparse rules is the inner optimizer's `iterations`
(Keras) or the wrapper's own step counter (`tf.compat.v1.train`), read before this step
increments it.

Three wrapper classes share that machinery, one per optimizer family, each subclassing
its family's base class so that the frameworks accept it (`model.compile`,
`tf.compat.v1.train.MonitoredTrainingSession`, ...):
- `KerasDynamicEmbeddingOptimizer` for Keras 3 optimizers (`tf.keras` on TF >= 2.16);
- `TfKerasDynamicEmbeddingOptimizer` for `tf_keras` (Keras 2) optimizers;
- `V1DynamicEmbeddingOptimizer` for `tf.compat.v1.train` optimizers.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tensorflow_dynemb import step_ops
from tensorflow_dynemb.optimizer_rules import FusedStep, SparseRule, get_rule
from tensorflow_dynemb.slots import SlotStore, SlotView, join_state, split_state
from tensorflow_dynemb.trainable import TrainableRows, rows_of

__all__ = ["DynamicEmbeddingOptimizer", "SparseApplier"]


# ---------------------------------------------------------------------------------------
# The sparse part of a step
# ---------------------------------------------------------------------------------------


class SparseGradient(NamedTuple):
    """A `de.Variable`'s gradient in one step, one entry per distinct key."""

    params: Any
    keys: tf.Tensor
    old_rows: tf.Tensor  # the rows the step's lookups read
    exists: tf.Tensor  # whether each key was stored when looked up
    grad: tf.Tensor  # summed over every occurrence of the key
    counts: tf.Tensor  # occurrences of the key in the step's lookups


class SparseApplier:
    """The de.Variable half of `apply_gradients`, shared by every wrapper class."""

    def __init__(self, optimizer, bp_v2: Optional[bool], slot_store: SlotStore, name: str):
        self.optimizer = optimizer
        self.rule: SparseRule = get_rule(optimizer)
        self.bp_v2 = bp_v2
        self.slot_store = slot_store
        self.name = name

    # -- slots ------------------------------------------------------------------------------

    def slots_of(self, params) -> Dict[str, SlotView]:
        """`{slot name: SlotView}` of `params`, created on first use."""
        slots = self.slot_store.slots_of(params)
        if not slots and self.rule.slots:
            slots = self.slot_store.create(params, self.rule.slots, self.name)
        return slots

    def state_of(self, params):
        """The slot state `de.Variable` of `params` (every slot's columns side by side,
        see slots.py), created on first use; None for rules without slots."""
        self.slots_of(params)
        return self.slot_store.state_of(params)

    def create_slots(self, variables: Sequence[Any]) -> None:
        """Creates the slots of every de.Variable behind `variables` (trainable views)."""
        for variable in variables:
            rows = rows_of(variable)
            if rows is not None:
                self.slots_of(rows.params)

    # -- one step ---------------------------------------------------------------------------

    @staticmethod
    def split(grads_and_vars) -> Tuple[List[Tuple[Any, Any]], Dict[int, List[Tuple[TrainableRows, Any]]]]:
        """Dense `(grad, var)` pairs, and the trainable views' gradients grouped by
        de.Variable (pairs without a gradient are dropped from the sparse part)."""
        dense, sparse = [], {}
        for grad, var in grads_and_vars:
            rows = rows_of(var)
            if rows is None:
                dense.append((grad, var))
            elif grad is not None:
                sparse.setdefault(id(rows.params), []).append((rows, grad))
        return dense, sparse

    @staticmethod
    def summed(parts: List[Tuple[TrainableRows, Any]]) -> SparseGradient:
        """One gradient row per distinct key from every lookup of one de.Variable."""
        rows, grad = parts[0]
        if len(parts) == 1 and isinstance(grad, tf.IndexedSlices) and rows.holds_one_lookup():
            # The common case (one lookup of the variable in the step): the buffer's
            # ids are already distinct and in first-occurrence order, which is the
            # order tf.unique below would give, so sum the gradient per buffer row.
            keys, old_rows, exists, grad_sum, counts = rows.consume_distinct(grad)
            return SparseGradient(rows.params, keys, old_rows, exists, grad_sum, counts)
        consumed = [rows.consume(grad) for rows, grad in parts]
        keys, old_rows, exists, grads = (
            tf.concat([c[i] for c in consumed], 0) if len(consumed) > 1 else consumed[0][i]
            for i in range(4)
        )
        return _sum_by_key(parts[0][0].params, keys, old_rows, exists, grads, None)

    def apply_synced(self, sparse: List[SparseGradient], local_step: tf.Tensor) -> List[Any]:
        """`apply`, once per step for all replicas of a synchronous `tf.distribute`
        strategy (MirroredStrategy): in a replica context, every replica's gradients
        (one entry per key of its own lookups) are gathered in a `merge_call`, summed
        per key over the replicas (duplicated ids across replicas add up, like a dense
        variable's all-reduced gradient), and applied once. Elsewhere (no strategy, a
        single replica, or a ParameterServerStrategy worker, which updates the tables
        on its own): `apply`."""
        context = tf.distribute.get_replica_context() if tf.distribute.has_strategy() else None
        if context is None or context.num_replicas_in_sync == 1 or not sparse:
            return self.apply(sparse, local_step)
        params = [update.params for update in sparse]
        tensors = [tuple(update)[1:] for update in sparse]

        def merge(strategy, tensors, local_step):
            merged = []
            for variable, fields in zip(params, tensors):
                keys, old_rows, exists, grads, counts = (
                    tf.concat(strategy.experimental_local_results(f), 0) for f in fields
                )
                merged.append(_sum_by_key(variable, keys, old_rows, exists, grads, counts))
            self.apply(merged, strategy.experimental_local_results(local_step)[0])

        context.merge_call(merge, args=(tensors, local_step))
        return []

    def apply(self, sparse: List[SparseGradient], local_step: tf.Tensor) -> List[Any]:
        """Updates the rows and slots of every `SparseGradient`; returns the write ops
        (an empty list when executing eagerly)."""
        if not sparse:
            return []
        values = self.rule.step_values(local_step)
        writes = []
        for update in sparse:
            writes.extend(self._apply_one(update, values, local_step))
        return [w for w in writes if w is not None]

    def _apply_one(self, update: SparseGradient, values, local_step) -> List[Any]:
        params = update.params
        writes = []
        if params._admit is not None:  # ids not admitted yet get no row and no update
            admitted, counting = params._admit.admit(update.keys, update.counts, update.exists)
            writes += counting
            update = _masked(update, admitted)
        state = self.state_of(params)
        grad = tf.cast(update.grad, update.old_rows.dtype)
        fused = self._fused_step(state, update.old_rows.dtype, values)
        if fused is not None:
            # One op per shard reads, updates and writes the slot state rows and
            # returns the new parameter rows (the common case).
            new_rows = state._apply_rule(update.keys, update.old_rows, grad, fused)
        else:
            # One lookup and one upsert of the slot state serve every slot of the rule.
            names = [spec.name for spec in self.rule.slots]
            slot_rows = split_state(state.lookup(update.keys), names) if state is not None else {}
            new_rows, new_slot_rows = self.rule.apply(update.old_rows, grad, slot_rows, values)
        bp_v2 = params.bp_v2 if self.bp_v2 is None else self.bp_v2
        evicted = None
        # bp_v2 adds this step's delta, so that concurrent writers' deltas all count.
        # A bounded variable reports what the write-back evicted (handled below).
        if bp_v2 and params.bounded:
            evicted = params.accum_and_evict(
                update.keys, update.old_rows, new_rows, update.exists
            )[0]
        elif bp_v2:
            writes.append(params.accum(update.keys, update.old_rows, new_rows, update.exists))
        elif params.bounded:
            evicted = params.insert_and_evict(update.keys, new_rows)[0]
        else:
            writes.append(params.upsert(update.keys, new_rows))
        if state is not None and fused is None:
            writes.append(state.upsert(update.keys, join_state(new_slot_rows, names)))
        policy = params.restrict_policy
        if policy is not None:
            writes.append(policy.apply_update(update.keys, local_step))
        if evicted is not None:
            # A key the variable evicted (or turned away) loses its slot rows and status
            # too, so that it comes back with fresh ones. After the writes above.
            with tf.control_dependencies(_ops(writes)):
                writes += params.remove_everywhere(evicted)
                if policy is not None:
                    writes.append(policy.status.remove(evicted))
        return writes

    def _fused_step(self, state, dtype, values) -> Optional[FusedStep]:
        """The rule's step as one op on the slot state (`Variable._apply_rule`), where
        the rule has a fused form for `dtype` and the state's tables can apply it;
        None otherwise (then: lookup, `rule.apply`, upsert)."""
        if state is None or not state._can_apply_rules():
            return None
        return self.rule.fused(values, dtype)

    def step(self, grads_and_vars, local_step: tf.Tensor, clip) -> Tuple[List[Tuple[Any, Any]], List[Any]]:
        """The shared part of `apply_gradients`: clips every gradient with `clip`
        (`list of grads -> list of grads`), applies the sparse part, and returns the
        dense `(grad, var)` pairs still to apply and the sparse write ops."""
        dense, groups = self.split(grads_and_vars)
        sparse = [self.summed(parts) for parts in groups.values()]
        dense_grads = [g for g, _ in dense]
        clipped = clip(dense_grads + [s.grad for s in sparse])
        dense = list(zip(clipped[: len(dense)], [v for _, v in dense]))
        sparse = [s._replace(grad=g) for s, g in zip(sparse, clipped[len(dense) :])]
        return dense, self.apply_synced(sparse, local_step)


def _sum_by_key(params, keys, old_rows, exists, grads, counts) -> SparseGradient:
    """One entry per distinct key: the first entry's old row and existence, the sum of
    the gradients and of the counts (`counts` None: each entry counts once)."""
    unique_keys, index = step_ops.unique(keys)
    count = tf.size(unique_keys)
    first = tf.math.unsorted_segment_min(tf.range(tf.size(keys)), index, count)
    grad, occurrences = step_ops.segment_sum_with_counts(grads, index, count)
    counts = occurrences if counts is None else tf.math.unsorted_segment_sum(counts, index, count)
    return SparseGradient(
        params,
        unique_keys,
        tf.gather(old_rows, first),
        tf.gather(exists, first),
        grad,
        counts,
    )


def _masked(update: SparseGradient, mask: tf.Tensor) -> SparseGradient:
    """The entries of `update` where `mask` holds."""
    return update._replace(
        **{
            field: tf.boolean_mask(getattr(update, field), mask)
            for field in ("keys", "old_rows", "exists", "grad", "counts")
        }
    )


def _ops(writes: List[Any]) -> List[Any]:
    """The write ops to order after (eager writes return None and need no ordering)."""
    return [w for w in writes if w is not None]


def keras_clip(optimizer):
    """The clipping of a Keras (3 or 2) optimizer as a function of a gradient list: the
    same options and order as Keras (`clipnorm`, else `global_clipnorm`, else
    `clipvalue`)."""

    def clip(grads):
        clipnorm = getattr(optimizer, "clipnorm", None)
        global_clipnorm = getattr(optimizer, "global_clipnorm", None)
        clipvalue = getattr(optimizer, "clipvalue", None)
        if clipnorm and clipnorm > 0:
            return [None if g is None else _clip_by_norm(g, clipnorm) for g in grads]
        if global_clipnorm and global_clipnorm > 0:
            present = [g for g in grads if g is not None]
            clipped, _ = tf.clip_by_global_norm(present, global_clipnorm)
            it = iter(clipped)
            return [None if g is None else next(it) for g in grads]
        if clipvalue and clipvalue > 0:
            return [None if g is None else _clip_by_value(g, clipvalue) for g in grads]
        return grads

    return clip


def _clip_by_norm(grad, clipnorm):
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)
    return tf.clip_by_norm(grad, clipnorm)


def _clip_by_value(grad, clipvalue):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(
            tf.clip_by_value(grad.values, -clipvalue, clipvalue), grad.indices, grad.dense_shape
        )
    return tf.clip_by_value(grad, -clipvalue, clipvalue)


def _no_clip(grads):
    return grads


def _in_graph() -> bool:
    """Whether ops need explicit ordering (TF1 graphs; tf.function orders stateful ops
    itself, eager runs them in order)."""
    return not tf.executing_eagerly() and not tf.inside_function()


# ---------------------------------------------------------------------------------------
# What the Keras 3 and tf_keras wrappers share
# ---------------------------------------------------------------------------------------


class KerasWrapperMixin:
    """The composition shared by the Keras 3 and the tf_keras wrapper: put it first in
    the bases, before the framework's optimizer class, so that its delegating
    properties win. The wrapped optimizer (`inner_optimizer`) owns the step counter, the
    learning rate and the dense variables' state."""

    def _init_wrapper(self, inner_optimizer, bp_v2: Optional[bool]) -> None:
        if getattr(inner_optimizer, "loss_scale_factor", None):
            # Keras unscales gradients before clipping them; the wrapper clips first.
            raise ValueError(
                "DynamicEmbeddingOptimizer does not support `loss_scale_factor` yet; got "
                f"loss_scale_factor={inner_optimizer.loss_scale_factor}."
            )
        self.inner_optimizer = inner_optimizer
        self.bp_v2 = bp_v2
        self._slot_store = SlotStore()
        self._dynemb = SparseApplier(
            inner_optimizer, bp_v2, self._slot_store, optimizer_name(inner_optimizer)
        )

    @staticmethod
    def _dense_only(var_list):
        return [v for v in var_list if rows_of(v) is None]

    def _apply_pairs(self, pairs, apply_dense) -> None:
        """Applies `(grad, var)` pairs: the sparse part here, the dense part through
        `apply_dense(dense_pairs)` (the inner optimizer, which advances `iterations`)."""
        self._dynemb.create_slots([v for g, v in pairs if g is not None])
        # The step the inner optimizer is about to apply.
        local_step = tf.cast(self.inner_optimizer.iterations, tf.float32) + 1.0
        dense, _ = self._dynemb.step(pairs, local_step, keras_clip(self.inner_optimizer))
        dense = [(g, v) for g, v in dense if g is not None]
        if dense:
            apply_dense(dense)
        else:
            self.inner_optimizer.iterations.assign_add(1)

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def variables(self):
        variables = self.inner_optimizer.variables
        # tf_keras' legacy optimizers have a `variables()` method instead.
        return variables() if callable(variables) else variables

    def get_slot_variables(self, params) -> List[Any]:
        """The slots (`SlotView`s) of `params` (empty before its first update)."""
        return list(self._slot_store.slots_of(params).values())

    def exclude_from_weight_decay(self, var_list=None, var_names=None):
        self.inner_optimizer.exclude_from_weight_decay(var_list=var_list, var_names=var_names)

    # Subclasses set these to their Keras' (de)serialization functions.
    _serialize_inner = None
    _deserialize_inner = None

    def get_config(self):
        return {
            "name": self.name,
            "inner_optimizer": self._serialize_inner(self.inner_optimizer),
            "bp_v2": self.bp_v2,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = cls._deserialize_inner(config.pop("inner_optimizer"), custom_objects=custom_objects)
        return cls(inner, **config)


# ---------------------------------------------------------------------------------------
# The public factory
# ---------------------------------------------------------------------------------------


def DynamicEmbeddingOptimizer(optimizer, bp_v2: Optional[bool] = None):
    """Wraps `optimizer` so that it trains `de.Variable`s as well as dense variables.

    Args:
      optimizer: a Keras 3 optimizer (`tf.keras.optimizers.*` on TF >= 2.16), a
        `tf_keras` optimizer, or a `tf.compat.v1.train` optimizer. Supported:
        SGD (momentum, nesterov), Adam (amsgrad), AdamW, Adagrad, RMSprop, Adadelta,
        Adamax, Nadam, Ftrl; for `tf.compat.v1.train`: GradientDescent, Momentum, Adam,
        Adagrad, Adadelta, RMSProp, Ftrl, ProximalAdagrad. A wrapped optimizer is
        returned unchanged.
      bp_v2: write back by `accum` (adding this step's deltas) instead of `upsert`, for
        every variable (True / False); None (default) uses each variable's `bp_v2`.

    Returns:
      An optimizer of the same family (a subclass of its base class), usable with
      `minimize`, `apply_gradients` and Keras `compile`/`fit`. Its `inner_optimizer`
      is `optimizer`, which keeps training the dense variables.

    Raises:
      TypeError: `optimizer` is not an optimizer of a supported class.
    """
    if wrapped(optimizer) is not None:
        return optimizer
    if bp_v2 is not None and not isinstance(bp_v2, bool):
        raise TypeError(f"`bp_v2` must be None, True or False, got {bp_v2!r}.")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return V1DynamicEmbeddingOptimizer(optimizer, bp_v2=bp_v2)
    keras3 = _keras3_optimizer_class()
    if keras3 is not None and isinstance(optimizer, keras3):
        return _keras3_wrapper_class()(optimizer, bp_v2=bp_v2)
    tf_keras_bases = _tf_keras_optimizer_classes()
    if tf_keras_bases and isinstance(optimizer, tf_keras_bases):
        from tensorflow_dynemb.optimizer_tf_keras import TfKerasDynamicEmbeddingOptimizer

        return TfKerasDynamicEmbeddingOptimizer(optimizer, bp_v2=bp_v2)
    raise TypeError(
        "`optimizer` must be a Keras 3 optimizer, a tf_keras optimizer or a "
        f"tf.compat.v1.train optimizer, got {type(optimizer).__module__}."
        f"{type(optimizer).__name__}."
    )


def optimizer_name(optimizer) -> str:
    """An optimizer's name (tf_keras' legacy optimizers keep it in their config only)."""
    for get in (lambda: optimizer.name, lambda: optimizer.get_name(), lambda: optimizer.get_config()["name"]):
        try:
            name = get()
        except (AttributeError, KeyError, TypeError):
            continue
        if isinstance(name, str) and name:
            return name
    return type(optimizer).__name__


def _keras3_optimizer_class():
    try:
        import keras
    except ImportError:  # pragma: no cover - TF >= 2.16 depends on keras 3
        return None
    if not keras.__version__.startswith("3."):
        return None
    return keras.optimizers.Optimizer


def _tf_keras_optimizer_classes() -> tuple:
    try:
        import tf_keras
    except ImportError:
        return ()
    return (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)


def wrapped(optimizer):
    """The `SparseApplier` of a wrapper, or None for any other optimizer."""
    return getattr(optimizer, "_dynemb", None)


# ---------------------------------------------------------------------------------------
# tf.compat.v1.train
# ---------------------------------------------------------------------------------------


class V1DynamicEmbeddingOptimizer(tf.compat.v1.train.Optimizer):
    """A `tf.compat.v1.train` optimizer that also trains `de.Variable`s (see the module
    docstring); made by `de.DynamicEmbeddingOptimizer`."""

    _STEP = "dynamic_embedding_step"

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, bp_v2: Optional[bool] = None):
        super().__init__(use_locking=False, name=f"DynamicEmbedding{optimizer_name(optimizer)}")
        self.inner_optimizer = optimizer
        # TF1 optimizers track nothing by attribute: checkpoints reach the inner
        # optimizer (its slots and beta powers) and the embedding slots only this way.
        self._track_trackable(optimizer, name="inner_optimizer")
        self._slot_store = SlotStore()
        self._track_trackable(self._slot_store, name="dynamic_embedding_slots")
        self._dynemb = SparseApplier(optimizer, bp_v2, self._slot_store, optimizer_name(optimizer))

    def compute_gradients(self, loss, var_list=None, **kwargs):
        return self.inner_optimizer.compute_gradients(loss, var_list=var_list, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pairs = list(grads_and_vars)
        shadows = [v for g, v in pairs if g is not None and rows_of(v) is not None]
        if not shadows:  # nothing sparse: exactly the inner optimizer
            return self.inner_optimizer.apply_gradients(pairs, global_step=global_step, name=name)
        with tf.init_scope():  # long-lived state, also when traced in a tf.function
            self._dynemb.create_slots(shadows)
            step = self._step_variable(_step_anchor(shadows[0]))
        local_step = tf.cast(step, tf.float32) + 1.0
        dense, writes = self._dynemb.step(pairs, local_step, _no_clip)
        with tf.control_dependencies(writes if _in_graph() else []):
            if any(g is not None for g, _ in dense):
                update = self.inner_optimizer.apply_gradients(
                    dense, global_step=global_step, name=name
                )
            elif global_step is not None:
                update = global_step.assign_add(1)
            else:
                update = tf.no_op()
        with tf.control_dependencies([update] if _in_graph() else []):
            advance = step.assign_add(1)
        if tf.executing_eagerly():
            return None
        return tf.group(update, advance, *writes, name=name or self.get_name())

    def _step_variable(self, colocate_with):
        """The number of steps applied so far (per graph), saved with the optimizer."""
        graph = None if tf.executing_eagerly() else colocate_with.graph
        step = self._get_non_slot_variable(self._STEP, graph=graph)
        if step is None:
            self._create_non_slot_variable(
                initial_value=tf.constant(0, tf.int64), name=self._STEP, colocate_with=colocate_with
            )
            step = self._get_non_slot_variable(self._STEP, graph=graph)
        return step

    def get_slot(self, var, name):
        return self.inner_optimizer.get_slot(var, name)

    def get_slot_names(self):
        """None: the dense variables' slots belong to (and are saved with) the inner
        optimizer, where `get_slot` finds them; embedding slots are `SlotView`s
        (`de.Variable.get_slot_variables`)."""
        return []

    def variables(self):
        return self.inner_optimizer.variables() + list(self._non_slot_dict.values())


class _TableAnchor:
    """Stands for a shard table's resource where TF's colocation expects a resource
    variable (`colocate_with`, `is_resource_variable`)."""

    _should_act_as_resource_variable = True

    def __init__(self, handle: tf.Tensor):
        self.handle = handle
        self.graph = handle.graph
        self.device = handle.device
        self.name = handle.name


def _step_anchor(view):
    """What the wrapper's step counter is colocated with: in a TF1 graph, the first
    shard table of the view's variable (a parameter server in a cluster, shared by all
    workers and initialised by the chief, like TF1 Adam's beta powers); elsewhere the
    view itself."""
    if not _in_graph():
        return view
    return _TableAnchor(rows_of(view).params.tables[0].resource_handle)


# ---------------------------------------------------------------------------------------
# Keras 3 (built lazily: the class subclasses keras.optimizers.Optimizer)
# ---------------------------------------------------------------------------------------

_KERAS3_WRAPPER = None


def _keras3_wrapper_class():
    global _KERAS3_WRAPPER
    if _KERAS3_WRAPPER is None:
        from tensorflow_dynemb.optimizer_keras import KerasDynamicEmbeddingOptimizer

        _KERAS3_WRAPPER = KerasDynamicEmbeddingOptimizer
    return _KERAS3_WRAPPER
