"""TFRA's Horovod variable of shadow ops (`HvdVariable`), which tensorflow_dynemb does
not provide: it routes lookups through Horovod's all-to-all. The name exists so that
code importing it loads; making one raises and says what to use instead."""

from __future__ import annotations

__all__ = ["HvdVariable"]


class HvdVariable:
    """Not provided: tensorflow_dynemb does not use Horovod (see `__init__`)."""

    def __init__(self, *args, **kwargs):
        """Raises NotImplementedError (whatever the arguments)."""
        del args, kwargs
        raise NotImplementedError(
            "de.shadow_ops.HvdVariable (Horovod all-to-all lookups) is not provided by "
            "tensorflow_dynemb. Under tf.distribute.MultiWorkerMirroredStrategy, a "
            "de.Variable made without `devices` (and de.keras.layers) exchanges ids and "
            "rows by all-to-all over TensorFlow's collectives; see docs/scaling.md for "
            "that and the other strategies."
        )
