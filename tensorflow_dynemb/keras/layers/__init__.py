"""Keras layers over `de.Variable`s: TFRA's `de.keras.layers`.

- embedding.py: `Embedding` (alias `BasicEmbedding`), what every layer shares;
- reduced.py: `SquashedEmbedding`, `FieldWiseEmbedding`;
- coalesced.py: `CoalescedEmbedding` (several features in one table);
- layer_normalization.py: `LayerNormalization` (for dynamically shaped and ragged inputs).
"""

from tensorflow_dynemb.keras.layers.embedding import BasicEmbedding, Embedding
from tensorflow_dynemb.keras.layers.coalesced import CoalescedEmbedding
from tensorflow_dynemb.keras.layers.layer_normalization import LayerNormalization
from tensorflow_dynemb.keras.layers.reduced import FieldWiseEmbedding, SquashedEmbedding

__all__ = [
    "Embedding",
    "BasicEmbedding",
    "SquashedEmbedding",
    "FieldWiseEmbedding",
    "CoalescedEmbedding",
    "LayerNormalization",
]
