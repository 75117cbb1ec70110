"""Keras scenarios of `de.keras.layers`, run with whichever Keras `tf.keras` is.

`test_keras_layers.py` runs each one in the pytest process with Keras 3, and all of them
in one subprocess (`keras_worker.py`) with tf_keras (`TF_USE_LEGACY_KERAS=1`), then
checks both results the same way. A scenario returns plain data (lists, numbers,
strings), so that results cross the process boundary as JSON.

References: a model with a stock `keras.layers.Embedding` over the same initial rows,
trained by plain SGD (which updates only looked-up rows, like the dynamic table), and
identical runs of the same model (plain optimizer name vs wrapped optimizer, saved and
restored vs uninterrupted).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List

import numpy as np
import tensorflow as tf

import tensorflow_dynemb as de
import tensorflow_dynemb.keras  # noqa: F401  (de.keras, until the package imports it)
from tensorflow_dynemb.keras._compat import IS_KERAS3, keras_module as K

layers = de.keras.layers

SCENARIOS: Dict[str, Callable[[str], Any]] = {}

DIM = 3
# Ids of 4 examples x 2 features; 6 distinct ids, two repeated inside examples.
IDS = np.array([[3, 17], [-5, 3], [2**40, 42], [17, 17]], np.int64)
LABELS = np.array([[1.0], [0.0], [0.5], [2.0]], np.float32)
SHARDS = {1: ["/CPU:0"], 2: ["/CPU:0", "/CPU:1"]}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def flavor() -> str:
    return "keras3" if IS_KERAS3 else "tf_keras"


def initializer(seed: int = 7):
    return K.initializers.RandomNormal(0.0, 0.5, seed=seed)


def embedding_model(layer, key_dtype="int64", width: int = 2):
    """ids [batch, width] -> layer -> flatten -> Dense(1), with seeded weights."""
    ids = K.Input(shape=(width,), dtype=key_dtype)
    x = K.layers.Flatten()(layer(ids))
    out = K.layers.Dense(1, kernel_initializer=K.initializers.GlorotUniform(seed=3))(x)
    return K.Model(ids, out)


def wrapped_adam():
    return de.DynamicEmbeddingOptimizer(K.optimizers.Adam(0.05))


def table(params) -> Dict[str, List[float]]:
    keys, values = params.export()
    return {str(k): v for k, v in zip(keys.numpy().tolist(), values.numpy().tolist())}


def fit_losses(model, x, y, epochs: int = 3) -> List[float]:
    history = model.fit(x, y, epochs=epochs, batch_size=2, shuffle=False, verbose=0)
    return history.history["loss"]


# ----------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------


@scenario
def outputs(workdir):
    """Each layer's output for rows put in its table, eagerly and in a tf.function, in
    every training mode; and the table never grows from lookups."""
    keys = np.unique(IDS)
    rows = np.arange(len(keys) * DIM, dtype=np.float32).reshape(-1, DIM) / 10
    by_key = dict(zip(keys.tolist(), rows))
    expected_rows = np.stack([[by_key[k] for k in example] for example in IDS.tolist()])

    def fields(ids):
        return tf.math.floormod(ids, 2)

    made = {
        "Embedding": (layers.Embedding(DIM, devices=SHARDS[2]), expected_rows),
        "BasicEmbedding": (layers.BasicEmbedding(DIM, with_unique=False), expected_rows),
        "SquashedEmbedding": (
            layers.SquashedEmbedding(DIM, combiner="mean"),
            expected_rows.mean(axis=1),
        ),
        "FieldWiseEmbedding": (
            layers.FieldWiseEmbedding(DIM, 2, fields, devices=SHARDS[2]),
            np.stack(
                [
                    [rows_in(by_key, example, field) for field in (0, 1)]
                    for example in IDS.tolist()
                ]
            ),
        ),
    }
    results = {}
    for name, (layer, expected) in made.items():
        layer.params.upsert(keys, rows)
        traced = tf.function(lambda x, training, layer=layer: layer(x, training=training))
        got = {}
        for training in (None, True, False):
            got[f"eager-{training}"] = layer(IDS, training=training).numpy().tolist()
            got[f"function-{training}"] = traced(tf.constant(IDS), training).numpy().tolist()
        results[name] = {
            "got": got,
            "expected": expected.tolist(),
            "size": int(layer.params.size()),
            "weights": len(layer.trainable_weights),
        }
    squashed = layers.SquashedEmbedding(DIM, combiner="sum", initializer=1.0)
    results["squashed_1d"] = squashed(tf.constant([1, 2, 3], tf.int64)).numpy().tolist()
    return results


def rows_in(by_key, example, field):
    picked = [by_key[k] for k in example if k % 2 == field]
    return np.sum(picked, axis=0) if picked else np.zeros(DIM, np.float32)


# ----------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------


def dense_reference(de_model, de_layer, vocab, shared_inputs: int = 1):
    """A copy of `de_model` with a stock Embedding over `vocab`'s current rows."""
    index_inputs = [K.Input(shape=(2,), dtype="int32") for _ in range(shared_inputs)]
    embedding = K.layers.Embedding(len(vocab), DIM)
    parts = [K.layers.Flatten()(embedding(i)) for i in index_inputs]
    x = parts[0] if shared_inputs == 1 else K.layers.Concatenate()(parts)
    dense = K.layers.Dense(1)
    model = K.Model(index_inputs if shared_inputs > 1 else index_inputs[0], dense(x))
    embedding.set_weights([de_layer.params.lookup(vocab).numpy()])
    dense.set_weights(de_model.layers[-1].get_weights())
    return model, embedding


def indices(ids, vocab):
    return np.searchsorted(vocab, ids).astype(np.int32)


@scenario
def fit_matches_dense(workdir):
    """compile("sgd") + fit on a 1- and a 2-shard table equals a stock Embedding trained
    by SGD; evaluate / predict then agree and do not grow the table."""
    vocab = np.unique(IDS)
    results = {}
    for shards, devices in SHARDS.items():
        layer = layers.Embedding(DIM, initializer=initializer(), devices=devices, name=f"e{shards}")
        model = embedding_model(layer)
        model.compile(optimizer="sgd", loss="mse")
        reference, ref_embedding = dense_reference(model, layer, vocab)
        reference.compile(optimizer=K.optimizers.SGD(), loss="mse")
        losses = fit_losses(model, IDS, LABELS)
        ref_losses = fit_losses(reference, indices(IDS, vocab), LABELS)
        results[shards] = {
            "losses": losses,
            "ref_losses": ref_losses,
            "rows": layer.params.lookup(vocab).numpy().tolist(),
            "ref_rows": ref_embedding.get_weights()[0].tolist(),
            "size": int(layer.params.size()),
            "distinct": len(vocab),
            "optimizer": type(model.optimizer).__name__,
            "predict": model.predict(IDS, verbose=0).tolist(),
            "ref_predict": reference.predict(indices(IDS, vocab), verbose=0).tolist(),
            "evaluate": model.evaluate(IDS, LABELS, verbose=0),
            "ref_evaluate": reference.evaluate(indices(IDS, vocab), LABELS, verbose=0),
            "size_after": int(layer.params.size()),
        }
    return results


@scenario
def tf1_optimizer(workdir):
    """compile(de.DynamicEmbeddingOptimizer(tf.compat.v1.train optimizer)) + fit, as
    TFRA's `EmbeddingLayerTest::test_backward` does: tf_keras wraps the optimizer in its
    TFOptimizer, which the layer sees through. GradientDescent trains as it trains a
    stock Embedding; Adam gives every id seen a row. (Keras 3 takes no TF1 optimizers.)"""
    if IS_KERAS3:
        return {}
    vocab = np.unique(IDS)
    layer = layers.Embedding(DIM, initializer=initializer(), name="tf1_sgd")
    model = embedding_model(layer)
    model.compile(
        optimizer=de.DynamicEmbeddingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1)),
        loss="mse",
    )
    reference, ref_embedding = dense_reference(model, layer, vocab)
    reference.compile(optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.1), loss="mse")
    losses = fit_losses(model, IDS, LABELS)
    ref_losses = fit_losses(reference, indices(IDS, vocab), LABELS)

    adam_layer = layers.Embedding(DIM, initializer=initializer(), name="tf1_adam")
    adam_model = embedding_model(adam_layer)
    adam_model.compile(
        optimizer=de.DynamicEmbeddingOptimizer(tf.compat.v1.train.AdamOptimizer(1e-3)),
        loss="mse",
    )
    sizes = []
    for step in range(1, 4):
        ids = np.arange(10 * step, 10 * step + 8, dtype=np.int64).reshape(4, 2)
        adam_model.fit(ids, LABELS, verbose=0)
        sizes.append(int(adam_layer.params.size()))
    return {
        "losses": losses,
        "ref_losses": ref_losses,
        "rows": layer.params.lookup(vocab).numpy().tolist(),
        "ref_rows": ref_embedding.get_weights()[0].tolist(),
        "adam_sizes": sizes,
        "adam_slots": [int(s.size()) for s in adam_layer.params.get_slot_variables(
            adam_model.optimizer.optimizer)],
    }


@scenario
def shared_layer(workdir):
    """One layer called on two inputs in each step trains the rows of both, as a shared
    stock Embedding does."""
    other = IDS[::-1] + 1
    vocab = np.unique(np.concatenate([IDS, other]))
    layer = layers.Embedding(DIM, initializer=initializer(), devices=SHARDS[2], name="shared")
    inputs = [K.Input(shape=(2,), dtype="int64") for _ in range(2)]
    x = K.layers.Concatenate()([K.layers.Flatten()(layer(i)) for i in inputs])
    model = K.Model(inputs, K.layers.Dense(1)(x))
    model.compile(optimizer="sgd", loss="mse")
    reference, ref_embedding = dense_reference(model, layer, vocab, shared_inputs=2)
    reference.compile(optimizer=K.optimizers.SGD(), loss="mse")
    return {
        "losses": fit_losses(model, [IDS, other], LABELS),
        "ref_losses": fit_losses(reference, [indices(IDS, vocab), indices(other, vocab)], LABELS),
        "rows": layer.params.lookup(vocab).numpy().tolist(),
        "ref_rows": ref_embedding.get_weights()[0].tolist(),
        "size": int(layer.params.size()),
        "distinct": len(vocab),
    }


@scenario
def plain_vs_wrapped(workdir):
    """compile("adam") trains exactly as compile(de.DynamicEmbeddingOptimizer(Adam()));
    the model's weights outside a step are its dense ones; summary() works."""
    runs = {}
    for name in ("plain", "wrapped"):
        layer = layers.SquashedEmbedding(DIM, initializer=initializer(), name="squashed")
        model = embedding_model(layer)
        plain = K.optimizers.Adam()
        optimizer = plain if name == "plain" else de.DynamicEmbeddingOptimizer(plain)
        model.compile(optimizer=optimizer, loss="mse")
        losses = fit_losses(model, IDS, LABELS)
        model.summary(print_fn=lambda *args, **kwargs: None)
        runs[name] = {
            "losses": losses,
            "table": table(layer.params),
            "optimizer": type(model.optimizer).__name__,
            "inner_is_plain": model.optimizer.inner_optimizer is plain,
            "trainable_weights": len(model.trainable_weights),
            "dense_weights": len(model.layers[-1].trainable_weights),
            "slots": len(model.optimizer.get_slot_variables(layer.params)),
        }
    return runs


# ----------------------------------------------------------------------------------------
# Saving
# ----------------------------------------------------------------------------------------


def saving_model(key_dtype: str, devices):
    layer = layers.Embedding(
        DIM, key_dtype=key_dtype, initializer=initializer(), devices=devices, name="user"
    )
    model = embedding_model(layer, key_dtype=key_dtype)
    model.compile(optimizer=wrapped_adam(), loss="mse")
    return model


def as_keys(ids, key_dtype):
    """`ids` as model input of `key_dtype` (Keras takes strings as a tensor only)."""
    return tf.constant(ids.astype(str)) if key_dtype == "string" else ids


@scenario
def keras_files(workdir):
    """model.save + load_model, and save_weights + load_weights: a 2-shard model comes
    back with its table and the optimizer's slot tables, predicts the same and trains
    on identically (int64 and string keys)."""
    results = {}
    for key_dtype in ("int64", "string"):
        x = as_keys(IDS, key_dtype)
        model = saving_model(key_dtype, SHARDS[2])
        fit_losses(model, x, LABELS, epochs=2)
        path = os.path.join(workdir, f"{flavor()}-{key_dtype}.keras")
        weights = os.path.join(workdir, f"{flavor()}-{key_dtype}.weights.h5")
        model.save(path)
        model.save_weights(weights)

        loaded = K.models.load_model(path)
        fresh = saving_model(key_dtype, SHARDS[1])
        fresh.optimizer.build(fresh.trainable_variables)
        fresh.load_weights(weights)
        results[key_dtype] = {
            "predict": model.predict(x, verbose=0).tolist(),
            "loaded_predict": loaded.predict(x, verbose=0).tolist(),
            "fresh_predict": fresh.predict(x, verbose=0).tolist(),
            "loaded_optimizer": type(loaded.optimizer).__name__,
            "loaded_shards": loaded.get_layer("user").params.shard_num,
            "loaded_size": int(loaded.get_layer("user").params.size()),
            "size": int(model.get_layer("user").params.size()),
            "losses": fit_losses(model, x, LABELS),
            "loaded_losses": fit_losses(loaded, x, LABELS),
            "fresh_losses": fit_losses(fresh, x, LABELS),
        }
    return results


@scenario
def checkpoint(workdir):
    """tf.train.Checkpoint(model, optimizer) of a 2-shard model restores into a fresh
    1-shard model: same predictions, then the same losses as the uninterrupted run."""
    model = saving_model("int64", SHARDS[2])
    fit_losses(model, IDS, LABELS, epochs=2)
    path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(
        os.path.join(workdir, f"{flavor()}-ckpt")
    )
    fresh = saving_model("int64", SHARDS[1])
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).restore(path)
    return {
        "predict": model.predict(IDS, verbose=0).tolist(),
        "fresh_predict": fresh.predict(IDS, verbose=0).tolist(),
        "losses": fit_losses(model, IDS, LABELS),
        "fresh_losses": fit_losses(fresh, IDS, LABELS),
    }


@scenario
def save_for_fresh_process(workdir):
    """Saves a trained model (and its input) for `keras_worker.py load`, which loads it
    in a process that imported nothing but tensorflow_dynemb."""
    model = saving_model("int64", SHARDS[2])
    fit_losses(model, IDS, LABELS, epochs=2)
    model.save(os.path.join(workdir, f"{flavor()}-fresh.keras"))
    np.save(os.path.join(workdir, "ids.npy"), IDS)
    return {"predict": model.predict(IDS, verbose=0).tolist()}


# Ids a served SavedModel is asked for: those of IDS, which training put in the table,
# and ids it never saw (12345, -2**50, 99), which read the initializer's per-id rows.
SERVE_IDS = np.concatenate([IDS, np.array([[3, 12345], [-(2**50), 99]], np.int64)])


def saved_model_dir(workdir: str, form: str) -> str:
    """Where the `saved_model` scenario writes the SavedModel `form` of this Keras."""
    return os.path.join(workdir, f"{flavor()}-savedmodels", form)


def saved_tables(path: str) -> int:
    """How many de.Variable / table contents the SavedModel at `path` holds (each saves
    one `-keys` tensor)."""
    checkpoint = os.path.join(path, "variables", "variables")
    names = [name for name, _ in tf.train.list_variables(checkpoint)]
    return sum(name.endswith("/.ATTRIBUTES/-keys") for name in names)


@scenario
def saved_model(workdir):
    """A trained 2-shard model exports to SavedModels with our ops, which
    `keras_worker.py serve` serves in a fresh process: Keras 3 `model.export` (Keras'
    ExportArchive) and `tf.saved_model.save`; tf_keras `model.save(dir,
    save_format="tf")` and `tf.saved_model.save`. Returns the live predictions of
    SERVE_IDS and how many tables each export holds."""
    model = saving_model("int64", SHARDS[2])
    fit_losses(model, IDS, LABELS, epochs=1)
    exports = {"tf_saved_model": lambda path: tf.saved_model.save(model, path)}
    if IS_KERAS3:
        exports["export"] = lambda path: model.export(path, verbose=False)
    else:
        exports["save_format_tf"] = lambda path: model.save(path, save_format="tf")
    tables = {}
    for form, export in exports.items():
        path = saved_model_dir(workdir, form)
        export(path)
        tables[form] = saved_tables(path)
    np.save(os.path.join(workdir, "serve_ids.npy"), SERVE_IDS)
    return {"predict": model.predict(SERVE_IDS, verbose=0).tolist(), "tables": tables}


# ----------------------------------------------------------------------------------------
# Configs
# ----------------------------------------------------------------------------------------


@K.saving.register_keras_serializable(package="dynemb_tests")
def field_of(ids):
    return tf.math.floormod(ids, 3)


@K.saving.register_keras_serializable(package="dynemb_tests")
def by_parity(keys, shard_num):
    return tf.cast(tf.math.floormod(keys, shard_num), tf.int32)


@scenario
def configs(workdir):
    """get_config is JSON, and from_config(get_config()) gives the same config and
    the same kind of table, for every layer and argument kind."""
    import functools

    made = [
        layers.Embedding(4),
        layers.Embedding(
            2,
            key_dtype=tf.string,
            value_dtype="float64",
            initializer=0.25,
            devices=SHARDS[2],
            keep_distribution=True,
            with_unique=False,
            bp_v2=True,
            init_capacity=64,
            max_norm=1.5,
            checkpoint=False,
            trainable=False,
        ),
        layers.Embedding(
            3,
            initializer=[0.1, 0.2, 0.3],
            devices=SHARDS[2],
            partitioner=by_parity,
            kv_creator=de.HkvHashTableCreator(
                de.HkvHashTableConfig(init_capacity=8, max_capacity=64, evict_strategy="lfu")
            ),
            restrict_policy=functools.partial(de.TimestampRestrictPolicy, use_step=True),
            admit_policy=de.FrequencyAdmitPolicy(2, max_tracked=100),
        ),
        layers.SquashedEmbedding(2, combiner="max", initializer="zeros"),
        layers.FieldWiseEmbedding(2, 3, field_of, combiner="sqrtn", name="fields"),
    ]
    results = []
    for layer in made:
        config = layer.get_config()
        rebuilt = type(layer).from_config(json.loads(json.dumps(config)))
        params, rebuilt_params = layer.params, rebuilt.params
        results.append(
            {
                "class": type(layer).__name__,
                "config": json.loads(json.dumps(config)),
                "rebuilt_config": json.loads(json.dumps(rebuilt.get_config())),
                "tables": [
                    [p.dim, p.key_dtype.name, p.value_dtype.name, p.bounded, p.bp_v2]
                    for p in (params, rebuilt_params)
                ],
                "shards": [params.shard_num, rebuilt_params.shard_num],
                "keep_distribution": layer.keep_distribution,
                "policies": [
                    [type(p.restrict_policy).__name__, repr(p.admit_policy)]
                    for p in (params, rebuilt_params)
                ],
            }
        )
    return results


@scenario
def not_jit_compiled(workdir):
    """The layers opt out of XLA: Keras 3's jit_compile="auto" resolves to False."""
    layer = layers.Embedding(DIM, initializer=initializer())
    model = embedding_model(layer)
    model.compile(optimizer="sgd", loss="mse", jit_compile="auto" if IS_KERAS3 else None)
    losses = fit_losses(model, IDS, LABELS, epochs=1)
    return {"jit_compile": bool(getattr(model, "jit_compile", False)), "losses": losses}
