"""SavedModel export: `tf.saved_model.save` with our ops, and `de.export_static_saved_model`.

One model (`ServingModel`: tables and variables of int64 and string keys, one and three
shards, HKV shards, random and constant initializers) is saved both ways once per
module; fresh processes (tests/saved_model_worker.py, `saved_model_cli`) load the
exports and serve them, and their outputs are compared with the live model's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import tensorflow_dynemb as de
from tensorflow_dynemb.serving import frozen as de_frozen
from tensorflow_dynemb.serving.keyed_random import keyed_random_rows

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "saved_model_worker.py")
SAVED_MODEL_CLI = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
CPUS = ["/CPU:0", "/CPU:1", "/CPU:2"]
NUM_KEYS = 40
# Row variables of at most 64 bytes: the static export splits every table.
SMALL_SHARD_BYTES = 64
# Ops a read-only signature must not contain.
WRITING_OPS = {
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceScatterUpdate", "LookupTableInsertV2", "LookupTableImportV2",
    "DynembTableInsert", "DynembTableInsertAndEvict", "DynembTableAccum",
    "DynembTableAccumAndEvict",
    "DynembTableImport", "DynembTableRemove", "DynembTableClear",
}

IDS = np.array([0, 1, 5, 39, 40, 77, -8, 2**40], np.int64)  # known: the first 4
NAMES = np.array([b"n0", b"n7", b"n39", b"zz", b"", "unknown-\u00e9".encode()], object)
IDS_2D = np.array([[0, 1], [40, -3], [39, 2**40]], np.int64)
INPUTS = {
    "serving_default": {"ids": IDS, "names": NAMES},
    "serve_2d": {"ids": IDS_2D},
}


class ServingModel(tf.Module):
    """Every kind of table and variable the exports must carry."""

    def __init__(self):
        super().__init__()
        self.ids_table = de.HashTable(tf.int64, tf.float32, [-1.0, -2.0], name="ids_table")
        self.names_table = de.HkvHashTable(  # LRU: a live lookup refreshes scores
            tf.string, tf.float32, 0.5, name="names_table", init_capacity=64, max_capacity=64
        )
        self.one_shard = de.Variable(  # trainable: lookups in functions use the view
            tf.int64, tf.float32, dim=3, name="one_shard",
            initializer=keras.initializers.RandomNormal(seed=7),
        )
        self.three_shards = de.Variable(
            tf.int64, tf.float32, dim=3, devices=CPUS, name="three_shards",
            initializer=keras.initializers.TruncatedNormal(mean=0.1, stddev=0.2, seed=8),
            kv_creator=de.HkvHashTableCreator(
                de.HkvHashTableConfig(init_capacity=64, max_capacity=64)
            ),
        )
        self.string_shards = de.Variable(
            tf.string, tf.float32, dim=2, devices=CPUS, name="string_shards",
            initializer=keras.initializers.RandomUniform(-1.0, 1.0, seed=9),
        )
        self.constant_rows = de.Variable(
            tf.int64, tf.float32, dim=2, name="constant_rows", initializer=-3.0,
            trainable=False,
        )

    def fill(self):
        keys = np.arange(NUM_KEYS, dtype=np.int64)
        names = np.array([f"n{i}".encode() for i in range(NUM_KEYS)], object)
        rows = np.arange(NUM_KEYS * 3, dtype=np.float32).reshape(NUM_KEYS, 3) / 7
        self.ids_table.insert(keys, rows[:, :2])
        self.names_table.insert(names, rows[:, 0])
        self.one_shard.upsert(keys, rows + 1)
        self.three_shards.upsert(keys, rows + 2)
        self.string_shards.upsert(names, rows[:, 1:] + 3)
        self.constant_rows.upsert(keys, rows[:, :2] + 4)

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.int64, name="ids"),
        tf.TensorSpec([None], tf.string, name="names"),
    ])
    def serve(self, ids, names):
        return {
            "ids_table": self.ids_table.lookup(ids),
            "names_table": self.names_table.lookup(names),
            "one_shard": de.embedding_lookup(self.one_shard, ids),
            "three_shards": de.embedding_lookup(self.three_shards, ids),
            "string_shards": de.embedding_lookup(self.string_shards, names),
            "constant_rows": self.constant_rows.lookup(ids),
        }

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64, name="ids")])
    def serve_2d(self, ids):
        per_key_defaults = tf.cast(tf.stack([ids, -ids], -1), tf.float32)
        found, exists = self.ids_table.lookup(
            ids, dynamic_default_values=per_key_defaults, return_exists=True
        )
        return {
            "rows": de.embedding_lookup(self.three_shards, ids),
            "found": found,
            "exists": exists,
            "combined": de.embedding_lookup_sparse(
                self.one_shard, tf.RaggedTensor.from_tensor(ids), None, combiner="mean"
            ),
            # Asking for the trainable view (as Keras layers do) still reads directly.
            "viewed": de.embedding_lookup_unique(
                self.one_shard, ids, name="viewed", return_trainable=True
            )[0],
        }

    @tf.function(input_signature=[])
    def scores(self):
        """Keys and scores of the HKV tables (to check that serving leaves them)."""
        names_keys, _, names_scores = self.names_table.export_with_scores()
        shard_keys, _, shard_scores = self.three_shards.export_with_scores()
        return {
            "names_keys": names_keys, "names_scores": names_scores,
            "shard_keys": shard_keys, "shard_scores": shard_scores,
        }


def _call(function, feeds):
    outputs = function(**{k: tf.constant(v) for k, v in feeds.items()})
    return {k: v.numpy() for k, v in outputs.items()}


def _live_outputs(model):
    functions = {"serving_default": model.serve, "serve_2d": model.serve_2d}
    return {
        f"{signature}/{name}": value
        for signature, feeds in INPUTS.items()
        for name, value in _call(functions[signature], feeds).items()
    }


def _assert_outputs_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if value.dtype == bool:
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-6, err_msg=key)


def _write_inputs(path):
    """The worker's inputs, as "<signature>/<input>" entries."""
    np.savez(path, **{
        f"{signature}/{name}": value
        for signature, feeds in INPUTS.items() for name, value in feeds.items()
    })


def _worker_env(with_package: bool):
    """The environment of a fresh process: the repository importable only when the
    process is meant to use our ops (the package is not installed in the venv)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if with_package:
        env["PYTHONPATH"] = REPO_ROOT
    return env


def _start_worker(mode, export_dir, inputs, outputs):
    return subprocess.Popen(
        [sys.executable, WORKER, mode, export_dir, inputs, outputs],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE,
        env=_worker_env(with_package=mode != "static"),
    )


def _finish_worker(process, outputs):
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-4000:]
    with np.load(outputs, allow_pickle=True) as data:
        served = {k: data[k] for k in data.files}
    return served, json.loads(stdout.strip().splitlines()[-1])


def _saved_model_ops(export_dir, signature=None):
    """Op types in a SavedModel's graph; with `signature`, only those its function
    (and the functions that calls) runs."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    graph = proto.meta_graphs[0].graph_def
    functions = {fn.signature.name: fn for fn in graph.library.function}
    if signature is None:
        nodes = list(graph.node) + [n for fn in functions.values() for n in fn.node_def]
        return {node.op for node in nodes}
    outputs = proto.meta_graphs[0].signature_def[signature].outputs.values()
    call_nodes = {o.name.split(":")[0] for o in outputs}
    pending = [n.attr["f"].func.name for n in graph.node if n.name in call_nodes]
    ops, seen = set(), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in functions[name].node_def:
            ops.add(node.op)
            if node.op in functions:
                pending.append(node.op)
            for attr in node.attr.values():
                if attr.func.name:
                    pending.append(attr.func.name)
                pending.extend(f.name for f in attr.list.func)
    return ops


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The live model's outputs and both exports, each served by fresh processes."""
    root = tmp_path_factory.mktemp("saved_model")
    model = ServingModel()
    model.fill()
    live = _live_outputs(model)  # also traces the trainable view of `one_shard`
    shard_tables = list(model.three_shards.tables)

    ops_dir, static_dir = str(root / "ops"), str(root / "static")
    signatures = {"serving_default": model.serve, "serve_2d": model.serve_2d}
    tf.saved_model.save(model, ops_dir, signatures=signatures)
    limit = de_frozen.MAX_SHARD_BYTES
    de_frozen.MAX_SHARD_BYTES = SMALL_SHARD_BYTES
    try:
        frozen = de.export_static_saved_model(model, static_dir, signatures=signatures)
    finally:
        de_frozen.MAX_SHARD_BYTES = limit

    inputs = str(root / "inputs.npz")
    _write_inputs(inputs)
    np.save(root / "ids.npy", IDS)
    np.save(root / "names.npy", NAMES)
    workers = {}  # all at once: each spends most of its time importing TensorFlow
    for mode, path in (("ops", ops_dir), ("ops-tf1", ops_dir), ("static", static_dir)):
        outputs = str(root / f"{mode}.npz")
        workers[mode] = (_start_worker(mode, path, inputs, outputs), outputs)
    cli = subprocess.run(
        [SAVED_MODEL_CLI, "run", "--dir", static_dir, "--tag_set", "serve",
         "--signature_def", "serving_default",
         "--inputs", f"ids={root / 'ids.npy'};names={root / 'names.npy'}",
         "--outdir", str(root / "cli")],
        capture_output=True, text=True, timeout=120, cwd=HERE,
        env=_worker_env(with_package=False),
    )
    served = {mode: _finish_worker(process, out) for mode, (process, out) in workers.items()}
    return {
        "model": model, "live": live, "shard_tables": shard_tables, "frozen": frozen,
        "ops_dir": ops_dir, "static_dir": static_dir, "served": served, "cli": cli,
        "cli_dir": root / "cli",
    }


# ---------------------------------------------------------------------------------------
# tf.saved_model.save with our ops
# ---------------------------------------------------------------------------------------


def test_saved_model_with_ops_serves_the_live_outputs_in_a_fresh_process(exported):
    outputs, _ = exported["served"]["ops"]
    _assert_outputs_equal(outputs, exported["live"])


def test_saved_model_with_ops_serves_through_the_tf1_loader(exported):
    # The restore and init ops TF Serving's C++ loader runs: the tables must be made
    # once per session, not per run (not anonymous), to keep what was restored.
    outputs, _ = exported["served"]["ops-tf1"]
    _assert_outputs_equal(outputs, exported["live"])


def test_serving_changes_no_scores_and_threads_agree(exported):
    _, summary = exported["served"]["ops"]
    assert summary["scored_keys"] == {"names": NUM_KEYS, "shard": NUM_KEYS}
    assert summary["scores_unchanged"]
    assert summary["threads_agree"]


def test_serving_signatures_write_nothing(exported):
    for signature in INPUTS:
        ops = _saved_model_ops(exported["ops_dir"], signature)
        assert "DynembTableFind" in ops
        assert not ops & WRITING_OPS, (signature, ops & WRITING_OPS)


def test_save_leaves_the_variable_tracking_its_own_tables(exported):
    model = exported["model"]
    assert all(a is b for a, b in zip(model.three_shards.tables, exported["shard_tables"]))
    children = model.three_shards._trackable_children("savedmodel")
    assert list(children["_tables"]) == exported["shard_tables"]


def test_a_saved_model_that_reaches_only_the_shard_tables_holds_the_variable(tmp_path):
    # What Keras 3's `model.export` saves: the tables found under the model, not the
    # de.Variable between them. The tables bring their variable (and its content).
    variable = de.Variable(tf.int64, tf.float32, dim=2, devices=CPUS[:2], name="reached")
    variable.upsert([1, 2, 3], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    root = tf.Module()
    root.tables = list(variable.tables)
    root.serve = tf.function(
        lambda ids: variable.lookup(ids), input_signature=[tf.TensorSpec([None], tf.int64)]
    )
    tf.saved_model.save(root, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    np.testing.assert_array_equal(
        loaded.serve(tf.constant([3, 1], tf.int64)), [[3.0, 3.0], [1.0, 1.0]]
    )


# ---------------------------------------------------------------------------------------
# Static export
# ---------------------------------------------------------------------------------------


def test_static_export_serves_the_live_outputs_without_our_ops(exported):
    outputs, summary = exported["served"]["static"]
    assert not summary["dynemb_imported"]
    assert not summary["dynemb_ops_registered"]
    _assert_outputs_equal(outputs, exported["live"])
    assert summary["threads_agree"]
    assert summary["max_row_shards"] >= 8  # 40 rows of 12 bytes, 64-byte variables


def test_static_export_runs_in_saved_model_cli(exported):
    cli = exported["cli"]
    assert cli.returncode == 0, cli.stderr[-4000:]
    served = {
        f"serving_default/{name[:-4]}": np.load(exported["cli_dir"] / name)
        for name in os.listdir(exported["cli_dir"])
    }
    live = {k: v for k, v in exported["live"].items() if k.startswith("serving_default/")}
    _assert_outputs_equal(served, live)


def test_static_export_holds_no_custom_op_and_reads_only(exported):
    assert sorted(exported["frozen"]) == sorted(
        ["ids_table", "names_table", "one_shard", "three_shards", "string_shards",
         "constant_rows"]
    )
    assert not any(op.startswith("Dynemb") for op in _saved_model_ops(exported["static_dir"]))
    for signature in INPUTS:
        ops = _saved_model_ops(exported["static_dir"], signature)
        assert "LookupTableFindV2" in ops
        assert not ops & WRITING_OPS, (signature, ops & WRITING_OPS)


def test_static_export_keeps_the_values_out_of_the_graph(tmp_path):
    # 4 MiB of rows: in variables (any size; split by MAX_SHARD_BYTES), not constants.
    variable = de.Variable(tf.int64, tf.float32, dim=16, name="big")
    keys = np.arange(65536, dtype=np.int64)
    variable.upsert(keys, np.ones([keys.size, 16], np.float32))
    module = tf.Module()
    module.variable = variable
    module.serve = tf.function(
        lambda ids: variable.lookup(ids), input_signature=[tf.TensorSpec([None], tf.int64)]
    )
    de.export_static_saved_model(module, str(tmp_path))
    assert os.path.getsize(tmp_path / "saved_model.pb") < 256 * 1024
    variables = tmp_path / "variables"
    assert sum(os.path.getsize(variables / f) for f in os.listdir(variables)) > 4 * 1024 * 1024


def test_frozen_table_splits_rows_as_embedding_lookup_reads_them(monkeypatch):
    monkeypatch.setattr(de_frozen, "MAX_SHARD_BYTES", 3 * 8)  # 3 rows of 2 floats
    keys = tf.constant([b"k%d" % i for i in range(11)])
    values = tf.reshape(tf.range(22, dtype=tf.float32), [11, 2])
    frozen = de_frozen.FrozenTable(keys, values, tf.constant([-1.0, -1.0]), "frozen")
    assert [int(s.shape[0]) for s in frozen.shards] == [3, 3, 3, 2]
    query = tf.constant([[b"k10", b"k0"], [b"nope", b"k5"]])
    found, exists = frozen.find(query)
    np.testing.assert_array_equal(
        found.numpy(), [[[20, 21], [0, 1]], [[-1, -1], [10, 11]]]
    )
    np.testing.assert_array_equal(exists.numpy(), [[True, True], [False, True]])
    int32_keys = de_frozen.FrozenTable(
        tf.constant([7, -7], tf.int32), tf.constant([1.0, 2.0]), tf.constant(0.0), "int32"
    )
    np.testing.assert_array_equal(int32_keys.find(tf.constant([-7, 3, 7]))[0], [2.0, 0.0, 1.0])
    empty = de_frozen.FrozenTable(
        tf.constant([], tf.int64), tf.zeros([0]), tf.constant(0.5), "empty"
    )
    np.testing.assert_array_equal(empty.find(tf.constant([1, 2], tf.int64))[0], [0.5, 0.5])


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.int32, tf.string])
@pytest.mark.parametrize("distribution,a,b", [
    ("uniform", -0.3, 0.7), ("normal", 0.1, 2.0), ("truncated_normal", -1.0, 0.5),
])
def test_keyed_random_rows_in_stock_ops_match_the_op(key_dtype, distribution, a, b):
    from tensorflow_dynemb._ops import ops

    if key_dtype == tf.string:
        keys = tf.constant([b"", b"a", b"\xff\x00z", b"x" * 70] + [b"k%d" % i for i in range(300)])
    else:
        keys = tf.constant(np.r_[0, -1, 2**31 - 1, -(2**31), np.arange(-150, 150)], key_dtype)
    for dtype, seed in ((tf.float32, 12345), (tf.float64, -(2**62) + 17)):
        expected = ops.dynemb_keyed_random(
            keys, dim=7, seed=seed, distribution=distribution, a=a, b=b, dtype=dtype
        )
        got = tf.function(keyed_random_rows, autograph=False)(
            keys, 7, seed, distribution, a, b, dtype
        )
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-12)


def _noise(shape, dtype):
    """A user initializer: fresh random rows on every call."""
    return tf.random.normal(shape, dtype=dtype)


class _CallableAndSelection(tf.Module):
    """A variable with a callable (not key-seeded) initializer, and several functions
    for the signatures=None rules."""

    def __init__(self):
        super().__init__()
        self.noisy = de.Variable(tf.int64, tf.float32, dim=2, initializer=_noise)
        self.noisy.upsert([1], [[1.0, 2.0]])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(self, ids):
        return {"rows": self.noisy.lookup(ids)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def doubled(self, ids):
        return {"rows": 2.0 * de.embedding_lookup(self.noisy, ids)}

    @tf.function
    def no_signature(self, ids):
        return self.noisy.lookup(ids)


def test_static_export_default_signatures_and_callable_initializer(tmp_path):
    module = _CallableAndSelection()
    assert de.export_static_saved_model(module, str(tmp_path)) == [module.noisy.name]
    loaded = tf.saved_model.load(str(tmp_path))
    assert sorted(loaded.signatures) == ["doubled", "serve", "serving_default"]
    ids = tf.constant([1, 2, 3], tf.int64)
    # Unknown ids of a callable initializer read zeros (documented).
    expected = [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]
    np.testing.assert_array_equal(loaded.signatures["serving_default"](ids=ids)["rows"], expected)
    np.testing.assert_array_equal(loaded.doubled(ids)["rows"], 2 * np.array(expected))


def test_static_export_rejects_what_it_cannot_freeze(tmp_path):
    module = _CallableAndSelection()
    table = de.HashTable(tf.int64, tf.float32, 0.0)
    counts = tf.function(lambda: {"size": table.size()}, input_signature=[])
    with pytest.raises(ValueError, match="DynembTableSize"):
        de.export_static_saved_model(module, str(tmp_path / "a"), signatures=counts)
    with pytest.raises(ValueError, match="input_signature"):
        de.export_static_saved_model(
            module, str(tmp_path / "b"), signatures={"x": module.no_signature}
        )
    concrete = module.serve.get_concrete_function()
    with pytest.raises(TypeError, match="concrete function"):
        de.export_static_saved_model(module, str(tmp_path / "c"), signatures=concrete)
    with pytest.raises(ValueError, match="signatures="):
        de.export_static_saved_model(tf.Module(), str(tmp_path / "d"))
    with pytest.raises(ValueError, match="identifier"):
        de.export_static_saved_model(
            module, str(tmp_path / "e"), signatures={"frozen_tables": module.serve}
        )


class _ParamsEmbedding(keras.layers.Layer):
    """A minimal Keras layer holding a de.Variable in `params`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.params = de.Variable(
            tf.int64, tf.float32, dim=4, name="keras_params",
            initializer=keras.initializers.RandomNormal(seed=3),
        )

    def call(self, ids):
        return de.embedding_lookup(self.params, ids)


def test_static_export_of_a_keras_model(tmp_path):
    ids = keras.Input(shape=(2,), dtype="int64", name="ids")
    embedding = _ParamsEmbedding()
    output = keras.layers.Dense(1)(keras.layers.Flatten()(embedding(ids)))
    model = keras.Model(ids, output)
    embedding.params.upsert([1, 2], np.ones([2, 4], np.float32))
    batch = np.array([[1, 2], [5, 99]], np.int64)
    live = model(batch, training=False).numpy()

    assert de.export_static_saved_model(model, str(tmp_path)) == ["keras_params"]
    assert not any(op.startswith("Dynemb") for op in _saved_model_ops(str(tmp_path)))
    serve = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    np.testing.assert_allclose(serve(ids=tf.constant(batch))["output_0"], live, rtol=0, atol=1e-6)


def test_static_export_of_the_demo_model_serves_without_our_ops(tmp_path):
    # The README demo's model: a functional Keras model over dict inputs of int64 ids,
    # one de.keras.layers.Embedding per feature, trained with model.fit.
    from tensorflow_dynemb import demo, demo_data

    specs = demo_data.feature_specs(3, 2_000)
    features, labels, _ = demo_data.generate_clicks(2_000, specs, seed=1)
    train = {k: v[:1_800] for k, v in features.items()}
    held_out = {k: v[1_800:] for k, v in features.items()}
    assert any(not np.isin(ids, train[k]).all() for k, ids in held_out.items())
    model = demo.build_model(specs, dim=4, seed=1)
    model.compile(optimizer=demo.make_optimizer(0.01), loss="binary_crossentropy",
                  jit_compile=False)
    model.fit(demo.make_dataset(train, labels[:1_800], 256), verbose=0)
    live = model.predict(held_out, verbose=0)

    frozen = de.export_static_saved_model(model, str(tmp_path / "static"))
    assert sorted(frozen) == sorted(f"{s.name}_embedding-parameter" for s in specs)
    inputs = str(tmp_path / "inputs.npz")
    np.savez(inputs, **{f"serving_default/{k}": v for k, v in held_out.items()})
    outputs = str(tmp_path / "outputs.npz")
    served, summary = _finish_worker(
        _start_worker("static", str(tmp_path / "static"), inputs, outputs), outputs
    )
    assert not summary["dynemb_imported"] and not summary["dynemb_ops_registered"]
    np.testing.assert_allclose(served["serving_default/output_0"], live, rtol=0, atol=1e-6)
