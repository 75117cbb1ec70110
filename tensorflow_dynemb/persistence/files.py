"""Streaming tables to and from files: one table's file, and generations.

A table saved on its own is one file (table file format 2, `cc/core/table_io.h`),
written aside, synced and renamed into place. A `de.Variable` (any set of tables)
saves a *generation*: every shard's file carries the save's id, and a manifest
written last (`<prefix>.dynemb-manifest`, `cc/core/generation.h`) names them with
their sizes, row counts and digests. The manifest's rename is the commit: a crash at
any moment leaves the previous generation or the new one, and the save that commits
deletes the files of the one it replaced and whatever killed saves left.

A load stages every table first (`DynembTableStageLoad`: every check, the rows
loaded into a table aside) and commits them only when every table staged without
error (`DynembTableCommitLoad`), so a failed load leaves every table as it was
(cc/kernels/file_kernels.h says what `in_place` changes).

TFRA's arguments are accepted where they keep their meaning (`buffer_size`,
`dirpath_env`, `file://` paths); `append_to_file=True` is refused: a file appended
to would mix two saves, which is what generations exist to prevent.
"""

from __future__ import annotations

import os
import re
from typing import Any, List, Optional, Sequence

import tensorflow as tf

from tensorflow_dynemb import _ops

MANIFEST_SUFFIX = ".dynemb-manifest"
DEFAULT_CHUNK_ROWS = 65536
# TFRA's name for the environment variable whose value overrides `dirpath`.
DEFAULT_DIRPATH_ENV = "TFRA_SAVED_KV"

# A generation's data file: `<stem>.<save id>.dynemb`.
_DATA_FILE = re.compile(r"\.[0-9a-f]{16}\.dynemb$")
# A version 1 shard file (the layout before generations).
_V1_SHARD_FILE = re.compile(r"-(\d{5})-of-(\d{5})\.dynemb$")


def chunk_rows_of(chunk_rows: Optional[int], buffer_size: Optional[int]) -> int:
    """Rows per chunk: `chunk_rows` (our name) or `buffer_size` (TFRA's: keys per
    read/write buffer); the default when neither is given."""
    for arg, value in (("chunk_rows", chunk_rows), ("buffer_size", buffer_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"`{arg}` must be an integer, got {value!r}.")
        if value is not None and value < 1:
            raise ValueError(f"`{arg}` must be >= 1, got {value}.")
    if chunk_rows is not None and buffer_size is not None and chunk_rows != buffer_size:
        raise ValueError(
            f"`chunk_rows` ({chunk_rows}) and `buffer_size` ({buffer_size}) are the same "
            "setting (rows per chunk): pass one of them."
        )
    value = chunk_rows if chunk_rows is not None else buffer_size
    return DEFAULT_CHUNK_ROWS if value is None else int(value)


def check_procs(proc_size: Any, proc_rank: Any) -> tuple:
    """`(proc_size, proc_rank)` checked (None, None: one process)."""
    if proc_size is None and proc_rank is None:
        return 1, 0
    for arg, value in (("proc_size", proc_size), ("proc_rank", proc_rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"`{arg}` must be an integer, got {value!r}.")
    if proc_size < 1 or not 0 <= proc_rank < proc_size:
        raise ValueError(
            f"`proc_rank` must be in [0, proc_size) and `proc_size` >= 1, got proc_rank "
            f"{proc_rank}, proc_size {proc_size}."
        )
    return proc_size, proc_rank


def resolve_dirpath(dirpath: Any, dirpath_env: Optional[str]) -> Any:
    """`dirpath`, or the value of the environment variable `dirpath_env` when it is set
    and not empty (TFRA's rule; read when the op is built, not each time it runs)."""
    if dirpath_env is not None and not isinstance(dirpath_env, str):
        raise TypeError(f"`dirpath_env` must be a string or None, got {dirpath_env!r}.")
    if dirpath_env:
        override = os.environ.get(dirpath_env)
        if override:
            return override
    if tf.is_tensor(dirpath):
        if hasattr(dirpath, "numpy"):
            return os.fsdecode(dirpath.numpy())
        if dirpath.dtype != tf.string:
            raise TypeError(f"`dirpath` must be a string tensor, got dtype {dirpath.dtype.name}.")
        return dirpath
    if not isinstance(dirpath, (str, bytes, os.PathLike)):
        raise TypeError(f"`dirpath` must be a path or a string tensor, got {dirpath!r}.")
    return os.fsdecode(dirpath)


def refuse_append(append_to_file: bool) -> None:
    if append_to_file:
        raise ValueError(
            "append_to_file=True is not supported: every save writes a new, whole "
            "generation of checksummed files, so that a load never mixes two saves. Save "
            "each part under its own file name (or directory) and load them together with "
            "load_entire_dir=True."
        )


def join(dirpath: Any, name: str):
    """`dirpath/name`, in the graph when `dirpath` is a symbolic tensor."""
    if tf.is_tensor(dirpath):
        return tf.strings.join([dirpath, name], separator="/")
    return tf.io.gfile.join(dirpath, name)


def python_dir(dirpath: Any, what: str) -> str:
    """`dirpath` as a Python string, for what must list a directory while building."""
    if tf.is_tensor(dirpath):
        raise ValueError(
            f"{what} lists `dirpath` while the op is built, so `dirpath` must be a Python "
            f"path (or an eager tensor), got the symbolic tensor {dirpath!r}."
        )
    return dirpath


def new_save_id() -> tf.Tensor:
    """A new save id (16 hex characters), different on every run of the op."""
    with tf.device("/CPU:0"):
        return _ops.ops.dynemb_new_save_id()


# -- saving --------------------------------------------------------------------------------


def save_table_file(
    table, dirpath: Any, file_name: str, chunk_rows: int, sync: bool = True
) -> tf.Tensor:
    """Saves `table` on its own as `dirpath/file_name`; returns the file's manifest
    entry (the op's output)."""
    save_id = new_save_id()
    with table._placement():
        return _ops.ops.dynemb_table_save_to_file(
            table.resource_handle, dirpath, file_name, save_id, chunk_rows=chunk_rows,
            sync=bool(sync),
        )


def save_generation(
    tables: Sequence[Any],
    dirpath: Any,
    prefix: str,
    *,
    dim: int,
    chunk_rows: int,
    routed: bool,
    stems: Optional[Sequence[str]] = None,
    save_id: Optional[tf.Tensor] = None,
    sync: bool = True,
) -> tf.Tensor:
    """Saves `tables` (shard i of n each) as one generation of `prefix` in `dirpath`.

    Args:
      tables: the shard tables, in shard order.
      dirpath: the directory (created if needed).
      prefix: names the manifest (`<prefix>.dynemb-manifest`) and, unless `stems` is
        given, the data files (`<prefix>-<i:05d>-of-<n:05d>.<save id>.dynemb`).
      dim: the tables' value size.
      chunk_rows: rows per chunk.
      routed: whether every key of shard i satisfies
        `default_partition_fn(key, n) == i` (the load then checks it).
      stems: per shard, the data file's name before `.<save id>.dynemb`.
      save_id: the save id (one op's output) to use; default a new one.
      sync: sync every file and the directory before and after the manifest's
        rename (a machine that stops cannot lose the save); False: through the page
        cache, unsynced (a killed process still leaves one whole generation).

    Returns:
      The committed save id: a string tensor that is ready once the manifest is in
      place.
    """
    n = len(tables)
    if stems is None:
        stems = [f"{prefix}-{i:05d}-of-{n:05d}" for i in range(n)]
    if save_id is None:
        save_id = new_save_id()
    entries = []
    for i, (table, stem) in enumerate(zip(tables, stems)):
        with table._placement():
            entries.append(
                _ops.ops.dynemb_table_save_to_file(
                    table.resource_handle,
                    dirpath,
                    stem,
                    save_id,
                    chunk_rows=chunk_rows,
                    shard_index=i,
                    num_shards=n,
                    routed=routed,
                    generation=True,
                    sync=bool(sync),
                )
            )
    with tf.device("/CPU:0"):
        return _ops.ops.dynemb_write_manifest(
            dirpath,
            prefix,
            save_id,
            tf.stack(entries),
            key_dtype=tables[0].key_dtype,
            value_dtype=tables[0].value_dtype,
            dim=dim,
            partitioner="default" if routed else "custom",
            sync=bool(sync),
        )


def check_stems(stems: Optional[Sequence[str]], num_shards: int, arg: str) -> Optional[List[str]]:
    """`file_name_list` checked: one plain file name per shard, all different."""
    if stems is None:
        return None
    if isinstance(stems, (str, bytes)) or len(stems) != num_shards:
        raise ValueError(f"`{arg}` must hold one file name per shard ({num_shards}), got {stems!r}.")
    stems = [os.fsdecode(s) for s in stems]
    if len(set(stems)) != num_shards or any(not s or "/" in s for s in stems):
        raise ValueError(f"`{arg}` must hold {num_shards} different file names without '/', got {stems!r}.")
    return stems


# -- loading -------------------------------------------------------------------------------


def load_tables(
    tables: Sequence[Any],
    *,
    manifest_paths: Any,
    filepaths: Any,
    files_are_fallback: bool,
    chunk_rows: int,
    partitioner: str,
    clear: bool,
    in_place: bool = False,
    expected_save_id: Any = "",
) -> List[Any]:
    """Loads into every table (shard i of len(tables)) all or nothing: stages each,
    checks that they all read the same saves, then commits each.

    Returns:
      The commit operations (empty when executing eagerly).
    """
    n = len(tables)
    manifest_paths = tf.reshape(tf.convert_to_tensor(manifest_paths, tf.string), [-1])
    filepaths = tf.reshape(tf.convert_to_tensor(filepaths, tf.string), [-1])
    staged, save_ids = [], []
    try:
        for i, table in enumerate(tables):
            with table._placement():
                handle, ids = _ops.ops.dynemb_table_stage_load(
                    table.resource_handle,
                    manifest_paths,
                    filepaths,
                    expected_save_id,
                    chunk_rows=chunk_rows,
                    num_shards=n,
                    shard_index=i,
                    partitioner=partitioner,
                    clear_first=bool(clear),
                    in_place=bool(in_place),
                    files_are_fallback=files_are_fallback,
                )
            staged.append(handle)
            save_ids.append(ids)
        checks = []
        if n > 1:
            message = (
                "the shards read different saves: a save replaced the files while they were "
                "loaded; load again"
            )
            with tf.device("/CPU:0"):
                joined = [tf.strings.reduce_join(ids, separator=",") for ids in save_ids]
                same = tf.reduce_all(tf.stack([tf.equal(j, joined[0]) for j in joined[1:]]))
                check = tf.debugging.Assert(same, [message, tf.stack(joined)])
            checks = [check] if check is not None else []
        commits = []
        with tf.control_dependencies(checks + save_ids):
            for table, handle in zip(tables, staged):
                with table._placement():
                    commits.append(_ops.ops.dynemb_table_commit_load(table.resource_handle, handle))
    except Exception:
        # Eagerly, the staged tables are freed with their handles: do not keep them
        # alive through the traceback.
        staged.clear()
        raise
    return [op for op in commits if op is not None]


def variable_paths(dirpath: Any, prefix: str):
    """`(manifest_paths, v1 filepaths)` of a variable's save of `prefix`: its
    manifest, and the version 1 shard files a load falls back to without one."""
    manifest = join(dirpath, prefix + MANIFEST_SUFFIX)
    if tf.is_tensor(dirpath):
        pattern = tf.strings.join([dirpath, f"{_glob_escape(prefix)}-*-of-*.dynemb"], separator="/")
        return [manifest], tf.io.matching_files(pattern)
    if tf.io.gfile.exists(manifest):
        return [manifest], []
    v1 = []
    if tf.io.gfile.isdir(dirpath):
        pattern = tf.io.gfile.join(dirpath, f"{_glob_escape(prefix)}-*-of-*.dynemb")
        v1 = sorted(p for p in tf.io.gfile.glob(pattern) if _V1_SHARD_FILE.search(p)
                    and os.path.basename(p)[: -len("-00000-of-00000.dynemb")] == prefix)
    if not v1:
        raise ValueError(
            f"no save of `{prefix}` in `dirpath` {dirpath!r}: no manifest "
            f"{prefix + MANIFEST_SUFFIX!r} and no version 1 files `{prefix}-*-of-*.dynemb`."
        )
    return [manifest], v1


def directory_saves(dirpath: str, stem: str):
    """`(manifest_paths, filepaths)`: every generation and every table file in
    `dirpath` whose name starts with `stem` (TFRA's `load_entire_dir`); a generation's
    data files are read through its manifest."""
    manifests, files = [], []
    if tf.io.gfile.isdir(dirpath):
        for name in sorted(tf.io.gfile.listdir(dirpath)):
            if not name.startswith(stem):
                continue
            if name.endswith(MANIFEST_SUFFIX):
                manifests.append(tf.io.gfile.join(dirpath, name))
            elif name.endswith(".dynemb") and not _DATA_FILE.search(name):
                files.append(tf.io.gfile.join(dirpath, name))
    if not manifests and not files:
        raise ValueError(
            f"load_entire_dir=True found no saves `{stem}*` in `dirpath` {dirpath!r}."
        )
    return manifests, files


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)
