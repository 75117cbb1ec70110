"""Loads a SavedModel in a fresh process and serves it; run by tests/test_saved_model.py.

    python tests/saved_model_worker.py MODE EXPORT_DIR INPUTS_NPZ OUTPUTS_NPZ

MODE:
    ops      `import tensorflow_dynemb`, then `tf.saved_model.load` (TF2).
    ops-tf1  `import tensorflow_dynemb`, then the TF1 loader in a Session: the restore
             and init ops TF Serving's C++ loader runs.
    static   never imports tensorflow_dynemb (and checks that no Dynemb op is
             registered), then `tf.saved_model.load`.

Every mode serves each signature named in INPUTS_NPZ (entries "<signature>/<input>")
and writes the outputs to OUTPUTS_NPZ as "<signature>/<output>". The TF2 modes also
call "serving_default" from 8 threads at once and compare with one thread; "ops" also
reads the model's `scores()` before and after serving. The last line of stdout is a
JSON summary.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import defaultdict

import numpy as np
import tensorflow as tf

NUM_LOGICAL_CPUS = 3
THREADS = 8
CALLS_PER_THREAD = 10


def _logical_cpus() -> None:
    """Three logical CPUs, as in the saving process (the shards were placed on them)."""
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
    )


def _inputs_by_signature(path: str):
    """{signature: {input: array}} from the "<signature>/<input>" entries of an npz."""
    grouped = defaultdict(dict)
    with np.load(path, allow_pickle=True) as data:
        for key in data.files:
            signature, name = key.split("/", 1)
            grouped[signature][name] = data[key]
    return grouped


def _call(function, inputs):
    outputs = function(**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in outputs.items()}


def _threads_agree(function, inputs) -> bool:
    """Whether 8 threads calling `function` at once get what one thread gets."""
    expected = _call(function, inputs)
    results, errors = [], []

    def work():
        try:
            for _ in range(CALLS_PER_THREAD):
                results.append(_call(function, inputs))
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(repr(e))

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(errors[0])
    return len(results) == THREADS * CALLS_PER_THREAD and all(
        all(np.array_equal(result[k], expected[k]) for k in expected) for result in results
    )


def _scores(model):
    """{table: {key: score}} from the model's `scores()` function."""
    out = {k: v.numpy() for k, v in model.scores().items()}
    by_table = {}
    for name in ("names", "shard"):
        keys, scores = out[f"{name}_keys"], out[f"{name}_scores"]
        by_table[name] = {repr(k): int(s) for k, s in zip(keys.tolist(), scores.tolist())}
    return by_table


def _max_row_shards(model) -> int:
    """The most row variables any frozen table of a static model was split into."""
    counts = [0]
    for frozen in model.frozen_tables:
        table = getattr(frozen, "table", frozen)
        counts.append(len(table.shards))
    return max(counts)


def serve_tf2(export_dir: str, inputs, check_scores: bool):
    model = tf.saved_model.load(export_dir)
    summary = {}
    if check_scores:
        before = _scores(model)
    outputs = {}
    for signature, feeds in inputs.items():
        for name, value in _call(model.signatures[signature], feeds).items():
            outputs[f"{signature}/{name}"] = value
    summary["threads_agree"] = _threads_agree(
        model.signatures["serving_default"], inputs["serving_default"]
    )
    if check_scores:
        after = _scores(model)
        summary["scores_unchanged"] = before == after
        summary["scored_keys"] = {name: len(scores) for name, scores in before.items()}
    else:
        summary["max_row_shards"] = _max_row_shards(model)
    return outputs, summary


def serve_tf1(export_dir: str, inputs):
    outputs = {}
    with tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], export_dir)
        for signature, feeds in inputs.items():
            definition = meta_graph.signature_def[signature]
            feed_dict = {definition.inputs[k].name: v for k, v in feeds.items()}
            fetches = {k: v.name for k, v in definition.outputs.items()}
            # Twice: the tables must keep their content across runs.
            session.run(fetches, feed_dict)
            for name, value in session.run(fetches, feed_dict).items():
                outputs[f"{signature}/{name}"] = value
    return outputs, {}


def main(argv):
    mode, export_dir, inputs_path, outputs_path = argv[1:5]
    if mode == "ops-tf1":
        tf.compat.v1.disable_eager_execution()
    _logical_cpus()
    inputs = _inputs_by_signature(inputs_path)
    if mode == "static":
        from tensorflow.python.framework import op_def_registry

        outputs, summary = serve_tf2(export_dir, inputs, check_scores=False)
        summary["dynemb_imported"] = any(m.startswith("tensorflow_dynemb") for m in sys.modules)
        summary["dynemb_ops_registered"] = op_def_registry.get("DynembTableFind") is not None
    else:
        import tensorflow_dynemb  # noqa: F401 - registers the ops the SavedModel uses

        if mode == "ops":
            outputs, summary = serve_tf2(export_dir, inputs, check_scores=True)
        elif mode == "ops-tf1":
            outputs, summary = serve_tf1(export_dir, inputs)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
    np.savez(outputs_path, **outputs)
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv)
