"""`de.keras.layers` with Keras 3 (in this process) and tf_keras (in a subprocess).

Every scenario of `keras_scenarios.py` runs under both Keras versions, and each test
checks both results the same way:

- outputs of every layer in every training mode match the table rows, and lookups
  never insert;
- `compile("sgd")` + `fit` trains exactly as a stock `Embedding` with SGD (also with a
  layer shared by two inputs), on 1 and 2 shards; the table then holds exactly the ids
  seen; `evaluate` / `predict` agree with the reference;
- `compile("adam")` trains exactly as `compile(de.DynamicEmbeddingOptimizer(Adam()))`;
- `model.save` / `load_model` (also in a fresh process, without custom_objects),
  `save_weights` / `load_weights` and `tf.train.Checkpoint` bring back the table and the
  optimizer's slots: same predictions, then the same losses as an uninterrupted run;
- SavedModels (Keras 3 `model.export`, tf_keras `model.save(dir, save_format="tf")`,
  `tf.saved_model.save`) serve the trained table in a fresh process;
- `get_config` / `from_config` round trips; XLA is not used; argument errors.
"""

from __future__ import annotations

import doctest
import importlib
import functools
import importlib.util
import json
import os
import subprocess
import sys
from typing import Any, Dict

import numpy as np
import pytest
import tensorflow as tf

import keras_scenarios
from _tables_util import REPO_ROOT, temp_workdir
from keras_scenarios import layers

FLAVORS = ["keras3", "tf_keras"]
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras_worker.py")


# ----------------------------------------------------------------------------------------
# Running scenarios
# ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def workdir() -> str:
    return temp_workdir()


def run_worker(mode: str, legacy_keras: bool, *args: str) -> Any:
    """Runs keras_worker.py `mode` (with `args`) in a fresh process; its JSON result."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy_keras:
        env["TF_USE_LEGACY_KERAS"] = "1"
    proc = subprocess.run(
        [sys.executable, WORKER, mode, workdir(), *args],
        env=env,
        cwd=os.path.dirname(WORKER),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.lru_cache(maxsize=None)
def tf_keras_results(module: str = "keras_scenarios") -> Dict[str, Any]:
    return run_worker("scenarios", True, module)


@functools.lru_cache(maxsize=None)
def keras3_result(name: str, module: str = "keras_scenarios") -> Any:
    # Through JSON like the tf_keras results, so that both are checked alike.
    scenarios = importlib.import_module(module).SCENARIOS
    return json.loads(json.dumps(scenarios[name](workdir())))


def result(name: str, flavor: str, module: str = "keras_scenarios") -> Any:
    """Scenario `name` of the tests' `module`, run with Keras 3 here or with tf_keras in
    a subprocess (all of the module's scenarios at once)."""
    if flavor == "tf_keras" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed")
    got = keras3_result(name, module) if flavor == "keras3" else tf_keras_results(module)[name]
    if isinstance(got, dict) and "error" in got:
        raise AssertionError(f"scenario {name} failed with {flavor}:\n{got['error']}")
    return got


def close(a, b, **kwargs) -> None:
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), **kwargs)


# ----------------------------------------------------------------------------------------
# Scenarios, under both Keras versions
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", FLAVORS)
def test_outputs_in_every_mode(flavor):
    got = result("outputs", flavor)
    for name in ("Embedding", "BasicEmbedding", "SquashedEmbedding", "FieldWiseEmbedding"):
        for mode, output in got[name]["got"].items():
            close(output, got[name]["expected"], rtol=1e-6, err_msg=f"{name} {mode}")
        assert got[name]["size"] == len(np.unique(keras_scenarios.IDS)), name
        assert got[name]["weights"] == 0, f"{name}: the view is listed outside a step"
    close(got["squashed_1d"], [3.0, 3.0, 3.0])


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("shards", ["1", "2"])
def test_fit_with_optimizer_name_matches_dense_embedding(flavor, shards):
    got = result("fit_matches_dense", flavor)[shards]
    close(got["losses"], got["ref_losses"], rtol=1e-5)
    close(got["rows"], got["ref_rows"], rtol=1e-5, atol=1e-6)
    close(got["predict"], got["ref_predict"], rtol=1e-5, atol=1e-6)
    close(got["evaluate"], got["ref_evaluate"], rtol=1e-5)
    assert got["optimizer"].endswith("DynamicEmbeddingOptimizer")
    assert got["size"] == got["size_after"] == got["distinct"]


def test_compile_with_a_wrapped_tf1_optimizer():
    """tf_keras only: Keras 3 takes no tf.compat.v1.train optimizers."""
    got = result("tf1_optimizer", "tf_keras")
    close(got["losses"], got["ref_losses"], rtol=1e-5)
    close(got["rows"], got["ref_rows"], rtol=1e-5, atol=1e-6)
    assert got["adam_sizes"] == [8, 16, 24]
    assert got["adam_slots"] == [24, 24]  # Adam's m and v


@pytest.mark.parametrize("flavor", FLAVORS)
def test_layer_shared_by_two_inputs_trains_both(flavor):
    got = result("shared_layer", flavor)
    close(got["losses"], got["ref_losses"], rtol=1e-5)
    close(got["rows"], got["ref_rows"], rtol=1e-5, atol=1e-6)
    assert got["size"] == got["distinct"]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_optimizer_name_trains_as_wrapped_optimizer(flavor):
    got = result("plain_vs_wrapped", flavor)
    plain, wrapped = got["plain"], got["wrapped"]
    assert plain["losses"] == wrapped["losses"]
    assert plain["table"] == wrapped["table"]
    assert plain["optimizer"] == wrapped["optimizer"]
    assert plain["optimizer"].endswith("DynamicEmbeddingOptimizer")
    assert plain["inner_is_plain"] and wrapped["inner_is_plain"]
    assert plain["slots"] == 2  # Adam's m and v, as tables
    # Outside a training step the model's trainable weights are its dense ones.
    assert plain["trainable_weights"] == plain["dense_weights"] == 2


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("key_dtype", ["int64", "string"])
def test_keras_files_restore_table_and_slots(flavor, key_dtype):
    got = result("keras_files", flavor)[key_dtype]
    assert got["loaded_optimizer"].endswith("DynamicEmbeddingOptimizer")
    assert got["loaded_shards"] == 1  # layer configs leave devices out (keep_distribution)
    assert got["loaded_size"] == got["size"] == len(np.unique(keras_scenarios.IDS))
    close(got["loaded_predict"], got["predict"], rtol=1e-6)
    close(got["fresh_predict"], got["predict"], rtol=1e-6)
    # Slots restored: training on gives the losses of the uninterrupted run.
    close(got["loaded_losses"], got["losses"], rtol=1e-5)
    close(got["fresh_losses"], got["losses"], rtol=1e-5)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_checkpoint_restores_into_other_shards_and_trains_on(flavor):
    got = result("checkpoint", flavor)
    close(got["fresh_predict"], got["predict"], rtol=1e-6)
    close(got["fresh_losses"], got["losses"], rtol=1e-5)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_saved_models_serve_the_trained_table_in_a_fresh_process(flavor):
    # Keras 3: `model.export` and `tf.saved_model.save`; tf_keras: `model.save(dir,
    # save_format="tf")` and `tf.saved_model.save`. Ids seen in training and unseen.
    got = result("saved_model", flavor)
    served = run_worker("serve", legacy_keras=flavor == "tf_keras")
    if "error" in served:
        raise AssertionError(served["error"])
    forms = ["export", "tf_saved_model"] if flavor == "keras3" else [
        "save_format_tf", "tf_saved_model"]
    assert sorted(served) == sorted(got["tables"]) == forms
    for form, outputs in served.items():
        for endpoint, output in outputs.items():
            close(output, got["predict"], rtol=0, atol=1e-6, err_msg=f"{form} {endpoint}")
    if flavor == "keras3":
        assert "serve" in served["export"]
        # `model.export` holds the embedding's content, not the optimizer's slots.
        assert got["tables"]["export"] == 1


@pytest.mark.parametrize("flavor", FLAVORS)
def test_load_model_in_fresh_process_without_custom_objects(flavor):
    saved = result("save_for_fresh_process", flavor)
    loaded = run_worker("load", legacy_keras=flavor == "tf_keras")
    if "error" in loaded:
        raise AssertionError(loaded["error"])
    assert loaded["layer"] == "Embedding"
    assert loaded["optimizer"].endswith("DynamicEmbeddingOptimizer")
    close(loaded["predict"], saved["predict"], rtol=1e-6)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_config_round_trip(flavor):
    for got in result("configs", flavor):
        assert got["rebuilt_config"] == got["config"], got["class"]
        assert got["tables"][0] == got["tables"][1], got["class"]
        # Devices are in the config only with keep_distribution (TFRA).
        assert got["shards"][1] == (got["shards"][0] if got["keep_distribution"] else 1)
        assert got["policies"][0] == got["policies"][1], got["class"]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_not_compiled_with_xla(flavor):
    got = result("not_jit_compiled", flavor)
    assert got["jit_compile"] is False
    assert np.isfinite(got["losses"]).all()


# ----------------------------------------------------------------------------------------
# Keras 3 only
# ----------------------------------------------------------------------------------------


def test_config_pins_seed_of_random_initializer():
    layer = layers.Embedding(4, name="unseeded")
    rebuilt = layers.Embedding.from_config(layer.get_config())
    ids = tf.constant([5, 6, 7], tf.int64)
    close(rebuilt(ids), layer(ids))


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: layers.Embedding("four"), TypeError, "embedding_size"),
        (lambda: layers.Embedding(0), ValueError, "^`embedding_size` must be >= 1, got 0"),
        (lambda: layers.Embedding(4, value_dtype=tf.int32), TypeError, "floating"),
        (lambda: layers.Embedding(4, dtype="float32"), TypeError, "value_dtype"),
        (
            lambda: layers.Embedding(4, distribute_strategy=object()),
            NotImplementedError,
            "distribute",
        ),
        (lambda: layers.Embedding(4, init_capacity=8, init_size=16), ValueError, "init_size"),
        (lambda: layers.SquashedEmbedding(4, combiner="median"), ValueError, "reduce"),
        (lambda: layers.FieldWiseEmbedding(4, 3, None), ValueError, "slot_map_fn"),
        (lambda: layers.FieldWiseEmbedding(4, 0, keras_scenarios.field_of), ValueError, "nslots"),
        (
            lambda: layers.FieldWiseEmbedding(4, 3, keras_scenarios.field_of, combiner="max"),
            ValueError,
            "sqrtn",
        ),
    ],
)
def test_argument_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_ids_of_other_dtype_raise():
    layer = layers.Embedding(2)
    with pytest.raises(TypeError, match="int64"):
        layer(tf.constant([1, 2], tf.int32))


def test_float_ids_raise_with_a_hint():
    with pytest.raises(TypeError, match="keras.Input"):
        layers.Embedding(2)(tf.constant([1.0, 2.0]))


@pytest.mark.parametrize("make", [
    lambda: layers.Embedding(8),
    lambda: layers.SquashedEmbedding(8),
    lambda: layers.FieldWiseEmbedding(8, 3, keras_scenarios.field_of),
], ids=["Embedding", "SquashedEmbedding", "FieldWiseEmbedding"])
def test_a_float_keras_input_is_refused_when_the_model_is_built(make):
    # Keras 3 builds a functional model from compute_output_spec, not `call`: without the
    # check there, the model is built and the error comes only at `fit`.
    with pytest.raises(TypeError, match=r"got float32: declare the model input with its dtype"):
        make()(keras_scenarios.K.Input(shape=(3,)))
    assert make()(keras_scenarios.K.Input(shape=(3,), dtype="int64")).shape[-1] == 8


def test_a_float_keras_input_is_refused_by_a_coalesced_layer():
    layer = layers.CoalescedEmbedding(8, num_features=2)
    with pytest.raises(TypeError, match=r"got float32: declare the model input"):
        layer([keras_scenarios.K.Input(shape=(1,), dtype="int64"),
               keras_scenarios.K.Input(shape=(3,))])


@pytest.mark.parametrize("module_name", ["embedding", "reduced"])
def test_docstring_examples(module_name):
    module = importlib.import_module(f"tensorflow_dynemb.keras.layers.{module_name}")
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_field_wise_needs_two_dimensional_ids():
    layer = layers.FieldWiseEmbedding(2, 3, keras_scenarios.field_of)
    with pytest.raises(ValueError, match=r"\[batch, n\]"):
        layer(tf.constant([1, 2], tf.int64))
