"""Streaming a `de.Variable` to and from a directory: one generation per save.

A save writes shard `i` of `n` to `<prefix>-<i:05d>-of-<n:05d>.<save id>.dynemb` (or
`<file_name_list[i]>.<save id>.dynemb`) and commits them with the manifest
`<prefix>.dynemb-manifest` (persistence/files.py, cc/core/generation.h), so no shard
is ever copied whole in memory and a load sees one whole save or the one before it.
With `proc_size` > 1 (one variable per process, as with Horovod), the prefix is
`<prefix>_rank<proc_rank>_size<proc_size>`: each process saves and loads its own
generation, and `load_entire_dir=True` loads every process's.

A load reads the manifest and loads each shard aside, all or nothing. Into as many
shards, file `i` goes to shard `i` (each key checked to belong there, under
`default_partition_fn`); into another number of shards, every shard reads every
file and keeps the keys `default_partition_fn` routes to it (the filter runs inside
the load op, while streaming), which needs the default partitioner on both sides.
Directories saved before generations (version 1 files `<prefix>-<i>-of-<n>.dynemb`,
no manifest) load the same way.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import tensorflow as tf

from tensorflow_dynemb.persistence import files
from tensorflow_dynemb.variable.sharding import default_partition_fn


def prefix_of(variable, file_name: Optional[str], proc_size: int, proc_rank: int) -> str:
    """The generation prefix: `file_name` or the variable's name, plus the process's
    rank and count when there are several processes."""
    if file_name is not None and (not isinstance(file_name, str) or not file_name or "/" in file_name):
        raise ValueError(f"`file_name` must be a file name prefix without '/', got {file_name!r}.")
    prefix = file_name or variable.name.replace("/", "_")
    if proc_size > 1:
        prefix += f"_rank{proc_rank}_size{proc_size}"
    return prefix


def routes_by_default(variable) -> bool:
    """Whether every key of shard i satisfies default_partition_fn(key, n) == i."""
    return variable.shard_num == 1 or variable.partition_fn is default_partition_fn


def save(
    variable,
    dirpath: Any,
    prefix: str,
    chunk_rows: int,
    stems: Optional[Sequence[str]] = None,
    save_id: Optional[tf.Tensor] = None,
    sync: bool = True,
) -> tf.Tensor:
    """Saves the variable as one generation of `prefix`; returns the committed save id."""
    stems = files.check_stems(stems, variable.shard_num, "file_name_list")
    return files.save_generation(
        variable.tables,
        dirpath,
        prefix,
        dim=variable.dim,
        chunk_rows=chunk_rows,
        routed=routes_by_default(variable),
        stems=stems,
        save_id=save_id,
        sync=sync,
    )


def load(
    variable,
    dirpath: Any,
    prefix: str,
    chunk_rows: int,
    clear: bool,
    in_place: bool = False,
    load_entire_dir: bool = False,
    expected_save_id: Any = "",
) -> List[Any]:
    """Loads the generation of `prefix` (with `load_entire_dir`, every generation whose
    prefix starts with `prefix`, and the table files saved on their own there)."""
    if load_entire_dir:
        directory = files.python_dir(dirpath, "load_entire_dir=True")
        manifests, paths = files.directory_saves(directory, prefix)
        fallback = False
    else:
        manifests, paths = files.variable_paths(dirpath, prefix)
        fallback = True
    return files.load_tables(
        variable.tables,
        manifest_paths=manifests,
        filepaths=paths,
        files_are_fallback=fallback,
        chunk_rows=chunk_rows,
        partitioner="default" if routes_by_default(variable) else "custom",
        clear=clear,
        in_place=in_place,
        expected_save_id=expected_save_id,
    )
