"""TFRA's Horovod checkpoint saver (`DEHvdSaver`), which tensorflow_dynemb does not
provide. The name exists so that code importing it loads; making one raises and says
what to use instead."""

from __future__ import annotations

__all__ = ["DEHvdSaver"]


class DEHvdSaver:
    """Not provided: tensorflow_dynemb does not use Horovod (see `__init__`)."""

    def __init__(self, *args, **kwargs):
        """Raises NotImplementedError (whatever the arguments)."""
        del args, kwargs
        raise NotImplementedError(
            "de.train.DEHvdSaver (a tf.compat.v1.train.Saver that splits table files "
            "between Horovod ranks) is not provided by tensorflow_dynemb, which does not "
            "use Horovod. tf.compat.v1.train.Saver and tf.train.Checkpoint save "
            "de.Variables as they are, and restore them into any number of shards; under "
            "MultiWorkerMirroredStrategy tf.train.Checkpoint saves every worker's slice "
            "(docs/scaling.md)."
        )
