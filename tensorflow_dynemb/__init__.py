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
    RedisTable,
    RedisTableConfig,
    RedisTableCreator,
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
    feature_keys,
    get_variable,
    safe_embedding_lookup_sparse,
    split_feature_keys,
)
from tensorflow_dynemb.persistence import FileSystemSaver, FileSystemSaverConfig
from tensorflow_dynemb.training import DynamicEmbeddingOptimizer
from tensorflow_dynemb.model_mode import (
    ModelMode,
    enable_inference_mode,
    enable_train_mode,
    get_model_mode,
)
from tensorflow_dynemb.policies import (
    FrequencyAdmitPolicy,
    FrequencyRestrictPolicy,
    RestrictPolicy,
    TimestampRestrictPolicy,
)
from tensorflow_dynemb import keras  # registers the layers and optimizer with Keras
from tensorflow_dynemb import distribute  # multi-worker settings (docs/scaling.md)
from tensorflow_dynemb import serving
from tensorflow_dynemb.serving import DeltaExporter, export_static_saved_model
# TFRA's namespaces and remaining names (de.math, de.data_flow, de.shadow_ops, de.train).
from tensorflow_dynemb import data_flow, math, ragged_embedding_ops, shadow_ops, train
from tensorflow_dynemb.shadow_ops import DEResourceVariable, trainable_wrapper_filter
from tensorflow_dynemb.train.warm_start import WarmStartHook, warm_start
from tensorflow_dynemb.variable.graph_keys import GraphKeys

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
    "DeltaExporter",
    "serving",
    "HashTable",
    "HkvEvictStrategy",
    "HkvHashTable",
    "HkvHashTableConfig",
    "RedisTable",
    "RedisTableConfig",
    "RedisTableCreator",
    "embedding_lookup",
    "embedding_lookup_sparse",
    "embedding_lookup_unique",
    "safe_embedding_lookup_sparse",
    "feature_keys",
    "split_feature_keys",
    "keras",
    "distribute",
    "ModelMode",
    "enable_inference_mode",
    "enable_train_mode",
    "get_model_mode",
    "math",
    "data_flow",
    "shadow_ops",
    "ragged_embedding_ops",
    "train",
    "DEResourceVariable",
    "GraphKeys",
    "trainable_wrapper_filter",
    "warm_start",
    "WarmStartHook",
    "__version__",
]
