"""`de.DynamicEmbeddingOptimizer`: trains `de.Variable`s and dense variables together.

The wrapper is built by composition: it holds the user's optimizer (`inner_optimizer`)
and splits every `apply_gradients` call in two:

- dense variables (and Keras variables) go to the inner optimizer unchanged;
- the trainable views of `de.Variable`s (`TrainableRows.variable`, see
  variable/trainable.py) are updated by `SparseApplier` (applier.py): their gradient
  rows are mapped back to keys and summed per key (duplicate ids in a batch and
  several lookups of one variable add up), then the rows of only those keys, and the
  matching rows of the optimizer slots, are updated by the explicit rule for the
  inner optimizer (rules/) and written back (`upsert`, or `accum` with `bp_v2`). For the common rules (Adam, AdamW,
  Adagrad, SGD with momentum; `SparseRule.fused`) one op per shard reads, updates and
  writes the slot rows in place and returns the new rows (`DynembTableApplyRule`, the
  same arithmetic bit for bit); otherwise the slot rows are looked up, updated by TF
  ops and upserted.

Slots (Adam's `m`/`v`, Adagrad's accumulator, ...) live side by side in the rows of one
companion `de.Variable` per trained variable (its slot state: the parameter's devices,
partitioner and table creator; `slots.py`), created once and tracked by the wrapper, so
checkpoints of the optimizer hold them; users see each slot as a `SlotView`.

Gradient clipping (`clipnorm`, `global_clipnorm`, `clipvalue` of the inner Keras
optimizer) is applied once over all gradients, dense and sparse (summed per key) alike,
before either part is applied; the inner optimizer's own clipping then finds nothing
left to clip. The step number of the sparse rules is the inner optimizer's `iterations`
(Keras) or the wrapper's own step counter (`tf.compat.v1.train`), read before this step
increments it.

Four wrapper classes share that machinery, one per optimizer family, each subclassing
its family's base class so that the frameworks accept it (`model.compile`,
`tf.compat.v1.train.MonitoredTrainingSession`, ...):
- `KerasDynamicEmbeddingOptimizer` for Keras 3 optimizers (`tf.keras` on TF >= 2.16;
  keras_optimizer.py);
- `TfKerasDynamicEmbeddingOptimizer` for `tf_keras` (Keras 2) optimizers
  (tf_keras_optimizer.py);
- `TfLegacyKerasDynamicEmbeddingOptimizer` for the OptimizerV2 optimizers of the Keras
  inside TensorFlow (`tensorflow.python.keras.optimizer_v2`; tf_legacy_keras_optimizer.py);
  the three share `KerasWrapperMixin` (keras_wrapper.py);
- `V1DynamicEmbeddingOptimizer` for `tf.compat.v1.train` optimizers (v1_optimizer.py).
This module only picks the class.
"""

from __future__ import annotations

import sys
from typing import Optional

import tensorflow as tf

from tensorflow_dynemb.training.applier import wrapped
from tensorflow_dynemb.training.v1_optimizer import V1DynamicEmbeddingOptimizer

__all__ = ["DynamicEmbeddingOptimizer"]


def DynamicEmbeddingOptimizer(optimizer, bp_v2: Optional[bool] = None):
    """Wraps `optimizer` so that it trains `de.Variable`s as well as dense variables.

    Args:
      optimizer: a Keras 3 optimizer (`tf.keras.optimizers.*` on TF >= 2.16), a
        `tf_keras` optimizer (current or `legacy`), an OptimizerV2 of TensorFlow's own
        legacy Keras (`tensorflow.python.keras.optimizer_v2`, as TFRA's tests use), or a
        `tf.compat.v1.train` optimizer. Supported: SGD (momentum, nesterov), Adam
        (amsgrad), AdamW, Adagrad, RMSprop, Adadelta, Adamax, Nadam, Ftrl; for
        `tf.compat.v1.train`: GradientDescent, Momentum, Adam, Adagrad, Adadelta,
        RMSProp, Ftrl, ProximalAdagrad, ProximalGradientDescent, AdagradDA. A wrapped
        optimizer is returned unchanged.
      bp_v2: write back by `accum` (adding this step's deltas) instead of `upsert`, for
        every variable (True / False); None (default) uses each variable's `bp_v2`.

    Returns:
      An optimizer of the same family (a subclass of its base class), usable with
      `minimize`, `apply_gradients` and Keras `compile`/`fit`. Its `inner_optimizer`
      is `optimizer`, which keeps training the dense variables.

    Raises:
      TypeError: `optimizer` is not an optimizer of a supported class.
    """
    if wrapped(optimizer) is not None:
        return optimizer
    if bp_v2 is not None and not isinstance(bp_v2, bool):
        raise TypeError(f"`bp_v2` must be None, True or False, got {bp_v2!r}.")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return V1DynamicEmbeddingOptimizer(optimizer, bp_v2=bp_v2)
    keras3 = _keras3_optimizer_class()
    if keras3 is not None and isinstance(optimizer, keras3):
        return _keras3_wrapper_class()(optimizer, bp_v2=bp_v2)
    tf_keras_bases = _tf_keras_optimizer_classes()
    if tf_keras_bases and isinstance(optimizer, tf_keras_bases):
        from tensorflow_dynemb.training.tf_keras_optimizer import TfKerasDynamicEmbeddingOptimizer

        return TfKerasDynamicEmbeddingOptimizer(optimizer, bp_v2=bp_v2)
    tf_legacy_keras_base = _tf_legacy_keras_optimizer_class()
    if tf_legacy_keras_base is not None and isinstance(optimizer, tf_legacy_keras_base):
        from tensorflow_dynemb.training.tf_legacy_keras_optimizer import (
            TfLegacyKerasDynamicEmbeddingOptimizer,
        )

        return TfLegacyKerasDynamicEmbeddingOptimizer(optimizer, bp_v2=bp_v2)
    raise TypeError(
        "`optimizer` must be a Keras 3 optimizer, a tf_keras optimizer, an optimizer of "
        "tensorflow.python.keras.optimizer_v2 or a tf.compat.v1.train optimizer, got "
        f"{type(optimizer).__module__}.{type(optimizer).__name__}."
    )


def _keras3_optimizer_class():
    try:
        import keras
    except ImportError:  # pragma: no cover - TF >= 2.16 depends on keras 3
        return None
    if not keras.__version__.startswith("3."):
        return None
    return keras.optimizers.Optimizer


def _tf_keras_optimizer_classes() -> tuple:
    try:
        import tf_keras
    except ImportError:
        return ()
    return (tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer)


def _tf_legacy_keras_optimizer_class():
    """OptimizerV2 of the Keras inside TensorFlow, if imported (else its instances can't
    exist); not imported here, as it is no public API."""
    module = sys.modules.get("tensorflow.python.keras.optimizer_v2.optimizer_v2")
    return None if module is None else module.OptimizerV2


_KERAS3_WRAPPER = None


def _keras3_wrapper_class():
    global _KERAS3_WRAPPER
    if _KERAS3_WRAPPER is None:
        from tensorflow_dynemb.training.keras_optimizer import KerasDynamicEmbeddingOptimizer

        _KERAS3_WRAPPER = KerasDynamicEmbeddingOptimizer
    return _KERAS3_WRAPPER
