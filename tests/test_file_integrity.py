"""File saves and loads never lose or mix data (issue 25).

Each numbered case of the issue, as an operator would meet it: a truncated,
bit-flipped, swapped or foreign file, a save killed at random moments, and what
killed saves leave behind. Every failed load must leave the table or variable
exactly as it was; every load that succeeds must give one whole save.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import REPO_ROOT

KILL_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_kill_worker.py")


def sharded(shards, name="emb", dim=3, **kwargs):
    return de.Variable(tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * shards, name=name,
                       **kwargs)


def content(obj):
    """Sorted (key, row) pairs, and for a variable the size of each shard."""
    keys, values = obj.export()
    rows = sorted(zip(keys.numpy().tolist(), values.numpy().tolist()))
    shards = [int(obj.size(i)) for i in range(obj.shard_num)] if hasattr(obj, "shard_num") else []
    return rows, shards


def manifest_files(directory, prefix):
    """{shard: file name} of the generation `directory/<prefix>.dynemb-manifest` names."""
    text = open(os.path.join(directory, prefix + ".dynemb-manifest")).read()
    return {int(line.split()[1]): line.split()[2] for line in text.splitlines()
            if line.startswith("file ")}


def flip_bit(path, offset, bit=0):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 1 << bit
    open(path, "wb").write(bytes(data))


def saved_variable(directory, shards=3, keys=3000, name="emb", seed=0):
    rng = np.random.default_rng(seed)
    var = sharded(shards, name=name)
    var.upsert(np.arange(keys, dtype=np.int64) + seed * 100_000,
               rng.standard_normal((keys, 3)).astype(np.float32))
    var.save_to_file_system(str(directory), chunk_rows=256)
    return var


def loaded_target(shards, name="emb"):
    """A variable holding 500 keys of its own, which a failed load must keep."""
    var = sharded(shards, name=name)
    var.upsert(np.arange(500, dtype=np.int64) + 10**9, np.full([500, 3], 7.0, np.float32))
    return var


# ----------------------------------------------------------------------------------------
# 1. A failed load changes nothing, whichever shard's file fails.
# ----------------------------------------------------------------------------------------


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) * 2 // 3])


DAMAGE = {
    "truncated": (_truncate, tf.errors.DataLossError),
    "flipped_bit": (lambda p: flip_bit(p, os.path.getsize(p) // 2, 3), tf.errors.DataLossError),
    "deleted": (os.remove, tf.errors.NotFoundError),
}


@pytest.mark.parametrize("loaded_shards", [3, 2])
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_failed_load_leaves_every_shard_unchanged(tmp_path, damage, loaded_shards):
    saved_variable(tmp_path)
    last = tmp_path / manifest_files(tmp_path, "emb")[2]
    hurt, error = DAMAGE[damage]
    hurt(str(last))
    target = loaded_target(loaded_shards)
    before = content(target)
    with pytest.raises(error, match=last.name):
        target.load_from_file_system(str(tmp_path))
    assert content(target) == before  # shards 0 and 1 loaded fine, and were not kept


def test_a_damaged_manifest_is_data_loss(tmp_path):
    saved_variable(tmp_path)
    manifest = tmp_path / "emb.dynemb-manifest"
    text = manifest.read_text().replace("dim 3", "dim 4")
    manifest.write_text(text)
    target = loaded_target(3)
    before = content(target)
    with pytest.raises(tf.errors.DataLossError, match="manifest is damaged: checksum mismatch"):
        target.load_from_file_system(str(tmp_path))
    assert content(target) == before


def test_a_failed_load_in_place_still_checks_everything_first(tmp_path):
    var = saved_variable(tmp_path)
    target = loaded_target(3)
    target.load_from_file_system(str(tmp_path), in_place=True)
    assert content(target)[0] == content(var)[0]
    _truncate(str(tmp_path / manifest_files(tmp_path, "emb")[1]))
    target = loaded_target(3)
    before = content(target)
    for clear in (True, False):  # a replacing load and an upsert alike
        with pytest.raises(tf.errors.DataLossError):
            target.load_from_file_system(str(tmp_path), in_place=True, clear=clear)
        assert content(target) == before


@pytest.mark.parametrize("sync", [True, False])
def test_unsynced_saves_are_generations_too(tmp_path, sync):
    var = saved_variable(tmp_path / "old")
    var.save_to_file_system(str(tmp_path), sync=sync)
    var.save_to_file_system(str(tmp_path), sync=sync)  # replaces the first
    assert len(os.listdir(tmp_path)) == 5  # "old", the manifest and 3 files
    target = loaded_target(2)
    target.load_from_file_system(str(tmp_path))
    assert content(target)[0] == content(var)[0]
    table = var.tables[0]
    table.save_to_file_system(str(tmp_path), "t.dynemb", sync=sync)
    other = de.HashTable(tf.int64, tf.float32, [0.0] * 3)
    other.load_from_file_system(str(tmp_path), "t.dynemb")
    assert content(other)[0] == content(table)[0]


# ----------------------------------------------------------------------------------------
# 2. A file of another save is never loaded with this one.
# ----------------------------------------------------------------------------------------


def test_a_file_of_another_save_in_its_place_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    saved_variable(a, seed=1)
    saved_variable(b, seed=2)
    # b's shard 1 copied over a's shard 1 file (the name a's manifest gives).
    shutil.copy(b / manifest_files(b, "emb")[1], a / manifest_files(a, "emb")[1])
    target = loaded_target(3)
    before = content(target)
    with pytest.raises(tf.errors.DataLossError):
        target.load_from_file_system(str(a))
    assert content(target) == before


def test_files_no_manifest_names_are_ignored_then_deleted(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    var_a = saved_variable(a, seed=1)
    saved_variable(b, seed=2)
    stray = b / manifest_files(b, "emb")[0]
    shutil.copy(stray, a / stray.name)  # another save's file beside a's generation
    target = loaded_target(3)
    target.load_from_file_system(str(a))
    assert content(target) == content(var_a)
    var_a.save_to_file_system(str(a))  # the next save of the prefix deletes it
    assert not (a / stray.name).exists()
    assert sorted(os.listdir(a)) == sorted(["emb.dynemb-manifest"] + list(manifest_files(a, "emb").values()))


# ----------------------------------------------------------------------------------------
# 3. Every block is checksummed.
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["header", "block_head", "payload", "footer"])
def test_a_flipped_bit_in_a_table_file_is_data_loss_naming_file_and_offset(tmp_path, where):
    source = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    source.insert(np.arange(5000, dtype=np.int64), np.ones([5000, 2], np.float32))
    source.save_to_file_system(str(tmp_path), "t.dynemb", chunk_rows=1000)
    path = tmp_path / "t.dynemb"
    size = os.path.getsize(path)
    offset = {"header": 40, "block_head": 64 + 3, "payload": size // 2, "footer": size - 5}[where]
    flip_bit(path, offset, 6)
    target = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    target.insert([-1], [[2.0, 3.0]])
    with pytest.raises(tf.errors.DataLossError, match=r"t\.dynemb: .*byte \d+"):
        target.load_from_file_system(str(tmp_path), "t.dynemb")
    assert content(target)[0] == [(-1, [2.0, 3.0])]


def test_a_flipped_bit_in_a_shard_file_is_data_loss(tmp_path):
    saved_variable(tmp_path)
    shard1 = tmp_path / manifest_files(tmp_path, "emb")[1]
    flip_bit(shard1, os.path.getsize(shard1) // 3, 1)
    target = loaded_target(3)
    before = content(target)
    with pytest.raises(tf.errors.DataLossError, match=f"{shard1.name}: checksum mismatch"):
        target.load_from_file_system(str(tmp_path))
    assert content(target) == before


# ----------------------------------------------------------------------------------------
# 4. Swapped shard files: keys in a shard that does not own them.
# ----------------------------------------------------------------------------------------


def test_swapped_shard_files_are_refused(tmp_path):
    saved_variable(tmp_path)
    names = manifest_files(tmp_path, "emb")
    os.rename(tmp_path / names[0], tmp_path / "swap")
    os.rename(tmp_path / names[1], tmp_path / names[0])
    os.rename(tmp_path / "swap", tmp_path / names[1])
    target = loaded_target(3)
    before = content(target)
    with pytest.raises(tf.errors.DataLossError):
        target.load_from_file_system(str(tmp_path))
    assert content(target) == before


# Version 1 files (the format before checksums and manifests), written byte for byte
# as this package wrote them: this writer's output was checked identical to files the
# version 1 code saved (int64 and string keys, several chunks, a variable's shards).
V1_KEY_TYPES = {tf.int32: (0, "<i4"), tf.int64: (1, "<i8"), tf.string: (2, None)}
V1_VALUE_TYPES = {tf.float32: (0, "<f4"), tf.float64: (1, "<f8")}


def write_v1(path, key_dtype, value_dtype, dim, chunks, version=1):
    """A version 1 table file of `chunks`: lists of (key, score, row)."""
    kt, kfmt = V1_KEY_TYPES[key_dtype]
    vt, vfmt = V1_VALUE_TYPES[value_dtype]
    out = [b"DYNEMB\x00\x01", struct.pack("<IIIIq", version, kt, vt, 0, dim)]
    total = 0
    for chunk in chunks:
        out.append(struct.pack("<Q", len(chunk)))
        for key, score, row in chunk:
            if kfmt is None:
                out.append(struct.pack("<I", len(key)) + key)
            else:
                out.append(np.array([key], kfmt).tobytes())
            out.append(struct.pack("<Q", score))
            out.append(np.asarray(row, vfmt).tobytes())
        total += len(chunk)
    out.append(struct.pack("<QQ", 0, total))
    with open(path, "wb") as f:
        f.write(b"".join(out))


def write_v1_variable(directory, prefix, shards, keys, swap=False):
    """A version 1 save of a variable: key k with row [k, -k, 1] in the shard
    default_partition_fn gives it, chunks of 7 rows; `swap` exchanges files 0 and 1."""
    routed = de.default_partition_fn(tf.constant(keys, tf.int64), shards).numpy()
    for i in range(shards):
        rows = [(int(k), 5, [float(k), -float(k), 1.0]) for k in keys[routed == i]]
        index = {0: 1, 1: 0}.get(i, i) if swap else i
        write_v1(os.path.join(directory, f"{prefix}-{index:05d}-of-{shards:05d}.dynemb"),
                 tf.int64, tf.float32, 3, [rows[j : j + 7] for j in range(0, len(rows), 7)])


@pytest.mark.parametrize("loaded_shards", [3, 2, 1])
def test_version_1_saves_still_load(tmp_path, loaded_shards):
    keys = np.arange(-50, 250, dtype=np.int64)
    write_v1_variable(tmp_path, "old", 3, keys)
    var = sharded(loaded_shards, name="old")
    var.load_from_file_system(str(tmp_path))
    rows, _ = content(var)
    assert rows == [(int(k), [float(k), -float(k), 1.0]) for k in sorted(keys)]
    # A save replaces the version 1 files with a generation.
    var.save_to_file_system(str(tmp_path))
    names = sorted(os.listdir(tmp_path))
    assert names == sorted(["old.dynemb-manifest"] + list(manifest_files(tmp_path, "old").values()))


def test_version_1_table_files_still_load(tmp_path):
    write_v1(tmp_path / "s.dynemb", tf.string, tf.float64, 1,
             [[(b"", 3, [1.0]), (b"a", 4, [2.0])], [(b"\xff\x00", 5, [3.0])]])
    table = de.HashTable(tf.string, tf.float64, [0.0])
    table.load_from_file_system(str(tmp_path), "s.dynemb")
    keys, values, scores = table.export_with_scores()
    got = sorted(zip(keys.numpy().tolist(), values.numpy()[:, 0].tolist(), scores.numpy().tolist()))
    assert got == [(b"", 1.0, 3), (b"a", 2.0, 4), (b"\xff\x00", 3.0, 5)]


def test_swapped_version_1_files_are_refused(tmp_path):
    write_v1_variable(tmp_path, "old", 3, np.arange(300, dtype=np.int64), swap=True)
    target = loaded_target(3, name="old")
    before = content(target)
    with pytest.raises(tf.errors.DataLossError, match="belongs to shard"):
        target.load_from_file_system(str(tmp_path))
    assert content(target) == before


def test_an_incomplete_version_1_set_is_refused(tmp_path):
    write_v1_variable(tmp_path, "old", 3, np.arange(300, dtype=np.int64))
    os.remove(tmp_path / "old-00002-of-00003.dynemb")
    with pytest.raises(tf.errors.InvalidArgumentError, match="incomplete or mixed"):
        sharded(3, name="old").load_from_file_system(str(tmp_path))


def test_a_newer_format_is_refused_naming_its_version(tmp_path):
    write_v1(tmp_path / "t.dynemb", tf.int64, tf.float32, 3, [[(1, 0, [1.0, 2.0, 3.0])]],
             version=4)
    table = de.HashTable(tf.int64, tf.float32, [0.0, 0.0, 0.0])
    with pytest.raises(tf.errors.FailedPreconditionError, match="version 4 is not supported"):
        table.load_from_file_system(str(tmp_path), "t.dynemb")
    saved_variable(tmp_path)
    manifest = tmp_path / "emb.dynemb-manifest"
    manifest.write_text(manifest.read_text().replace("manifest 1", "manifest 2"))
    with pytest.raises(tf.errors.DataLossError, match="checksum"):
        loaded_target(3).load_from_file_system(str(tmp_path))


# ----------------------------------------------------------------------------------------
# 5. What killed saves leave is deleted by the next save of ours.
# ----------------------------------------------------------------------------------------


def test_a_save_deletes_what_killed_saves_of_its_prefix_left(tmp_path):
    var = saved_variable(tmp_path)
    dead = "0123456789abcdef"
    leftovers = [
        f"emb.dynemb-manifest.tmp-{dead}",  # a manifest being written
        f"emb-00000-of-00002.{dead}.dynemb",  # a data file no manifest names
        "emb-00001-of-00003.dynemb",  # version 1 files
        "emb-00001-of-00003.dynemb.tmp",
    ]
    kept = ["notes.txt", f"emb2-00000-of-00001.{dead}.dynemb", "emb_rank1_size2.dynemb-manifest"]
    for name in leftovers + kept:
        (tmp_path / name).write_bytes(b"x")
    var.save_to_file_system(str(tmp_path))
    generation = sorted(["emb.dynemb-manifest"] + list(manifest_files(tmp_path, "emb").values()))
    assert sorted(os.listdir(tmp_path)) == sorted(generation + kept)


def test_a_table_save_deletes_its_killed_saves_temporary_files(tmp_path):
    table = de.HashTable(tf.int64, tf.float32, [0.0])
    table.insert([1], [[1.0]])
    for name in ["t.dynemb.tmp-0123456789abcdef", "t.dynemb.tmp", "u.dynemb.tmp-0123456789abcdef"]:
        (tmp_path / name).write_bytes(b"x")
    table.save_to_file_system(str(tmp_path), "t.dynemb")
    assert sorted(os.listdir(tmp_path)) == ["t.dynemb", "u.dynemb.tmp-0123456789abcdef"]


def test_a_checkpoint_save_deletes_bundles_killed_saves_left(tmp_path):
    var = sharded(1, name="ckpt_var")
    var.upsert([1, 2], np.ones([2, 3], np.float32))
    leftovers = [f"ckpt-1-tensorflow_dynemb.tables_{kind}0.{ext}"
                 for kind in ("stream", "export") for ext in ("index", "data-00000-of-00001")]
    for name in leftovers:
        (tmp_path / name).write_bytes(b"x")
    prefix = tf.train.Checkpoint(v=var).write(str(tmp_path / "ckpt-2"))
    assert not any(name.startswith("ckpt-1") for name in os.listdir(tmp_path))
    restored = sharded(1, name="ckpt_var")
    tf.train.Checkpoint(v=restored).read(prefix).assert_consumed()
    assert content(restored)[0] == content(var)[0]


# ----------------------------------------------------------------------------------------
# 2 and 5 together: kill -9 during saves.
# ----------------------------------------------------------------------------------------


def _generations_of(rows):
    return {row[0] for _, row in rows}


# What a kill at a random moment leaves is decided by our writer and its commit order,
# not by TensorFlow's version: CI runs these 20 processes with its first TensorFlow.
@pytest.mark.once_in_ci
def test_saves_killed_at_random_moments_leave_one_whole_generation(tmp_path):
    """A process saving a 3-shard variable in a loop is killed (SIGKILL) at random
    moments, 20 times; after each kill, a load gives exactly one whole generation,
    and the directory holds at most one save besides the committed one (the one the
    kill interrupted, or the one being replaced)."""
    num_keys = 120_000
    rng = random.Random(25)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    interrupted = 0
    last_generation = 0
    for kill in range(20):
        first = (kill + 1) * 1000
        proc = subprocess.Popen(
            [sys.executable, KILL_WORKER, str(tmp_path), str(first), str(num_keys)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=REPO_ROOT,
        )
        try:
            line = proc.stdout.readline()  # the first save is complete
            assert line.startswith("saved"), f"the worker did not save: {line!r}"
            time.sleep(rng.uniform(0.0, 0.8))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        completed = [int(l.split()[1]) for l in [line] + proc.stdout.read().splitlines()
                     if l.startswith("saved")]
        proc.stdout.close()
        names = os.listdir(tmp_path)
        save_ids = {n.split(".")[1] for n in names if n.endswith(".dynemb")}
        assert len(save_ids) <= 2, names
        interrupted += len(save_ids) == 2 or any(".tmp-" in n for n in names)

        var = sharded(3 if kill % 2 == 0 else 2, name="killed", dim=4)
        var.load_from_file_system(str(tmp_path))
        rows, _ = content(var)
        (generation,) = _generations_of(rows)  # one generation, whichever it is
        assert generation >= max(completed) and generation >= last_generation
        assert rows == [(k, [generation, float(k), generation, -float(k)]) for k in range(num_keys)]
        last_generation = generation
    assert interrupted > 0, "no kill landed inside a save"
    # A save after the kills leaves exactly its own generation.
    var.save_to_file_system(str(tmp_path))
    generation = ["killed.dynemb-manifest"] + list(manifest_files(tmp_path, "killed").values())
    assert sorted(os.listdir(tmp_path)) == sorted(generation)
