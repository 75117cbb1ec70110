"""Table scenarios that need a fresh process; run by the table tests, not by pytest.

    python tests/tables_worker.py graph WORKDIR
        TF1 graph mode (`tf.compat.v1.disable_eager_execution()` is process-global):
        basic ops in a Session, errors, files, and a `tf.compat.v1.train.Saver` round
        trip restored into a new graph and session.
    python tests/tables_worker.py eager-restore CHECKPOINT_PREFIX
        Restores a `tf.train.Checkpoint` written by another process.

Prints one JSON object on the last line of stdout: {scenario: result}. A scenario that
raises records {"error": traceback} instead; the tests assert on the values.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np
import tensorflow as tf

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, (bytes, np.bytes_)):
        return bytes(x).decode("latin-1")
    if isinstance(x, np.generic):
        return x.item()
    return x


def entries(keys, values, scores=None):
    """{key: [value row, score]} from exported arrays."""
    values = np.asarray(values)
    if values.dtype.kind == "V" or values.dtype == np.float16:  # bfloat16, float16
        values = values.astype(np.float32)
    out = {}
    for i, k in enumerate(keys.tolist()):
        k = k.decode("latin-1") if isinstance(k, bytes) else k
        out[k] = [np.asarray(values[i]).tolist(), None if scores is None else int(scores[i])]
    return out


# ----------------------------------------------------------------------------------------
# TF1 graph mode
# ----------------------------------------------------------------------------------------


@scenario
def graph_basic(workdir):
    import tensorflow_dynemb as de

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        table = de.HashTable(tf.int64, tf.float32, [-1.0, -1.0, -1.0])
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        values = tf.compat.v1.placeholder(tf.float32, [None, 3])
        exists = tf.compat.v1.placeholder(tf.bool, [None])
        insert = table.insert(keys, values)
        looked_up, found = table.lookup(keys, return_exists=True)
        accum = table.accum(keys, values, exists)
        remove = table.remove(keys)
        size = table.size()
        exported = table.export()
        clear = table.clear()
        static = table.lookup(tf.constant([[1, 2], [3, 9]], tf.int64))  # rank-2 keys
        assert static.shape.as_list() == [2, 2, 3], static.shape

        result = {"name": table.name}
        sess.run(insert, {keys: [1, 2, 3, -1], values: np.arange(12).reshape(4, 3)})
        result["size_after_insert"] = sess.run(size)
        v, e = sess.run([looked_up, found], {keys: [2, 5, -1]})
        result["lookup"] = [v, e]
        result["rank2_lookup"] = sess.run(static)
        sess.run(accum, {keys: [1, 7, 1], values: np.ones((3, 3)), exists: [True, False, True]})
        sess.run(remove, {keys: [3, 100]})
        result["export"] = entries(*sess.run(exported))
        sess.run(clear)
        result["size_after_clear"] = sess.run(size)
    return result


@scenario
def graph_hkv_string_keys(workdir):
    import tensorflow_dynemb as de

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        config = de.HkvHashTableConfig(
            init_capacity=16, max_capacity=128, evict_strategy=de.HkvEvictStrategy.CUSTOMIZED
        )
        table = de.HkvHashTable(tf.string, tf.int32, -7, config=config)
        sess.run(table.insert(["a", "", "b"], [1, 2, 3], scores=[30, 10, 20]))
        values = sess.run(table.lookup(tf.constant(["", "zz", "b"])))
        exported = entries(*sess.run(table.export_with_scores()))
    return {"lookup": values, "export": exported}


@scenario
def graph_eviction_and_stats(workdir):
    import tensorflow_dynemb as de

    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        config = de.HkvHashTableConfig(
            init_capacity=3, max_capacity=3, evict_strategy=de.HkvEvictStrategy.CUSTOMIZED
        )
        table = de.HkvHashTable(tf.int64, tf.float32, [0.0, 0.0], config=config)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        values = tf.compat.v1.placeholder(tf.float32, [None, 2])
        scores = tf.compat.v1.placeholder(tf.int64, [None])
        evict = table.insert_and_evict(keys, values, scores=scores)
        stats = table.stats()
        result["first"] = sess.run(
            evict, {keys: [1, 2, 3], values: [[1, 1], [2, 2], [3, 3]], scores: [10, 20, 30]}
        )
        sess.run(table.lookup(tf.constant([3, 9], tf.int64)))
        k, v, s = sess.run(evict, {keys: [4, 5], values: [[4, 4], [5, 5]], scores: [40, 50]})
        order = np.argsort(k)
        result["evicted"] = [k[order], v[order], s[order]]
        result["size"] = sess.run(table.size())
        result["stats"] = sess.run(stats)
        try:
            table.insert([7], [[7.0, 7.0]])
            result["customized_without_scores"] = "no error"
        except ValueError as e:
            result["customized_without_scores"] = f"ValueError: {e}"
    return result


@scenario
def graph_accum_and_evict(workdir):
    import tensorflow_dynemb as de

    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        config = de.HkvHashTableConfig(
            init_capacity=3, max_capacity=3, evict_strategy=de.HkvEvictStrategy.LFU
        )
        table = de.HkvHashTable(tf.int64, tf.float32, [0.0, 0.0], config=config)
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        deltas = tf.compat.v1.placeholder(tf.float32, [None, 2])
        exists = tf.compat.v1.placeholder(tf.bool, [None])
        evict = table.accum_and_evict(keys, deltas, exists)
        result["first"] = sess.run(
            evict, {keys: [1, 2, 3], deltas: [[1, 1], [2, 2], [3, 3]], exists: [False] * 3}
        )
        # LFU: 1 and 3 are accumulated (count 2), so the new key 4 evicts 2.
        k, v, s = sess.run(
            evict, {keys: [1, 3, 4], deltas: [[1, 1], [1, 1], [4, 4]], exists: [True, True, False]}
        )
        result["evicted"] = [k, v, s]
        result["size"] = sess.run(table.size())
    return result


@scenario
def graph_tables_with_default_names_are_distinct(workdir):
    import tensorflow_dynemb as de

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        a = de.HashTable(tf.int64, tf.float32, 0.0)
        b = de.HashTable(tf.int64, tf.float32, 0.0)
        sess.run(a.insert([1, 2], [1.0, 2.0]))
        return {"names": [a.name, b.name], "sizes": sess.run([a.size(), b.size()])}


@scenario
def graph_uncheckpointed_tables_are_distinct(workdir):
    import tensorflow_dynemb as de

    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        a = de.HashTable(tf.int64, tf.float32, 0.0, checkpoint=False)
        b = de.HashTable(tf.int64, tf.float32, 0.0, checkpoint=False)
        sess.run(a.insert([1, 2], [1.0, 2.0]))
        return {"sizes": sess.run([a.size(), b.size()])}


@scenario
def graph_errors(workdir):
    import tensorflow_dynemb as de

    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        table = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
        sess.run(table.insert([1, 2], [[1.0, 1.0], [2.0, 2.0]]))
        try:
            table.insert(tf.constant([3, 4], tf.int64), tf.zeros([2, 3]))
            result["static_shape"] = "no error"
        except ValueError as e:
            result["static_shape"] = ["ValueError", str(e)]
        try:
            table.insert(tf.constant([3], tf.int32), tf.zeros([1, 2]))
            result["key_dtype"] = "no error"
        except TypeError as e:
            result["key_dtype"] = ["TypeError", str(e)]
        keys = tf.compat.v1.placeholder(tf.int64, [None])
        values = tf.compat.v1.placeholder(tf.float32, None)
        insert = table.insert(keys, values)
        try:
            sess.run(insert, {keys: [3, 4], values: np.zeros((2, 5))})
            result["dynamic_shape"] = "no error"
        except tf.errors.InvalidArgumentError as e:
            result["dynamic_shape"] = ["InvalidArgumentError", e.message]
        result["export_after_errors"] = entries(*sess.run(table.export()))
    return result


@scenario
def graph_file_system(workdir):
    import tensorflow_dynemb as de

    dirpath = os.path.join(workdir, "graph_files")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        src = de.HashTable(tf.int32, tf.float16, [0.0, 0.0], name="gfile")
        sess.run(src.insert([5, 6], [[1.0, 2.0], [3.0, 4.0]]))
        sess.run(src.save_to_file_system(dirpath, chunk_rows=1))
        dst = de.HashTable(tf.int32, tf.float16, [0.0, 0.0], name="gfile_dst")
        sess.run(dst.insert([9], [[9.0, 9.0]]))
        sess.run(dst.load_from_file_system(dirpath, file_name="gfile.dynemb"))
        return {"files": sorted(os.listdir(dirpath)), "export": entries(*sess.run(dst.export()))}


def _build_saver_graph():
    import tensorflow_dynemb as de

    plain = de.HashTable(tf.int64, tf.float32, [0.0, 0.0], name="plain")
    config = de.HkvHashTableConfig(
        init_capacity=16, max_capacity=128, evict_strategy=de.HkvEvictStrategy.CUSTOMIZED
    )
    hkv = de.HkvHashTable(tf.string, tf.int64, -1, config=config, name="hkv")
    dense = tf.compat.v1.get_variable("dense", initializer=[1.0, 2.0])
    saver = tf.compat.v1.train.Saver()
    return plain, hkv, dense, saver


@scenario
def graph_saver_round_trip(workdir):
    prefix = os.path.join(workdir, "saver", "model.ckpt")
    result = {}
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        plain, hkv, dense, saver = _build_saver_graph()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(plain.insert([1, -2, 3], [[1.0, 1.5], [2.0, 2.5], [3.0, 3.5]]))
        sess.run(hkv.insert(["x", "", "y"], [10, 20, 30], scores=[7, 8, 9]))
        saved_path = saver.save(sess, prefix)
        result["saved"] = [
            entries(*sess.run(plain.export_with_scores())),
            entries(*sess.run(hkv.export_with_scores())),
        ]
        # Changes after the save are undone by a restore in the same session.
        sess.run(plain.insert([4], [[4.0, 4.0]]))
        sess.run(hkv.remove(["x"]))
        saver.restore(sess, saved_path)
        result["restored_same_session"] = [
            entries(*sess.run(plain.export_with_scores())),
            entries(*sess.run(hkv.export_with_scores())),
        ]
    # A new graph and session: fresh resources, restored from the file.
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        plain, hkv, dense, saver = _build_saver_graph()
        sess.run(plain.insert([99], [[9.0, 9.0]]))
        saver.restore(sess, saved_path)
        result["restored_new_graph"] = [
            entries(*sess.run(plain.export_with_scores())),
            entries(*sess.run(hkv.export_with_scores())),
        ]
        result["dense"] = sess.run(dense)
    return result


# ----------------------------------------------------------------------------------------
# Eager restore of a checkpoint written by another process
# ----------------------------------------------------------------------------------------


def eager_tables():
    """The same structure as tests/test_tables_checkpoint.py::make_checkpointed_module."""
    import tensorflow_dynemb as de

    module = tf.Module()
    module.plain = de.HashTable(tf.int64, tf.float32, [0.0, 0.0, 0.0])
    module.hkv = de.HkvHashTable(
        tf.string,
        tf.bfloat16,
        [0.0, 0.0],
        config=de.HkvHashTableConfig(
            init_capacity=8, max_capacity=64, evict_strategy=de.HkvEvictStrategy.CUSTOMIZED
        ),
    )
    module.lfu = de.HkvHashTable(
        tf.int32,
        tf.int8,
        0,
        config=de.HkvHashTableConfig(
            init_capacity=8, max_capacity=64, evict_strategy=de.HkvEvictStrategy.LFU
        ),
    )
    return module


def export_all(module):
    return {
        name: entries(*[t.numpy() for t in getattr(module, name).export_with_scores()])
        for name in ("plain", "hkv", "lfu")
    }


def run_eager_restore(prefix):
    result = {}
    module = eager_tables()
    # Content that the restore must replace.
    module.plain.insert([12345], [[5.0, 5.0, 5.0]])
    module.hkv.insert(["junk"], [[1.0, 1.0]], scores=[1])
    tf.train.Checkpoint(model=module).restore(prefix).assert_consumed()
    result["restored"] = export_all(module)

    # Deferred restoration: the tables are attached after `restore` is called.
    root = tf.Module()
    status = tf.train.Checkpoint(model=root).restore(prefix)
    fresh = eager_tables()
    root.plain, root.hkv, root.lfu = fresh.plain, fresh.hkv, fresh.lfu
    status.assert_existing_objects_matched()
    result["deferred"] = export_all(root)
    return result


def guarded(fn, arg):
    """`fn(arg)`, or {"error": traceback} for the test to fail with."""
    try:
        return fn(arg)
    except Exception:  # reported to the test, which fails with the traceback
        return {"error": traceback.format_exc()}


def run_worker(argv, scenarios, eager_modes):
    """Runs mode argv[1] with argument argv[2] and prints its JSON result: "graph" runs
    every TF1 graph-mode scenario; other modes are the functions in `eager_modes`."""
    mode, arg = argv[1], argv[2]
    if mode == "graph":
        tf.compat.v1.disable_eager_execution()
        results = {name: guarded(fn, arg) for name, fn in scenarios.items()}
    elif mode in eager_modes:
        results = guarded(eager_modes[mode], arg)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(jsonable(results)))


def main(argv):
    run_worker(argv, SCENARIOS, {"eager-restore": run_eager_restore})


if __name__ == "__main__":
    main(sys.argv)
