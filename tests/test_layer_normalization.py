"""`de.keras.layers.LayerNormalization` with Keras 3 (in this process) and tf_keras (this
file run as a script in a subprocess with `TF_USE_LEGACY_KERAS=1`), against NumPy.

`scenario()` computes everything under whichever Keras `tf.keras` is and returns plain
lists; the tests check both results the same way.
"""

from __future__ import annotations

import doctest
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

EPSILON = 1e-3  # Keras' default
FLAVORS = ["keras3", "tf_keras"]


def np_layer_norm(x, axes, gamma=1.0, beta=0.0):
    mean = x.mean(axis=tuple(axes), keepdims=True)
    variance = x.var(axis=tuple(axes), keepdims=True)
    return (x - mean) / np.sqrt(variance + EPSILON) * gamma + beta


def scenario() -> dict:
    """Every check's inputs and outputs, as lists (runs under either Keras)."""
    import tensorflow as tf

    import tensorflow_dynemb as de

    keras = tf.keras
    rng = np.random.default_rng(3)
    out = {}

    # Dynamic length: [batch, None, 10] through a functional model.
    inputs = keras.Input(shape=(None, 10))
    layer = de.keras.layers.LayerNormalization()
    model = keras.Model(inputs, layer(inputs))
    x = rng.normal(size=(2, 5, 10)).astype(np.float32)
    out["dynamic"] = {"x": x.tolist(), "y": model.predict(x, verbose=0).tolist()}
    x7 = rng.normal(size=(3, 7, 10)).astype(np.float32)
    out["dynamic_other_length"] = {"x": x7.tolist(), "y": model.predict(x7, verbose=0).tolist()}

    # Two axes, with gamma and beta of their shape.
    layer = de.keras.layers.LayerNormalization(axis=[-2, -1])
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    layer.build(x.shape)
    gamma = rng.normal(size=(3, 4)).astype(np.float32)
    beta = rng.normal(size=(3, 4)).astype(np.float32)
    layer.set_weights([gamma, beta])
    out["two_axes"] = {
        "x": x.tolist(), "gamma": gamma.tolist(), "beta": beta.tolist(),
        "y": layer(tf.constant(x)).numpy().tolist(),
    }

    # Ragged [batch, (len), 3]: each row normalized on its own.
    rows = rng.normal(size=(5, 3)).astype(np.float32)
    ragged = tf.RaggedTensor.from_row_lengths(rows, [2, 0, 3])
    y = de.keras.layers.LayerNormalization()(ragged)
    out["ragged"] = {
        "x": rows.tolist(), "y": y.flat_values.numpy().tolist(),
        "row_lengths": y.row_lengths().numpy().tolist(),
    }
    for axis in (0, 1):  # the batch axis, the ragged axis
        try:
            de.keras.layers.LayerNormalization(axis=axis)(ragged)
            out[f"ragged_axis_{axis}_error"] = None
        except ValueError as e:
            out[f"ragged_axis_{axis}_error"] = str(e)

    # float16 inputs: computed in float32, returned as the layer's compute dtype.
    layer = de.keras.layers.LayerNormalization(dtype="float16")
    x = (rng.normal(size=(4, 8)) * 100).astype(np.float16)
    y = layer(tf.constant(x))
    out["float16"] = {
        "x": x.astype(np.float32).tolist(),
        "y": y.numpy().astype(np.float32).tolist(),
        "dtype": y.dtype.name,
    }

    # Training changes gamma and beta; config and weights round trip.
    inputs = keras.Input(shape=(10,))
    norm = de.keras.layers.LayerNormalization(name="norm")
    model = keras.Model(inputs, keras.layers.Dense(1)(norm(inputs)))
    model.compile(optimizer="adam", loss="mse")
    features = rng.normal(size=(64, 10)).astype(np.float32)
    labels = features.sum(axis=1, keepdims=True)
    before = [w.copy() for w in norm.get_weights()]
    model.fit(features, labels, epochs=2, batch_size=16, verbose=0)
    out["trained_change"] = [float(np.abs(a - b).sum()) for a, b in zip(before, norm.get_weights())]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
    out["loaded_class"] = type(loaded.get_layer("norm")).__module__
    predictions = [m.predict(features, verbose=0) for m in (loaded, model)]
    out["loaded_same"] = bool(np.allclose(*predictions, atol=1e-6))
    clone = de.keras.layers.LayerNormalization.from_config(norm.get_config())
    out["config_epsilon"] = clone.epsilon
    out["keras_base"] = de.keras.layers.LayerNormalization.__mro__[1].__module__
    return out


@functools.lru_cache(maxsize=None)
def results(flavor: str) -> dict:
    if flavor == "keras3":
        return json.loads(json.dumps(scenario()))
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def close(got, want, **kwargs):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), **kwargs)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_dynamic_shapes(flavor):
    for case in ("dynamic", "dynamic_other_length"):
        got = results(flavor)[case]
        close(got["y"], np_layer_norm(np.asarray(got["x"]), [-1]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_two_axes_with_gamma_and_beta(flavor):
    got = results(flavor)["two_axes"]
    x, gamma, beta = (np.asarray(got[k]) for k in ("x", "gamma", "beta"))
    want = np_layer_norm(x, [1, 2], gamma, beta)
    close(got["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_ragged_rows_are_normalized_alone(flavor):
    got = results(flavor)
    want = np_layer_norm(np.asarray(got["ragged"]["x"]), [-1])
    close(got["ragged"]["y"], want, rtol=1e-5, atol=1e-5)
    assert got["ragged"]["row_lengths"] == [2, 0, 3]
    assert "uniform inner axes" in got["ragged_axis_0_error"]
    assert "axis 1 of the input shape (3, None, 3) has none" in got["ragged_axis_1_error"]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_float16(flavor):
    got = results(flavor)["float16"]
    assert got["dtype"] == "float16"
    close(got["y"], np_layer_norm(np.asarray(got["x"], np.float64), [-1]), atol=2e-3)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_training_saving_and_config(flavor):
    got = results(flavor)
    assert all(change > 0 for change in got["trained_change"]) and len(got["trained_change"]) == 2
    assert got["loaded_class"] == "tensorflow_dynemb.keras.layers.layer_normalization"
    assert got["loaded_same"]
    assert got["config_epsilon"] == pytest.approx(EPSILON)
    # The Keras layer extended is the one of the Keras in use.
    assert got["keras_base"].split(".")[0] == ("keras" if flavor == "keras3" else "tf_keras")


def test_docstring_example():
    from tensorflow_dynemb.keras.layers import layer_normalization

    failures, attempted = doctest.testmod(layer_normalization)
    assert attempted > 0 and failures == 0


if __name__ == "__main__":
    print(json.dumps(scenario()))
