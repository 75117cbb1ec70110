"""One worker of a MultiWorkerMirroredStrategy cluster, for tests/test_multi_worker.py;
not run by pytest. Also the single-process reference those tests compare with (the
same model code with the default strategy, on the concatenated batches).

    python tests/multi_worker_worker.py MODE '<json args>'

Every mode takes `workers` (the workers' addresses) and `index` (this worker's), sets
`TF_CONFIG` before importing TensorFlow, and prints one JSON object on its last line
(`{"error": ...}` on an exception).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import cluster_util  # this folder (the script's own, first on sys.path)

DIM = 3
NUM_IDS = 40
IDS_PER_EXAMPLE = 2
STEPS = 20
OPTIMIZERS = ("sgd", "adam", "adagrad")


# ----------------------------------------------------------------------------------------
# Data: variable-size batches, duplicates within and across workers, empty batches
# ----------------------------------------------------------------------------------------


def batch(step: int, worker: int, num_workers: int):
    """`(ids [b, 2] int64, labels [b] float32)` of `worker` at `step`. Sizes vary (0 to
    5 examples); worker 1 has an empty batch at step 3; ids repeat within a batch and
    across workers (ids 0..39 for 20 steps of up to 15 examples)."""
    rng = np.random.default_rng(1000 * num_workers + 31 * step + worker)
    size = 0 if (worker == 1 and step == 3) else int(rng.integers(1, 6))
    ids = rng.integers(0, NUM_IDS, (size, IDS_PER_EXAMPLE)).astype(np.int64)
    if size:
        ids[0, 1] = 7  # in every worker's batch: its gradients add up across workers
    labels = np.sin(ids.sum(1) * 0.3).astype(np.float32)
    return ids, labels


def global_batch(step: int, num_workers: int):
    """Every worker's batch of `step`, concatenated in rank order (the reference's)."""
    parts = [batch(step, w, num_workers) for w in range(num_workers)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


# ----------------------------------------------------------------------------------------
# The model of the custom loops
# ----------------------------------------------------------------------------------------


def _optimizer(kind: str):
    """`kind`: sgd, adam or adagrad of Keras 3, or `tf_keras_adam` (tf.keras is tf_keras
    in a process with TF_USE_LEGACY_KERAS=1); a `_replicated` suffix is the table's."""
    import keras
    import tensorflow as tf

    kind = kind.replace("_replicated", "")
    if kind == "tf_keras_adam":
        return tf.keras.optimizers.Adam(0.05)
    return {
        "sgd": lambda: keras.optimizers.SGD(0.2),
        "adam": lambda: keras.optimizers.Adam(0.05),
        "adagrad": lambda: keras.optimizers.Adagrad(0.3),
    }[kind]()


class LoopModel:
    """A table, a dense weight and a bias, trained by `strategy.run` steps. A kind
    ending in `_replicated` gives the table `devices`: a full copy on every worker."""

    def __init__(self, strategy, kind: str):
        import tensorflow as tf
        import tensorflow_dynemb as de

        self.strategy = strategy
        with strategy.scope():
            self.emb = de.Variable(
                tf.int64,
                tf.float32,
                dim=DIM,
                devices=["/CPU:0"] if kind.endswith("_replicated") else None,
                initializer=tf.keras.initializers.RandomNormal(0.0, 0.3, seed=5),
                name=f"emb_{kind}",
            )
            self.weight = tf.Variable(tf.fill([DIM, 1], 0.5), name=f"w_{kind}")
            self.bias = tf.Variable(tf.zeros([1]), name=f"b_{kind}")
            self.optimizer = de.DynamicEmbeddingOptimizer(_optimizer(kind))
        signature = [
            tf.TensorSpec([None, IDS_PER_EXAMPLE], tf.int64),
            tf.TensorSpec([None], tf.float32),
            tf.TensorSpec([], tf.float32),
        ]
        self.step = tf.function(self._step, input_signature=signature)
        self.lookup = tf.function(
            self._lookup, input_signature=[tf.TensorSpec([None], tf.int64)]
        )

    def _step(self, ids, labels, global_size):
        import tensorflow as tf
        import tensorflow_dynemb as de

        def replica_fn(ids, labels, global_size):
            with tf.GradientTape() as tape:
                rows, view = de.embedding_lookup(self.emb, ids, name="e", return_trainable=True)
                pred = tf.matmul(tf.reduce_sum(rows, 1), self.weight)[:, 0] + self.bias
                loss = tf.reduce_sum(tf.square(pred - labels)) / global_size
            variables = [view, self.weight, self.bias]
            grads = tape.gradient(loss, variables)
            self.optimizer.apply_gradients(zip(grads, variables))
            return loss

        return self.strategy.run(replica_fn, args=(ids, labels, global_size))

    def _lookup(self, ids):
        return self.strategy.run(lambda ids: self.emb.lookup(ids, return_exists=True), args=(ids,))

    def content(self):
        """This process's slice (or the whole table): rows and slot rows by key."""
        keys, values = self.emb.export()
        out = {"rows": _by_key(keys, values)}
        for slot in self.emb.slot_variables:
            k, v = slot.export()
            out[slot.name.rsplit("/", 1)[-1]] = _by_key(k, v)
        out["dense"] = [self.weight.numpy().tolist(), self.bias.numpy().tolist()]
        out["iterations"] = int(self.optimizer.iterations.numpy())
        return out


def _by_key(keys, values):
    return {str(int(k)): [float(x) for x in v] for k, v in zip(keys.numpy(), values.numpy())}


def write_dir(directory: str, rank) -> str:
    """Where a worker writes a checkpoint of `directory` (TF's MultiWorkerMirroredStrategy
    convention, as Keras' `distributed_file_utils`): the chief (rank 0, or one process)
    the directory itself, the others a temporary directory inside it."""
    return directory if not rank else os.path.join(directory, f"workertemp_{rank}")


def checkpoint_of(model):
    import tensorflow as tf

    return tf.train.Checkpoint(
        emb=model.emb, weight=model.weight, bias=model.bias, optimizer=model.optimizer
    )


def save(model, directory: str, rank) -> str:
    """Saves every worker's checkpoint (the chief's is the real one) and removes the
    temporary ones; returns the chief's prefix."""
    import tensorflow as tf

    target = write_dir(directory, rank)
    manager = tf.train.CheckpointManager(checkpoint_of(model), target, max_to_keep=2)
    path = manager.save()
    if rank:
        tf.io.gfile.rmtree(target)
    return os.path.join(directory, os.path.basename(path))


def restore(model, directory: str):
    """Restores the latest checkpoint of `directory` into `model`; slots are created
    first (as a training step would) so that the restore fills them now."""
    import tensorflow as tf

    view = model.emb.get_eager_trainable_by_name("e")
    with model.strategy.scope():
        model.optimizer.build([view, model.weight, model.bias])
    status = checkpoint_of(model).restore(tf.train.latest_checkpoint(directory))
    status.assert_existing_objects_matched()


def train_loop(
    strategy,
    kind: str,
    num_workers: int,
    rank,
    steps: int = STEPS,
    first_step: int = 0,
    restore_from=None,
    save_to=None,
):
    """Trains a LoopModel for `steps` (batches `first_step`...): on worker `rank`'s
    batches under a multi-worker strategy, on the global batches with `rank` None.
    Restores the latest checkpoint of `restore_from` first and saves to `save_to`
    after, if given. Returns its content after the restore (`restored`) and at the end,
    the per-step losses (this worker's share) and a lookup of every id inside
    strategy.run."""
    import tensorflow as tf

    model = LoopModel(strategy, kind)
    result = {}
    if restore_from:
        restore(model, restore_from)
        result["restored"] = model.content()
    losses = []
    for step in range(first_step, first_step + steps):
        ids, labels = global_batch(step, num_workers) if rank is None else batch(step, rank, num_workers)
        size = float(len(global_batch(step, num_workers)[0]))
        loss = model.step(tf.constant(ids), tf.constant(labels), tf.constant(size))
        losses.append(float(strategy.experimental_local_results(loss)[0]))
    values, exists = model.lookup(tf.range(NUM_IDS + 2, dtype=tf.int64))
    values = strategy.experimental_local_results(values)[0]
    exists = strategy.experimental_local_results(exists)[0]
    if save_to:
        result["saved_to"] = save(model, save_to, rank)
    result.update(model.content())
    result["losses"] = losses
    result["lookup"] = values.numpy().tolist()
    result["lookup_exists"] = exists.numpy().tolist()
    return result


# ----------------------------------------------------------------------------------------
# Keras: fit / evaluate / predict of de.keras.layers
# ----------------------------------------------------------------------------------------

FIT_BATCH = 4  # examples per worker and step (Keras averages per replica: equal sizes)
FIT_STEPS = 6  # steps per epoch


def fit_batches(worker: int, num_workers: int, steps: int = FIT_STEPS, salt: int = 0):
    """`worker`'s `(ids [steps * FIT_BATCH, 2], labels)`, in step order."""
    rng = np.random.default_rng(7000 + 13 * num_workers + worker + 101 * salt)
    ids = rng.integers(0, NUM_IDS, (steps * FIT_BATCH, IDS_PER_EXAMPLE)).astype(np.int64)
    ids[::FIT_BATCH, 0] = 11  # in every worker's every batch
    return ids, np.sin(ids.sum(1) * 0.3).astype(np.float32)[:, None]


def global_fit_batches(num_workers: int, steps: int = FIT_STEPS, salt: int = 0):
    """Step `s`'s global batch: every worker's batch `s`, concatenated in rank order."""
    parts = [fit_batches(w, num_workers, steps, salt) for w in range(num_workers)]
    ids = np.concatenate([p[0].reshape(steps, FIT_BATCH, -1) for p in parts], 1)
    labels = np.concatenate([p[1].reshape(steps, FIT_BATCH, -1) for p in parts], 1)
    return ids.reshape(-1, IDS_PER_EXAMPLE), labels.reshape(-1, 1)


_FIELD_OF_ID = []


def _field_of_id():
    """The FieldWiseEmbedding's `slot_map_fn` (id parity), registered once with Keras so
    that `.keras` files name it instead of holding a lambda."""
    import tensorflow as tf

    if not _FIELD_OF_ID:

        @tf.keras.utils.register_keras_serializable(package="multi_worker_test")
        def field_of_id(keys):
            return tf.cast(keys % 2, tf.int32)

        _FIELD_OF_ID.append(field_of_id)
    return _FIELD_OF_ID[0]


def build_keras_model(layer: str = "Embedding"):
    """ids [2] -> a de.keras.layers layer -> Dense(1), compiled with Adam.
    "DecoratedCall": the same with Embedding, as a subclassed model whose `call` is a
    `tf.function` (TFRA's demos' shape)."""
    import tensorflow as tf
    import tensorflow_dynemb as de

    initializer = tf.keras.initializers.RandomNormal(0.0, 0.3, seed=9)
    if layer == "DecoratedCall":

        class DecoratedCall(tf.keras.Model):
            def __init__(self):
                super().__init__()
                self.user = de.keras.layers.Embedding(DIM, initializer=initializer, name="user")
                self.flatten = tf.keras.layers.Flatten()
                self.dense = tf.keras.layers.Dense(1, kernel_initializer="ones", name="dense")

            @tf.function
            def call(self, ids):
                return self.dense(self.flatten(self.user(ids)))

        model = DecoratedCall()
        model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="mse")
        return model
    ids = tf.keras.Input(shape=(IDS_PER_EXAMPLE,), dtype="int64")
    if layer == "Embedding":
        x = tf.keras.layers.Flatten()(de.keras.layers.Embedding(DIM, initializer=initializer, name="user")(ids))
    elif layer == "SquashedEmbedding":
        x = de.keras.layers.SquashedEmbedding(DIM, initializer=initializer, combiner="sum", name="user")(ids)
    else:  # FieldWiseEmbedding: two fields, by id parity
        x = tf.keras.layers.Flatten()(
            de.keras.layers.FieldWiseEmbedding(
                DIM, 2, _field_of_id(), initializer=initializer, name="user"
            )(ids)
        )
    out = tf.keras.layers.Dense(1, kernel_initializer="ones", name="dense")(x)
    model = tf.keras.Model(ids, out)
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="mse")
    return model


def keras_run(strategy, num_workers: int, rank, layer: str, save_dir=None):
    """fit (2 epochs), evaluate and predict: per worker under a multi-worker strategy
    (its own batches through distribute_datasets_from_function), on the global batches
    with `rank` None."""
    import tensorflow as tf

    def dataset(salt):
        if rank is None:
            ids, labels = global_fit_batches(num_workers, salt=salt)
            return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(FIT_BATCH * num_workers).repeat()

        def per_worker(context):
            ids, labels = fit_batches(context.input_pipeline_id, num_workers, salt=salt)
            return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(FIT_BATCH).repeat()

        return strategy.distribute_datasets_from_function(per_worker)

    with strategy.scope():
        model = build_keras_model(layer)
    history = model.fit(dataset(0), epochs=2, steps_per_epoch=FIT_STEPS, verbose=0)
    evaluated = model.evaluate(dataset(1), steps=FIT_STEPS, verbose=0)
    predicted = model.predict(dataset(1), steps=FIT_STEPS, verbose=0)
    result = keras_content(model)
    result.update(
        losses=[float(v) for v in history.history["loss"]],
        evaluate=float(evaluated),
        predict=np.asarray(predicted).reshape(-1).tolist(),
    )
    if save_dir and layer != "DecoratedCall":  # a subclassed model has no config to save
        # Every worker saves (MWMS); the chief's files are the real ones.
        target = write_dir(os.path.join(save_dir, layer), rank)
        model.save_weights(os.path.join(target, "weights"))  # TF checkpoint format
        model.save(os.path.join(target, "model.keras"))
        tf.saved_model.save(model, os.path.join(target, "saved_model"))
        if rank:
            tf.io.gfile.rmtree(target)
    return result


def keras_content(model):
    """The model's table slice (or whole table), slots and dense weights."""
    params = model.get_layer("user").params
    keys, values = params.export()
    return {
        "rows": _by_key(keys, values),
        "dense": [w.tolist() for w in model.get_layer("dense").get_weights()],
        "slots": {
            slot.name.rsplit("/", 1)[-1]: _by_key(*slot.export()) for slot in params.slot_variables
        },
        "model_parallel": params.worker_group is not None,
    }


def keras_load(strategy, num_workers: int, rank, layer: str, save_dir: str):
    """What `keras_run` saved, loaded under `strategy`: the weights checkpoint into a
    new model (with its optimizer's slots), the `.keras` file, and (one process) the
    SavedModel, serving the evaluation inputs."""
    import tensorflow as tf
    import tensorflow_dynemb as de

    directory = os.path.join(save_dir, layer)
    with strategy.scope():
        model = build_keras_model(layer)
        # The optimizer's slots exist after a step; make them now so that the
        # restore fills them.
        view = model.get_layer("user").params.get_eager_trainable_by_name("user")
        model.optimizer = de.DynamicEmbeddingOptimizer(model.optimizer)
        model.optimizer.build([view] + model.get_layer("dense").trainable_weights)
    model.load_weights(os.path.join(directory, "weights")).assert_existing_objects_matched()
    result = {"weights": keras_content(model)}
    with strategy.scope():
        loaded = tf.keras.models.load_model(os.path.join(directory, "model.keras"))
    result["keras_file"] = keras_content(loaded)
    if rank is None:
        served = tf.saved_model.load(os.path.join(directory, "saved_model"))
        ids, _ = global_fit_batches(num_workers, salt=1)
        result["served"] = np.asarray(served(tf.constant(ids))).reshape(-1).tolist()
    return result


# ----------------------------------------------------------------------------------------
# Modes
# ----------------------------------------------------------------------------------------


def _strategy(args):
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": args["workers"]},
            "task": {"type": "worker", "index": args["index"]},
        }
    )
    import tensorflow as tf

    return tf.distribute.MultiWorkerMirroredStrategy()


def keras3_fit_outcomes(strategy):
    """Whether Keras 3's own `fit` runs under this strategy: a dense-only model, then a
    de.keras.layers.Embedding model. Each: `{"ok": bool, "error": its first line}`."""
    import keras
    import tensorflow as tf
    import tensorflow_dynemb as de

    def dense():
        inputs = keras.Input(shape=(2,))
        return keras.Model(inputs, keras.layers.Dense(1)(inputs)), np.ones((8, 2), np.float32)

    def embedding():
        inputs = keras.Input(shape=(2,), dtype="int64")
        rows = de.keras.layers.Embedding(DIM, initializer=0.1, name="user")(inputs)
        outputs = keras.layers.Dense(1)(keras.layers.Flatten()(rows))
        return keras.Model(inputs, outputs), np.ones((8, 2), np.int64)

    outcomes = {}
    for name, build in (("dense", dense), ("embedding", embedding)):
        with strategy.scope():
            model, x = build()
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        data = tf.data.Dataset.from_tensor_slices((x, np.ones((8, 1), np.float32))).batch(4)
        try:
            model.fit(data, epochs=1, verbose=0)
            outcomes[name] = {"ok": True, "error": ""}
        except Exception as error:  # noqa: BLE001 - reported, whatever Keras raises
            outcomes[name] = {"ok": False, "error": f"{type(error).__name__}: {error}".splitlines()[0]}
    return outcomes


def loop(args):
    """Custom `strategy.run` loops, one per optimizer kind in `args["optimizers"]`;
    with `keras3_fit`, then `keras3_fit_outcomes`."""
    strategy = _strategy(args)
    import tensorflow_dynemb  # noqa: F401

    result = _loops(strategy, len(args["workers"]), args["index"], args)
    if args.get("policies"):
        result["policies"] = policy_run(strategy, len(args["workers"]), args["index"])
    if args.get("keras3_fit"):
        result["keras3_fit"] = keras3_fit_outcomes(strategy)
    return result


def _loops(strategy, num_workers, rank, args):
    started = time.time()
    result = {}
    for kind in args.get("optimizers", OPTIMIZERS):
        directory = lambda key: args[key] and os.path.join(args[key], kind)  # noqa: E731
        result[kind] = train_loop(
            strategy,
            kind,
            num_workers,
            rank,
            steps=args.get("steps", STEPS),
            first_step=args.get("first_step", 0),
            restore_from=directory("restore_from") if args.get("restore_from") else None,
            save_to=directory("checkpoint_to") if args.get("checkpoint_to") else None,
        )
    result["seconds"] = time.time() - started
    return result


def reference_loop(args):
    """The single-process reference of `loop` (`num_workers`: whose batches)."""
    import tensorflow as tf
    import tensorflow_dynemb  # noqa: F401

    strategy = tf.distribute.get_strategy()
    result = _loops(strategy, args["num_workers"], None, args)
    if args.get("policies"):
        result["policies"] = policy_run(strategy, args["num_workers"], None)
    return result


def keras(args):
    """`keras_run` for each layer in `args["layers"]` (`legacy_keras`: tf_keras)."""
    if args.get("legacy_keras"):
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    if args.get("reference"):
        import tensorflow as tf

        strategy, rank = tf.distribute.get_strategy(), None
    else:
        strategy, rank = _strategy(args), args["index"]
    num_workers = args["num_workers"] if rank is None else len(args["workers"])
    result = {}
    if args.get("optimizers"):  # custom loops with tf_keras optimizers
        result = _loops(strategy, num_workers, rank, args)
    for layer in args["layers"]:
        if args.get("load_from"):
            result[layer] = keras_load(strategy, num_workers, rank, layer, args["load_from"])
        else:
            result[layer] = keras_run(strategy, num_workers, rank, layer, args.get("save_to"))
    return result


# ----------------------------------------------------------------------------------------
# Policies: bounded shards, admission, bp_v2, restrict, statistics
# ----------------------------------------------------------------------------------------

POLICY_CAPACITY = 8  # keys per table shard: the 40 ids do not fit, shards evict
POLICY_RESERVED = 9  # restrict keeps this many keys of the whole variable


def policy_run(strategy, num_workers: int, rank):
    """A bounded (LFU), admitting (min_count 2), bp_v2 variable with a frequency restrict
    policy, trained 20 steps by a custom loop, then restricted to POLICY_RESERVED keys.
    Under a multi-worker strategy it is model-parallel (a slice per worker); in one
    process (`rank` None) it has one shard per worker of the same capacity, so each
    shard holds what the worker of that rank holds. Returns the content (rows, slots,
    statuses) and the whole-variable statistics before and after the restriction."""
    import tensorflow as tf
    import tensorflow_dynemb as de
    from tensorflow_dynemb.keras.callbacks import _whole_variable_stats

    model = LoopModel.__new__(LoopModel)
    model.strategy = strategy
    config = de.HkvHashTableConfig(
        init_capacity=POLICY_CAPACITY,
        max_capacity=POLICY_CAPACITY,
        evict_strategy=de.HkvEvictStrategy.LFU,
    )
    with strategy.scope():
        model.emb = de.Variable(
            tf.int64,
            tf.float32,
            dim=DIM,
            devices=None if rank is not None else ["/CPU:0"] * num_workers,
            initializer=tf.keras.initializers.RandomNormal(0.0, 0.3, seed=5),
            name="emb_policies",
            kv_creator=de.HkvHashTableCreator(config),
            admit_policy=de.FrequencyAdmitPolicy(min_count=2),
            restrict_policy=de.FrequencyRestrictPolicy,
            bp_v2=True,
        )
        model.weight = tf.Variable(tf.fill([DIM, 1], 0.5))
        model.bias = tf.Variable(tf.zeros([1]))
        model.optimizer = de.DynamicEmbeddingOptimizer(_optimizer("adam"))
    signature = [
        tf.TensorSpec([None, IDS_PER_EXAMPLE], tf.int64),
        tf.TensorSpec([None], tf.float32),
        tf.TensorSpec([], tf.float32),
    ]
    model.step = tf.function(model._step, input_signature=signature)
    for step in range(STEPS):
        ids, labels = global_batch(step, num_workers) if rank is None else batch(step, rank, num_workers)
        size = float(len(global_batch(step, num_workers)[0]))
        model.step(tf.constant(ids), tf.constant(labels), tf.constant(size))

    def stats():
        whole, _ = _whole_variable_stats(model.emb)
        return {key: float(value) for key, value in whole.items()}

    result = {"trained": model.content(), "stats": stats()}
    policy = model.emb.restrict_policy
    result["trained"]["status"] = _by_key(*policy.status.export())
    model.emb.restrict(POLICY_RESERVED)
    result["restricted"] = model.content()
    result["restricted"]["status"] = _by_key(*policy.status.export())
    result["restricted_stats"] = stats()
    return result


def policies(args):
    if args.get("reference"):
        import tensorflow as tf

        return policy_run(tf.distribute.get_strategy(), args["num_workers"], None)
    return policy_run(_strategy(args), len(args["workers"]), args["index"])


def _without_error_stack_traces_on_tf_2_16():
    """TF 2.16 can crash (SIGSEGV) reading the stack traces of a function whose collective
    it has just aborted: `AtomicFunction.graph_debug_info`, which decorates the error's
    message (CI, with faulthandler: "Collective has timed out", then the crash in
    `context.get_graph_debug_info`). TF 2.21 runs the same Python without crashing. The
    failover worker reports the error's type and message, so on TF 2.16 its message is
    decorated without the traces."""
    import tensorflow as tf

    if tuple(int(part) for part in tf.__version__.split(".")[:2]) >= (2, 17):
        return
    from tensorflow.core.framework import graph_debug_info_pb2
    from tensorflow.python.eager.polymorphic_function import atomic_function

    atomic_function.AtomicFunction.graph_debug_info = property(
        lambda self: graph_debug_info_pb2.GraphDebugInfo())


def failover(args):
    """Trains with checkpoints until worker `victim` fails at step `fail_at`: `how`
    "kill" ends its process, "stall" makes it sleep `stall_seconds` (alive, its
    heartbeats going on, but out of the collectives). The others report how their
    step failed and how long it took; every worker reports what it had saved."""
    import tensorflow as tf

    _without_error_stack_traces_on_tf_2_16()
    strategy = _strategy(args)
    rank, num_workers = args["index"], len(args["workers"])
    model = LoopModel(strategy, "adam")
    result = {"saved": None}
    for step in range(STEPS):
        if step == args["fail_at"] and rank == args["victim"]:
            if args["how"] == "kill":
                os._exit(3)
            time.sleep(args["stall_seconds"])
            return result
        ids, labels = batch(step, rank, num_workers)
        size = float(len(global_batch(step, num_workers)[0]))
        started = time.time()
        try:
            model.step(tf.constant(ids), tf.constant(labels), tf.constant(size))
        except tf.errors.OpError as error:
            result["failure"] = {
                "step": step,
                "seconds": time.time() - started,
                "type": type(error).__name__,
                "message": str(error)[:3000],
            }
            return result
        if step + 1 == args["save_after"]:
            # As `loop` saves an "adam" model, so that it restores this checkpoint.
            save(model, os.path.join(args["checkpoint_dir"], "adam"), rank)
            result["saved"] = model.content()
            # What this worker saved, for the test to read even if it dies.
            with open(os.path.join(args["checkpoint_dir"], f"saved-{rank}.json"), "w") as f:
                json.dump(result["saved"], f)
    return result


MODES = {
    "loop": loop,
    "reference_loop": reference_loop,
    "keras": keras,
    "policies": policies,
    "failover": failover,
}


def main(argv):
    if cluster_util.child_main(MODES, argv) == "failover":
        # Exit at once: tearing down a MultiWorkerMirroredStrategy whose collectives
        # were aborted (a failed worker) can crash in TF's destructors. (Elsewhere the
        # normal exit waits at TF's shutdown barrier for the others' last collectives.)
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
