"""The `tf.compat.v1.train` wrapper of `de.DynamicEmbeddingOptimizer` (see optimizer.py)."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tensorflow_dynemb.training.applier import (
    SparseApplier,
    StepNumbers,
    _in_graph,
    _no_clip,
    get_slot,
    optimizer_name,
    slot_names,
    views_to_train,
)
from tensorflow_dynemb.training.slots import SlotStore
from tensorflow_dynemb.variable.trainable import rows_of

__all__ = ["V1DynamicEmbeddingOptimizer"]


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
        shadows = views_to_train(pairs)
        if not shadows:  # nothing sparse: exactly the inner optimizer
            return self.inner_optimizer.apply_gradients(pairs, global_step=global_step, name=name)
        rule = self._dynemb.rule
        with tf.init_scope():  # long-lived state, also when traced in a tf.function
            self._dynemb.create_slots(shadows)
            anchor = _step_anchor(shadows[0])
            step = self._step_variable(anchor)
            rule.create_non_slot_variables(anchor)
        local_step = tf.cast(step, tf.float32) + 1.0
        dense, writes = self._dynemb.step(pairs, StepNumbers(local_step), _no_clip)
        with tf.control_dependencies(writes if _in_graph() else []):
            if any(g is not None for g, _ in dense):
                update = self.inner_optimizer.apply_gradients(
                    dense, global_step=global_step, name=name
                )
            else:
                # What the inner optimizer's apply_gradients would have done besides
                # updating variables: its `_finish` (Adam's beta powers), global_step.
                finish = rule.finish_step()
                if global_step is not None:
                    finish.append(global_step.assign_add(1))
                update = tf.group(*finish)  # None when executing eagerly
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
        """The `SlotView` of slot `name` of a de.Variable's trainable view (as TFRA's,
        its `.params` is the slot); None for other variables, whose slots are the inner
        optimizer's (`inner_optimizer.get_slot`)."""
        return get_slot(self._dynemb, var, name)

    def get_slot_names(self):
        """TFRA's: the slot names of the de.Variables' slots (sorted, as TF1
        optimizers list theirs), which `get_slot` takes."""
        return sorted(slot_names(self._dynemb))

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
