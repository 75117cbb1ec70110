"""What the Keras 3 and the tf_keras optimizer wrappers share (keras_optimizer.py,
tf_keras_optimizer.py)."""

from __future__ import annotations

from typing import Any, List, Optional

import tensorflow as tf

from tensorflow_dynemb.training.applier import (
    SparseApplier, keras_clip, optimizer_name, views_to_train,
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
        self._dynemb = SparseApplier(
            inner_optimizer, bp_v2, self._slot_store, optimizer_name(inner_optimizer)
        )

    @staticmethod
    def _dense_only(var_list):
        return [v for v in var_list if rows_of(v) is None]

    def _apply_pairs(self, pairs, apply_dense) -> None:
        """Applies `(grad, var)` pairs: the sparse part here, the dense part through
        `apply_dense(dense_pairs)` (the inner optimizer, which advances `iterations`)."""
        self._dynemb.create_slots(views_to_train(pairs))
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
