"""`tf.saved_model.save` before, between and after calls leaves the live object working.

`tf.saved_model.save` traces every function it exports in its save context, where
lookups read the tables directly (docs/serving.md). For a function never called
before, that trace is the function's first one, and a `tf.function` may create
variables in its first trace only: whatever the live trace needs (trainable views,
optimizer slots) must be made by the save's trace too, or the next live call fails
with "Creating variables on a non-first call to a function". Each case below saves
before any call, between calls and after them, checks the live object's values after
each save, and serves the last SavedModel in one fresh process (where the Keras model's
case also runs under tf_keras).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import traceback

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from tensorflow_dynemb.keras import _compat

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
IDS = np.array([1, 2, 7], np.int64)

# Loads each SavedModel of argv[1] (JSON: {name: [dir, input name, ids]}) after
# `import tensorflow_dynemb`, serves its "serving_default" signature and prints
# {name: output as a list}. With a directory argv[2], started with TF_USE_LEGACY_KERAS=1,
# it also runs the Keras model's scenario there under tf_keras (the other Keras; here
# because this process starts TensorFlow anyway) and serves its SavedModel:
# {"tf_keras": [error traceback or None, served, live]}.
_SERVE = """
import json, pathlib, sys, traceback
import numpy as np
import tensorflow as tf
import tensorflow_dynemb  # registers the ops the tables use
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 3)
served = {}
for name, (path, arg, ids) in json.loads(sys.argv[1]).items():
    loaded = tf.saved_model.load(path)
    (output,) = loaded.signatures["serving_default"](**{arg: tf.constant(ids, tf.int64)}).values()
    served[name] = output.numpy().tolist()
if len(sys.argv) > 2:
    import test_save_while_live as scenarios  # this folder is the working directory
    try:
        path, arg, ids, live = scenarios._keras_model_saved_before_fit(pathlib.Path(sys.argv[2]))
        loaded = tf.saved_model.load(path)
        (output,) = loaded.signatures["serving_default"](**{arg: tf.constant(ids)}).values()
        served["tf_keras"] = [None, output.numpy().tolist(), np.asarray(live).tolist()]
    except Exception:
        served["tf_keras"] = [traceback.format_exc(), None, None]
print(json.dumps(served))
"""


def _save(obj, path, signatures=None):
    tf.saved_model.save(obj, str(path), signatures=signatures)
    return str(path)


class _TableModule(tf.Module):
    def __init__(self):
        super().__init__()
        self.table = de.HashTable(tf.int64, tf.float32, default_value=[-1.0, -1.0])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(self, ids):
        return {"rows": self.table.lookup(ids)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def insert(self, ids):
        self.table.insert(ids, tf.stack([tf.cast(ids, tf.float32)] * 2, axis=1))


class _Ranker(tf.Module):
    """docs/serving.md's Ranker, with a training function besides its serving one."""

    def __init__(self, optimizer):
        super().__init__()
        self.emb = de.Variable(
            tf.int64, tf.float32, dim=4, devices=["/CPU:0", "/CPU:1"],
            initializer=tf.keras.initializers.RandomNormal(0.0, 0.01, seed=1),
        )
        self.optimizer = de.DynamicEmbeddingOptimizer(optimizer)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(self, ids):
        return {"rows": de.embedding_lookup(self.emb, ids)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def train(self, ids):
        # One step of SGD on sum(rows): every looked-up row moves by -learning_rate.
        with tf.GradientTape() as tape:
            rows, view = de.embedding_lookup(self.emb, ids, name="train", return_trainable=True)
            loss = tf.reduce_sum(rows)
        self.optimizer.apply_gradients([(tape.gradient(loss, view), view)])
        return loss


class _LayerModule(tf.Module):
    """A tf.Module serving a Keras embedding layer through its own tf.function."""

    def __init__(self):
        super().__init__()
        self.layer = de.keras.layers.Embedding(
            4, name="items", initializer=tf.keras.initializers.RandomNormal(0.0, 0.01, seed=2)
        )

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(self, ids):
        return {"rows": self.layer(ids)}


# Each scenario works on its own object in `tmp_path`, checks the live values after
# each save (plain asserts) and returns what its last SavedModel must serve in a fresh
# process: `(export dir, input name, ids, expected output)`.


def _table_module(tmp_path):
    module = _TableModule()
    _save(module, tmp_path / "before")
    np.testing.assert_array_equal(module.serve(IDS)["rows"], [[-1, -1]] * 3)
    module.insert(IDS[:2])
    _save(module, tmp_path / "between")
    module.insert(IDS[2:])
    expected = [[1, 1], [2, 2], [7, 7]]
    np.testing.assert_array_equal(module.serve(IDS)["rows"], expected)
    return _save(module, tmp_path / "after"), "ids", IDS, expected


def _ranker_saved_before_its_first_call(tmp_path, family):
    """docs/serving.md's example: saved before the model was ever called."""
    optimizer = (tf.keras.optimizers.SGD(0.5) if family == "keras"
                 else tf.compat.v1.train.GradientDescentOptimizer(0.5))
    model = _Ranker(optimizer)
    signatures = {"serving_default": model.serve}
    _save(model, tmp_path / "before", signatures)  # traces serve and train for the first time
    initial = model.serve(IDS)["rows"].numpy()
    # Unknown ids read the seeded initializer: small rows, one per id.
    assert initial.shape == (3, 4) and 0 < np.abs(initial).max() < 0.1
    assert model.emb.size() == 0

    model.train(IDS)
    _save(model, tmp_path / "between", signatures)
    np.testing.assert_allclose(model.serve(IDS)["rows"], initial - 0.5, atol=1e-6)
    model.train(IDS[:1])
    expected = initial - 0.5
    expected[0] -= 0.5
    np.testing.assert_allclose(model.serve(IDS)["rows"], expected, atol=1e-6)
    path = _save(model, tmp_path / "after", signatures)
    assert model.emb.size() == 3
    return path, "ids", IDS, expected


def _ranker_saved_between_a_first_serving_call_and_training(tmp_path):
    model = _Ranker(tf.keras.optimizers.SGD(1.0))
    initial = model.serve(IDS)["rows"].numpy()
    _save(model, tmp_path / "served_once", {"serving_default": model.serve})
    model.train(IDS)  # the first trace of `train` comes after the save traced it
    np.testing.assert_allclose(model.serve(IDS)["rows"], initial - 1.0, atol=1e-6)
    return None


def _module_serving_a_keras_layer(tmp_path):
    module = _LayerModule()
    module.layer.build((None,))
    _save(module, tmp_path / "before", {"serving_default": module.serve})
    live = module.serve(IDS)["rows"].numpy()
    assert live.shape == (3, 4) and 0 < np.abs(live).max() < 0.1
    module.layer.params.upsert(IDS[:1], tf.ones([1, 4]))
    live = module.serve(IDS)["rows"].numpy()
    np.testing.assert_array_equal(live[0], [1, 1, 1, 1])
    return _save(module, tmp_path / "after", {"serving_default": module.serve}), "ids", IDS, live


def _keras_model_saved_before_fit(tmp_path):
    ids = tf.keras.Input(shape=(2,), dtype="int64", name="ids")
    rows = de.keras.layers.Embedding(
        4, name="user", initializer=tf.keras.initializers.RandomNormal(0.0, 0.01, seed=3)
    )(ids)
    model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(rows)))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1)),
                  loss="mse")
    x = np.array([[1, 2], [3, 4]], np.int64)
    y = np.ones([2, 1], np.float32)

    _save(model, tmp_path / "before")
    model.fit(x, y, epochs=2, verbose=0)
    _save(model, tmp_path / "between")
    table = model.layers[1].params
    rows = table.lookup(x).numpy()
    losses = model.fit(x, y, epochs=3, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses))
    assert not np.allclose(table.lookup(x), rows)  # still training the table
    assert table.size() == 4
    live = model.predict(x, verbose=0)
    path = str(tmp_path / "after")
    if _compat.IS_KERAS3:
        model.export(path, verbose=False)
    else:
        _save(model, path)
    return path, "ids", x, live


SCENARIOS = {
    "table_module": _table_module,
    "ranker_keras_optimizer": functools.partial(_ranker_saved_before_its_first_call,
                                                family="keras"),
    "ranker_v1_optimizer": functools.partial(_ranker_saved_before_its_first_call, family="v1"),
    "ranker_between_serving_and_training": _ranker_saved_between_a_first_serving_call_and_training,
    "module_serving_a_keras_layer": _module_serving_a_keras_layer,
    "keras_model_saved_before_fit": _keras_model_saved_before_fit,
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Runs every scenario, then serves their last SavedModels in one fresh process
    (one TensorFlow start for all). `{name: (error traceback or None, expected, served)}`."""
    failed, exports = {}, {}
    for name, scenario in SCENARIOS.items():
        try:
            exports[name] = scenario(tmp_path_factory.mktemp(name))
        except Exception:  # noqa: BLE001 - reported by the scenario's own test below
            failed[name] = traceback.format_exc()
    tf_keras_dir = (
        str(tmp_path_factory.mktemp("tf_keras")) if importlib.util.find_spec("tf_keras") else None
    )
    served = _serve_fresh({n: e[:3] for n, e in exports.items() if e is not None}, tf_keras_dir)
    outcomes = {
        name: (failed.get(name), None if exports.get(name) is None else exports[name][3],
               served.get(name))
        for name in SCENARIOS
    }
    if "tf_keras" in served:
        error, served_output, live = served["tf_keras"]
        outcomes["tf_keras_model_saved_before_fit"] = (error, live, served_output)
    return outcomes


@pytest.mark.parametrize("name", list(SCENARIOS) + ["tf_keras_model_saved_before_fit"])
def test_saving_leaves_the_live_object_working_and_the_saved_model_serves(outcomes, name):
    if name not in outcomes:
        pytest.skip("tf_keras is not installed")
    error, expected, served = outcomes[name]
    assert error is None, error
    if expected is not None:
        np.testing.assert_allclose(served, expected, atol=1e-5)


def _serve_fresh(exports, tf_keras_dir=None):
    """Serves each `{name: (dir, input name, ids)}` in one fresh process; `{name: output}`
    (and the tf_keras scenario's outcome, run in `tf_keras_dir` when given)."""
    request = {name: (path, arg, np.asarray(ids).tolist()) for name, (path, arg, ids) in exports.items()}
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    args = [json.dumps(request)]
    if tf_keras_dir:
        env["TF_USE_LEGACY_KERAS"] = "1"
        args.append(tf_keras_dir)
    result = subprocess.run(
        [sys.executable, "-c", _SERVE, *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=HERE,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
