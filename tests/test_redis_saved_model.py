"""A SavedModel of a model whose embedding lives in Redis (de.RedisTableCreator), served
in a fresh process: what TFRA users do when training jobs and online services share one
Redis.

* The served outputs equal the trained model's.
* Serving reads Redis live: a row the trainer writes after the export is what the server
  returns next (the SavedModel holds the table's config, not a copy of its rows).
* The server reads the config file again where it loads (TFRA_REDIS_CONFIG_PATH), so the
  same SavedModel can point at another Redis or model tag: there it finds no rows and
  returns the default row (not the trained one, and not an error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import tensorflow_dynemb as de
from redis_util import redis_config, redis_server, write_config  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DIM = 4
IDS = np.array([1, 2, 3, 7, 1, 99], np.int64)  # 99 is never trained

SERVE = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_dynemb  # registers the ops the SavedModel calls
loaded = tf.saved_model.load(sys.argv[1])
ids = tf.constant(json.loads(sys.argv[2]), tf.int64)
out = loaded.signatures["serving_default"](ids=ids)["scores"]
print(json.dumps(out.numpy().tolist()))
"""


class Ranker(tf.Module):
    def __init__(self, config):
        super().__init__()
        self.emb = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM,
                               name="saved_emb", kv_creator=de.RedisTableCreator(config),
                               initializer=tf.keras.initializers.Constant(0.5))
        self.w = tf.Variable(np.linspace(-1.0, 1.0, DIM, dtype=np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    def serve(self, ids):
        rows = de.embedding_lookup(self.emb, ids, name="serve")
        return {"scores": tf.reduce_sum(rows * self.w, axis=1)}


def _train(model, steps=4):
    """Trains a few steps on ids in [1, 9); returns the set of ids trained."""
    optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
    rng = np.random.default_rng(0)
    trained = set()
    for _ in range(steps):
        batch = rng.integers(1, 9, size=6)
        trained.update(batch.tolist())
        ids = tf.constant(batch, tf.int64)
        with tf.GradientTape() as tape:
            rows, view = de.embedding_lookup(model.emb, ids, name="train",
                                             return_trainable=True)
            loss = tf.reduce_sum(tf.square(tf.reduce_sum(rows * model.w, axis=1) - 1.0))
        grads = tape.gradient(loss, [view, model.w])
        optimizer.apply_gradients(zip(grads, [view, model.w]))
    return trained


def _serve(export_dir, config_path):
    env = dict(os.environ, TFRA_REDIS_CONFIG_PATH=config_path,
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", SERVE, export_dir, json.dumps(IDS.tolist())],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.array(json.loads(proc.stdout.strip().splitlines()[-1]), np.float32)


def _export(tmp_path, config_path):
    model = Ranker(redis_config(config_path))
    trained = _train(model)
    assert 1 in trained
    live = model.serve(tf.constant(IDS))["scores"].numpy()
    assert live[0] != live[-1]  # trained rows differ from the default row
    export_dir = str(tmp_path / "export")
    tf.saved_model.save(model, export_dir, signatures={"serving_default": model.serve})
    return model, live, export_dir, trained


def test_a_server_with_table_store_mode_2_reads_the_trainers_live_rows(tmp_path, redis_server):
    tag = f"live_{os.getpid()}"
    path = write_config(tmp_path, redis_server.port, model_tag_runtime=tag)
    model, live, export_dir, trained = _export(tmp_path, path)
    # The server's own config: the same Redis and tag, restoring nothing.
    serving = write_config(tmp_path, redis_server.port, model_tag_runtime=tag,
                           table_store_mode=2)
    np.testing.assert_array_equal(_serve(export_dir, serving), live)

    # The trainer writes after the export: the server returns the new row, and loading
    # the SavedModel again leaves the trainer's rows as they are.
    model.emb.upsert(tf.constant([1, 50], tf.int64), tf.fill([2, DIM], 2.0))
    expected = model.serve(tf.constant(IDS))["scores"].numpy()
    assert expected[0] != live[0]
    np.testing.assert_array_equal(_serve(export_dir, serving), expected)
    np.testing.assert_array_equal(model.serve(tf.constant(IDS))["scores"].numpy(), expected)
    assert int(model.emb.size()) == len(trained | {50})  # 50: written after the export

    # Pointed at another model tag, the same SavedModel finds no rows there: every id
    # gets the variable's default row, and nothing is written there.
    other = write_config(tmp_path, redis_server.port, model_tag_runtime=tag + "_other",
                         table_store_mode=2)
    default_score = float(np.sum(np.full(DIM, 0.5, np.float32) * model.w.numpy()))
    np.testing.assert_allclose(_serve(export_dir, other), np.full(len(IDS), default_score),
                               rtol=1e-6)
    client = redis_server.client()
    assert not client.call("KEYS", f"{tag}_other:*")
    client.close()


def test_a_server_with_the_trainers_config_restores_the_export_into_redis(tmp_path,
                                                                          redis_server):
    """table_store_mode 0 / 1 (the default): loading the SavedModel restores its rows, as a
    checkpoint restore does -- the table holds the export's content afterwards (rows
    written since are gone). docs/tables.md tells servers to load with mode 2."""
    tag = f"restore_{os.getpid()}"
    path = write_config(tmp_path, redis_server.port, model_tag_runtime=tag)
    model, live, export_dir, trained = _export(tmp_path, path)
    model.emb.upsert(tf.constant([1, 50], tf.int64), tf.fill([2, DIM], 2.0))
    np.testing.assert_array_equal(_serve(export_dir, path), live)
    np.testing.assert_array_equal(model.serve(tf.constant(IDS))["scores"].numpy(), live)
    assert int(model.emb.size()) == len(trained)  # 50, written after the export, is gone


def test_table_store_mode_2_keeps_a_variables_rows_out_of_checkpoints(tmp_path,
                                                                     redis_server):
    """With mode 2 in the trainer's config a Redis-backed de.Variable saves none of its
    rows (and a restore writes none); with mode 0 the checkpoint holds them."""
    saved = {}
    for mode in (2, 0):
        path = write_config(tmp_path, redis_server.port, table_store_mode=mode)
        var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM,
                          name=f"ckpt_mode{mode}", kv_creator=de.RedisTableCreator(
                              redis_config(path)))
        var.upsert(tf.constant([1, 2, 3], tf.int64), tf.ones([3, DIM]))
        prefix = tf.train.Checkpoint(v=var).save(str(tmp_path / f"ckpt{mode}"))
        names = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
        saved[mode] = sorted(n for n in names if n.startswith("v/"))
        var.upsert(tf.constant([4], tf.int64), tf.ones([1, DIM]))
        tf.train.Checkpoint(v=var).restore(prefix)
        assert int(var.size()) == (4 if mode == 2 else 3)  # mode 2: Redis left as it is
    assert saved[2] == []
    assert saved[0] == ["v/.ATTRIBUTES/-keys", "v/.ATTRIBUTES/-scores", "v/.ATTRIBUTES/-values"]
