"""What the Keras 3 and the tf_keras optimizer wrappers share (keras_optimizer.py,
tf_keras_optimizer.py)."""

from __future__ import annotations

from typing import Any, List, Optional

import tensorflow as tf

from tensorflow_dynemb.training.accumulation import GradientAccumulation, accumulation_steps
from tensorflow_dynemb.training.applier import (
    SparseApplier,
    StepNumbers,
    _in_graph,
    _no_clip,
    get_slot,
    keras_clip,
    optimizer_name,
    slot_names,
    views_to_train,
)
from tensorflow_dynemb.training.slots import SlotStore
from tensorflow_dynemb.variable.trainable import rows_of


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
        name = optimizer_name(inner_optimizer)
        # Keras 3's gradient accumulation: the wrapper clips nothing itself then (the
        # inner optimizer clips its dense averages, the accumulation the sparse ones).
        steps = accumulation_steps(inner_optimizer)
        self._clip = _no_clip if steps else keras_clip(inner_optimizer)
        accumulation = (
            GradientAccumulation(steps, self._slot_store, name, keras_clip(inner_optimizer))
            if steps
            else None
        )
        self._dynemb = SparseApplier(inner_optimizer, bp_v2, self._slot_store, name, accumulation)

    @staticmethod
    def _dense_only(var_list):
        return [v for v in var_list if rows_of(v) is None]

    def _apply_pairs(self, pairs, apply_dense):
        """Applies `(grad, var)` pairs: the sparse part here, the dense part through
        `apply_dense(dense_pairs)` (the inner optimizer, which advances `iterations`).

        Returns:
          In a TF1 graph, the op of the whole step (what legacy optimizers'
          `apply_gradients` return there); None elsewhere, where ops run as built
          (eagerly) or in program order (`tf.function`).
        """
        self._dynemb.create_slots(views_to_train(pairs))
        dense, writes = self._dynemb.step(pairs, self._step_numbers(), self._clip)
        dense = [(g, v) for g, v in dense if g is not None]
        # In a TF1 graph nothing else orders them: the sparse writes read `iterations`
        # (the step numbers), which the dense step advances.
        with tf.control_dependencies(writes if _in_graph() else []):
            if dense:
                update = apply_dense(dense)
            else:
                update = self._step_counter().assign_add(1)
        if not _in_graph():
            return None
        return tf.group(update, *writes)

    def _step_counter(self):
        """The inner optimizer's step counter variable. Under Keras 3's gradient
        accumulation `iterations` is a tensor (`_iterations // N`), not the counter."""
        if self._dynemb.accumulation is not None:
            return self.inner_optimizer._iterations
        return self.inner_optimizer.iterations

    def _step_numbers(self) -> StepNumbers:
        """The step the inner optimizer is about to apply, as Keras numbers it."""
        local = tf.cast(self.inner_optimizer.iterations, tf.float32) + 1.0
        accumulation = self._dynemb.accumulation
        if accumulation is None:
            return StepNumbers(local)
        counter = self._step_counter()
        return StepNumbers(
            local,
            schedule=counter,
            update_now=tf.equal((counter + 1) % accumulation.steps, 0),
        )

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

    def get_slot_names(self) -> List[str]:
        """TFRA's: the slot names of the de.Variables' slots, which `get_slot` takes."""
        return slot_names(self._dynemb)

    def get_slot(self, var, slot_name: str):
        """The `SlotView` of slot `slot_name` of a de.Variable's trainable view (as
        TFRA's, its `.params` is the slot); None for other variables, whose slots are
        the wrapped optimizer's."""
        return get_slot(self._dynemb, var, slot_name)

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
