"""Checkpoints of model-parallel variables: every worker's slice in the chief's checkpoint.

Under `MultiWorkerMirroredStrategy` every worker saves (TF's convention): the chief to
the real path, the others to temporary paths they delete afterwards, because mirrored
state is the same everywhere. A model-parallel variable's slices are not: each is the
only copy of its ids. So `tf.train.Checkpoint` (through the package's registered
checkpoint saver, persistence/checkpoint.py) saves them like this, on every worker:

1. the workers all-gather the checkpoint prefix each was given (its bytes, as int32) and
   take the chief's (rank 0): every slice goes beside the chief's checkpoint, whatever
   path a worker was told to write to;
2. each worker writes its slice as a TF checkpoint bundle beside the chief's
   checkpoint, at the prefix TF gave the chief's saver plus `_dynemb_slice<r>of<W>`
   (`<checkpoint>-tensorflow_dynemb.tables_dynemb_slice<r>of<W>`), with tensors named
   `<object path>/.ATTRIBUTES/-slice<r>of<W>-keys` (`-values`, `-scores`), streamed
   from the table where the streaming op takes it (CPU tables), else exported;
3. a barrier (one more all-gather) waits for every worker's bundle;
4. the chief returns every slice bundle's prefix to TF, which merges them into its
   checkpoint (`MergeV2Checkpoints` renames the data files; nothing is copied). The
   chief's checkpoint then holds every slice, as ordinary checkpoint tensors;
   `tf.train.CheckpointManager` keeps and deletes it whole, and a killed save's
   bundles are deleted by the next save (persistence/checkpoint.py).

So the checkpoint directory must be shared by the workers (one disk here; a network
file system in production), and every worker must save (as MWMS requires anyway): a
save on the chief alone waits for the others until the collective timeout.

A restore reads every slice of the checkpoint (`restore_slices`) and keeps, per
variable, the keys the restoring variable holds: a model-parallel variable under another
number of workers keeps the ids its partitioner assigns to its rank, one process keeps
them all (routed into its shards). A checkpoint written in one process restores into a
model-parallel variable the same way (each worker keeps its ids). Restores read the
checkpoint in eager mode (TF2 restores do); no collective is involved.

Keras weight files and SavedModels cannot name side files: there `_serialize_to_tensors`
returns the whole content, all-gathered from every worker (`gather_content`), so those
files hold the whole table, as they do in one process.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from tensorflow_dynemb.distribute.cluster import WorkerGroup
from tensorflow_dynemb.distribute.collectives import all_gather, gather_rows

__all__ = ["save_slices", "sliced_objects", "restore_slices", "gather_content"]

_SLICE_KEY = re.compile(r"^(?P<path>.*)/\.ATTRIBUTES/-slice(?P<rank>\d+)of(?P<num>\d+)-keys$")

# Every byte as a one-byte string, to turn gathered prefix bytes back into a string.
_BYTES = [bytes([i]) for i in range(256)]


def _local_names(rank: int, num: int) -> Tuple[str, str, str]:
    base = f"-slice{rank}of{num}"
    return f"{base}-keys", f"{base}-values", f"{base}-scores"


def slice_tensor_names(path: str, rank: int, num: int, with_scores: bool) -> List[str]:
    """Checkpoint keys of slice `rank` of `num` of the object at `path`: keys, values and
    scores ("" when not saved), as `DynembSaveTablesToBundle` takes them."""
    from tensorflow.python.trackable import trackable_utils  # noqa: PLC0415

    keys, values, scores = _local_names(rank, num)
    names = [trackable_utils.checkpoint_key(path, local) for local in (keys, values)]
    return names + [trackable_utils.checkpoint_key(path, scores) if with_scores else ""]


def _chief_prefix(group: WorkerGroup, file_prefix: tf.Tensor) -> tf.Tensor:
    """The checkpoint prefix rank 0 (the chief) was given, on every worker."""
    raw = tf.cast(tf.io.decode_raw(file_prefix, tf.uint8), tf.int32)
    length = tf.size(raw)
    lengths = all_gather(group, length[tf.newaxis], name="dynemb_checkpoint_prefix_lengths")
    width = tf.reduce_max(lengths)
    padded = tf.pad(raw, [[0, width - length]])[tf.newaxis, :]
    prefixes = all_gather(group, padded, name="dynemb_checkpoint_prefixes")
    chief = prefixes[0, : lengths[0]]
    return tf.strings.reduce_join(tf.gather(tf.constant(_BYTES), chief))


def _bundle_prefix(chief_prefix, rank: int, num: int):
    return tf.strings.join([chief_prefix, f"_dynemb_slice{rank}of{num}"])


def save_slices(entries, file_prefix: tf.Tensor, stream_device) -> List[tf.Tensor]:
    """The registered saver's part for model-parallel variables (see the module
    docstring). Every worker runs it with the same `entries` (`(path, variable,
    CheckpointTables)` of one `WorkerGroup`, in checkpoint order).

    Args:
      entries: the model-parallel objects of this save.
      file_prefix: the prefix TF gave this worker's saver.
      stream_device: persistence.checkpoint's `_stream_device` (tables -> device or
        None), to decide between the streaming op and an export.

    Returns:
      The prefixes for TF to merge into this worker's checkpoint: every slice bundle
      on the chief, none elsewhere.
    """
    from tensorflow_dynemb._ops import ops  # noqa: PLC0415 (the op library loads lazily)

    group = entries[0][1].worker_group
    rank, num = group.rank, group.num_workers
    chief_prefix = _chief_prefix(group, file_prefix)
    mine = _bundle_prefix(chief_prefix, rank, num)
    # The same choice on every worker (same variables, same kind of device): the
    # chief must know the bundles' names.
    devices = [stream_device(spec.tables) for _, _, spec in entries]
    streamed = all(d is not None for d in devices) and len(set(devices)) == 1
    if streamed:
        with tf.device(devices[0]):
            (written,) = ops.dynemb_save_tables_to_bundle(
                prefix=mine,
                num_files=1,
                tables=[t.resource_handle for _, _, spec in entries for t in spec.tables],
                tensor_names=[
                    n
                    for path, _, spec in entries
                    for n in slice_tensor_names(path, rank, num, spec.with_scores)
                ],
                entry_tables=[len(spec.tables) for _, _, spec in entries],
            )
        suffix = "_0_of_1"  # DynembSaveTablesToBundle's name of its one file
    else:
        names, tensors = [], []
        for path, variable, spec in entries:
            content = variable._local_content(with_scores=spec.with_scores)
            for name, tensor in zip(slice_tensor_names(path, rank, num, spec.with_scores), content):
                names.append(name)
                tensors.append(tensor)
        with tf.device("/CPU:0"):
            written = tf.raw_ops.SaveV2(
                prefix=mine, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
            )
        suffix = ""
    with tf.control_dependencies([written]):
        # Every slice is on disk once every worker passed this point.
        done = all_gather(group, tf.ones([1], tf.int32), name="dynemb_checkpoint_barrier")
    if rank != 0:
        return []
    with tf.control_dependencies([done]):
        return [
            tf.strings.join([_bundle_prefix(chief_prefix, r, num), suffix]) for r in range(num)
        ]


def sliced_objects(
    paths: List[str], prefix: str, dtypes: Optional[Dict[str, tf.DType]]
) -> Dict[str, Tuple[int, bool]]:
    """`{object path: (number of slices, whether they hold scores)}` of the objects at
    `paths` that the checkpoint at `prefix` holds as per-worker slices.

    Args:
      dtypes: the checkpoint's tensors, `{key: dtype}`; None when `prefix` is not
        known while building (a restore in a TF1 graph or a tf.function): then none.

    Raises:
      ValueError: a slice is missing.
    """
    if dtypes is None:
        return {}
    found: Dict[str, Dict[int, int]] = {}
    for key in dtypes:
        match = _SLICE_KEY.match(key)
        if match:
            found.setdefault(match["path"], {})[int(match["rank"])] = int(match["num"])
    out = {}
    for path in paths:
        ranks = found.get(path)
        if not ranks:
            continue
        num = next(iter(ranks.values()))
        if set(ranks) != set(range(num)) or set(ranks.values()) != {num}:
            raise ValueError(
                f"The checkpoint {prefix!r} holds an incomplete or mixed set of slices of "
                f"{path!r}: ranks {sorted(ranks)} of {sorted(set(ranks.values()))} workers."
            )
        scores = slice_tensor_names(path, 0, num, True)[2] in dtypes
        out[path] = (num, scores)
    return out


def restore_slices(variable, path: str, prefix: tf.Tensor, num: int, with_scores: bool, dtypes):
    """Restores `variable` from the `num` slices of `path` in the checkpoint at `prefix`:
    reads them one by one and keeps the keys `variable` holds (`_owned`), then restores
    those (`_restore_from_tensors`, which routes them into its shards).

    Args:
      dtypes: `(key dtype, value dtype)` of the saved tensors.
    """
    parts = []
    for rank in range(num):
        names = [n for n in slice_tensor_names(path, rank, num, with_scores) if n]
        with tf.device("/CPU:0"):
            tensors = tf.raw_ops.RestoreV2(
                prefix=prefix,
                tensor_names=names,
                shape_and_slices=[""] * len(names),
                dtypes=list(dtypes) + ([tf.int64] if with_scores else []),
            )
        parts.append(variable._owned(*tensors))
    from tensorflow_dynemb.persistence.checkpoint import CKPT_KEYS, CKPT_SCORES, CKPT_VALUES  # noqa: PLC0415

    fields = [CKPT_KEYS, CKPT_VALUES] + ([CKPT_SCORES] if with_scores else [])
    merged = {field: tf.concat([p[i] for p in parts], 0) for i, field in enumerate(fields)}
    return variable._restore_from_tensors(merged)


def gather_content(variable, with_scores: bool) -> Tuple[tf.Tensor, ...]:
    """The whole content of a model-parallel variable, every worker's slice
    concatenated in rank order, on every worker: `(keys, values[, scores])`. Every
    worker must call it (a Keras weight file or a SavedModel being written)."""
    group: Optional[WorkerGroup] = variable.worker_group
    local = variable._local_content(with_scores=with_scores)
    return tuple(
        gather_rows(group, tensor, name=f"{variable._unique_name}_gather_{i}")
        for i, tensor in enumerate(local)
    )
