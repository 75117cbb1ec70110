"""Streaming a `de.Variable` to and from a directory, one file per shard.

Shard `i` of `n` writes `<prefix>-<i:05d>-of-<n:05d>.dynemb` (the table file format of
cc/core/table_io.h), so no shard is ever copied whole in memory. Loading into as many
shards as files maps file `i` to shard `i`; loading into another number of shards makes
every shard read every file and keep the keys `default_partition_fn` routes to it (the
filter runs inside the load op, while streaming).
"""

from __future__ import annotations

import os
import re
from typing import Any, List

import tensorflow as tf

from tensorflow_dynemb.variable.sharding import default_partition_fn

_SHARD_FILE = re.compile(r"-(\d{5})-of-(\d{5})\.dynemb$")


def shard_file_name(prefix: str, index: int, num_shards: int) -> str:
    return f"{prefix}-{index:05d}-of-{num_shards:05d}.dynemb"


def _shard_files(directory: str, prefix: str) -> List[str]:
    """The files a save of `prefix` wrote in `directory`, sorted by shard index."""
    if not tf.io.gfile.isdir(directory):
        return []
    pattern = tf.io.gfile.join(directory, f"{prefix}-*-of-*.dynemb")
    return sorted(p for p in tf.io.gfile.glob(pattern) if _SHARD_FILE.search(p))


def save(variable, dirpath: Any, prefix: str, chunk_rows: int) -> List[Any]:
    """One save op per shard; removes an earlier save of `prefix` with another number
    of shards first (when `dirpath` is a Python path), so a load reads one set."""
    n = variable.shard_num
    if not tf.is_tensor(dirpath):
        for stale in _shard_files(os.fsdecode(dirpath), prefix):
            if not stale.endswith(f"-of-{n:05d}.dynemb"):
                tf.io.gfile.remove(stale)
    return [
        table.save_to_file_system(dirpath, shard_file_name(prefix, i, n), chunk_rows)
        for i, table in enumerate(variable.tables)
    ]


def _saved_paths(dirpath: Any, prefix: str):
    """`(paths, number of saved shards)`; the number is None for a symbolic `dirpath`."""
    if tf.is_tensor(dirpath):
        pattern = tf.strings.join([dirpath, f"{prefix}-*-of-*.dynemb"], separator="/")
        return tf.io.matching_files(pattern), None
    directory = os.fsdecode(dirpath)
    paths = _shard_files(directory, prefix)
    if not paths:
        raise ValueError(f"no files `{prefix}-*-of-*.dynemb` in `dirpath` {directory!r}.")
    counts = {int(_SHARD_FILE.search(p).group(2)) for p in paths}
    if len(counts) != 1 or counts.pop() != len(paths):
        raise ValueError(
            f"`dirpath` {directory!r} holds an incomplete or mixed set of `{prefix}` shard "
            f"files: {[os.path.basename(p) for p in paths]}."
        )
    return paths, len(paths)


def load(variable, dirpath: Any, prefix: str, chunk_rows: int, clear: bool) -> List[Any]:
    """One load op per shard (see the module docstring for the routing)."""
    paths, saved_shards = _saved_paths(dirpath, prefix)
    n = variable.shard_num
    if saved_shards == n:
        return [
            table._load_files(paths[i], chunk_rows, clear)
            for i, table in enumerate(variable.tables)
        ]
    if variable.partition_fn is not default_partition_fn:
        raise ValueError(
            f"Loading files of {saved_shards or 'an unknown number of'} shards into {n} "
            "shards routes keys with de.default_partition_fn, but this variable uses "
            f"{variable.partition_fn!r}; save and load with the same number of shards, or "
            "restore through tf.train.Checkpoint."
        )
    return [
        table._load_files(paths, chunk_rows, clear, num_shards=n, shard_index=i)
        for i, table in enumerate(variable.tables)
    ]
