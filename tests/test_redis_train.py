"""Training with Redis-backed variables (de.RedisTableCreator): the same losses and rows
as in-memory tables under DynamicEmbeddingOptimizer with slots, restrict policies, and
a Redis killed mid-training: the step fails with UnavailableError, and training resumes
from the last checkpoint once Redis is back (empty: the checkpoint refills it)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from redis_util import RedisServer, redis_config, redis_server, require_redis, write_config  # noqa: F401

DIM = 4
STEPS = [np.array(ids, np.int64) for ids in
         ([1, 2, 3, 2], [3, 4, 5], [1, 5, 6, 7, 7], [8, 1, 2], [2, 9, 10], [1, 11, 3])]
OPTIMIZERS = {
    "adam": lambda: tf.keras.optimizers.Adam(0.1),
    "adagrad": lambda: tf.keras.optimizers.Adagrad(0.2),
    "sgd": lambda: tf.keras.optimizers.SGD(0.3),
}


def make_var(name, kv_creator, restrict_policy=None):
    # de.Variable, not de.get_variable: that returns the variable made before under `name`.
    return de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, name=name,
                       initializer=tf.keras.initializers.Constant(0.25),
                       kv_creator=kv_creator, restrict_policy=restrict_policy)


def train(var, optimizer, dense, steps):
    weights = tf.constant(np.linspace(-1.0, 1.0, DIM, dtype=np.float32))
    losses = []
    for ids in steps:
        with tf.GradientTape() as tape:
            rows, view = de.embedding_lookup(var, tf.constant(ids), name="user",
                                             return_trainable=True)
            loss = tf.reduce_sum(tf.square(rows * weights - dense))
        grads = tape.gradient(loss, [view, dense])
        optimizer.apply_gradients(zip(grads, [view, dense]))
        losses.append(float(loss))
    return np.array(losses)


def run(kv_creator, optimizer_name, steps=STEPS, name="emb"):
    var = make_var(name, kv_creator)
    dense = tf.Variable(np.full(DIM, 0.1, np.float32))
    optimizer = de.DynamicEmbeddingOptimizer(OPTIMIZERS[optimizer_name]())
    losses = train(var, optimizer, dense, steps)
    keys = np.arange(1, 12, dtype=np.int64)
    return losses, var.lookup(keys).numpy(), var, optimizer


@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_trains_like_the_in_memory_table(tmp_path, redis_server, optimizer_name):
    path = write_config(tmp_path, redis_server.port, model_tag_runtime=f"train_{optimizer_name}")
    creator = de.RedisTableCreator(redis_config(path))
    losses, rows, var, optimizer = run(creator, optimizer_name)
    ref_losses, ref_rows, _, _ = run(de.HashTableCreator(), optimizer_name)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    np.testing.assert_allclose(rows, ref_rows, rtol=1e-6)
    assert int(var.size()) == 11
    # The variable and its slots live in Redis, under the variable's name.
    client = redis_server.client()
    names = sorted(client.call("KEYS", f"train_{optimizer_name}:*"))
    client.close()
    assert f"train_{optimizer_name}:emb{{3560}}".encode() in names
    slots = var.get_slot_variables(optimizer)
    assert len(names) == 1 + (1 if slots else 0)
    for slot in slots:
        assert int(slot.size()) == 11


def test_restrict_policy(tmp_path, redis_server):
    path = write_config(tmp_path, redis_server.port)
    results = []
    for creator in (de.RedisTableCreator(redis_config(path)), de.HashTableCreator()):
        var = make_var("restricted", creator, restrict_policy=de.FrequencyRestrictPolicy)
        dense = tf.Variable(np.full(DIM, 0.1, np.float32))
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
        train(var, optimizer, dense, STEPS)
        var.restrict(3, trigger=5)
        keys = sorted(var.export()[0].numpy().tolist())
        slot_keys = [sorted(s.export()[0].numpy().tolist()) for s in var.get_slot_variables(optimizer)]
        results.append((keys, slot_keys, var.lookup(np.array(keys, np.int64)).numpy()))
    assert results[0][0] == results[1][0] and len(results[0][0]) == 3
    assert results[0][1] == results[1][1]
    np.testing.assert_allclose(results[0][2], results[1][2], rtol=1e-6)


def test_killed_redis_fails_the_step_and_training_resumes_from_the_checkpoint(tmp_path):
    require_redis()
    server = RedisServer(str(tmp_path / "train_kill"))
    try:
        path = write_config(tmp_path, server.port, model_tag_runtime="resume")
        creator = de.RedisTableCreator(redis_config(path))
        var = make_var("emb", creator)
        dense = tf.Variable(np.full(DIM, 0.1, np.float32))
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
        first = train(var, optimizer, dense, STEPS[:3])
        saved = tf.train.Checkpoint(emb=var, optimizer=optimizer, dense=dense).write(
            str(tmp_path / "ckpt"))
        train(var, optimizer, dense, STEPS[3:4])
        server.kill()
        with pytest.raises(tf.errors.UnavailableError, match="Redis at 127.0.0.1"):
            train(var, optimizer, dense, STEPS[4:5])

        server.start()  # empty: nothing was persisted
        var = make_var("emb", de.RedisTableCreator(redis_config(path)))
        dense = tf.Variable(np.zeros(DIM, np.float32))
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1))
        status = tf.train.Checkpoint(emb=var, optimizer=optimizer, dense=dense).read(saved)
        second = train(var, optimizer, dense, STEPS[3:])
        status.assert_existing_objects_matched()
        reference, _, _, _ = run(de.HashTableCreator(), "adam")
        np.testing.assert_allclose(np.concatenate([first, second]), reference, rtol=1e-6)
    finally:
        server.kill()


def test_a_redis_backed_variable_takes_one_shard(tmp_path, redis_server):
    creator = de.RedisTableCreator(redis_config(write_config(tmp_path, redis_server.port)))
    with pytest.raises(ValueError, match="takes one shard, got 2"):
        de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=DIM, name="two_shards",
                    devices=["/CPU:0", "/CPU:1"], kv_creator=creator)
