"""Real programs on real data, in the shape of TFRA's public MovieLens demos, for
tests/test_real_programs.py. Each mode runs in its own process (as the demos' modes
do) and prints one JSON line:

    python tests/real_programs_worker.py MODE '<json args>'

- `train`: the two-channel model (user and movie `SquashedEmbedding`s, an MLP of
  64-16-5 softmax plus a bias net; `call` decorated with `@tf.function`, as TFRA's
  movielens-1m-keras demo writes it) trained on 90% of MovieLens-100k with
  `de.DynamicEmbeddingOptimizer(Adam)` and MSE against the one-hot rating; saved
  (`model.save`: a SavedModel directory with tf_keras, weights with Keras 3);
  predictions on the held-out 10% written to `trained.npy`.
- `export`: a fresh model in inference mode (`de.enable_inference_mode()`), the
  saved weights loaded, exported as a SavedModel with a `serving_default` signature
  from `model.call.get_concrete_function(spec)`.
- `serve`: the export loaded (`tf.saved_model.load`, and tf_keras'
  `load_model`, as the demo's test mode does) after `import tensorflow_dynemb`; its
  predictions on the held-out rows.
- `ps_chief`: the movielens-1m-keras-ps shape: the same model with its tables on 2
  parameter servers, trained by tf_keras `model.fit` under ParameterServerStrategy
  with 2 workers (loopback cluster of tests/cluster_util.py).

Arguments: `flavor` ("keras3" or "tf_keras"), `workdir`, `steps` (training steps),
`batch`, and for `ps_chief` the `cluster` spec.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict

import numpy as np

import cluster_util

DIM = 32
TEST_FRACTION = 0.1


def _setup(args) -> None:
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    if args["flavor"] == "tf_keras":
        os.environ["TF_USE_LEGACY_KERAS"] = "1"


def ratings():
    """MovieLens-100k split 90/10 at random (seed 0): features and one-hot labels."""
    from tensorflow_dynemb.datasets import load_movielens_100k

    data = load_movielens_100k()
    order = np.random.default_rng(0).permutation(len(data["rating"]))
    test = order[: int(len(order) * TEST_FRACTION)]
    train = order[len(test):]

    def part(index):
        features = {"user_id": data["user_id"][index], "movie_id": data["movie_id"][index]}
        labels = np.eye(5, dtype=np.float32)[data["rating"][index] - 1]
        return features, labels

    return part(train), part(test)


def build_model(devices=None, initializer=None, training: bool = True):
    """Two channels: user and movie ids -> SquashedEmbedding each -> MLP and bias net
    -> 5 rating probabilities. `call` is a tf.function, as in TFRA's demos."""
    import tensorflow as tf
    import tensorflow_dynemb as de

    if not training:
        de.enable_inference_mode()
    dense = lambda units, activation: tf.keras.layers.Dense(  # noqa: E731
        units,
        activation=activation,
        kernel_initializer=tf.keras.initializers.RandomNormal(0.0, 0.1, seed=units),
        bias_initializer=tf.keras.initializers.RandomNormal(0.0, 0.1, seed=units + 1),
    )

    class TwoChannels(tf.keras.Model):
        def __init__(self):
            super().__init__()
            init = initializer or tf.keras.initializers.Zeros()
            kwargs = {"devices": devices} if devices else {}
            self.user_embedding = de.keras.layers.SquashedEmbedding(
                DIM, initializer=init, name="user_embedding", **kwargs
            )
            self.movie_embedding = de.keras.layers.SquashedEmbedding(
                DIM, initializer=init, name="movie_embedding", **kwargs
            )
            self.dnn1, self.dnn2, self.dnn3 = dense(64, "relu"), dense(16, "relu"), dense(5, "softmax")
            self.bias_net = dense(5, "softmax")

        @tf.function
        def call(self, features):
            user = self.user_embedding(tf.reshape(features["user_id"], (-1, 1)))
            movie = self.movie_embedding(tf.reshape(features["movie_id"], (-1, 1)))
            latent = tf.concat([user, movie], axis=1)
            x = self.dnn3(self.dnn2(self.dnn1(latent)))
            return 0.2 * x + 0.8 * self.bias_net(latent)

    return TwoChannels()


def input_spec():
    import tensorflow as tf

    return {
        "user_id": tf.TensorSpec([None], tf.int64, name="user_id"),
        "movie_id": tf.TensorSpec([None], tf.int64, name="movie_id"),
    }


def compile_model(model, steps_per_execution: int = 1):
    import tensorflow as tf
    import tensorflow_dynemb as de

    model.compile(
        optimizer=de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam(1e-3)),
        loss=tf.keras.losses.MeanSquaredError(),
        metrics=[tf.keras.metrics.AUC(num_thresholds=1000)],
        steps_per_execution=steps_per_execution,
    )


def dataset(features, labels, batch: int, repeat: bool = True):
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(4096, seed=0)
    return (data.repeat() if repeat else data).batch(batch)


def accuracy(predictions, labels) -> float:
    return float(np.mean(np.argmax(predictions, 1) == np.argmax(labels, 1)))


def _weights_path(workdir, flavor) -> str:
    # tf_keras: the demo's `model.save(model_dir)` SavedModel; Keras 3 saves weights.
    return os.path.join(workdir, "model_dir" if flavor == "tf_keras" else "model.weights.h5")


def train(args) -> Dict[str, Any]:
    _setup(args)
    import tensorflow as tf

    tf.random.set_seed(0)
    (train_x, train_y), (test_x, test_y) = ratings()
    model = build_model(initializer=tf.keras.initializers.RandomNormal(0.0, 0.5, seed=0))
    compile_model(model)
    history = model.fit(
        dataset(train_x, train_y, args["batch"]), steps_per_epoch=args["steps"], epochs=1, verbose=0
    )
    path = _weights_path(args["workdir"], args["flavor"])
    if args["flavor"] == "tf_keras":
        model.save(path, options=tf.saved_model.SaveOptions(namespace_whitelist=["TFRA"]))
    else:
        model.save_weights(path)
    predictions = model.predict(test_x, batch_size=1024, verbose=0)
    np.save(os.path.join(args["workdir"], "trained.npy"), predictions)
    # Held-out rows whose ids were both trained: the export reads missing ids as its
    # initializer's rows (Zeros, as TFRA's demo exports), the trained model as its own.
    known = np.logical_and(
        model.user_embedding.params.lookup(test_x["user_id"], return_exists=True)[1].numpy(),
        model.movie_embedding.params.lookup(test_x["movie_id"], return_exists=True)[1].numpy(),
    )
    np.save(os.path.join(args["workdir"], "known.npy"), known)
    # The ids of exactly the batches trained on (the same pipeline, the same seed).
    trained_on = dataset(train_x, train_y, args["batch"]).take(args["steps"])
    seen = {name: set() for name in ("user_id", "movie_id")}
    for features, _ in trained_on.as_numpy_iterator():
        for name in seen:
            seen[name].update(features[name].tolist())
    return {
        "loss": float(history.history["loss"][-1]),
        "auc": float([v for k, v in history.history.items() if k.startswith("auc")][0][-1]),
        "accuracy": accuracy(predictions, test_y),
        "majority": float(np.mean(np.argmax(test_y, 1) == 3)),
        "sizes": {
            "user_id": int(model.user_embedding.params.size()),
            "movie_id": int(model.movie_embedding.params.size()),
        },
        "distinct_ids_trained": {name: len(ids) for name, ids in seen.items()},
        "known_share": float(known.mean()),
    }


def export(args) -> Dict[str, Any]:
    _setup(args)
    import tensorflow as tf

    model = build_model(training=False)
    dummy = {"user_id": tf.zeros([16], tf.int64), "movie_id": tf.zeros([16], tf.int64)}
    if args["flavor"] == "keras3":
        model(dummy)  # Keras 3 loads weights into built models only
    model.load_weights(_weights_path(args["workdir"], args["flavor"]))
    # tf_keras restores a SavedModel's weights when the model is first built, as the
    # demo's export does (TFRA's `load_weights` before the first call).
    model(dummy)
    signatures = model.call.get_concrete_function(input_spec())
    export_dir = os.path.join(args["workdir"], "export_dir")
    options = tf.saved_model.SaveOptions(namespace_whitelist=["TFRA"])
    if args["flavor"] == "tf_keras":
        tf.keras.models.save_model(
            model, export_dir, options=options, include_optimizer=False, signatures=signatures
        )
    else:
        tf.saved_model.save(model, export_dir, signatures=signatures, options=options)
    return {
        "sizes": {
            "user_id": int(model.user_embedding.params.size()),
            "movie_id": int(model.movie_embedding.params.size()),
        }
    }


def serve(args) -> Dict[str, Any]:
    _setup(args)
    import tensorflow as tf
    import tensorflow_dynemb  # noqa: F401  (the ops the SavedModel uses)

    (_, _), (test_x, test_y) = ratings()
    export_dir = os.path.join(args["workdir"], "export_dir")
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    features = {k: tf.constant(v) for k, v in test_x.items()}
    (served,) = signature(**features).values()
    result = {"served_vs_trained": _max_difference(served.numpy(), args)}
    if args["flavor"] == "tf_keras":  # the demo's test mode: load_model, then call it
        loaded = tf.keras.models.load_model(export_dir)
        result["load_model_vs_trained"] = _max_difference(loaded(features).numpy(), args)
    result["accuracy"] = accuracy(served.numpy(), test_y)
    return result


def _max_difference(predictions, args) -> float:
    """The largest difference from the trained model's predictions, over the held-out
    rows whose ids were both trained."""
    trained = np.load(os.path.join(args["workdir"], "trained.npy"))
    known = np.load(os.path.join(args["workdir"], "known.npy"))
    return float(np.max(np.abs(predictions - trained)[known]))


def ps_chief(args) -> Dict[str, Any]:
    """TFRA's movielens-1m-keras-ps: tables on the PS, tf_keras `fit` on 2 workers."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(args["cluster"]), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    ps_devices = [f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(len(args["cluster"]["ps"]))]
    (train_x, train_y), (test_x, test_y) = ratings()
    with strategy.scope():
        model = build_model(
            devices=ps_devices, initializer=tf.keras.initializers.RandomNormal(0.0, 0.5, seed=0)
        )
        compile_model(model, steps_per_execution=args.get("steps_per_execution", 1))
    model.fit(
        dataset(train_x, train_y, args["batch"]), steps_per_epoch=args["steps"], epochs=1, verbose=0
    )
    # On the chief, in order (`predict` under this strategy would hand batches to the
    # workers, whose results need not come back in order).
    predictions = np.concatenate([
        model({k: v[i : i + 1024] for k, v in test_x.items()}).numpy()
        for i in range(0, len(test_y), 1024)
    ])
    return {
        "accuracy": accuracy(predictions, test_y),
        "majority": float(np.mean(np.argmax(test_y, 1) == 3)),
        "placement": [t.resource_handle.device for t in model.user_embedding.params.tables],
        "sizes": {
            "user_id": int(model.user_embedding.params.size()),
            "movie_id": int(model.movie_embedding.params.size()),
        },
        "iterations": int(model.optimizer.iterations.numpy()),
    }


MODES = {"train": train, "export": export, "serve": serve, "ps_chief": ps_chief}

if __name__ == "__main__":
    cluster_util.child_main(MODES, sys.argv)
