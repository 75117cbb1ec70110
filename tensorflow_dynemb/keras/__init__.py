"""Keras support of tensorflow_dynemb: `de.keras.layers` (TFRA's `de.keras.layers`).

The layers are built on `tf.keras`: Keras 3, or tf_keras when `TF_USE_LEGACY_KERAS=1`.
Importing this package registers the layers (and the `de.DynamicEmbeddingOptimizer`
wrapper of that Keras) with Keras, so that `keras.models.load_model` rebuilds them
without `custom_objects`.
"""

from tensorflow_dynemb.keras import callbacks, layers

__all__ = ["callbacks", "layers"]
