"""`de.shadow_ops`: TFRA's `dynamic_embedding.shadow_ops` namespace.

- shadow_variable.py: `ShadowVariable` (a trainable variable standing for the rows of a
  `de.Variable` that a model holds), `DEResourceVariable`, `trainable_wrapper_filter`;
- lookup.py: `embedding_lookup`, `embedding_lookup_unique`, `embedding_lookup_unique_base`;
- horovod.py: `HvdVariable`, which is not provided (making one raises).
"""

from tensorflow_dynemb.shadow_ops.horovod import HvdVariable
from tensorflow_dynemb.shadow_ops.lookup import (
    embedding_lookup,
    embedding_lookup_unique,
    embedding_lookup_unique_base,
)
from tensorflow_dynemb.shadow_ops.shadow_variable import (
    DEResourceVariable,
    ShadowVariable,
    trainable_wrapper_filter,
)

__all__ = [
    "ShadowVariable",
    "DEResourceVariable",
    "embedding_lookup",
    "embedding_lookup_unique",
    "embedding_lookup_unique_base",
    "trainable_wrapper_filter",
    "HvdVariable",
]
