"""The wrapper of TensorFlow's own legacy Keras optimizers (`de.DynamicEmbeddingOptimizer`,
see `optimizer.py`).

TensorFlow 2.16-2.21 still ship the OptimizerV2 optimizers of the Keras that lived inside
TensorFlow (`tensorflow.python.keras.optimizer_v2`: SGD, Adam, Adagrad, ...), outside the
public API; TFRA's users and tests train with them (`from tensorflow.python.keras import
optimizer_v2`). This wrapper is an OptimizerV2 of that Keras, composed like the tf_keras
wrapper: OptimizerV2's own `minimize` (gradients by a tape, then `apply_gradients`)
returns the train op in a TF1 graph, as the wrapped optimizer's would. Neither Keras 3
nor tf_keras compiles a model with these optimizers, so the class is not registered for
Keras serialization.

This module imports `tensorflow.python.keras`; `optimizer.py` imports it only for an
optimizer of that Keras, which is then imported already.
"""

from __future__ import annotations

from typing import Optional

from tensorflow.python.keras import optimizers as _legacy_optimizers
from tensorflow.python.keras.optimizer_v2 import optimizer_v2 as _optimizer_v2

from tensorflow_dynemb.training.applier import optimizer_name
from tensorflow_dynemb.training.keras_wrapper import KerasWrapperMixin

__all__ = ["TfLegacyKerasDynamicEmbeddingOptimizer"]

OptimizerV2 = _optimizer_v2.OptimizerV2


class TfLegacyKerasDynamicEmbeddingOptimizer(KerasWrapperMixin, OptimizerV2):
    """An OptimizerV2 of `tensorflow.python.keras` that also trains `de.Variable`s; made
    by `de.DynamicEmbeddingOptimizer(optimizer)` for such an optimizer."""

    def __init__(self, inner_optimizer, bp_v2: Optional[bool] = None, name: Optional[str] = None):
        super().__init__(name=name or f"DynamicEmbedding{optimizer_name(inner_optimizer)}")
        self._init_wrapper(inner_optimizer, bp_v2)
        # OptimizerV2 tracks nothing by attribute: checkpoints of the wrapper reach the
        # inner optimizer (its slots, iterations) and the embedding slots only this way.
        self._track_trackable(inner_optimizer, name="inner_optimizer")
        self._track_trackable(self._slot_store, name="dynamic_embedding_slots")

    def apply_gradients(self, grads_and_vars, name=None, experimental_aggregate_gradients=True):
        pairs = list(grads_and_vars)
        train_op = self._apply_pairs(
            pairs,
            lambda dense: self.inner_optimizer.apply_gradients(
                dense, name=name,
                experimental_aggregate_gradients=experimental_aggregate_gradients,
            ),
        )
        # In a TF1 graph, the step's op, which the session runs (as OptimizerV2 returns).
        return self.iterations if train_op is None else train_op

    def variables(self):
        """The wrapped optimizer's variables (the embedding slots are `de.Variable`s:
        `de.Variable.get_slot_variables`)."""
        return self.inner_optimizer.variables()

    @property
    def weights(self):
        return self.inner_optimizer.weights

    _serialize_inner = staticmethod(_legacy_optimizers.serialize)
    _deserialize_inner = staticmethod(_legacy_optimizers.deserialize)
