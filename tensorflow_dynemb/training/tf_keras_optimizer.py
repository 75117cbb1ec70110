"""The tf_keras (Keras 2) wrapper of `de.DynamicEmbeddingOptimizer` (see `optimizer.py`).

A subclass of `tf_keras.optimizers.Optimizer`, so that tf_keras' `model.compile` accepts
it; it wraps both the current tf_keras optimizers and the `tf_keras.optimizers.legacy`
ones by composition. tf_keras' `Model.train_step` calls `minimize`, which this class
inherits: it computes gradients with the tape and calls `apply_gradients` below.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf
import tf_keras

from tensorflow_dynemb.keras._saving import SlotTablesSaving
from tensorflow_dynemb.training.applier import optimizer_name
from tensorflow_dynemb.training.keras_wrapper import KerasWrapperMixin


@tf_keras.saving.register_keras_serializable(package="tensorflow_dynemb")
class TfKerasDynamicEmbeddingOptimizer(
    SlotTablesSaving, KerasWrapperMixin, tf_keras.optimizers.Optimizer
):
    """A tf_keras optimizer that also trains `de.Variable`s; made by
    `de.DynamicEmbeddingOptimizer(tf_keras_optimizer)`. Keras files (`.keras`,
    `.weights.h5`) hold its slot tables (`SlotTablesSaving`)."""

    def __init__(self, inner_optimizer, bp_v2: Optional[bool] = None, name: Optional[str] = None, **kwargs):
        if kwargs:
            raise ValueError(
                f"DynamicEmbeddingOptimizer takes no optimizer arguments of its own, got "
                f"{sorted(kwargs)}; set them on the wrapped optimizer."
            )
        super().__init__(name=name or f"DynamicEmbedding{optimizer_name(inner_optimizer)}")
        self._init_wrapper(inner_optimizer, bp_v2)

    def build(self, var_list):
        dense = self._dense_only(var_list)
        # Legacy optimizers create their slots on first use and have no build(). With
        # no dense variable (a model of embeddings only) the inner optimizer is left to
        # build itself when one comes: tf_keras' Nadam cannot build over none.
        if isinstance(self.inner_optimizer, tf_keras.optimizers.Optimizer) and dense:
            if not getattr(self.inner_optimizer, "_built", False):
                self.inner_optimizer.build(dense)
        self._dynemb.create_slots(var_list)
        super().build(dense)

    def apply_gradients(self, grads_and_vars, name=None, **kwargs):
        pairs = list(grads_and_vars)
        if not getattr(self, "_built", False):
            # Out of the function being traced, as tf_keras builds its own optimizers:
            # slot variables created inside a MirroredStrategy replica's trace get
            # lifted initialisers that capture that trace's tensors.
            with tf.init_scope():
                self.build([v for _, v in pairs])
        train_op = self._apply_pairs(
            pairs, lambda dense: self.inner_optimizer.apply_gradients(dense, name=name, **kwargs)
        )
        # In a TF1 graph (legacy optimizers only), the step's op, which the session runs.
        return self.iterations if train_op is None else train_op

    def minimize(self, loss, var_list, tape=None):
        """tf_keras' `minimize`, returning what `apply_gradients` returns: in a TF1 graph
        the train op, as the legacy optimizers' `minimize` does (tf_keras' returns None)."""
        grads_and_vars = self.compute_gradients(loss, var_list, tape)
        return self.apply_gradients(grads_and_vars)

    def finalize_variable_values(self, var_list):
        if isinstance(self.inner_optimizer, tf_keras.optimizers.Optimizer):
            self.inner_optimizer.finalize_variable_values(self._dense_only(var_list))

    _serialize_inner = staticmethod(tf_keras.optimizers.serialize)
    _deserialize_inner = staticmethod(tf_keras.optimizers.deserialize)
