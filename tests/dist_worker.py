"""One task of a local cluster, for tests/test_distributed.py; not run by pytest.

    python tests/dist_worker.py MODE '<json args>'

Modes:
  ps             a parameter server: `tf.distribute.Server(...).join()`.
  tf1_train      a chief or worker of TF1 between-graph training: variables on the PS
                 tasks, a `MonitoredTrainingSession` on this task's server.
  tf1_restore    a chief that restores the checkpoint of `tf1_train` into a cluster with
                 another number of PS (or, without a cluster, into one local shard).
  tf1_inspect    a client of the PS servers only: reads the trained tables there.

Prints one JSON object on the last line of stdout; an exception prints {"error": ...}.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import cluster_util  # this folder (the script's own, first on sys.path)

DIM = 4
NUM_KEYS = 48
BATCH = 16
SHARED_KEY = 1_000_003  # looked up by every task in every step (the bp_v2 check)
LR = 0.25  # SGD: every step moves the shared counter by exactly -LR
BIAS_SCALE = 0.05


def targets(keys: np.ndarray) -> np.ndarray:
    """What each key's row should learn."""
    return np.sin(np.asarray(keys, np.float32)[:, None] * np.arange(1, DIM + 1) * 0.37).astype(
        np.float32
    )


def batches(job: str, index: int, steps: int):
    seed = {"chief": 0, "worker": 1 + index}.get(job, 100 + index)
    rng = np.random.default_rng(seed)
    return [rng.integers(0, NUM_KEYS, BATCH).astype(np.int64) for _ in range(steps)]


def ps_devices(num_ps: int):
    return [f"/job:ps/task:{i}" for i in range(num_ps)]


# ----------------------------------------------------------------------------------------
# TF1 graph model
# ----------------------------------------------------------------------------------------


class TF1Model:
    """`emb` (the regression table), `counter` (one key, moved by -LR per step by every
    task: with bp_v2 no task's update may be lost), a dense bias; SGD, bp_v2=True."""

    def __init__(self, devices, worker_device=None, cluster=None):
        import tensorflow as tf
        import tensorflow_dynemb as de

        setter = (
            tf.compat.v1.train.replica_device_setter(worker_device=worker_device, cluster=cluster)
            if cluster is not None
            else None
        )
        with tf.compat.v1.device(setter):
            self.emb = de.get_variable(
                "emb",
                dim=DIM,
                devices=devices,
                initializer=tf.keras.initializers.RandomNormal(0.0, 0.1, seed=3),
            )
            self.counter = de.get_variable("counter", dim=2, devices=devices, initializer=0.0)
            self.bias = tf.compat.v1.get_variable("bias", initializer=tf.zeros([DIM]))
            self.ids = tf.compat.v1.placeholder(tf.int64, [None])
            rows = de.embedding_lookup(self.emb, self.ids, name="user")
            pred = rows + BIAS_SCALE * self.bias
            target = tf.math.sin(
                tf.cast(self.ids, tf.float32)[:, None] * tf.range(1.0, DIM + 1.0) * 0.37
            )
            self.loss = 0.5 * tf.reduce_sum(tf.square(pred - target))
            shared = de.embedding_lookup(
                self.counter, tf.constant([SHARED_KEY], tf.int64), name="shared"
            )
            self.global_step = tf.compat.v1.train.get_or_create_global_step()
            optimizer = de.DynamicEmbeddingOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(LR), bp_v2=True
            )
            self.train = optimizer.minimize(
                self.loss + tf.reduce_sum(shared), global_step=self.global_step
            )
            all_keys = tf.range(NUM_KEYS, dtype=tf.int64)
            all_pred = self.emb.lookup(all_keys) + BIAS_SCALE * self.bias
            all_target = tf.constant(targets(np.arange(NUM_KEYS)))
            self.eval_loss = tf.reduce_mean(tf.reduce_sum(tf.square(all_pred - all_target), 1))
            self.state = state_tensors(self.emb, self.counter)
            # Stores the shared key before any task trains (see tf1_train).
            self.store_counter = self.counter.upsert(
                tf.constant([SHARED_KEY], tf.int64), tf.zeros([1, 2])
            )


def state_tensors(emb, counter):
    import tensorflow as tf

    keys, values = emb.export()
    return {
        "sizes": [emb.size(i) for i in range(emb.shard_num)],
        "keys": keys,
        "values": values,
        "counter": counter.lookup(tf.constant([SHARED_KEY], tf.int64)),
        "counter_size": counter.size(),
    }


def content(state):
    """JSON-able state: rows by key."""
    return {
        "sizes": [int(s) for s in state["sizes"]],
        "rows": {str(int(k)): [float(x) for x in v] for k, v in zip(state["keys"], state["values"])},
        "counter": [float(x) for x in state["counter"][0]],
        "counter_size": int(state["counter_size"]),
    }


def _server(args):
    import tensorflow as tf

    cluster = tf.train.ClusterSpec(args["cluster"])
    return cluster, tf.distribute.Server(
        cluster, job_name=args["job"], task_index=args["index"], start=True
    )


def _session_config(job, index):
    import tensorflow as tf

    return tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:{job}/task:{index}"])


def tf1_train(args):
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    cluster, server = _server(args)
    job, index = args["job"], args["index"]
    is_chief = job == "chief"
    workdir = args["workdir"]
    steps = args["steps"]
    num_ps = len(args["cluster"]["ps"])
    model = TF1Model(ps_devices(num_ps), f"/job:{job}/task:{index}", cluster)
    result = {"placement": {}}
    for name, var in (("emb", model.emb), ("counter", model.counter)):
        result["placement"][name] = [t.resource_handle.device for t in var.tables]
    result["view_devices"] = [
        view.device for var in (model.emb, model.counter) for view in var.trainable_store.values()
    ]
    losses = []
    done = 0
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=is_chief,
        checkpoint_dir=os.path.join(workdir, "ckpt") if is_chief else None,
        save_checkpoint_secs=3600,  # the chief saves when the session closes
        config=_session_config(job, index),
        log_step_count_steps=0,
    ) as sess:
        # The chief measures the initial loss and stores the shared key before any
        # task trains: a worker's session may open before the chief's first run, and
        # bp_v2 counts every delta to a stored key, but of concurrent first writes of
        # a new key only one (accum semantics, docs/scaling.md).
        ready = os.path.join(workdir, "chief-ready")
        if is_chief:
            losses.append(float(sess.run(model.eval_loss)))
            sess.run(model.store_counter)
            _touch_atomically(ready)
        else:
            _wait_for_file(ready)
        for ids in batches(job, index, steps):
            sess.run(model.train, {model.ids: ids})
            done += 1
            if args.get("pace"):
                time.sleep(args["pace"])
        result["steps"] = done
        if is_chief:
            # Everyone's updates are in before the final state and the checkpoint.
            for w in range(len(args["cluster"].get("worker", []))):
                path = os.path.join(workdir, f"done-worker{w}")
                _wait_for_file(path)
                with open(path) as f:
                    result.setdefault("worker_steps", []).append(int(f.read()))
            losses.append(float(sess.run(model.eval_loss)))
            result["state"] = content(sess.run(model.state))
            result["global_step"] = int(sess.run(model.global_step))
        else:
            _touch_atomically(os.path.join(workdir, f"done-{job}{index}"), str(done))
    result["eval_losses"] = losses
    return result


def _touch_atomically(path, text=""):
    """Writes `path` so that a reader sees it whole or not at all."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def _wait_for_file(path, timeout=120):
    """Waits until another task of the cluster wrote `path` (a timeout leaves the
    caller's open() to fail with the file's name)."""
    deadline = time.time() + timeout
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.05)


def tf1_failover(args):
    """The chief alone trains until global step `last_step`, one paced step at a time,
    checkpointing every `every` steps and writing its progress to `progress`; the test
    kills a PS meanwhile, then restarts it. MonitoredTrainingSession recovers from the
    UnavailableError by creating a new session, which waits for the PS and restores
    the last checkpoint on every PS."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    cluster, server = _server(args)
    num_ps = len(args["cluster"]["ps"])
    model = TF1Model(ps_devices(num_ps), "/job:chief/task:0", cluster)
    errors = []
    final = {}

    class Progress(tf.compat.v1.train.SessionRunHook):
        def after_create_session(self, session, coord):
            errors.append(("session", int(session.run(model.global_step))))

        def end(self, session):
            final.update(state=content(session.run(model.state)),
                         global_step=int(session.run(model.global_step)))

    steps = 0
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target,
        is_chief=True,
        checkpoint_dir=os.path.join(args["workdir"], "failover"),
        save_checkpoint_steps=args["every"],
        config=_session_config("chief", 0),
        hooks=[tf.compat.v1.train.StopAtStepHook(last_step=args["last_step"]), Progress()],
        log_step_count_steps=0,
    ) as sess:
        batch = batches("chief", 0, 1)[0]
        while not sess.should_stop():
            sess.run(model.train, {model.ids: batch})
            steps += 1
            with open(args["progress"], "w") as f:
                f.write(str(steps))
            time.sleep(args["pace"])
    return dict(final, steps_run=steps, sessions=errors)


def tf1_restore(args):
    """Restores `args["checkpoint_dir"]` into a cluster of this task (a chief) and the
    given PS, or into a single process with one shard when no cluster is given."""
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    if args.get("cluster"):
        cluster, server = _server(args)
        num_ps = len(args["cluster"]["ps"])
        model = TF1Model(ps_devices(num_ps), "/job:chief/task:0", cluster)
        master, config = server.target, _session_config("chief", 0)
    else:
        model = TF1Model(["/CPU:0"])
        master, config = "", None
    scaffold = tf.compat.v1.train.Scaffold()
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=master,
        is_chief=True,
        checkpoint_dir=args["checkpoint_dir"],
        save_checkpoint_steps=None,
        save_checkpoint_secs=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        config=config,
        scaffold=scaffold,
    ) as sess:
        return {
            "state": content(sess.run(model.state)),
            "global_step": int(sess.run(model.global_step)),
            "eval_loss": float(sess.run(model.eval_loss)),
        }


def tf1_inspect(args):
    """A fresh graph naming the same tables, run on the PS servers only: what the PS
    processes hold."""
    import tensorflow as tf
    import tensorflow_dynemb as de

    tf.compat.v1.disable_eager_execution()
    num_ps = len(args["cluster"]["ps"])
    emb = de.get_variable("emb", dim=DIM, devices=ps_devices(num_ps))
    counter = de.get_variable("counter", dim=2, devices=ps_devices(num_ps))
    state = state_tensors(emb, counter)
    target = "grpc://" + args["cluster"]["ps"][0]
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps"])
    with tf.compat.v1.Session(target, config=config) as sess:
        return {"state": content(sess.run(state))}


def ps(args):
    import tensorflow as tf
    import tensorflow_dynemb  # noqa: F401  (registers the table ops and kernels here)

    server = tf.distribute.Server(
        tf.train.ClusterSpec(args["cluster"]), job_name="ps", task_index=args["index"], start=True
    )
    print("ps started", flush=True)
    server.join()


def _pss(args):
    """The ParameterServerStrategy and ClusterCoordinator of this chief."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(args["cluster"]), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    return strategy, tf.distribute.coordinator.ClusterCoordinator(strategy)


class TF2Model:
    """TF1Model's regression (`emb`, the shared `counter` key, a dense bias) as TF2
    objects; SGD with bp_v2=True, so that every worker's step moves the counter."""

    def __init__(self, devices):
        import tensorflow as tf
        import tensorflow_dynemb as de

        self.emb = de.get_variable(
            "emb", dim=DIM, devices=devices,
            initializer=tf.keras.initializers.RandomNormal(0.0, 0.1, seed=3),
        )
        self.counter = de.get_variable("counter", dim=2, devices=devices, initializer=0.0)
        self.bias = tf.Variable(tf.zeros([DIM]), name="bias")
        self.optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.SGD(LR), bp_v2=True)
        self.checkpoint = tf.train.Checkpoint(
            emb=self.emb, counter=self.counter, bias=self.bias, optimizer=self.optimizer
        )

    def loss(self, ids, rows):
        import tensorflow as tf

        pred = rows + BIAS_SCALE * self.bias
        target = tf.math.sin(tf.cast(ids, tf.float32)[:, None] * tf.range(1.0, DIM + 1.0) * 0.37)
        return 0.5 * tf.reduce_sum(tf.square(pred - target))

    def step(self, ids):
        """One training step of one worker."""
        import tensorflow as tf
        import tensorflow_dynemb as de

        with tf.GradientTape() as tape:
            rows, user = de.embedding_lookup(self.emb, ids, name="user", return_trainable=True)
            shared, counter = de.embedding_lookup(
                self.counter, tf.constant([SHARED_KEY], tf.int64), name="shared",
                return_trainable=True,
            )
            loss = self.loss(ids, rows) + tf.reduce_sum(shared)
        variables = [user, counter, self.bias]
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    def eval_loss(self):
        import tensorflow as tf

        keys = tf.range(NUM_KEYS, dtype=tf.int64)
        pred = self.emb.lookup(keys) + BIAS_SCALE * self.bias
        return float(tf.reduce_mean(tf.reduce_sum(tf.square(pred - targets(np.arange(NUM_KEYS))), 1)))

    def state(self):
        return content({k: (v.numpy() if hasattr(v, "numpy") else [x.numpy() for x in v])
                        for k, v in state_tensors(self.emb, self.counter).items()})


def _pss_regression(args):
    """The coordinator, a TF2Model on this cluster's PS, and its step function (one
    worker's training step, for `coordinator.schedule`)."""
    import tensorflow as tf

    strategy, coordinator = _pss(args)
    with strategy.scope():
        model = TF2Model(ps_devices(len(args["cluster"]["ps"])))

    @tf.function
    def step(ids):
        strategy.run(model.step, args=(ids,))

    return coordinator, model, step


def pss_custom_loop(args):
    """The coordinator of a ParameterServerStrategy cluster: a ClusterCoordinator custom
    loop over the batches of every task of the TF1 test (`steps` each), then a
    checkpoint of the trained state."""
    import tensorflow as tf

    coordinator, model, step = _pss_regression(args)
    # The shared key is stored before the workers start: bp_v2 adds every step's delta
    # to a stored key, but of two concurrent first writes of a key no one stored yet
    # (both looked it up as missing) only one inserts (accum semantics, docs/scaling.md).
    model.counter.upsert(tf.constant([SHARED_KEY], tf.int64), tf.zeros([1, 2]))

    initial = model.eval_loss()
    scheduled = 0
    for job, index in (("chief", 0), ("worker", 0), ("worker", 1)):
        for ids in batches(job, index, args["steps"]):
            coordinator.schedule(step, args=(tf.constant(ids),))
            scheduled += 1
    coordinator.join()
    result = {
        "placement": {
            "emb": [t.resource_handle.device for t in model.emb.tables],
            "counter": [t.resource_handle.device for t in model.counter.tables],
            "bias": model.bias.device,
        },
        "scheduled": scheduled,
        "iterations": int(model.optimizer.iterations.numpy()),
        "eval_losses": [initial, model.eval_loss()],
        "state": model.state(),
    }
    result["checkpoint"] = model.checkpoint.write(os.path.join(args["workdir"], "pss", "ckpt"))
    return result


def pss_keras3_layer_loop(args):
    """The chief of a ParameterServerStrategy cluster training a Keras 3 model of a
    de.keras.layers.Embedding (on the PS) with a ClusterCoordinator custom loop."""
    import keras
    import tensorflow as tf
    import tensorflow_dynemb as de

    strategy, coordinator = _pss(args)
    with strategy.scope():
        embedding = de.keras.layers.Embedding(
            DIM, devices=ps_devices(len(args["cluster"]["ps"])), name="emb",
            initializer=keras.initializers.RandomNormal(0.0, 0.1, seed=3),
        )
        inputs = keras.Input((), dtype="int64")
        dense = keras.layers.Dense(DIM, kernel_initializer=keras.initializers.GlorotUniform(seed=5))
        model = keras.Model(inputs, dense(embedding(inputs)))
        optimizer = de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(0.02))

    @tf.function
    def step(ids):
        def replica_fn(ids):
            with tf.GradientTape() as tape:
                pred = model(ids, training=True)
                loss = tf.reduce_mean(tf.square(pred - tf.math.sin(
                    tf.cast(ids, tf.float32)[:, None] * tf.range(1.0, DIM + 1.0) * 0.37)))
            variables = model.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

        strategy.run(replica_fn, args=(ids,))

    def eval_loss():
        keys = np.arange(NUM_KEYS)
        return float(np.mean((model(keys).numpy() - targets(keys)) ** 2))

    initial = eval_loss()
    scheduled = 0
    for _ in range(args["epochs"]):
        for job, index in (("chief", 0), ("worker", 0), ("worker", 1)):
            for ids in batches(job, index, args["steps"]):
                coordinator.schedule(step, args=(tf.constant(ids),))
                scheduled += 1
    coordinator.join()
    slots = embedding.params.get_slot_variables(optimizer)
    return {
        "placement": [t.resource_handle.device for t in embedding.params.tables],
        "slot_placement": [[t.resource_handle.device for t in s.tables] for s in slots],
        "sizes": [int(embedding.params.size(i)) for i in range(embedding.params.shard_num)],
        "eval_losses": [initial, eval_loss()],
        "scheduled": scheduled,
    }


def pss_failover(args):
    """A ClusterCoordinator loop that checkpoints after `every` steps, writes
    `progress`, then keeps scheduling paced steps while the test kills a PS. Returns
    the error the coordinator raised and the checkpointed state."""
    import tensorflow as tf

    coordinator, model, step = _pss_regression(args)

    ids = batches("chief", 0, 1)[0]
    for _ in range(args["every"]):
        coordinator.schedule(step, args=(tf.constant(ids),))
    coordinator.join()
    saved = {"state": model.state(), "iterations": int(model.optimizer.iterations.numpy())}
    saved["checkpoint"] = model.checkpoint.write(os.path.join(args["workdir"], "pssf", "ckpt"))
    with open(args["progress"], "w") as f:
        f.write("saved")
    raised = None
    try:
        for _ in range(args["more_steps"]):
            coordinator.schedule(step, args=(tf.constant(ids),))
            time.sleep(args["pace"])
        coordinator.join()
    except Exception as e:  # what a user's loop sees
        raised = f"{type(e).__name__}: {e}"
    return dict(saved, raised=raised)


def pss_keras_fit(args):
    """The chief of a ParameterServerStrategy cluster training a tf_keras model with
    `model.fit` (tf_keras: Keras 3 has no ParameterServerStrategy support): a
    `de.keras.layers.Embedding` on the PS regressing each id's target row, Adam."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    import tf_keras
    import tensorflow_dynemb as de

    strategy, _ = _pss(args)
    ids = np.concatenate([np.concatenate(batches(j, i, args["steps"]))
                          for j, i in (("chief", 0), ("worker", 0), ("worker", 1))])
    with strategy.scope():
        embedding = de.keras.layers.Embedding(
            DIM, devices=ps_devices(len(args["cluster"]["ps"])), name="emb",
            initializer=tf_keras.initializers.RandomNormal(0.0, 0.1, seed=3),
        )
        if args.get("decorated_call"):
            # TFRA's movielens-1m-keras-ps demo's shape: a subclassed model whose
            # `call` is a tf.function, traced inside Keras' train function.
            class Decorated(tf_keras.Model):
                def __init__(self):
                    super().__init__()
                    self.emb = embedding

                @tf.function
                def call(self, ids):
                    return self.emb(ids)

            model = Decorated()
        else:
            inputs = tf_keras.Input((), dtype=tf.int64)
            model = tf_keras.Model(inputs, embedding(inputs))
        model.compile(
            de.DynamicEmbeddingOptimizer(tf_keras.optimizers.Adam(0.05)), loss="mse"
        )

    def eval_loss():
        keys = np.arange(NUM_KEYS)
        return float(np.mean((embedding.params.lookup(keys).numpy() - targets(keys)) ** 2))

    dataset = tf.data.Dataset.from_tensor_slices((ids, targets(ids))).repeat().batch(BATCH)
    initial = eval_loss()
    steps = len(ids) // BATCH
    model.fit(dataset, epochs=2, steps_per_epoch=steps, verbose=0)
    slots = embedding.params.get_slot_variables(model.optimizer)
    return {
        "placement": [t.resource_handle.device for t in embedding.params.tables],
        "slot_placement": [[t.resource_handle.device for t in s.tables] for s in slots],
        "sizes": [int(embedding.params.size(i)) for i in range(embedding.params.shard_num)],
        "slot_sizes": [int(s.size()) for s in slots],
        "eval_losses": [initial, eval_loss()],
        "iterations": int(model.optimizer.iterations.numpy()),
        "steps": 2 * steps,
    }


def pss_restore(args):
    """Restores `pss_custom_loop`'s checkpoint into variables on the PS of another
    cluster (this process a client of it), or into one local shard without a cluster."""
    import tensorflow as tf

    if args.get("cluster"):
        tf.config.experimental_connect_to_cluster(
            tf.train.ClusterSpec(args["cluster"]), job_name="chief", task_index=0
        )
        devices = ps_devices(len(args["cluster"]["ps"]))
    else:
        devices = ["/CPU:0"]
    model = TF2Model(devices)
    model.checkpoint.read(args["checkpoint"]).assert_existing_objects_matched()
    return {
        "state": model.state(),
        "iterations": int(model.optimizer.iterations.numpy()),
        "eval_loss": model.eval_loss(),
    }


# Ids per global batch of 4 examples: replica 0 gets the first 2 rows, replica 1 the
# last 2; ids 1 and 2 are in both replicas' halves (their gradients must add up).
MIRRORED_IDS = np.array(
    [[[1, 2], [3, 1], [1, 5], [2, 2]], [[7, 1], [2, 3], [1, 1], [5, 7]], [[2, 9], [1, 3], [9, 2], [1, 2]]],
    np.int64,
)
MIRRORED_LABELS = np.array([[1.0], [0.0], [0.5], [-1.0]], np.float32)


def mirrored_fit(args):
    """`model.fit` of a de.keras.layers.Embedding model on a 2-replica MirroredStrategy
    and on one device, with the Keras `tf.keras` is in this process (`legacy_keras`:
    set TF_USE_LEGACY_KERAS=1 first, in a fresh process with 2 logical CPUs)."""
    if args.get("legacy_keras"):
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    if args.get("legacy_keras"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tensorflow_dynemb as de

    class DecoratedCall(tf.keras.Model):
        """The same model, subclassed, with `call` a tf.function (TFRA's demos)."""

        def __init__(self, embedding, dense):
            super().__init__()
            self.user, self.dense = embedding, dense
            self.flatten = tf.keras.layers.Flatten()

        @tf.function
        def call(self, ids):
            return self.dense(self.flatten(self.user(ids)))

    def build(strategy, decorated=False):
        with strategy.scope():
            embedding = de.keras.layers.Embedding(
                3, initializer=tf.keras.initializers.RandomNormal(0.0, 0.5, seed=4), name="user"
            )
            dense = tf.keras.layers.Dense(1, kernel_initializer="ones")
            if decorated:
                # Compiled with the wrapper, as TFRA's demos do: under Keras 3 a layer
                # in a decorated `call` cannot find its model to wrap a plain optimizer.
                model = DecoratedCall(embedding, dense)
                model.compile(
                    optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(0.1)),
                    loss="mse",
                )
                return model, embedding, dense
            else:
                ids = tf.keras.Input(shape=(2,), dtype="int64")
                model = tf.keras.Model(ids, dense(tf.keras.layers.Flatten()(embedding(ids))))
            model.compile(optimizer=tf.keras.optimizers.Adam(0.1), loss="mse")
        return model, embedding, dense

    x = MIRRORED_IDS.reshape(-1, 2)
    y = np.tile(MIRRORED_LABELS, (len(MIRRORED_IDS), 1))
    runs = {}
    for name, strategy, decorated in (
        ("mirrored", tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"]), False),
        # Keras 3's symbolic build of this model feeds `call` float32 placeholders
        # for the int64 ids (see keras/layers/embedding.py `_checked_ids`).
        ("mirrored_tf_function_call", tf.distribute.MirroredStrategy(["/CPU:0", "/CPU:1"]), True),
        ("one", tf.distribute.get_strategy(), False),
    ):
        model, layer, dense = build(strategy, decorated)
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        keys, values = layer.params.export()
        order = np.argsort(keys.numpy())
        runs[name] = {
            "losses": [float(v) for v in history.history["loss"]],
            "keys": keys.numpy()[order].tolist(),
            "rows": values.numpy()[order].tolist(),
            "dense": [w.tolist() for w in dense.get_weights()],
            "slot_sizes": [int(s.size()) for s in layer.params.slot_variables],
        }
    return runs


def server(args):
    """A worker (or any task) of a ParameterServerStrategy cluster: a server only."""
    import tensorflow as tf
    import tensorflow_dynemb  # noqa: F401  (registers the table ops and kernels here)

    tf.distribute.Server(
        tf.train.ClusterSpec(args["cluster"]),
        job_name=args["job"],
        task_index=args["index"],
        start=True,
    ).join()


MODES = {"ps": ps, "server": server, "pss_custom_loop": pss_custom_loop, "pss_restore": pss_restore, "pss_keras_fit": pss_keras_fit, "pss_failover": pss_failover, "pss_keras3_layer_loop": pss_keras3_layer_loop, "mirrored_fit": mirrored_fit, "tf1_train": tf1_train, "tf1_failover": tf1_failover, "tf1_restore": tf1_restore, "tf1_inspect": tf1_inspect}


def main(argv):
    cluster_util.child_main(MODES, argv)


if __name__ == "__main__":
    main(sys.argv)
