"""tensorflow_dynemb: dynamic-embedding hash tables for TensorFlow recommender models.

A drop-in for TFRA's `dynamic_embedding` module::

    import tensorflow_dynemb as de

Importing the package loads the op library and changes nothing in TensorFlow or Keras.
"""

from tensorflow_dynemb import _ops
from tensorflow_dynemb.tables import (
    CuckooHashTable,
    HashTable,
    HkvEvictStrategy,
    HkvHashTable,
    HkvHashTableConfig,
)
from tensorflow_dynemb.variable import (
    CuckooHashTableCreator,
    HashTableCreator,
    HkvHashTableCreator,
    Variable,
    default_partition_fn,
    embedding_lookup,
    embedding_lookup_sparse,
    embedding_lookup_unique,
    get_variable,
    safe_embedding_lookup_sparse,
)
from tensorflow_dynemb.persistence import FileSystemSaver, FileSystemSaverConfig
from tensorflow_dynemb.training import DynamicEmbeddingOptimizer
from tensorflow_dynemb.policies import (
    FrequencyAdmitPolicy,
    FrequencyRestrictPolicy,
    RestrictPolicy,
    TimestampRestrictPolicy,
)
from tensorflow_dynemb import keras  # registers the layers and optimizer with Keras
from tensorflow_dynemb.serving import export_static_saved_model

__version__ = "0.1.0"

# Register the ops now, so that graphs and SavedModels using them load after
# `import tensorflow_dynemb` (raises one clear ImportError if the library is unusable).
_ops.load_op_library()

__all__ = [
    "CuckooHashTable",
    "CuckooHashTableCreator",
    "DynamicEmbeddingOptimizer",
    "FileSystemSaver",
    "FileSystemSaverConfig",
    "FrequencyAdmitPolicy",
    "FrequencyRestrictPolicy",
    "RestrictPolicy",
    "TimestampRestrictPolicy",
    "HashTableCreator",
    "HkvHashTableCreator",
    "Variable",
    "default_partition_fn",
    "get_variable",
    "export_static_saved_model",
    "HashTable",
    "HkvEvictStrategy",
    "HkvHashTable",
    "HkvHashTableConfig",
    "embedding_lookup",
    "embedding_lookup_sparse",
    "embedding_lookup_unique",
    "safe_embedding_lookup_sparse",
    "keras",
    "__version__",
]
