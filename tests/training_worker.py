"""Training scenarios in TF1 graph mode, which needs a fresh process; run by
tests/test_training.py, not by pytest. Also the home of the training data and loss
that test_training.py shares, so that the graph and the eager runs train on the same.

    python tests/training_worker.py graph WORKDIR
        `tf.compat.v1.disable_eager_execution()`, then TFRA's graph pattern:
        `embedding_lookup(..., return_trainable=True)` + a TF1 optimizer's `minimize`,
        run in a `tf.compat.v1.Session` and in `MonitoredTrainingSession`s that stop
        after 5 steps and restart from their checkpoint_dir.

Prints one JSON object on the last line of stdout: {scenario: result}; a scenario
that raises records {"error": traceback}.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import tensorflow as tf

# ----------------------------------------------------------------------------------------
# The data: 8 keys, 10 batches of 6 ids (shared with test_training.py)
# ----------------------------------------------------------------------------------------

KEYS = np.array([3, 17, -5, 2**40, 42, 7, 1000, 99], np.int64)

# Indices into KEYS. Key 0 repeats in most batches (duplicates sum), key 7 (99) is
# seen only in step 2 (its row and slots must then stay put while the others move on),
# key 6 (1000) is new from step 6 on, and no batch holds every key.
_STEP_INDICES = [
    [0, 1, 0, 2, 0, 4],
    [1, 1, 3, 5, 0, 1],
    [7, 2, 2, 0, 4, 4],
    [3, 3, 3, 1, 5, 2],
    [0, 4, 5, 0, 1, 3],
    [2, 5, 1, 1, 0, 0],
    [6, 0, 6, 3, 4, 1],
    [5, 6, 2, 2, 6, 0],
    [4, 4, 1, 3, 0, 5],
    [6, 1, 0, 0, 2, 3],
]
STEP_IDS = [KEYS[np.array(indices)] for indices in _STEP_INDICES]
BATCH = len(_STEP_INDICES[0])
NUM_STEPS = len(STEP_IDS)

# The graph scenarios' model: dim and shards of the variable, TF1 Adam's learning rate.
GRAPH_DIM = 10
GRAPH_SHARDS = 2
GRAPH_ADAM_LR = 0.1


def loss_weights(dim: int) -> np.ndarray:
    """Fixed per-position weights of the loss, `[BATCH, dim]`."""
    rng = np.random.default_rng(dim)
    return rng.uniform(-1.0, 1.0, [BATCH, dim]).astype(np.float32)


def dense_initial(dim: int) -> np.ndarray:
    """The initial value of the dense variable trained alongside the table."""
    return np.linspace(0.5, 1.5, dim).astype(np.float32)


def loss_fn(emb, dense, weights):
    """Nonlinear in the rows (so gradients depend on the current rows and every
    optimizer's trajectory depends on getting earlier steps right) and coupled to a
    dense variable trained by the same optimizer."""
    return tf.reduce_sum(tf.tanh(emb * dense) * weights) + 0.1 * tf.reduce_sum(tf.square(emb))


def random_initializer():
    """Key-seeded random initial rows: every key starts somewhere else, the same in any
    process, mode and number of shards."""
    return tf.keras.initializers.RandomNormal(0.0, 0.5, seed=11)


# ----------------------------------------------------------------------------------------
# TF1 graph mode
# ----------------------------------------------------------------------------------------

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


class GraphModel:
    """TFRA's graph pattern in the default graph: a placeholder of ids, a lookup with
    `return_trainable=True`, TF1 Adam wrapped by DynamicEmbeddingOptimizer, and
    `minimize` over the trainable variables (the lookup's trainable view among them)."""

    def __init__(self, shards: int):
        import tensorflow_dynemb as de

        self.var = de.get_variable(
            "emb",
            dim=GRAPH_DIM,
            devices=["/CPU:0"] * shards,
            initializer=random_initializer(),
        )
        self.ids = tf.compat.v1.placeholder(tf.int64, [None])
        self.dense = tf.compat.v1.get_variable("dense", initializer=dense_initial(GRAPH_DIM))
        emb, self.trainable = de.embedding_lookup(
            self.var, self.ids, name="user", return_trainable=True
        )
        self.loss = loss_fn(emb, self.dense, tf.constant(loss_weights(GRAPH_DIM)))
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        self.optimizer = de.DynamicEmbeddingOptimizer(
            tf.compat.v1.train.AdamOptimizer(GRAPH_ADAM_LR)
        )
        self.train = self.optimizer.minimize(self.loss, global_step=self.global_step)
        self.rows = self.var.lookup(KEYS)
        self.size = self.var.size()
        self.slot_sizes = [slot.size() for slot in self.var.get_slot_variables(self.optimizer)]

    def steps(self, sess, steps):
        """Runs one training step per batch of ids; the loss of each (before its update)."""
        return [float(sess.run([self.train, self.loss], {self.ids: ids})[1]) for ids in steps]

    def state(self, sess):
        rows, size, slot_sizes, dense, step = sess.run(
            [self.rows, self.size, self.slot_sizes, self.dense, self.global_step]
        )
        return {"rows": rows, "size": size, "slot_sizes": slot_sizes, "dense": dense, "step": step}


@scenario
def graph_session(workdir):
    """10 steps in a plain Session."""
    with tf.Graph().as_default():
        model = GraphModel(GRAPH_SHARDS)
        trainable_names = [v.name for v in tf.compat.v1.trainable_variables()]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            result = {"losses": model.steps(sess, STEP_IDS)}
            result.update(model.state(sess))
            result["loss_after"] = float(sess.run(model.loss, {model.ids: STEP_IDS[0]}))
        result["trainable_is_listed"] = model.trainable.name in trainable_names
        result["trainable_by_name"] = model.var.get_trainable_by_name("user") is model.trainable
    return result


@scenario
def graph_monitored_session(workdir):
    """5 steps in a MonitoredTrainingSession, then a new graph (with another number of
    shards) and session on the same checkpoint_dir: restores table, slots, the dense
    variable, Adam's beta powers and the global step, and trains 5 more steps."""
    checkpoint_dir = os.path.join(workdir, "monitored")
    result = {}
    with tf.Graph().as_default():
        model = GraphModel(GRAPH_SHARDS)
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir) as sess:
            result["losses_first"] = model.steps(sess, STEP_IDS[:5])
            result["first"] = model.state(sess)
    with tf.Graph().as_default():
        model = GraphModel(GRAPH_SHARDS + 1)
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir) as sess:
            result["restored"] = model.state(sess)
            result["losses_second"] = model.steps(sess, STEP_IDS[5:])
            result.update(model.state(sess))
    return result


def main(argv):
    from tables_worker import run_worker

    run_worker(argv, SCENARIOS, {})


if __name__ == "__main__":
    main(sys.argv)
