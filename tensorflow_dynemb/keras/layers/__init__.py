"""Keras layers over `de.Variable`s: TFRA's `de.keras.layers`.

- embedding.py: `Embedding` (alias `BasicEmbedding`), what every layer shares;
- reduced.py: `SquashedEmbedding`, `FieldWiseEmbedding`;
- coalesced.py: `CoalescedEmbedding` (several features in one table).
"""

from tensorflow_dynemb.keras.layers.embedding import BasicEmbedding, Embedding
from tensorflow_dynemb.keras.layers.coalesced import CoalescedEmbedding
from tensorflow_dynemb.keras.layers.reduced import FieldWiseEmbedding, SquashedEmbedding

__all__ = [
    "Embedding",
    "BasicEmbedding",
    "SquashedEmbedding",
    "FieldWiseEmbedding",
    "CoalescedEmbedding",
]
