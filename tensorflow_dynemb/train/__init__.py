"""`de.train`: TFRA's `dynamic_embedding.train` namespace, and warm starts.

- checkpoint.py: `DECheckpoint` (alias `Checkpoint`), TFRA's name for `tf.train.Checkpoint`;
- horovod.py: `DEHvdSaver`, which is not provided (making one raises);
- warm_start.py: `warm_start`, `WarmStartHook` (exported as `de.warm_start` and
  `de.WarmStartHook`, where TFRA has them).
"""

from tensorflow_dynemb.train.checkpoint import Checkpoint, DECheckpoint
from tensorflow_dynemb.train.horovod import DEHvdSaver

__all__ = ["DECheckpoint", "Checkpoint", "DEHvdSaver"]
