"""`de.DeltaExporter`: incremental exports of a training model for online serving.

Each `write()` is one generation of a delta directory (`cc/core/delta.h`): the first
is a base (every table whole), the next ones deltas that hold only the rows each
table wrote since the previous write, plus the keys it removed or evicted since
(tombstones), and the model's dense variables. Tables say what changed themselves
(`cc/core/table.h`, "Change tracking"): the exporter keeps one mark per shard table,
a value it owns, so several exporters (or an exporter and a checkpoint) never take
changes from each other.

Where the sequence stands is the directory: the newest base and the last sequence
written after it (`DynembDeltaState`). A restarted trainer's exporter continues that
sequence: its tables are new tables (restored from a checkpoint, perhaps into another
number of shards), whose changes since the last write cannot be known, so its first
write replaces every table's content (a delta of full tables, in the same base and
numbering); the writes after it are proportional to what changed again. A model whose
tables or dense variables differ from the directory's (names, dtypes, dims, shapes)
starts a new base. docs/online_learning.md has the whole story.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb.persistence import files
from tensorflow_dynemb.serving import delta_items


class DeltaExporter:
    """Writes a model's tables and dense variables to `directory` as a base, then as
    deltas of what changed (docs/online_learning.md).

    Args:
      obj: a `de.Variable`, a table, a Keras model or a `tf.Module` holding them.
      directory: where the generations go (a local path or any `tf.io.gfile` file
        system); one exporter writes to a directory at a time.
      include_slots: also export the optimizer slot tables of every `de.Variable`
        (their dense slots are never exported); default: only what serving reads.
      rebase_every: after this many deltas, the next write is a new base (and the
        older base's files go): a new server then reads one base and at most this
        many deltas. None: only when asked (`write(rebase=True)`).
      chunk_rows: rows per chunk when reading tables (memory stays O(chunk_rows)).
      sync: sync every file and the directory before the manifest's rename and after
        it (a machine that stops cannot lose a write); False: through the page cache
        (a killed process still leaves whole generations).

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> emb = de.Variable(tf.int64, tf.float32, dim=2, name="emb")
    >>> exporter = de.DeltaExporter(emb, "/tmp/dynemb_doc_deltas")
    >>> emb.upsert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    >>> exporter.write()  # the base
    0
    >>> emb.upsert([2], [[3.0, 3.0]])
    >>> exporter.write()  # a delta: the row of key 2
    1
    """

    def __init__(
        self,
        obj: Any,
        directory: Any,
        *,
        include_slots: bool = False,
        rebase_every: Optional[int] = None,
        chunk_rows: int = files.DEFAULT_CHUNK_ROWS,
        sync: bool = True,
    ):
        if not isinstance(directory, (str, bytes, os.PathLike)):
            raise TypeError(f"`directory` must be a path, got {directory!r}.")
        if rebase_every is not None and (
            isinstance(rebase_every, bool) or not isinstance(rebase_every, int) or rebase_every < 1
        ):
            raise ValueError(f"`rebase_every` must be None or an integer >= 1, got {rebase_every!r}.")
        self._directory = os.fsdecode(directory)
        self._chunk_rows = files.chunk_rows_of(chunk_rows, None)
        self._sync = bool(sync)
        self._rebase_every = rebase_every
        self._tables, self._dense = delta_items.collect(obj, include_slots=include_slots)
        # One mark per shard table, once written (None: the next write replaces it).
        self._marks: List[List[Optional[np.ndarray]]] = [[None] * len(t.tables) for t in self._tables]
        with tf.device("/CPU:0"):
            base_id, serial, sequence, _, lines = _ops.ops.dynemb_delta_state(self._directory)
        self._base_id = base_id.numpy().decode()
        self._serial = int(serial)
        self._sequence = int(sequence)
        ours = sorted([t.signature() for t in self._tables] + [d.signature() for d in self._dense])
        theirs = sorted(_signature(line.decode()) for line in lines.numpy())
        # Another model's directory (or none): the next write is a new base.
        self._needs_base = self._sequence < 0 or ours != theirs

    @property
    def directory(self) -> str:
        return self._directory

    @property
    def base_id(self) -> str:
        """The id of the base the directory's deltas apply to ("" when it has none)."""
        return self._base_id

    @property
    def sequence(self) -> int:
        """The sequence number of the last generation written (0: the base; -1: none)."""
        return self._sequence

    def write(self, rebase: bool = False) -> int:
        """Writes the next generation and returns its sequence number.

        The first write (or with `rebase`, after `rebase_every` deltas, or when the
        directory holds another model's generations) is a base: every table whole,
        sequence 0 of a new base id. Otherwise a delta of the previous write: per
        table, the rows written since and the keys removed or evicted since (a table
        that cannot tell, after a restore, a `clear` or more removals than it keeps,
        is written whole), and every dense variable. Every file is written and synced
        before the manifest commits them: a write killed at any point leaves the
        previous generation in place, and the next write deletes what it left.

        Runs eagerly, between training steps: rows written while it runs go to this
        generation or to the next one.

        Raises:
          RuntimeError: called inside a `tf.function` or a TF1 graph.
        """
        if not tf.executing_eagerly():
            raise RuntimeError(
                "DeltaExporter.write() runs eagerly (between training steps, e.g. from a "
                "Keras callback): call it outside tf.function and TF1 graphs.")
        base = (bool(rebase) or self._needs_base or
                (self._rebase_every is not None and self._sequence >= self._rebase_every))
        serial = self._serial + 1 if base else self._serial
        serial = max(serial, 1)
        sequence = 0 if base else self._sequence + 1
        with tf.device("/CPU:0"):
            save_id = files.new_save_id()
        base_id = save_id.numpy().decode() if base else self._base_id
        lines, entries, marks = [], [], []
        for index, item in enumerate(self._tables):
            since = [None] * len(item.tables) if base else self._marks[index]
            written = [self._write_table(item, shard, index, serial, sequence, save_id, mark)
                       for shard, mark in enumerate(since)]
            full = [w[2] for w in written]
            if any(full) and not all(full):
                # A table item is replaced or updated as a whole (a served variable may
                # have another number of shards, each reading every file): write the
                # others whole too.
                written = [w if w[2] else self._write_table(item, shard, index, serial, sequence,
                                                            save_id, None)
                           for shard, w in enumerate(written)]
            lines.append(item.line(replace=all(w[2] for w in written)))
            entries += [f"{index} {e}" for w in written for e in w[0] if e]
            marks.append([w[1] for w in written])
        for offset, item in enumerate(self._dense):
            index = len(self._tables) + offset
            with tf.device("/CPU:0"):
                entry = _ops.ops.dynemb_save_dense(
                    self._directory, save_id, serial, sequence, index,
                    item.variable.read_value(), sync=self._sync)
            lines.append(item.line())
            entries.append(f"{index} {entry.numpy().decode()}")
        with tf.device("/CPU:0"):
            _ops.ops.dynemb_write_delta_manifest(
                self._directory, base_id, save_id, serial, sequence, lines, entries,
                sync=self._sync)
        # Committed: only now do the marks move (a failed write is written again).
        self._marks = marks
        self._base_id, self._serial, self._sequence = base_id, serial, sequence
        self._needs_base = False
        return sequence

    def _write_table(self, item, shard: int, index: int, serial: int, sequence: int, save_id,
                     since: Optional[np.ndarray]):
        """One shard table's files: `(entries, new mark, written whole)`."""
        table = item.tables[shard]
        with table._placement():
            entries, until, full = _ops.ops.dynemb_table_write_changes(
                table.resource_handle, self._directory, save_id, serial, sequence, index,
                since if since is not None else np.zeros([2], np.int64), since is None,
                chunk_rows=self._chunk_rows, shard_index=shard, num_shards=len(item.tables),
                routed=item.partitioner == "default", sync=self._sync)
        return [e.decode() for e in entries.numpy()], until.numpy(), bool(full)


def _signature(line: str) -> str:
    """The part of a manifest's item line that must match a model's item."""
    item = delta_items.parse_item_line(line)
    if item["kind"] == "table":
        return f"table {item['identity']} {item['key_dtype']} {item['value_dtype']} {item['dim']}"
    return line
