"""Online learning end to end (issue 28): a Keras model over a bounded HkvHashTable
(evicting) trains for several rounds and its de.DeltaExporter writes a delta after
each; a separate serving process, which loaded the base SavedModels (Keras
`model.export`, and `tf.saved_model.save` with an `apply_deltas` signature), applies
them while threads serve, and its predictions match the live model's after every
round. The readers look up wide rows that each hold one value: no read is torn.
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

import tensorflow_dynemb as de

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "delta_serving_worker.py")
CAPACITY = 512
ROUNDS = 4
ROW_DIM = 256


def build_model():
    ids = keras.Input(shape=(2,), dtype="int64", name="ids")
    embedding = de.keras.layers.Embedding(
        4, initializer=keras.initializers.RandomNormal(seed=3), name="user",
        devices=["/CPU:0"] * 2,
        kv_creator=de.HkvHashTableCreator(
            de.HkvHashTableConfig(init_capacity=CAPACITY, max_capacity=CAPACITY)))
    hidden = keras.layers.Dense(3, activation="relu")(keras.layers.Flatten()(embedding(ids)))
    model = keras.Model(ids, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.05)),
                  loss="mse", jit_compile=False)
    return model, embedding


class RowModel(tf.Module):
    """Rows of ROW_DIM equal values: a torn read shows two values in one row."""

    def __init__(self):
        super().__init__()
        self.rows = de.Variable(tf.int64, tf.float32, dim=ROW_DIM, name="wide_rows",
                                initializer=-1.0, trainable=False)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="keys")])
    def serve(self, keys):
        return {"rows": self.rows.lookup(keys)}


def write_rows(rows_model, generation):
    keys = np.arange(2000, dtype=np.int64)
    rows_model.rows.upsert(keys, np.full((2000, ROW_DIM), float(generation), np.float32))


def test_a_server_applies_each_round_while_serving(tmp_path):
    rng = np.random.default_rng(28)
    model, embedding = build_model()
    serve_ids = rng.integers(0, 3000, (64, 2)).astype(np.int64)
    np.save(tmp_path / "ids.npy", serve_ids)

    def train_round():
        x = rng.integers(0, 3000, (1024, 2)).astype(np.int64)
        y = rng.standard_normal((1024, 1)).astype(np.float32)
        model.fit(x, y, batch_size=128, epochs=1, verbose=0)

    train_round()
    exporter = de.DeltaExporter(model, str(tmp_path / "deltas"))
    assert exporter.write() == 0
    model.export(str(tmp_path / "keras_export"), verbose=False)
    updater = de.serving.DeltaUpdater(model)
    model.delta_updater = updater
    serve = tf.function(lambda ids: {"output": model(ids, training=False)},
                        input_signature=[tf.TensorSpec([None, 2], tf.int64, name="ids")])
    tf.saved_model.save(model, str(tmp_path / "saved_model"),
                        signatures={"serving_default": serve,
                                    "apply_deltas": updater.apply_deltas})
    rows_model = RowModel()
    write_rows(rows_model, 0)
    rows_exporter = de.DeltaExporter(rows_model, str(tmp_path / "row_deltas"))
    rows_exporter.write()
    tf.saved_model.save(rows_model, str(tmp_path / "rows"),
                        signatures={"serving_default": rows_model.serve})

    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.Popen([sys.executable, WORKER, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)

    def reply():
        line = proc.stdout.readline()
        assert line, "the serving process died"
        return json.loads(line)

    try:
        assert reply() == {"ready": True}
        evicted = 0
        previous = model(serve_ids, training=False).numpy()
        for round_ in range(1, ROUNDS + 1):
            train_round()
            evicted += int(embedding.params.size()) >= CAPACITY
            for _ in range(3):
                write_rows(rows_model, round_ * 10 + _)
                rows_exporter.write()
            assert exporter.write() == round_
            live = model(serve_ids, training=False).numpy()
            assert not np.allclose(live, previous, rtol=0, atol=1e-4)  # training moved it
            previous = live
            proc.stdin.write("apply\n")
            proc.stdin.flush()
            got = reply()
            # The first apply also takes the base: the SavedModels hold it already, and
            # applying it again changes nothing.
            first = 1 if round_ == 1 else 0
            assert got["applied"] == {"rows": 3 + first, "keras_export": 1 + first,
                                      "saved_model": 1 + first}
            np.testing.assert_allclose(got["keras_export"], live, rtol=0, atol=1e-6)
            np.testing.assert_allclose(got["saved_model"], live, rtol=0, atol=1e-6)
            assert got["torn"] == 0 and got["reads"] > 0
        assert evicted > 0, "the bounded table never filled"
        assert embedding.params.tables[0].size() > 0
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
