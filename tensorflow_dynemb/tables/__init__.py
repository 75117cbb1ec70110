"""Dynamic-embedding hash tables: `HashTable` (unbounded) and `HkvHashTable` (bounded).

- base.py: `_DynembTable`, the shared implementation (one generated op per method);
- content.py: export/import, files and checkpoint hooks of a table;
- evicting.py: `insert_and_evict` / `accum_and_evict`, the ops that return what they evicted;
- hash_table.py: `HashTable` (alias `CuckooHashTable`);
- hkv.py: `HkvHashTable`, `HkvHashTableConfig`, `HkvEvictStrategy`;
- redis.py: `RedisTable`, `RedisTableConfig`, `RedisTableCreator` (rows kept in Redis);
- xla.py: table ops refuse XLA compilation at trace time.
"""

from tensorflow_dynemb.tables.hash_table import CuckooHashTable, HashTable
from tensorflow_dynemb.tables.hkv import HkvEvictStrategy, HkvHashTable, HkvHashTableConfig
from tensorflow_dynemb.tables.redis import RedisTable, RedisTableConfig, RedisTableCreator

__all__ = [
    "HashTable",
    "CuckooHashTable",
    "HkvHashTable",
    "HkvHashTableConfig",
    "HkvEvictStrategy",
    "RedisTable",
    "RedisTableConfig",
    "RedisTableCreator",
]
