"""The `de.Variable` half of a training step, shared by every optimizer wrapper.

`SparseApplier` maps the trainable views' gradients back to keys, sums them per key,
clips, and applies the optimizer's rule (rules/) to the rows and the slots (slots.py);
see optimizer.py's docstring for the whole design.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from tensorflow_dynemb import _export_context
from tensorflow_dynemb.distribute.cluster import current_group
from tensorflow_dynemb.distribute.collectives import gather_rows
from tensorflow_dynemb.variable import step_ops
from tensorflow_dynemb.training.accumulation import GradientAccumulation
from tensorflow_dynemb.training.rules import FusedStep, SparseRule, get_rule
from tensorflow_dynemb.training.slots import SlotStore, SlotView, join_state, split_state
from tensorflow_dynemb.variable.trainable import TrainableRows, rows_of

__all__ = [
    "SparseApplier",
    "SparseGradient",
    "StepNumbers",
    "get_slot",
    "keras_clip",
    "optimizer_name",
    "slot_names",
    "views_to_train",
    "wrapped",
]


def views_to_train(grads_and_vars) -> List[Any]:
    """The trainable views of `grads_and_vars` whose slots a step needs: those with a
    gradient, and in a SavedModel's trace every view. There the lookups read the tables
    directly (docs/serving.md), so no view gets a gradient; but a `tf.function` may
    create variables in its first trace only, which is the save's trace when the
    function was never called before, so the slots the live trace needs are made now."""
    read_only = _export_context.read_only()
    return [
        v for g, v in grads_and_vars
        if rows_of(v) is not None and (g is not None or read_only)
    ]


class SparseGradient(NamedTuple):
    """A `de.Variable`'s gradient in one step, one entry per distinct key."""

    params: Any
    keys: tf.Tensor
    old_rows: tf.Tensor  # the rows the step's lookups read
    exists: tf.Tensor  # whether each key was stored when looked up
    grad: tf.Tensor  # summed over every occurrence of the key
    counts: tf.Tensor  # occurrences of the key in the step's lookups


class StepNumbers(NamedTuple):
    """Where the optimizer's step stands, as the rules need it."""

    local: tf.Tensor  # the rules' 1-based step number (Keras: `iterations + 1`)
    # Where learning-rate schedules are evaluated, when that is not `local - 1`: the
    # raw step counter under Keras' gradient accumulation (accumulation.py).
    schedule: Optional[tf.Tensor] = None
    # Under gradient accumulation: whether this step applies the accumulated average.
    update_now: Optional[tf.Tensor] = None


class SparseApplier:
    """The de.Variable half of `apply_gradients`, shared by every wrapper class."""

    def __init__(
        self,
        optimizer,
        bp_v2: Optional[bool],
        slot_store: SlotStore,
        name: str,
        accumulation: Optional[GradientAccumulation] = None,
    ):
        self.optimizer = optimizer
        self.rule: SparseRule = get_rule(optimizer)
        self.bp_v2 = bp_v2
        self.slot_store = slot_store
        self.name = name
        self.accumulation = accumulation

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
                if self.accumulation is not None:
                    self.accumulation.accumulator_of(rows.params)

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
        if getattr(rows, "sums_per_row", False):
            # Model-parallel views (distribute/model_parallel.py): the gradient has one
            # row per (sender, id), the counts come from the view; several lookups of
            # the step (or several views of the variable) may repeat an id.
            summed = [view.consume_distinct(g) for view, g in parts]
            if len(summed) == 1 and rows.holds_one_lookup():
                return SparseGradient(rows.params, *summed[0])
            fields = [tf.concat([s[i] for s in summed], 0) for i in range(5)]
            return _sum_by_key(rows.params, *fields)
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

    def apply_synced(self, sparse: List[SparseGradient], step: StepNumbers) -> List[Any]:
        """`apply`, once per step for all replicas of a synchronous `tf.distribute`
        strategy (MirroredStrategy): in a replica context, every replica's gradients
        (one entry per key of its own lookups) are gathered in a `merge_call`, summed
        per key over the replicas (duplicated ids across replicas add up, like a dense
        variable's all-reduced gradient), and applied once. Elsewhere (no strategy, a
        single replica, or a ParameterServerStrategy worker, which updates the tables
        on its own): `apply`.

        Under a MultiWorkerMirroredStrategy of several workers, model-parallel variables
        are applied locally (see below), and any other variable (made with `devices`:
        a full copy on every worker) also gathers the other workers' gradients, so that
        every worker applies the same update to its copy and the copies stay equal."""
        context = tf.distribute.get_replica_context() if tf.distribute.has_strategy() else None
        if context is None or context.num_replicas_in_sync == 1 or not sparse:
            return self.apply(sparse, step)
        # Model-parallel variables (MultiWorkerMirroredStrategy): each worker's gradient
        # already sums every worker's contribution to the ids it owns (the exchange's
        # gradient, distribute/model_parallel.py); each owner applies it to its own
        # slice, with no merge.
        local = [update for update in sparse if update.params.worker_group is not None]
        sparse = [update for update in sparse if update.params.worker_group is None]
        writes = self.apply(local, step) if local else []
        if not sparse:
            return writes
        params = [update.params for update in sparse]
        tensors = [tuple(update)[1:] for update in sparse]

        def merge(strategy, tensors, step):
            workers = current_group()  # None unless several MultiWorkerMirrored workers

            def every_replica(value, name):
                local = tf.concat(strategy.experimental_local_results(value), 0)
                return local if workers is None else gather_rows(workers, local, name)

            merged = []
            for variable, fields in zip(params, tensors):
                keys, old_rows, exists, grads, counts = (
                    every_replica(f, f"{variable._unique_name}_replicated_{i}")
                    for i, f in enumerate(fields)
                )
                merged.append(_sum_by_key(variable, keys, old_rows, exists, grads, counts))
            # The step numbers are the same in every replica.
            first = [None if f is None else strategy.experimental_local_results(f)[0] for f in step]
            self.apply(merged, StepNumbers(*first))

        context.merge_call(merge, args=(tensors, step))
        return writes

    def apply(self, sparse: List[SparseGradient], step: StepNumbers) -> List[Any]:
        """Updates the rows and slots of every `SparseGradient` (under gradient
        accumulation: accumulates them, and updates every N-th step); returns the
        write ops (an empty list when executing eagerly)."""
        if self.accumulation is not None:
            return self.accumulation.step(
                sparse, step.update_now, SparseGradient, lambda drained: self._apply_now(drained, step)
            )
        return self._apply_now(sparse, step)

    def _apply_now(self, sparse: List[SparseGradient], step: StepNumbers) -> List[Any]:
        if not sparse:
            return []
        values = self.rule.step_values(step.local, step.schedule)
        writes = []
        for update in sparse:
            writes.extend(self._apply_one(update, values, step.local))
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

    def step(self, grads_and_vars, step: StepNumbers, clip) -> Tuple[List[Tuple[Any, Any]], List[Any]]:
        """The shared part of `apply_gradients`: clips every gradient with `clip`
        (`list of grads -> list of grads`), applies the sparse part, and returns the
        dense `(grad, var)` pairs still to apply and the sparse write ops."""
        dense, groups = self.split(grads_and_vars)
        sparse = [self.summed(parts) for parts in groups.values()]
        dense_grads = [g for g, _ in dense]
        clipped = clip(dense_grads + [s.grad for s in sparse])
        dense = list(zip(clipped[: len(dense)], [v for _, v in dense]))
        sparse = [s._replace(grad=g) for s, g in zip(sparse, clipped[len(dense) :])]
        writes = self.apply_synced(sparse, step)
        # Each view may act on the rows just written (`TrainableRows.after_step`).
        with tf.control_dependencies(_ops(writes) if _in_graph() else []):
            for parts in groups.values():
                for rows, _ in parts:
                    writes += rows.after_step()
        return dense, writes


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



def wrapped(optimizer):
    """The `SparseApplier` of a wrapper, or None for any other optimizer. A wrapper is
    also found inside tf_keras' `TFOptimizer`, which `compile` puts around a
    `tf.compat.v1.train` optimizer (such as the TF1 wrapper)."""
    applier = getattr(optimizer, "_dynemb", None)
    if applier is None and isinstance(optimizer, _tf_optimizer_classes()):
        applier = getattr(optimizer.optimizer, "_dynemb", None)
    return applier


def _tf_optimizer_classes() -> tuple:
    """tf_keras' (and TF's own legacy Keras') `TFOptimizer`, where imported."""
    modules = ("tf_keras.src.optimizers.optimizer_v1", "tensorflow.python.keras.optimizer_v1")
    return tuple(
        sys.modules[name].TFOptimizer for name in modules
        if hasattr(sys.modules.get(name), "TFOptimizer")
    )


def slot_names(applier: SparseApplier) -> List[str]:
    """A wrapper's `get_slot_names()`: the slots of the de.Variables it trains (TFRA's
    optimizer, patched in place, lists these among its own), the names `get_slot` takes."""
    return [spec.name for spec in applier.rule.slots]


def get_slot(applier: SparseApplier, var, slot_name: str):
    """A wrapper's `get_slot(var, slot_name)`: the `SlotView` of a trainable view's
    de.Variable (created with its slots if needed); None for any other variable, whose
    slots are the inner optimizer's (`inner_optimizer.get_slot`). TF's checkpoints ask
    every optimizer for the slots of every variable: a wrapper that also answered for
    the inner optimizer's would save those twice, which TF refuses.

    Raises:
      KeyError: `var` is a trainable view and `slot_name` no slot of the rule.
    """
    rows = rows_of(var)
    if rows is None:
        return None
    slots = applier.slots_of(rows.params)
    if slot_name not in slots:
        raise KeyError(
            f"`slot_name` must be one of the slots {sorted(slots)} of the optimizer's "
            f"de.Variable rows, got {slot_name!r}."
        )
    return slots[slot_name]
