"""`de.Variable` and what it is made of.

- variable.py: `Variable` (creation, properties, size / clear / stats); routing.py,
  content.py and training_state.py: its per-key methods (with the key routing),
  whole-content and training parts; get_variable.py;
- sharding.py: `default_partition_fn`, table creators, shard devices;
- initializers.py: what missing keys read;
- lookup.py, sparse_lookup.py: `embedding_lookup*` over a `Variable`;
- trainable.py: the trainable views a training lookup reads through;
- step_ops.py: the training step's id deduplication and per-id gradient sums;
- coalesce.py: `feature_keys` / `split_feature_keys`: several features in one table;
- tf_dispatch.py: `tf.nn.embedding_lookup*` called with a `Variable` run the
  package's lookups (TF's type-based dispatch; registered on import).
"""

from tensorflow_dynemb.variable.coalesce import feature_keys, split_feature_keys
from tensorflow_dynemb.variable.get_variable import get_variable
from tensorflow_dynemb.variable.lookup import embedding_lookup, embedding_lookup_unique
from tensorflow_dynemb.variable.sharding import (
    CuckooHashTableCreator,
    HashTableCreator,
    HkvHashTableCreator,
    default_partition_fn,
)
from tensorflow_dynemb.variable.sparse_lookup import (
    embedding_lookup_sparse,
    safe_embedding_lookup_sparse,
)
from tensorflow_dynemb.variable.variable import Variable
from tensorflow_dynemb.variable import tf_dispatch  # noqa: F401 (registers the dispatch)

__all__ = [
    "Variable",
    "get_variable",
    "default_partition_fn",
    "HashTableCreator",
    "CuckooHashTableCreator",
    "HkvHashTableCreator",
    "embedding_lookup",
    "embedding_lookup_unique",
    "embedding_lookup_sparse",
    "safe_embedding_lookup_sparse",
    "feature_keys",
    "split_feature_keys",
]
