"""The Keras 3 wrapper of `de.DynamicEmbeddingOptimizer` (see `optimizer.py`).

A subclass of `keras.optimizers.Optimizer`, so that `model.compile` accepts it, built by
composition the way Keras' own `LossScaleOptimizer` is.
"""

from __future__ import annotations

from typing import Optional

import keras
import tensorflow as tf

from tensorflow_dynemb.keras._saving import SlotTablesSaving
from tensorflow_dynemb.training.applier import optimizer_name
from tensorflow_dynemb.training.keras_wrapper import KerasWrapperMixin


@keras.saving.register_keras_serializable(package="tensorflow_dynemb")
class KerasDynamicEmbeddingOptimizer(
    SlotTablesSaving, KerasWrapperMixin, keras.optimizers.Optimizer
):
    """A Keras 3 optimizer that also trains `de.Variable`s; made by
    `de.DynamicEmbeddingOptimizer(keras_optimizer)`.

    In Keras weight files (`model.save`, `save_weights`) it saves the wrapped
    optimizer's variables as its own, and its slot tables as the child
    `dynamic_embedding_slots` (`SlotTablesSaving`)."""

    def __init__(self, inner_optimizer, bp_v2: Optional[bool] = None, name: Optional[str] = None, **kwargs):
        if kwargs:
            raise ValueError(
                f"DynamicEmbeddingOptimizer takes no optimizer arguments of its own, got "
                f"{sorted(kwargs)}; set them on the wrapped optimizer."
            )
        super().__init__(learning_rate=0.0, name=name or f"DynamicEmbedding{optimizer_name(inner_optimizer)}")
        self._init_wrapper(inner_optimizer, bp_v2)

    def build(self, var_list):
        dense = self._dense_only(var_list)
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(dense)
        self._dynemb.create_slots(var_list)
        super().build(dense)

    def apply_gradients(self, grads_and_vars):
        pairs = list(grads_and_vars)
        self.apply([g for g, _ in pairs], [v for _, v in pairs])
        return self.iterations

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:  # Keras' "the variables I was built with": all dense
            return self.inner_optimizer.apply(grads)
        pairs = list(zip(grads, trainable_variables))
        if not self.built:
            self.build([v for _, v in pairs])
        self._apply_pairs(
            pairs, lambda dense: self.inner_optimizer.apply([g for g, _ in dense], [v for _, v in dense])
        )

    def minimize(self, loss, var_list, tape=None):
        """Minimizes `loss` over `var_list`, as tf_keras optimizers do (Keras 3 ones have
        no `minimize`; TFRA code calls it).

        Args:
          loss: a callable returning the loss (evaluated under a new tape), or a tensor
            computed under `tape`.
          var_list: the variables to train (trainable views of de.Variables included), or
            a callable returning them.
          tape: the `tf.GradientTape` that recorded a tensor `loss`.

        Returns:
          The `iterations` variable.
        """
        if not callable(loss) and tape is None:
            raise ValueError("`tape` is required when `loss` is a tensor, not a callable.")
        if callable(loss):
            tape = tf.GradientTape()
            with tape:
                loss = loss()
        if callable(var_list):
            var_list = var_list()
        var_list = list(var_list)
        grads = tape.gradient(loss, var_list)
        return self.apply_gradients(zip(grads, var_list))

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list):
        self.inner_optimizer.finalize_variable_values(self._dense_only(var_list))

    _serialize_inner = staticmethod(keras.saving.serialize_keras_object)
    _deserialize_inner = staticmethod(keras.saving.deserialize_keras_object)
