"""Checkpoint plumbing shared by tables and variables.

Both have the Trackable hooks `_serialize_to_tensors` / `_restore_from_tensors`: the
content as whole tensors (keys, values and, where kept, scores), made by an export.
TF1's `tf.compat.v1.train.Saver` looks for SaveableObjects in a graph collection;
`register_for_tf1_saver` puts one there, built from those hooks. SavedModels, Keras
weight files and TF1-style graphs use them too.

`tf.train.Checkpoint` (eager and `tf.function`) streams instead: a checkpoint saver
registered with TF (`_save_streaming` / `_restore_streaming`) writes each table from
a snapshot, chunk by chunk, straight into the checkpoint's bundle files
(`DynembSaveTablesToBundle`), as slices of the same tensors under the same names.
An export first copied the whole table into fresh tensors (for 10M keys of an Adam
state, 2.2 GB of new memory) and TF then wrote them on one thread; the stream needs
memory for a few chunks and writes several files at once. Restores stream too
(`DynembRestoreTablesFromBundle`): the slices go straight into the tables, where
`RestoreV2` would first assemble each whole tensor. Readers that are not ours see
whole tensors, so `tf.train.load_checkpoint`, `_restore_from_tensors` and
checkpoints written either way are interchangeable. Tables that cannot be streamed
(string keys, GPU tables, a variable's shards on several devices) are exported and
restored as whole tensors, inside the same saver; so are variables of several shards
whose keys a custom partitioner routes (the op routes by `default_partition_fn`).
Both ops write and read local files with direct I/O (cc/kernels/direct_io.h), so a
checkpoint does not pass through the page cache; `DYNEMB_DIRECT_IO=0` turns that off.
"""

from __future__ import annotations

import collections
import os
import re
import sys
from typing import Dict, List, NamedTuple, Optional

import tensorflow as tf

from tensorflow_dynemb import _export_context
from tensorflow_dynemb.distribute import checkpoint as _slices
from tensorflow_dynemb.persistence import file_saver
from tensorflow_dynemb.persistence import files as table_files

try:  # No public API registers a checkpoint saver; TF 2.16-2.21 all have this one.
    from tensorflow.python.saved_model import registration as _registration
    from tensorflow.python.trackable import trackable_utils as _trackable_utils
except ImportError:  # pragma: no cover - present in every supported TF
    _registration = None

# Checkpoint keys, relative to the object's own checkpoint prefix.
CKPT_KEYS = "-keys"
CKPT_VALUES = "-values"
CKPT_SCORES = "-scores"


class Untracked:
    """Plain attributes for an object to hold out of sight of Keras' and TF's
    attribute tracking (which would wrap dicts and lists, make checkpoint dependencies
    of trackables, and save layers)."""

    def __init__(self, **values):
        self.__dict__.update(values)


def in_tf1_graph() -> bool:
    """True while building a TF1 graph (not eager, not inside a `tf.function`)."""
    return not tf.executing_eagerly() and not tf.inside_function()


def register_for_tf1_saver(trackable, name: str) -> None:
    """Lets `tf.compat.v1.train.Saver` (and `MonitoredTrainingSession`'s default
    Scaffold) save and restore `trackable` under the graph-unique `name`."""
    # tf1_saver: what the object gives TF1's Saver (a de.FileSystemSaver's files)
    # when it says, else its _serialize_to_tensors.
    factories = tf.__internal__.tracking.saveable_objects_from_trackable(trackable, tf1_saver=True)
    (factory,) = factories.values()
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, factory(name=name))


# -- streaming saves for tf.train.Checkpoint ----------------------------------------------

# What a trackable offers the streaming saver: `_checkpoint_tables()` returns its
# CheckpointTables, or None when it saves nothing (`checkpoint=False`).
_TABLES_HOOK = "_checkpoint_tables"


class CheckpointTables(NamedTuple):
    """A trackable's checkpoint content as the streaming saver sees it."""

    tables: list  # whose rows, concatenated in order, are the content
    with_scores: bool  # whether the scores are saved
    # Whether a restore may send each key to table `default_partition_fn(key,
    # len(tables))` (always true of one table).
    routes_by_default: bool = True
    # Whether the tables are one worker's slice of a model-parallel variable, saved
    # beside the chief's checkpoint by every worker (distribute/checkpoint.py).
    sliced: bool = False


# At most this many bundle files per device and save, and at least this many rows each.
_MAX_FILES = 4
_MIN_ROWS_PER_FILE = 1 << 20


def writing_saved_model() -> bool:
    """Whether a SavedModel is being written: in its save context, or writing its
    variables, which `save_and_return_nodes` does after leaving that context."""
    if _export_context.in_saved_model_save():
        return True
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "save_and_return_nodes" and frame.f_globals.get(
            "__name__"
        ) == "tensorflow.python.saved_model.save":
            return True
        frame = frame.f_back
    return False


def _file_saver(obj):
    """The `de.FileSystemSaver` through which checkpoints keep `obj`'s content in
    files (persistence/file_saver.py), or None."""
    hook = getattr(obj, "_file_system_saver", None)
    return hook() if hook is not None else None


def _streams(obj) -> bool:
    """Whether `tf.train.Checkpoint` saves `obj` through the streaming saver (which
    also writes the files of objects with a `de.FileSystemSaver`).

    Not for SavedModels (they keep the export path: a loader revives tables as
    TF's generic objects, which no registered saver restores) and not in a TF1 graph
    (TF runs a registered saver's restore ops only in eager and `tf.function` code)."""
    hook = getattr(obj, _TABLES_HOOK, None)
    if (hook is None or hook() is None) and _file_saver(obj) is None:
        return False
    return not in_tf1_graph() and not writing_saved_model()


def _object_path(name: str) -> str:
    """The object's checkpoint path. TF passes a restore the first checkpoint key of an
    object saved by its export (`path/.ATTRIBUTES/-keys`) instead of the path."""
    return name.split("/.ATTRIBUTES/")[0]


def _tensor_names(path: str, with_scores: bool) -> List[str]:
    """Checkpoint keys of an object's keys, values and scores ("" when not saved): the
    names `_serialize_to_tensors` gives them."""
    names = [_trackable_utils.checkpoint_key(path, local) for local in (CKPT_KEYS, CKPT_VALUES)]
    return names + [_trackable_utils.checkpoint_key(path, CKPT_SCORES) if with_scores else ""]


def _stream_device(tables) -> Optional[str]:
    """The device of `tables` if the streaming ops (DynembSaveTablesToBundle,
    DynembRestoreTablesFromBundle) take them: CPU tables with numeric keys, all on one
    device ("": the default one). None otherwise."""
    if any(table.key_dtype == tf.string for table in tables):
        return None
    # Where the handle is (eager handles name it in full), else the device the table
    # was given (a handle captured by a tf.function may not say).
    devices = {table.resource_handle.device or table._device for table in tables}
    if len(devices) != 1:
        return None
    (device,) = devices
    if device and tf.DeviceSpec.from_string(device).device_type not in (None, "CPU"):
        return None
    return device


def _num_files(entries) -> int:
    """Bundle files for one device's tables: about a million rows each, at most
    _MAX_FILES and the machine's cores. Sizes are only known in eager mode (a
    `tf.function` writes one file)."""
    if not tf.executing_eagerly():
        return 1
    rows = sum(int(table.size()) for _, spec in entries for table in spec.tables)
    return max(1, min(_MAX_FILES, os.cpu_count() or 1, rows // _MIN_ROWS_PER_FILE))


def _split_file_savers(trackables: Dict[str, object]):
    """`(with_files, rest)`: the sorted `(name, object)` pairs of the objects whose
    content goes to files (a `de.FileSystemSaver`), and the others by name."""
    with_files = sorted((n, o) for n, o in trackables.items() if _file_saver(o) is not None)
    names = {n for n, _ in with_files}
    return with_files, {n: o for n, o in trackables.items() if n not in names}


def _recorded_tensors(merged_prefix: tf.Tensor):
    """`(prefix, {key: dtype})` of the checkpoint being restored, read from its index
    once; `(None, None)` when the prefix is not known while building (a restore in a
    TF1 graph or a tf.function)."""
    value = tf.get_static_value(merged_prefix)
    if value is None:
        return None, None
    prefix = os.fsdecode(value)
    # The reader itself, not tf.train.load_checkpoint: that takes a prefix its file
    # system calls a directory (ram://, where any name prefix is one) for a folder.
    return prefix, tf.compat.v1.train.NewCheckpointReader(prefix).get_variable_to_dtype_map()


def _split_by_recorded_content(with_files, prefix, recorded):
    """`(with_files, inline)`: of the objects with a `de.FileSystemSaver`, those whose
    checkpoint records a save id (their content is in files), and, by name, those whose
    checkpoint holds their content itself: a SavedModel's variables (SavedModels keep
    the content inside them, saver or not), or a checkpoint written before the saver
    was given. `recorded`: the checkpoint's tensors (`_recorded_tensors`), known when
    the prefix is (eager restores, as Keras' `load_weights`); without them (None) a
    restore expects files.

    Raises:
      ValueError: content held inside the checkpoint for a saver of several processes
        (`proc_size` > 1): which process wrote it is not recorded."""
    if recorded is None or not with_files:
        return with_files, {}
    files, inline = [], {}
    for name, obj in with_files:
        key = _trackable_utils.checkpoint_key(_object_path(name), file_saver.CKPT_SAVE_ID)
        if key in recorded:
            files.append((name, obj))
            continue
        config = _file_saver(obj).config
        if config.proc_size > 1:
            # The content inside is one process's part, which no key says: restored
            # into another rank it would put that rank's keys in the wrong process.
            raise ValueError(
                f"{name!r}: the checkpoint {prefix!r} holds the content of "
                "this variable itself (a SavedModel's variables do), written by one of "
                f"the {config.proc_size} processes of its de.FileSystemSaver(proc_size="
                f"{config.proc_size}), which it does not record; restoring it into rank "
                f"{config.proc_rank} could give it another rank's keys. Load each "
                "rank's files with load_from_file_system(dirpath, proc_size=..., "
                "proc_rank=...) instead, or restore from a tf.train.Checkpoint."
            )
        inline[name] = obj
    return files, inline


# What this saver's bundles are called beside a checkpoint `<prefix>`:
# `<prefix>-tensorflow_dynemb.tables_stream<i>` and `..._export<i>` (`.index`,
# `.data-*`). A completed save merges them into the checkpoint; a killed one leaves them.
# Model-parallel variables' slices (distribute/checkpoint.py) are
# `..._dynemb_slice<r>of<W>` (+ `_0_of_1` when streamed).
_OWN_BUNDLE = re.compile(
    r"^(.*)-tensorflow_dynemb\.tables_(stream\d+|export\d+|dynemb_slice\d+of\d+)(_\d+_of_\d+)?"
    r"\.(index|data-\d{5}-of-\d{5})$"
)


def _delete_killed_saves(file_prefix) -> None:
    """Deletes the bundles killed saves of this saver left beside `file_prefix`
    (eager saves only: a graph's prefix is known when it runs). Best effort: one
    writer per checkpoint directory, as `tf.train.CheckpointManager` assumes."""
    if not hasattr(file_prefix, "numpy"):
        return
    prefix = os.fsdecode(file_prefix.numpy())
    directory, own = os.path.split(prefix)
    own = own.rsplit("-tensorflow_dynemb.tables", 1)[0]
    try:
        names = tf.io.gfile.listdir(directory or ".")
    except tf.errors.OpError:
        return
    for name in names:
        match = _OWN_BUNDLE.match(name)
        if match and match.group(1) != own:
            try:
                tf.io.gfile.remove(os.path.join(directory, name))
            except tf.errors.OpError:
                pass


def _split_by_device(trackables: Dict[str, object], restoring: bool):
    """`(streamed, whole)`: the objects the ops stream, as sorted `(device, [(path,
    CheckpointTables)])` pairs, and the `(name, object, CheckpointTables)` of those saved
    or restored as whole tensors."""
    streamed = collections.defaultdict(list)
    whole = []
    for name, obj in trackables.items():
        spec = getattr(obj, _TABLES_HOOK)()
        device = _stream_device(spec.tables)
        if device is None or (restoring and not spec.routes_by_default):
            whole.append((name, obj, spec))
        else:
            streamed[device].append((_object_path(name), spec))
    return sorted(streamed.items()), whole


def _stream_op_inputs(entries):
    """The tables, tensor_names and entry_tables of the streaming ops for `entries`."""
    return dict(
        tables=[t.resource_handle for _, spec in entries for t in spec.tables],
        tensor_names=[n for path, spec in entries for n in _tensor_names(path, spec.with_scores)],
        entry_tables=[len(spec.tables) for _, spec in entries],
    )


def _save_streaming(trackables: Dict[str, object], file_prefix: tf.Tensor) -> List[tf.Tensor]:
    """The registered saver's save function: writes every object's content into
    bundles beside `file_prefix` and returns their prefixes, which TF merges into the
    checkpoint."""
    with_files, trackables = _split_file_savers(trackables)
    for name, obj in with_files:
        if getattr(obj, "worker_group", None) is not None:
            raise NotImplementedError(
                f"{name!r}: a model-parallel de.Variable (MultiWorkerMirroredStrategy) "
                "cannot keep its checkpoint content in files through a "
                "de.FileSystemSaver yet; checkpoint it without one (every worker's slice "
                "then goes into the chief's checkpoint)."
            )
    sliced = []
    for name in list(trackables):
        spec = getattr(trackables[name], _TABLES_HOOK)()
        if spec.sliced:
            sliced.append((_object_path(name), trackables.pop(name), spec))
    streamed, exported = _split_by_device(trackables, restoring=False)
    from tensorflow_dynemb._ops import ops  # noqa: PLC0415 (the op library loads lazily)

    _delete_killed_saves(file_prefix)
    # Model-parallel variables: every worker's slice, merged by the chief.
    prefixes = _slices.save_slices(sliced, file_prefix, _stream_device) if sliced else []
    for i, (device, entries) in enumerate(streamed):
        with tf.device(device):
            prefixes += ops.dynemb_save_tables_to_bundle(
                prefix=tf.strings.join([file_prefix, f"_stream{i}"]),
                num_files=_num_files(entries),
                **_stream_op_inputs(entries),
            )
    # The rest as the export path saves them: whole tensors, one SaveV2 per device.
    by_device = collections.defaultdict(list)
    for name, obj, _ in exported:
        path = _object_path(name)
        for local, tensor in obj._serialize_to_tensors().items():
            by_device[tensor.device].append((_trackable_utils.checkpoint_key(path, local), tensor))
    if with_files:
        # One save id for every variable of this checkpoint: their files are one
        # generation, and the checkpoint records it.
        save_id = table_files.new_save_id()
        folder = file_saver.folder_beside(file_prefix)
        for name, obj in with_files:
            committed = obj._save_files_for_checkpoint(save_id, folder)
            key = _trackable_utils.checkpoint_key(_object_path(name), file_saver.CKPT_SAVE_ID)
            by_device[committed.device].append((key, committed))
    for i, (device, items) in enumerate(sorted(by_device.items())):
        prefix = tf.strings.join([file_prefix, f"_export{i}"])
        with tf.device(device):
            save = tf.raw_ops.SaveV2(
                prefix=prefix,
                tensor_names=[n for n, _ in items],
                shape_and_slices=[""] * len(items),
                tensors=[t for _, t in items],
            )
        # In a tf.function the merge of the prefixes must wait for the files.
        with tf.control_dependencies([save] if save is not None else []):
            prefixes.append(tf.identity(prefix))
    return prefixes


def _restore_streaming(trackables: Dict[str, object], merged_prefix: tf.Tensor) -> None:
    """The registered saver's restore function: streams the checkpoint into the
    tables it can (DynembRestoreTablesFromBundle); reads the other objects' whole
    tensors (TF assembles streamed slices) for their `_restore_from_tensors`."""
    with_files, trackables = _split_file_savers(trackables)
    prefix, recorded = _recorded_tensors(merged_prefix)
    with_files, inline = _split_by_recorded_content(with_files, prefix, recorded)
    trackables.update(inline)
    # Checkpoints of model-parallel variables hold every worker's slice: read them all.
    paths = {_object_path(name): name for name in trackables}
    for path, (num, with_scores) in _slices.sliced_objects(list(paths), prefix, recorded).items():
        obj = trackables.pop(paths[path])
        tables = getattr(obj, _TABLES_HOOK)().tables
        dtypes = (tables[0].key_dtype, tables[0].value_dtype)
        _slices.restore_slices(obj, path, merged_prefix, num, with_scores, dtypes)
    streamed, whole = _split_by_device(trackables, restoring=True)
    from tensorflow_dynemb._ops import ops  # noqa: PLC0415 (the op library loads lazily)

    if with_files:
        folder = file_saver.folder_beside(merged_prefix)
    for name, obj in with_files:
        key = _trackable_utils.checkpoint_key(_object_path(name), file_saver.CKPT_SAVE_ID)
        with tf.device("/CPU:0"):
            (save_id,) = tf.raw_ops.RestoreV2(
                prefix=merged_prefix, tensor_names=[key], shape_and_slices=[""], dtypes=[tf.string]
            )
        obj._load_files_for_checkpoint(save_id, folder)

    for device, entries in streamed:
        with tf.device(device):
            ops.dynemb_restore_tables_from_bundle(prefix=merged_prefix, **_stream_op_inputs(entries))
    for name, obj, spec in whole:
        locals_ = [CKPT_KEYS, CKPT_VALUES] + ([CKPT_SCORES] if spec.with_scores else [])
        key_dtype, value_dtype = spec.tables[0].key_dtype, spec.tables[0].value_dtype
        dtypes = [key_dtype, value_dtype, tf.int64][: len(locals_)]
        names = [n for n in _tensor_names(_object_path(name), spec.with_scores) if n]
        with tf.device("/CPU:0"):
            tensors = tf.raw_ops.RestoreV2(
                prefix=merged_prefix,
                tensor_names=names,
                shape_and_slices=[""] * len(names),
                dtypes=dtypes,
            )
        obj._restore_from_tensors(dict(zip(locals_, tensors)))


if _registration is not None:
    _registration.register_checkpoint_saver(
        package="tensorflow_dynemb",
        name="tables",
        predicate=_streams,
        save_fn=_save_streaming,
        restore_fn=_restore_streaming,
        # A checkpoint this saver wrote, restored where it does not run (a TF1
        # graph), fails with TF's error naming the object instead of restoring nothing.
        strict_predicate_restore=True,
    )
