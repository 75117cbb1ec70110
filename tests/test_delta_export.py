"""de.DeltaExporter (tensorflow_dynemb/serving/delta_exporter.py): what each
generation holds (a base, then only the rows changed and the keys removed or evicted
since the previous write), its size against the bound of issue 28, integrity (damaged
files, gaps, writes killed at random moments), and a restarted trainer continuing the
sequence. Applying is tested through de.serving.DeltaUpdater on live variables here;
tests/test_delta_serving.py serves a loaded SavedModel in another process.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILL_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "delta_kill_worker.py")


def content(var):
    keys, values = var.export()
    return {int(k): tuple(v) for k, v in zip(keys.numpy(), values.numpy().tolist())}


def manifests(directory):
    """{sequence: [(item, role, shard, name, bytes, rows)]} of the newest base."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".dynemb-delta"):
            continue
        sequence = int(name.split("-")[2].split(".")[0])
        files = []
        with open(os.path.join(directory, name)) as f:
            for line in f:
                fields = line.split()
                if fields[0] == "file":
                    files.append((int(fields[1]), fields[2], int(fields[3]), fields[4],
                                  int(fields[5]), int(fields[6])))
        out[sequence] = files
    return out


def roles(files):
    totals = {}
    for _, role, _, _, _, rows in files:
        totals[role] = totals.get(role, 0) + rows
    return totals


def served_copy(name, shards=1, dim=2, **kwargs):
    return de.Variable(tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * shards, name=name,
                       **kwargs)


def test_base_then_only_what_changed(tmp_path):
    emb = served_copy("emb", shards=2)
    exporter = de.DeltaExporter(emb, str(tmp_path))
    keys = np.arange(1000, dtype=np.int64)
    emb.upsert(keys, np.stack([keys, -keys], axis=1).astype(np.float32))
    assert exporter.write() == 0
    emb.upsert(keys[:30], np.full((30, 2), 7.0, np.float32))  # 30 changed
    emb.upsert(np.arange(5000, 5010), np.ones((10, 2), np.float32))  # 10 new
    emb.remove(keys[500:520])  # 20 removed
    emb.remove(np.arange(9000, 9005))  # absent: nothing
    emb.lookup(keys[:900])  # reads are no changes
    assert exporter.write() == 1
    assert exporter.write() == 2  # nothing changed: an empty delta
    found = manifests(tmp_path)
    assert sorted(found) == [0, 1, 2]
    assert roles(found[0]) == {"full": 1000}
    assert roles(found[1]) == {"rows": 40, "removed": 20}
    assert roles(found[2]) == {"rows": 0, "removed": 0}
    served = served_copy("emb", shards=3)  # another number of shards reads them too
    updater = de.serving.DeltaUpdater(served, str(tmp_path))
    assert updater.apply() == 3
    assert content(served) == content(emb)
    assert updater.apply() == 0


def test_evictions_are_tombstones_and_sizes_keep_the_bound(tmp_path):
    """A bounded HkvHashTable that evicts: the evicted keys travel as tombstones, and
    a delta's bytes stay within 1.1 x (rows x row bytes + removed x key bytes) plus a
    fixed header per file."""
    dim = 8
    emb = served_copy("emb", dim=dim, kv_creator=de.HkvHashTableCreator(
        de.HkvHashTableConfig(init_capacity=4096, max_capacity=4096)))
    exporter = de.DeltaExporter(emb, str(tmp_path))
    rng = np.random.default_rng(3)
    served = served_copy("emb", dim=dim, shards=2)
    updater = de.serving.DeltaUpdater(served, str(tmp_path))
    evicted_total = 0
    for round_ in range(5):
        keys = rng.choice(20000, 3000, replace=False).astype(np.int64)
        before = content(emb)
        emb.upsert(keys, rng.standard_normal((3000, dim)).astype(np.float32))
        after = content(emb)
        sequence = exporter.write()
        assert updater.apply() == 1
        assert content(served) == after
        if sequence == 0:
            continue
        files = manifests(tmp_path)[sequence]
        totals = roles(files)
        gone = set(before) - set(after)
        evicted_total += len(gone)
        assert totals["removed"] == len(gone)
        changed = sum(1 for k, v in after.items() if before.get(k) != v)
        assert totals["rows"] == changed
        nbytes = sum(f[4] for f in files)
        bound = 1.1 * (changed * (8 + 4 * dim) + len(gone) * 8) + 2 * 256
        assert nbytes <= bound, (nbytes, bound)
    assert evicted_total > 0, "the table never evicted"
    # Evicted keys read the default in the served copy.
    absent = np.array(sorted(set(range(20000)) - set(content(emb))), np.int64)[:100]
    assert not served.lookup(absent, return_exists=True)[1].numpy().any()


def test_dense_variables_travel_with_the_tables(tmp_path):
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.emb = served_copy("model_emb")
            self.bias = tf.Variable([1.0, 2.0])

    model = Model()
    model.emb.upsert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    de.DeltaExporter(model, str(tmp_path / "plain")).write()
    lines = open(tmp_path / "plain" / "delta-000001-00000000.dynemb-delta").read().splitlines()
    assert [l.split()[0] for l in lines if l.split()[0] in ("table", "dense")] == ["table", "dense"]
    model.bias.assign([5.0, 6.0])
    exporter = de.DeltaExporter(model, str(tmp_path / "plain"))
    served = Model()
    updater = de.serving.DeltaUpdater(served, str(tmp_path / "plain"))
    exporter.write()
    assert updater.apply() == 2
    np.testing.assert_array_equal(served.bias.numpy(), [5.0, 6.0])


def test_damaged_files_and_gaps_are_errors_that_change_nothing(tmp_path):
    emb = served_copy("emb")
    exporter = de.DeltaExporter(emb, str(tmp_path))
    emb.upsert(np.arange(100), np.ones((100, 2), np.float32))
    exporter.write()
    emb.upsert(np.arange(50), np.full((50, 2), 2.0, np.float32))
    exporter.write()
    served = served_copy("emb")
    updater = de.serving.DeltaUpdater(served, str(tmp_path))
    assert updater.apply(max_generations=1) == 1
    before = content(served)
    (rows_file,) = [f for f in manifests(tmp_path)[1] if f[1] == "rows"]
    path = tmp_path / rows_file[3]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        updater.apply()
    assert content(served) == before
    # A gap: sequence 1 missing while 2 is there.
    emb.upsert([7], [[7.0, 7.0]])
    exporter.write()
    os.remove(tmp_path / "delta-000001-00000001.dynemb-delta")
    with pytest.raises(tf.errors.DataLossError, match="gap"):
        updater.apply()
    assert content(served) == before


def test_a_restarted_trainer_continues_the_sequence(tmp_path):
    """A new exporter (a restarted trainer, its variable restored from a checkpoint
    into another number of shards) continues the directory's base and numbering: its
    first write replaces the tables' content, the next ones are deltas again."""
    emb = served_copy("emb", shards=2)
    exporter = de.DeltaExporter(emb, str(tmp_path))
    emb.upsert(np.arange(200), np.ones((200, 2), np.float32))
    exporter.write()
    emb.upsert(np.arange(10), np.full((10, 2), 3.0, np.float32))
    exporter.write()
    checkpoint = tf.train.Checkpoint(emb=emb)
    path = checkpoint.write(str(tmp_path / "ckpt" / "c"))

    restarted = served_copy("emb", shards=3)
    tf.train.Checkpoint(emb=restarted).read(path).assert_consumed()
    again = de.DeltaExporter(restarted, str(tmp_path))
    assert again.sequence == 1 and again.base_id == exporter.base_id
    restarted.remove(np.arange(150, 200))
    assert again.write() == 2
    assert roles(manifests(tmp_path)[2]) == {"full": 150}  # unknown changes: whole
    restarted.upsert([5], [[9.0, 9.0]])
    assert again.write() == 3
    assert roles(manifests(tmp_path)[3]) == {"rows": 1, "removed": 0}
    served = served_copy("emb", shards=2)
    updater = de.serving.DeltaUpdater(served, str(tmp_path))
    assert updater.apply() == 4
    assert content(served) == content(restarted)


def test_rebase_every_starts_a_new_base_and_deletes_the_old(tmp_path):
    emb = served_copy("emb")
    exporter = de.DeltaExporter(emb, str(tmp_path), rebase_every=2)
    served = served_copy("emb")
    updater = None
    for i in range(5):
        emb.upsert([i], [[float(i), float(i)]])
        exporter.write()
        if updater is None:
            updater = de.serving.DeltaUpdater(served, str(tmp_path))
        updater.apply()
        assert content(served) == content(emb)
    names = os.listdir(tmp_path)
    assert all(n.startswith("delta-000002-") for n in names), names


def _rows_at(generation, num_keys):
    """The worker's table at `generation` (tests/delta_kill_worker.py)."""
    k = np.arange(num_keys)
    present = (k + generation) % 5 != 0
    last = generation - ((generation - k) % 4)
    return {int(key): (float(g), float(key)) for key, g, p in zip(k, last, present) if p}


# What a kill at a random moment leaves is decided by our writer and its commit order,
# not by TensorFlow's version: CI runs this minute-long test with its first TensorFlow.
@pytest.mark.once_in_ci
def test_writes_killed_at_random_moments_leave_whole_generations(tmp_path):
    """A trainer writing deltas in a loop is killed (SIGKILL) at random moments; after
    each kill a served copy that applies the directory holds exactly the table of one
    generation the trainer reached (never part of a delta), its sequence has no gap,
    and the next trainer continues it. A write after the kills leaves only the files
    its manifests name."""
    num_keys = 60_000
    rng = random.Random(28)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    served = served_copy("killed", shards=3)
    step = tf.Variable(-1.0)
    module = tf.Module()
    module.emb, module.step = served, step
    updater = None
    interrupted, last = 0, -1
    for kill in range(8):
        first = (kill + 1) * 100
        proc = subprocess.Popen(
            [sys.executable, KILL_WORKER, str(tmp_path), str(first), str(num_keys)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
        try:
            line = proc.stdout.readline()
            assert line.startswith("wrote"), f"the worker wrote nothing: {line!r} {proc.stderr.read()}"
            time.sleep(rng.uniform(0.0, 1.0))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        completed = [int(l.split()[2]) for l in [line] + proc.stdout.read().splitlines()
                     if l.startswith("wrote")]
        proc.stdout.close()
        proc.stderr.close()
        names = os.listdir(tmp_path)
        interrupted += any(".tmp-" in n for n in names) or any(
            n.split(".")[1] not in {open(tmp_path / m).read().split("save_id ")[1][:16]
                                    for m in names if m.endswith(".dynemb-delta")}
            for n in names if n.endswith(".dynemb"))
        if updater is None:
            updater = de.serving.DeltaUpdater(module, str(tmp_path))
        updater.apply()
        generation = int(step.numpy())
        assert generation >= max(completed) and generation >= last
        assert content(served) == _rows_at(generation, num_keys)
        last = generation
    assert interrupted > 0, "no kill landed inside a write"
    module.emb = served_copy("killed", shards=2)
    module.emb.upsert(list(_rows_at(last, num_keys)), list(_rows_at(last, num_keys).values()))
    module.step = tf.Variable(float(last))
    de.DeltaExporter(module, str(tmp_path)).write()
    named = {"delta-000001-%08d.dynemb-delta" % s for s in manifests(tmp_path)}
    named |= {f[3] for files in manifests(tmp_path).values() for f in files}
    assert sorted(os.listdir(tmp_path)) == sorted(named), (sorted(set(os.listdir(tmp_path)) - named), sorted(named - set(os.listdir(tmp_path))))


def test_optimizer_slots_only_when_asked(tmp_path):
    import keras

    ids = keras.Input(shape=(1,), dtype="int64")
    layer = de.keras.layers.Embedding(2, name="slotted")
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Flatten()(layer(ids))))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.1)),
                  loss="mse", jit_compile=False)
    model.fit(np.arange(8).reshape(8, 1), np.ones((8, 1)), verbose=0)

    def table_lines(directory):
        with open(os.path.join(directory, "delta-000001-00000000.dynemb-delta")) as f:
            return [line.split()[1] for line in f if line.startswith("table ")]

    de.DeltaExporter(model, str(tmp_path / "serving")).write()
    de.DeltaExporter(model, str(tmp_path / "slots"), include_slots=True).write()
    assert len(table_lines(tmp_path / "serving")) == 1
    with_slots = table_lines(tmp_path / "slots")
    assert len(with_slots) > 1 and table_lines(tmp_path / "serving")[0] in with_slots
    slot_rows = [f[5] for f in manifests(tmp_path / "slots")[0] if f[0] == 1]
    assert slot_rows == [8]  # the slot rows of the 8 keys trained
    # Slot tables track no changes (training state): a delta writes them whole.
    exporter = de.DeltaExporter(model, str(tmp_path / "slots"), include_slots=True)
    model.fit(np.arange(8, 10).reshape(2, 1), np.ones((2, 1)), verbose=0)
    exporter.write()
    delta = manifests(tmp_path / "slots")[1]
    tables = lambda files: {(f[0], f[1]) for f in files if f[1] != "dense"}  # noqa: E731
    assert tables(delta) == {(0, "full"), (1, "full")}  # a new exporter
    exporter.write()
    delta = manifests(tmp_path / "slots")[2]
    assert tables(delta) == {(0, "rows"), (0, "removed"), (1, "full")}
    assert [f[5] for f in delta if f[0] == 1] == [10]


def test_untracked_tables_are_written_whole(tmp_path):
    emb = served_copy("emb", kv_creator=de.HashTableCreator(track_changes=False))
    exporter = de.DeltaExporter(emb, str(tmp_path))
    emb.upsert(np.arange(100), np.ones((100, 2), np.float32))
    exporter.write()
    emb.upsert([1], [[4.0, 4.0]])
    emb.remove([2])
    exporter.write()
    assert roles(manifests(tmp_path)[1]) == {"full": 99}
    served = served_copy("emb")
    assert de.serving.DeltaUpdater(served, str(tmp_path)).apply() == 2
    assert content(served) == content(emb)
