"""The process-wide model mode of TFRA's API: training or inference.

In inference mode, lookups built from then on are read-only: embedding lookups of a
trainable `de.Variable` (and the Keras layers) read the tables directly instead of
through the trainable view, whose buffers every call overwrites (concurrent serving
calls would race on them), and no lookup refreshes a table's LRU scores. Nothing is
inserted in either mode: a missing key reads the initializer in both.

As in TFRA, the mode is read when a lookup is *built* (traced or added to a graph),
so set it before building the serving graph; a `tf.function` traced in one mode
keeps that behaviour. A leaf module: it imports nothing of the package.

Example:

>>> import tensorflow_dynemb as de
>>> de.enable_inference_mode()
>>> de.get_model_mode() == de.ModelMode.INFERENCE
True
>>> de.enable_train_mode()
>>> de.get_model_mode()
'train'
"""

from __future__ import annotations

__all__ = ["ModelMode", "enable_train_mode", "enable_inference_mode", "get_model_mode"]


class ModelMode:
    """The model modes: `TRAIN` (the default) and `INFERENCE`.

    `CURRENT_SETTING` holds the current one (TFRA's attribute); set it through
    `enable_train_mode()` / `enable_inference_mode()`.
    """

    TRAIN = "train"
    INFERENCE = "inference"

    CURRENT_SETTING = TRAIN


def get_model_mode() -> str:
    """The current mode: `ModelMode.TRAIN` ("train") or `ModelMode.INFERENCE`
    ("inference")."""
    return ModelMode.CURRENT_SETTING


def enable_train_mode() -> None:
    """Lookups built from now on may be trained (the default)."""
    ModelMode.CURRENT_SETTING = ModelMode.TRAIN


def enable_inference_mode() -> None:
    """Lookups built from now on are read-only (see the module docstring)."""
    ModelMode.CURRENT_SETTING = ModelMode.INFERENCE


def in_inference_mode() -> bool:
    """Whether lookups built now are read-only because of the model mode."""
    return ModelMode.CURRENT_SETTING == ModelMode.INFERENCE
