"""Runs Keras scenarios of `de.keras.layers` in a fresh process; used by
test_keras_layers.py.

    python tests/keras_worker.py scenarios WORKDIR [MODULE]
        every scenario of keras_scenarios.py (or of the tests' module MODULE, e.g.
        context_scenarios), with the Keras `tf.keras` is in this process (the caller
        sets TF_USE_LEGACY_KERAS=1 for tf_keras);
    python tests/keras_worker.py load WORKDIR
        `load_model` of the model the `save_for_fresh_process` scenario saved, in a
        process that imports nothing but tensorflow_dynemb: no custom_objects.
    python tests/keras_worker.py serve WORKDIR
        `tf.saved_model.load` of each SavedModel the `saved_model` scenario exported,
        after `import tensorflow_dynemb` (the ops) and nothing else of the package: the
        outputs of its "serving_default" signature (and of Keras 3's `serve` endpoint).

Prints one JSON object on the last line of stdout; a scenario that raises records
{"error": traceback}.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

# The devices of 2-shard tables, as tests/conftest.py configures them for pytest.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(_cpus[0], [tf.config.LogicalDeviceConfiguration()] * 3)

from tables_worker import guarded, jsonable  # noqa: E402


def load(workdir):
    import tensorflow_dynemb  # noqa: F401  (registers the layers and the optimizer wrapper)

    flavor = "keras3" if tf.keras.layers.Layer.__module__.startswith("keras") else "tf_keras"
    model = tf.keras.models.load_model(os.path.join(workdir, f"{flavor}-fresh.keras"))
    ids = np.load(os.path.join(workdir, "ids.npy"))
    return {
        "predict": model.predict(ids, verbose=0).tolist(),
        "optimizer": type(model.optimizer).__name__,
        "layer": type(model.get_layer("user")).__name__,
    }


def serve(workdir):
    import tensorflow_dynemb  # noqa: F401  (registers the ops the SavedModels use)

    flavor = "keras3" if tf.keras.layers.Layer.__module__.startswith("keras") else "tf_keras"
    root = os.path.join(workdir, f"{flavor}-savedmodels")
    ids = tf.constant(np.load(os.path.join(workdir, "serve_ids.npy")))
    served = {}
    for form in sorted(os.listdir(root)):
        loaded = tf.saved_model.load(os.path.join(root, form))
        (output,) = loaded.signatures["serving_default"](ids).values()
        served[form] = {"serving_default": output.numpy().tolist()}
        if hasattr(loaded, "serve"):  # Keras 3 `model.export`'s endpoint
            served[form]["serve"] = loaded.serve(ids).numpy().tolist()
    return served


def run_scenarios(workdir, module="keras_scenarios"):
    import importlib

    scenarios = importlib.import_module(module).SCENARIOS
    return {name: guarded(fn, workdir) for name, fn in scenarios.items()}


def main(argv):
    modes = {
        "scenarios": run_scenarios,
        "load": lambda workdir: guarded(load, workdir),
        "serve": lambda workdir: guarded(serve, workdir),
    }
    mode, workdir = argv[1], argv[2]
    if mode not in modes:
        raise SystemExit(f"unknown mode {mode!r}")
    if mode == "scenarios" and len(argv) > 3:
        print(json.dumps(jsonable(run_scenarios(workdir, argv[3]))))
        return
    print(json.dumps(jsonable(modes[mode](workdir))))


if __name__ == "__main__":
    main(sys.argv)
