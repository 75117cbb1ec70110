"""tf.train.Checkpoint streams tables into the checkpoint and back (persistence/checkpoint.py's
registered saver, the DynembSaveTablesToBundle and DynembRestoreTablesFromBundle ops):
the files hold the tensors the export path writes, under the same names, whatever the
number of files; restores read them straight into the tables, rerouted to any number of
shards, and a damaged or mismatched checkpoint leaves the tables as they were;
checkpoints written either way restore into each other; what cannot be streamed is
exported inside the same saver; the ops write and read local files with direct I/O
(DYNEMB_DIRECT_IO=0: through the page cache) and the bytes are the same either way;
bad op input is an error naming it."""

from __future__ import annotations

import ctypes
import mmap
import os
import platform

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

import tensorflow_dynemb as de
from tensorflow_dynemb.persistence import checkpoint as de_checkpoint
from tensorflow_dynemb._ops import ops
from _tables_util import run_python

SAVER = "tensorflow_dynemb.tables"


def saver_of(prefix):
    """{object path: registered saver name ("" for the export path)} of a checkpoint."""
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    out = {}
    for child in graph.nodes[0].children:
        out[child.local_name] = graph.nodes[child.node_id].registered_saver.name
    return out


def data_files(directory, stem):
    return sorted(f for f in os.listdir(directory) if f.startswith(stem + ".data-"))


def filled_variable(shards, n, dim=3, name="emb", **kwargs):
    v = de.Variable(tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * shards, name=name, **kwargs)
    keys = np.arange(1, n + 1, dtype=np.int64) * 7919
    values = np.arange(n * dim, dtype=np.float32).reshape(n, dim)
    v.upsert(keys, values)
    return v, keys, values


def by_key(keys, *columns):
    order = np.argsort(keys)
    return (keys[order],) + tuple(c[order] for c in columns)


@pytest.mark.parametrize("files", [1, 2])
def test_files_hold_the_export_under_the_same_names(tmp_path, monkeypatch, files):
    # Lower the rows a file needs, so 2 files (this machine may have 2 cores) need no
    # million keys; every entry then spans the files.
    monkeypatch.setattr(de_checkpoint, "_MIN_ROWS_PER_FILE", 100)
    monkeypatch.setattr(de_checkpoint, "_MAX_FILES", files)
    v, _, _ = filled_variable(3, 500)
    hkv = de.HkvHashTable(
        tf.int64, tf.float32, [0.0, 0.0], init_capacity=64, max_capacity=300, evict_strategy="lru"
    )
    for start in range(0, 400, 50):  # bounded: the export (and the stream) is oldest write first
        k = np.arange(start, start + 50, dtype=np.int64)
        hkv.insert(k, np.stack([k, -k], 1).astype(np.float32))
    prefix = tf.train.Checkpoint(v=v, hkv=hkv).write(str(tmp_path / "ck"))
    assert saver_of(prefix) == {"v": SAVER, "hkv": SAVER}
    # One bundle per file and the checkpoint's own (the object graph).
    assert len(data_files(tmp_path, "ck")) == min(files, os.cpu_count()) + 1
    reader = tf.train.load_checkpoint(prefix)
    for path, obj in (("v", v), ("hkv", hkv)):
        exported = [t.numpy() for t in obj.export_with_scores()]
        for local, expected in zip(("-keys", "-values", "-scores"), exported):
            stored = reader.get_tensor(f"{path}/.ATTRIBUTES/{local}")
            np.testing.assert_array_equal(stored, expected)


def test_restore_into_other_shard_counts_and_slot_state(tmp_path):
    v, keys, values = filled_variable(3, 2000)
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam())
    ids = tf.constant(keys[:10])
    with tf.GradientTape() as tape:
        rows, trainable = de.embedding_lookup(v, ids, name="rows", return_trainable=True)
        loss = tf.reduce_sum(rows * rows)
    optimizer.apply_gradients([(tape.gradient(loss, trainable), trainable)])  # makes the slot state
    state = optimizer._dynemb.state_of(v)
    prefix = tf.train.Checkpoint(v=v, state=state).write(str(tmp_path / "ck"))
    assert saver_of(prefix) == {"v": SAVER, "state": SAVER}
    names = dict(tf.train.list_variables(prefix))
    assert "state/.ATTRIBUTES/-scores" not in names  # the slot state saves no scores

    v2 = de.Variable(tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * 2, name="emb")
    state2 = v2.companion("state", tf.float32, state.dim, 0.0, checkpoint_scores=False)
    tf.train.Checkpoint(v=v2, state=state2).read(prefix).assert_consumed()
    for a, b in ((v, v2), (state, state2)):
        ka, va = by_key(*[t.numpy() for t in a.export()])
        kb, vb = by_key(*[t.numpy() for t in b.export()])
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(va, vb)


def test_unstreamable_tables_are_exported_in_the_same_checkpoint(tmp_path):
    strings = de.HashTable(tf.string, tf.float32, [0.0])
    strings.insert(["a", "", "\u00e9"], [[1.0], [2.0], [3.0]])
    numbers = de.HashTable(tf.int32, tf.float32, [0.0])
    numbers.insert([1, 2], [[1.0], [2.0]])
    prefix = tf.train.Checkpoint(s=strings, n=numbers).write(str(tmp_path / "ck"))
    assert saver_of(prefix) == {"s": SAVER, "n": SAVER}
    s2 = de.HashTable(tf.string, tf.float32, [-1.0])
    n2 = de.HashTable(tf.int32, tf.float32, [-1.0])
    tf.train.Checkpoint(s=s2, n=n2).read(prefix).assert_consumed()
    found = s2.lookup(["", "a", "\u00e9", "x"]).numpy().ravel()
    np.testing.assert_array_equal(found, [2, 1, 3, -1])
    np.testing.assert_array_equal(n2.lookup([2, 1, 3]).numpy().ravel(), [2, 1, -1])


def test_empty_tables_and_checkpoint_false(tmp_path):
    empty = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    skipped = de.HashTable(tf.int64, tf.float32, 0.0, checkpoint=False)
    skipped.insert([1], [1.0])
    prefix = tf.train.Checkpoint(empty=empty, skipped=skipped).write(str(tmp_path / "ck"))
    names = dict(tf.train.list_variables(prefix))
    assert names["empty/.ATTRIBUTES/-values"] == [0, 2]
    assert not any(name.startswith("skipped/") for name in names)
    restored = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    restored.insert([5], [[5.0, 5.0]])
    tf.train.Checkpoint(empty=restored).read(prefix)
    assert int(restored.size()) == 0


def test_checkpoint_manager_and_tf_function_saves(tmp_path):
    v, keys, values = filled_variable(2, 300)
    ckpt = tf.train.Checkpoint(v=v)
    manager = tf.train.CheckpointManager(ckpt, str(tmp_path), max_to_keep=1)
    manager.save()
    v.upsert(keys[:1], values[:1] + 100.0)
    last = manager.save()
    assert sorted(os.listdir(tmp_path))[0] == "checkpoint" and len(manager.checkpoints) == 1

    @tf.function
    def save_in_function(prefix):
        return ckpt.write(prefix)

    in_function = save_in_function(tf.constant(str(tmp_path / "fn")))
    for prefix in (last, in_function.numpy().decode()):
        restored = de.Variable(tf.int64, tf.float32, dim=3, name="emb")
        tf.train.Checkpoint(v=restored).read(prefix).assert_existing_objects_matched()
        found = restored.lookup(keys[:2]).numpy()
        np.testing.assert_array_equal(found, [values[0] + 100.0, values[1]])


def test_saved_models_keep_the_export_path(tmp_path):
    # Their loaders revive tables as TF's generic objects, which no registered saver restores.
    module = tf.Module()
    module.v, keys, values = filled_variable(2, 50)
    module.lookup = tf.function(
        lambda ids: module.v.lookup(ids), input_signature=[tf.TensorSpec([None], tf.int64)]
    )
    tf.saved_model.save(module, str(tmp_path / "sm"))
    reader = tf.train.load_checkpoint(str(tmp_path / "sm" / "variables" / "variables"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    assert not any(node.registered_saver.name for node in graph.nodes)
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_array_equal(loaded.lookup(tf.constant(keys[:3])).numpy(), values[:3])


def write_in_tf1_graph(prefix, keys, values):
    """A checkpoint written by tf.train.Checkpoint in a TF1 graph: the export path."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        v = de.Variable(tf.int64, tf.float32, dim=3, name="emb")
        session.run(v.upsert(keys, values))
        return tf.compat.v1.train.Checkpoint(v=v).save(prefix, session=session)


def test_export_path_checkpoints_restore_through_the_saver(tmp_path):
    keys = np.array([3, 1, 2], np.int64)
    values = np.arange(9, dtype=np.float32).reshape(3, 3)
    prefix = write_in_tf1_graph(str(tmp_path / "graph"), keys, values)
    assert saver_of(prefix)["v"] == ""
    restored = de.Variable(tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * 2, name="emb")
    tf.train.Checkpoint(v=restored).read(prefix).assert_existing_objects_matched()
    np.testing.assert_array_equal(restored.lookup(keys).numpy(), values)


def test_streamed_checkpoint_in_a_tf1_graph_is_an_error(tmp_path):
    v, _, _ = filled_variable(1, 10)
    prefix = tf.train.Checkpoint(v=v).write(str(tmp_path / "ck"))
    with tf.Graph().as_default():
        graph_v = de.Variable(tf.int64, tf.float32, dim=3, name="emb")
        with pytest.raises(ValueError, match="predicate"):
            tf.compat.v1.train.Checkpoint(v=graph_v).restore(prefix)


def test_op_rejects_bad_input(tmp_path):
    table = de.HashTable(tf.int64, tf.float32, [0.0])
    strings = de.HashTable(tf.string, tf.float32, [0.0])
    prefix = str(tmp_path / "b")
    errors = tf.errors.InvalidArgumentError
    with pytest.raises(errors, match="entry_tables must add up to the 1 tables, got 2"):
        ops.dynemb_save_tables_to_bundle(prefix, [table.resource_handle], ["k", "v", ""], [2])
    with pytest.raises(errors, match="3 names per entry"):
        ops.dynemb_save_tables_to_bundle(prefix, [table.resource_handle], ["k", "v"], [1])
    with pytest.raises(errors, match="string keys"):
        ops.dynemb_save_tables_to_bundle(prefix, [strings.resource_handle], ["k", "v", ""], [1])
    other = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    with pytest.raises(errors, match="differ in key dtype, value dtype or value shape"):
        ops.dynemb_save_tables_to_bundle(
            prefix, [table.resource_handle, other.resource_handle], ["k", "v", ""], [2]
        )
    # "" is the bundle's header key: TF's writer would end the process on it.
    with pytest.raises(errors, match=r"tensor_names\[1\] \(the values of entry 0\) must not be empty"):
        ops.dynemb_save_tables_to_bundle(prefix, [table.resource_handle], ["k", "", ""], [1])
    with pytest.raises(errors, match=r"prefix must be a scalar string, got string \[2\]"):
        ops.dynemb_save_tables_to_bundle([prefix, prefix], [table.resource_handle], ["k", "v", ""], [1])
    table.insert([1], [[1.0]])
    with pytest.raises(errors, match=r"num_files \(2\) must not exceed the rows to save \(1\)"):
        ops.dynemb_save_tables_to_bundle(prefix, [table.resource_handle], ["k", "v", ""], [1],
                                         num_files=2)


def forbid_whole_tensor_restores(monkeypatch):
    """Makes the whole-tensor restore path (RestoreV2 in persistence/checkpoint.py) fail."""

    def restore_v2(**kwargs):
        raise AssertionError(f"whole-tensor restore of {kwargs['tensor_names']}")

    monkeypatch.setattr(tf.raw_ops, "RestoreV2", restore_v2)


def damage(prefix):
    """Flips bytes in the middle of the checkpoint's largest data file."""
    directory, stem = os.path.split(prefix)
    path = max((os.path.join(directory, f) for f in data_files(directory, stem)), key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    open(path, "wb").write(bytes(data))


def contents(table_or_variable):
    return by_key(*[t.numpy() for t in table_or_variable.export_with_scores()])


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_restores_stream_into_any_number_of_shards(tmp_path, monkeypatch, key_dtype):
    # Small chunks and several files, so every tensor is many slices in several files.
    monkeypatch.setattr(de_checkpoint, "_MIN_ROWS_PER_FILE", 100)
    v = de.Variable(key_dtype, tf.float32, dim=3, devices=["/CPU:0"] * 2, name="emb")
    keys = np.arange(1, 3001, dtype=key_dtype.as_numpy_dtype) * 31
    v.upsert(keys, np.arange(9000, dtype=np.float32).reshape(3000, 3))
    hkv = de.HkvHashTable(
        key_dtype, tf.float32, [0.0], init_capacity=64, max_capacity=1000, evict_strategy="lfu"
    )
    for start in range(0, 1500, 100):
        k = keys[start : start + 100]
        hkv.insert(k, k.reshape(-1, 1).astype(np.float32))
    prefix = tf.train.Checkpoint(v=v, hkv=hkv).write(str(tmp_path / "ck"))
    forbid_whole_tensor_restores(monkeypatch)
    for shards in (1, 3):
        v2 = de.Variable(key_dtype, tf.float32, dim=3, devices=["/CPU:0"] * shards, name="emb")
        v2.upsert(keys[:1] + 1, np.ones([1, 3], np.float32))  # replaced, not kept
        hkv2 = de.HkvHashTable(
            key_dtype, tf.float32, [0.0], init_capacity=64, max_capacity=1000, evict_strategy="lfu"
        )
        tf.train.Checkpoint(v=v2, hkv=hkv2).read(prefix).assert_consumed()
        for a, b in ((v, v2), (hkv, hkv2)):
            for column_a, column_b in zip(contents(a), contents(b)):
                np.testing.assert_array_equal(column_a, column_b)
        for i, shard in enumerate(v2.tables):  # each key went to its default_partition_fn shard
            shard_keys = shard.export()[0]
            ids = de.default_partition_fn(shard_keys, shards).numpy()
            assert (ids == i).all()


def test_custom_partitioners_restore_whole_tensors(tmp_path, monkeypatch):
    modulo = lambda keys, n: tf.cast(keys % n, tf.int32)  # noqa: E731
    v, keys, values = filled_variable(2, 200, partitioner=modulo)
    prefix = tf.train.Checkpoint(v=v).write(str(tmp_path / "ck"))
    calls = []
    restore_v2 = tf.raw_ops.RestoreV2
    monkeypatch.setattr(
        tf.raw_ops, "RestoreV2", lambda **kw: calls.append(kw["tensor_names"]) or restore_v2(**kw)
    )
    v2 = de.Variable(tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * 3, partitioner=modulo)
    tf.train.Checkpoint(v=v2).read(prefix).assert_consumed()
    assert len(calls) == 1  # the op routes by default_partition_fn only
    np.testing.assert_array_equal(v2.lookup(keys).numpy(), values)
    assert int(v2.tables[1].size()) == int(np.sum(keys % 3 == 1))


@pytest.mark.parametrize("filled", [True, False])
def test_a_damaged_checkpoint_leaves_the_tables_unchanged(tmp_path, monkeypatch, filled):
    monkeypatch.setattr(de_checkpoint, "_MIN_ROWS_PER_FILE", 1000)
    v, keys, _ = filled_variable(2, 20000)
    prefix = tf.train.Checkpoint(v=v).write(str(tmp_path / "ck"))
    damage(prefix)
    v2 = de.Variable(tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * 2, name="emb")
    if filled:
        v2.upsert(keys[:5], np.full([5, 3], 7.0, np.float32))
    before = contents(v2)
    with pytest.raises(tf.errors.DataLossError, match="[Cc]hecksum") as info:
        tf.train.Checkpoint(v=v2).read(prefix)
    if platform.machine() == "x86_64":  # checked by the op's own reader (SSE4.2 CRC32C)
        assert "Checksum does not match for v/.ATTRIBUTES/-" in str(info.value)
    for column_before, column_after in zip(before, contents(v2)):
        np.testing.assert_array_equal(column_before, column_after)


def test_a_checkpoint_of_another_table_is_an_error_naming_it(tmp_path):
    v, keys, _ = filled_variable(2, 100, dim=3)
    prefix = tf.train.Checkpoint(v=v).write(str(tmp_path / "ck"))
    other = de.Variable(tf.int64, tf.float32, dim=4, name="emb")
    other.upsert(keys[:2], np.ones([2, 4], np.float32))
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"v/.ATTRIBUTES/-values is float \[100,3\], but the table takes float \[100,4\]",
    ):
        tf.train.Checkpoint(v=other).read(prefix)
    assert int(other.size()) == 2
    ints = de.Variable(tf.int32, tf.float32, dim=3, name="emb")
    with pytest.raises(tf.errors.InvalidArgumentError, match="is int64 \\[100\\], but the table takes int32"):
        tf.train.Checkpoint(v=ints).read(prefix)


def test_restore_op_rejects_bad_input(tmp_path):
    table = de.HashTable(tf.int64, tf.float32, [0.0])
    table.insert([1], [[1.0]])
    prefix = tf.train.Checkpoint(t=table).write(str(tmp_path / "ck"))
    names = ["t/.ATTRIBUTES/-keys", "t/.ATTRIBUTES/-values", "t/.ATTRIBUTES/-scores"]
    restore = ops.dynemb_restore_tables_from_bundle
    errors = tf.errors.InvalidArgumentError
    with pytest.raises(errors, match="entry_tables must add up to the 1 tables, got 2"):
        restore(prefix, [table.resource_handle], names, [2])
    with pytest.raises(errors, match="3 names per entry"):
        restore(prefix, [table.resource_handle], names[:2], [1])
    strings = de.HashTable(tf.string, tf.float32, [0.0])
    with pytest.raises(errors, match="string keys"):
        restore(prefix, [strings.resource_handle], names, [1])
    with pytest.raises(tf.errors.NotFoundError):
        restore(prefix, [table.resource_handle], ["absent", names[1], ""], [1])
    with pytest.raises(tf.errors.NotFoundError):
        restore(str(tmp_path / "absent"), [table.resource_handle], names, [1])
    with pytest.raises(errors, match=r"prefix must be a scalar string, got string \[2\]"):
        restore([prefix, prefix], [table.resource_handle], names, [1])
    short = str(tmp_path / "short")  # keys declared as 4 rows, slices of 2 stored
    tf.raw_ops.SaveV2(prefix=short, tensor_names=["k", "v"], shape_and_slices=["4 0,2", "4 1 0,2:-"],
                      tensors=[tf.constant([5, 6], tf.int64), tf.ones([2, 1])])
    with pytest.raises(errors, match="the checkpoint's slices of k end at row 2 of its 4"):
        restore(short, [table.resource_handle], ["k", "v", ""], [1])
    assert table.lookup([1]).numpy().tolist() == [[1.0]]
    restore(prefix, [table.resource_handle], names[:2] + [""], [1])  # scores: the table's own
    assert table.lookup([1]).numpy().tolist() == [[1.0]]


def save_in_slices(name, tensor, rows):
    """SaveV2 arguments that store `tensor` under `name` as the row ranges `rows`
    (an empty list: stored whole)."""
    if not rows:
        return [name], [""], [tensor]
    shape = " ".join(str(d) for d in tensor.shape)
    rest = ":-" * (tensor.ndim - 1)
    return ([name] * len(rows), [f"{shape} {s},{e - s}{rest}" for s, e in rows],
            [tensor[s:e] for s, e in rows])


@pytest.mark.parametrize("value_rows", [[], [(0, 3), (3, 5)], [(0, 1), (1, 4), (4, 5)]],
                         ids=["values-whole", "values-other-slices", "values-three-slices"])
def test_restore_reads_tensors_sliced_unlike_the_keys(tmp_path, value_rows):
    # Other writers may store a table's tensors in different pieces: the rows a batch
    # reads from one stored slice of the keys then lie in no stored slice of the values
    # (or in a tensor stored whole), which the bundle's reader cuts out. A batch's later
    # ranges start at any row, so they are misaligned views of the batch's buffer.
    keys = np.array([5, 1, 9, 4, 7], np.int64)
    values = np.arange(15, dtype=np.float32).reshape(5, 3)
    prefix = str(tmp_path / "mixed")
    names, specs, tensors = (a + b for a, b in zip(save_in_slices("k", keys, [(0, 2), (2, 5)]),
                                                  save_in_slices("v", values, value_rows)))
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=specs, tensors=tensors)
    table = de.HashTable(tf.int64, tf.float32, [0.0, 0.0, 0.0])
    table.insert([100], [[1.0, 2.0, 3.0]])  # a filled table: the check pass reads it all first
    ops.dynemb_restore_tables_from_bundle(prefix, [table.resource_handle], ["k", "v", ""], [1])
    assert int(table.size()) == 5
    np.testing.assert_array_equal(table.lookup(keys).numpy(), values)


# Saves a 2-shard variable of 300k keys at dim 16 (24 MB in one or two data files: more
# than the direct writer's 8 MiB buffer, so full buffers, the helper thread and the
# padded last block all run) into argv[1], restores it into 3 shards, checks the rows.
SAVE_AND_RESTORE = """
import sys
import numpy as np
import tensorflow as tf
import tensorflow_dynemb as de
from tensorflow_dynemb.persistence import checkpoint
checkpoint._MIN_ROWS_PER_FILE = 100000  # two files, where there are two cores
v = de.Variable(tf.int64, tf.float32, dim=16, devices=["/CPU:0"] * 2, name="emb")
keys = np.arange(1, 300001, dtype=np.int64) * 7919
v.upsert(keys, np.arange(300000 * 16, dtype=np.float32).reshape(300000, 16))
prefix = tf.train.Checkpoint(v=v).write(sys.argv[1] + "/ck")
restored = de.Variable(tf.int64, tf.float32, dim=16, devices=["/CPU:0"] * 3, name="emb")
tf.train.Checkpoint(v=restored).read(prefix).assert_consumed()
np.testing.assert_array_equal(restored.lookup(keys).numpy(), v.lookup(keys).numpy())
"""


def resident_pages(path):
    """How many of the file's pages are in the page cache (mincore on a mapping)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec)


def takes_direct_io(directory):
    try:
        fd = os.open(os.path.join(directory, "probe"), os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True


@pytest.mark.slow  # two processes each writing a checkpoint of tens of MiB
def test_direct_and_buffered_saves_write_the_same_bytes(tmp_path, monkeypatch):
    if not takes_direct_io(str(tmp_path)):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT (the buffered path runs)")
    script = tmp_path / "save_and_restore.py"
    script.write_text(SAVE_AND_RESTORE)
    for setting in ("1", "0"):
        (tmp_path / setting).mkdir()
        monkeypatch.setenv("DYNEMB_DIRECT_IO", setting)
        run_python(str(script), str(tmp_path / setting))
    names = sorted(os.listdir(tmp_path / "1"))
    assert names == sorted(os.listdir(tmp_path / "0"))
    # The streamed data files never went through the page cache (checked before the
    # comparison below reads them).
    streamed = [n for n in names if os.path.getsize(tmp_path / "1" / n) > 8 << 20]
    assert streamed
    assert [resident_pages(tmp_path / "1" / n) for n in streamed] == [0] * len(streamed)
    assert all(resident_pages(tmp_path / "0" / n) > 0 for n in streamed)
    for name in names:
        direct, buffered = (open(tmp_path / d / name, "rb").read() for d in ("1", "0"))
        assert direct == buffered, name


@pytest.mark.parametrize("scheme", ["file://", "ram://"])
def test_paths_with_a_scheme(tmp_path, scheme):
    # file:// is the local file system (direct I/O); other schemes (here TF's in-memory
    # file system) go to their own file system unchanged.
    v, keys, values = filled_variable(2, 1000)
    where = f"file://{tmp_path}/ck" if scheme == "file://" else f"ram://{tmp_path.name}/ck"
    prefix = tf.train.Checkpoint(v=v).write(where)
    restored = de.Variable(tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * 3, name="emb")
    tf.train.Checkpoint(v=restored).read(prefix).assert_consumed()
    np.testing.assert_array_equal(restored.lookup(keys).numpy(), values)
