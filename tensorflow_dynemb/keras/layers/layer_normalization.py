"""`de.keras.layers.LayerNormalization`: Keras' layer normalization that also takes
inputs whose sizes are known only when it runs, and ragged inputs (TFRA's
`dynamic_layer_normalization.LayerNormalization`).

The layer is Keras' own (`tf.keras.layers.LayerNormalization`: Keras 3, or tf_keras),
with its arguments, weights, config and saving; only `call` is replaced. It normalizes
with shapes taken from the tensor at run time, so an input of shape `[batch, None, d]`
(sequences of any length) works in every Keras, and a `tf.RaggedTensor` is normalized
through its flat values, whose rows are the ragged tensor's rows: padding it to a dense
tensor would put zeros into the moments. That requires every normalized axis to be a
uniform (inner) axis of the ragged tensor, such as the last one.
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

from tensorflow_dynemb.keras._compat import keras_module
from tensorflow_dynemb.keras.layers.embedding import _register

__all__ = ["LayerNormalization"]


@_register
class LayerNormalization(keras_module.layers.LayerNormalization):
    """`tf.keras.layers.LayerNormalization` for dynamically shaped and ragged inputs.

    Same arguments as Keras' layer (`axis=-1`, `epsilon=1e-3`, `center`, `scale`, ...):
    each example is normalized to mean 0 and variance 1 over `axis`, then scaled by
    `gamma` and shifted by `beta`. See the module docstring for what differs.

    Example:

    >>> import numpy as np
    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> layer = de.keras.layers.LayerNormalization()
    >>> x = tf.ragged.constant([[[1.0, 3.0]], [[2.0, 2.0], [0.0, 4.0]]], ragged_rank=1)
    >>> np.round(layer(x).flat_values.numpy(), 2).tolist()
    [[-1.0, 1.0], [0.0, 0.0], [-1.0, 1.0]]
    """

    def build(self, input_shape):
        # Keras sizes gamma and beta by the normalized axes: say which axis has no size
        # (a ragged or dynamic one) instead of failing to create them.
        shape = tf.TensorShape(input_shape)
        for axis in self._axes(shape.rank):
            if shape[axis] is None:
                raise ValueError(
                    f"{self.name}: every normalized axis needs a known size, but axis "
                    f"{axis} of the input shape {shape} has none (a ragged or dynamic axis "
                    f"cannot be normalized over); got axis={self.axis}."
                )
        super().build(input_shape)

    def call(self, inputs):
        if isinstance(inputs, tf.RaggedTensor):
            return self._normalize_ragged(inputs)
        inputs = tf.convert_to_tensor(inputs)
        return self._normalize(inputs, self._axes(inputs.shape.rank))

    def _axes(self, rank: Optional[int]) -> List[int]:
        """The normalized axes, non-negative and sorted, for an input of `rank`."""
        if rank is None:
            raise ValueError(f"{self.name}: the input's rank must be known, got an unknown rank.")
        axes = self.axis if isinstance(self.axis, (list, tuple)) else [self.axis]
        return sorted(int(a) % rank for a in axes)

    def _normalize_ragged(self, inputs: tf.RaggedTensor) -> tf.RaggedTensor:
        axes = self._axes(inputs.shape.rank)
        if any(a <= inputs.ragged_rank for a in axes):
            raise ValueError(
                f"{self.name}: a RaggedTensor is normalized over its uniform inner axes "
                f"only (> ragged_rank {inputs.ragged_rank}); got axis {self.axis} for an "
                f"input of shape {inputs.shape}."
            )
        flat = inputs.flat_values
        return inputs.with_flat_values(
            self._normalize(flat, [a - inputs.ragged_rank for a in axes])
        )

    def _normalize(self, x: tf.Tensor, axes: List[int]) -> tf.Tensor:
        """`x` normalized over `axes`, scaled and shifted; computed in at least float32
        (as Keras does, for half-precision inputs)."""
        compute = tf.float32 if x.dtype in (tf.float16, tf.bfloat16) else x.dtype
        x = tf.cast(x, compute)
        rank = x.shape.rank
        if getattr(self, "rms_scaling", False):  # Keras 3's option (its formula)
            variance = tf.math.reduce_variance(x, axis=axes, keepdims=True)
            outputs = x * tf.math.rsqrt(variance + self.epsilon)
        else:
            mean, variance = tf.nn.moments(x, axes, keepdims=True)
            outputs = (x - mean) * tf.math.rsqrt(variance + self.epsilon)
        if self.gamma is not None:
            outputs = outputs * self._broadcast(self.gamma, axes, rank, compute)
        if self.beta is not None:
            outputs = outputs + self._broadcast(self.beta, axes, rank, compute)
        return tf.cast(outputs, self.compute_dtype)

    @staticmethod
    def _broadcast(weight, axes: List[int], rank: int, dtype) -> tf.Tensor:
        """`weight` (shaped like the normalized axes, in order) reshaped to broadcast
        against a tensor of `rank`."""
        shape = [1] * rank
        for i, axis in enumerate(axes):
            shape[axis] = weight.shape[i]
        return tf.reshape(tf.cast(weight, dtype), shape)
