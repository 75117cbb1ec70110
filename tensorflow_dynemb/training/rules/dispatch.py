"""`get_rule`: the `SparseRule` of an optimizer, told apart by `isinstance`."""

from __future__ import annotations

import sys

import tensorflow as tf

from tensorflow_dynemb.training.rules.base import (
    SparseRule,
)
from tensorflow_dynemb.training.rules.keras import (
    _KerasAdadelta,
    _KerasAdagrad,
    _KerasAdam,
    _KerasAdamax,
    _KerasFtrl,
    _KerasNadam,
    _KerasRMSprop,
    _KerasSGD,
)
from tensorflow_dynemb.training.rules.legacy import (
    _LegacyAdadelta,
    _LegacyAdagrad,
    _LegacyAdam,
    _LegacyAdamax,
    _LegacyFtrl,
    _LegacyNadam,
    _LegacyRMSprop,
    _LegacySGD,
)
from tensorflow_dynemb.training.rules.tf1 import (
    _TF1Adadelta,
    _TF1Adagrad,
    _TF1AdagradDA,
    _TF1Adam,
    _TF1Ftrl,
    _TF1GradientDescent,
    _TF1Momentum,
    _TF1ProximalAdagrad,
    _TF1ProximalGradientDescent,
    _TF1RMSProp,
)


_KERAS_RULES = (
    # Most specific first: Keras 3 AdamW subclasses Adam.
    ("AdamW", _KerasAdam),
    ("Adam", _KerasAdam),
    ("SGD", _KerasSGD),
    ("Adagrad", _KerasAdagrad),
    ("RMSprop", _KerasRMSprop),
    ("Adadelta", _KerasAdadelta),
    ("Adamax", _KerasAdamax),
    ("Nadam", _KerasNadam),
    ("Ftrl", _KerasFtrl),
)

_LEGACY_RULES = (
    ("SGD", _LegacySGD),
    ("Adam", _LegacyAdam),
    ("Adagrad", _LegacyAdagrad),
    ("RMSprop", _LegacyRMSprop),
    ("Adadelta", _LegacyAdadelta),
    ("Adamax", _LegacyAdamax),
    ("Nadam", _LegacyNadam),
    ("Ftrl", _LegacyFtrl),
)

_TF1_RULES = (
    ("GradientDescentOptimizer", _TF1GradientDescent),
    ("MomentumOptimizer", _TF1Momentum),
    ("AdamOptimizer", _TF1Adam),
    ("AdagradOptimizer", _TF1Adagrad),
    ("AdadeltaOptimizer", _TF1Adadelta),
    ("RMSPropOptimizer", _TF1RMSProp),
    ("FtrlOptimizer", _TF1Ftrl),
    ("ProximalAdagradOptimizer", _TF1ProximalAdagrad),
    ("ProximalGradientDescentOptimizer", _TF1ProximalGradientDescent),
    ("AdagradDAOptimizer", _TF1AdagradDA),
)


def _keras3_optimizers():
    """Keras 3's optimizers module, if Keras 3 is imported (else its instances can't exist)."""
    keras = sys.modules.get("keras")
    if keras is None or not str(getattr(keras, "__version__", "")).startswith("3"):
        return None
    return keras.optimizers


def _tf_keras_optimizers():
    """tf_keras's optimizers module, if tf_keras is imported (else its instances can't exist)."""
    tf_keras = sys.modules.get("tf_keras")
    return None if tf_keras is None else tf_keras.optimizers


def _legacy_classes(optimizers):
    classes = [(getattr(optimizers.legacy, name), rule) for name, rule in _LEGACY_RULES]
    legacy_adam = sys.modules.get("tf_keras.src.optimizers.legacy.adam")
    non_fused = getattr(legacy_adam, "NonFusedAdam", None)
    if non_fused is not None:
        classes.append((non_fused, _LegacyAdam))
    return classes


# The OptimizerV2 optimizers of the Keras inside TensorFlow (tensorflow.python.keras,
# TFRA's tests use them): tf_keras' legacy optimizers are their copy, with the same
# formulas and attributes, so the legacy rules serve both. (module, class) pairs.
_TF_LEGACY_KERAS_RULES = (
    ("gradient_descent", "SGD", _LegacySGD),
    ("adam", "Adam", _LegacyAdam),
    ("adam", "NonFusedAdam", _LegacyAdam),
    ("adagrad", "Adagrad", _LegacyAdagrad),
    ("rmsprop", "RMSprop", _LegacyRMSprop),
    ("adadelta", "Adadelta", _LegacyAdadelta),
    ("adamax", "Adamax", _LegacyAdamax),
    ("nadam", "Nadam", _LegacyNadam),
    ("ftrl", "Ftrl", _LegacyFtrl),
)
_TF_LEGACY_KERAS = "tensorflow.python.keras.optimizer_v2"


def _tf_legacy_keras_classes():
    """(class, rule) of tensorflow.python.keras' optimizers whose modules are imported
    (else their instances can't exist)."""
    classes = []
    for module_name, class_name, rule in _TF_LEGACY_KERAS_RULES:
        module = sys.modules.get(f"{_TF_LEGACY_KERAS}.{module_name}")
        cls = getattr(module, class_name, None)
        if cls is not None:
            classes.append((cls, rule))
    return classes


def _check_keras_options(optimizer):
    if getattr(optimizer, "use_ema", False):
        raise ValueError(
            f"{type(optimizer).__name__}(use_ema=True) is not supported by dynamic-embedding "
            "sparse updates yet: create the optimizer without `use_ema`."
        )


def _supported_names():
    return (
        [f"keras.optimizers.{name}" for name, _ in _KERAS_RULES]
        + [f"tf_keras.optimizers.{name}" for name, _ in _KERAS_RULES]
        + [f"tf_keras.optimizers.legacy.{name}" for name, _ in _LEGACY_RULES]
        + [f"{_TF_LEGACY_KERAS}.{module}.{name}" for module, name, _ in _TF_LEGACY_KERAS_RULES]
        + [f"tf.compat.v1.train.{name}" for name, _ in _TF1_RULES]
    )


def get_rule(optimizer) -> SparseRule:
    """The `SparseRule` reproducing `optimizer`'s update on rows.

    Raises:
      TypeError: the optimizer's class is not supported (the message lists those that are).
      ValueError: the optimizer uses an option rules cannot reproduce
        (`use_ema`, `gradient_accumulation_steps`).
    """
    keras_optimizers = _keras3_optimizers()
    if keras_optimizers is not None:
        for name, rule in _KERAS_RULES:
            if isinstance(optimizer, getattr(keras_optimizers, name)):
                _check_keras_options(optimizer)
                return rule(optimizer)

    tf_keras_optimizers = _tf_keras_optimizers()
    if tf_keras_optimizers is not None:
        for name, rule in _KERAS_RULES:
            if isinstance(optimizer, getattr(tf_keras_optimizers, name)):
                _check_keras_options(optimizer)
                return rule(optimizer, tf_keras=True)
        for cls, rule in _legacy_classes(tf_keras_optimizers):
            if isinstance(optimizer, cls):
                return rule(optimizer)

    for cls, rule in _tf_legacy_keras_classes():
        if isinstance(optimizer, cls):
            return rule(optimizer)

    for name, rule in _TF1_RULES:
        if isinstance(optimizer, getattr(tf.compat.v1.train, name)):
            return rule(optimizer)

    cls = type(optimizer)
    raise TypeError(
        f"Dynamic-embedding sparse updates do not support the optimizer "
        f"{cls.__module__}.{cls.__qualname__}. Supported: {', '.join(_supported_names())}."
    )
