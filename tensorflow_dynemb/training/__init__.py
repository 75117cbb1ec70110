"""Training `de.Variable`s: `DynamicEmbeddingOptimizer` and what it is made of.

- optimizer.py: `DynamicEmbeddingOptimizer` (picks the wrapper class of an optimizer
  family); keras_optimizer.py, tf_keras_optimizer.py (sharing keras_wrapper.py) and
  v1_optimizer.py: the wrappers;
- applier.py: the `de.Variable` half of a step (`SparseApplier`);
- rules/: the optimizers' update rules on rows; slots.py: optimizer slots.
"""

from tensorflow_dynemb.training.optimizer import DynamicEmbeddingOptimizer

__all__ = ["DynamicEmbeddingOptimizer"]
