"""Dynamic-embedding hash tables: `HashTable` (unbounded) and `HkvHashTable` (bounded).

- base.py: `_DynembTable`, the shared implementation (one generated op per method);
- content.py: export/import, files and checkpoint hooks of a table;
- hash_table.py: `HashTable` (alias `CuckooHashTable`);
- hkv.py: `HkvHashTable`, `HkvHashTableConfig`, `HkvEvictStrategy`.
"""

from tensorflow_dynemb.tables.hash_table import CuckooHashTable, HashTable
from tensorflow_dynemb.tables.hkv import HkvEvictStrategy, HkvHashTable, HkvHashTableConfig

__all__ = [
    "HashTable",
    "CuckooHashTable",
    "HkvHashTable",
    "HkvHashTableConfig",
    "HkvEvictStrategy",
]
