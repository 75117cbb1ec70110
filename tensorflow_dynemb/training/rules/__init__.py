"""Row-wise sparse update rules that reproduce TensorFlow and Keras optimizers.

- base.py: the contract (`SparseRule`, `SlotSpec`, `FusedStep`) and hyperparameter helpers;
- keras.py: Keras 3 and tf_keras rules; legacy.py: tf_keras' legacy (OptimizerV2) rules;
  tf1.py: `tf.compat.v1.train` rules; kernels.py: TF training-kernel formulas they share;
- dispatch.py: `get_rule(optimizer)`.
"""

from tensorflow_dynemb.training.rules.base import FusedStep, SlotSpec, SparseRule
from tensorflow_dynemb.training.rules.dispatch import get_rule

__all__ = ["FusedStep", "SlotSpec", "SparseRule", "get_rule"]
