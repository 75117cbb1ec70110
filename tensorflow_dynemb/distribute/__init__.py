"""Strategy-specific routing: model-parallel variables under
`tf.distribute.MultiWorkerMirroredStrategy` (cluster.py, collectives.py,
model_parallel.py; see docs/scaling.md)."""

from tensorflow_dynemb.distribute.cluster import (
    DEFAULT_TIMEOUT_SECONDS,
    TIMEOUT_ENV,
    WorkerGroup,
    collective_timeout,
)

__all__ = ["DEFAULT_TIMEOUT_SECONDS", "TIMEOUT_ENV", "WorkerGroup", "collective_timeout"]
