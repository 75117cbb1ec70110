"""End-to-end demo: train a click-through-rate model on dynamic embeddings.

    python -m tensorflow_dynemb.demo [--data synthetic|movielens] [--rows 1000000] [--vocab 1000000] [--features 7]
        [--epochs 1] [--batch-size 1024] [--dim 8] [--workdir DIR] [--keep] [--seed 0]
        [--min-auc 0.7]

(`bash scripts/demo.sh [flags]` sets up a virtualenv first, then runs this through
`_quiet_start.py`, which keeps TensorFlow's C++ start-up lines out of the output.)

What it does:

1. Generates a synthetic click log (demo_data.py): categorical features (user_id,
   item_id, advertiser_id, category, city, device, hour, ...) with up to `--vocab`
   possible ids each. Ids are drawn with power-law (Zipf-like) frequencies, as in
   real logs: a few ids are very frequent, most are rare or never seen. Ids are
   large hash-like int64 values, not dense indices, so a static embedding table
   could not index them directly. The click label is
   Bernoulli(sigmoid(bias + sum of per-id effects + a device x hour interaction)),
   so there is something to learn; the AUC of the true click probabilities is
   the ceiling any model can reach.
2. Trains a CTR model (one dynamic embedding per feature, then an MLP) with
   `model.fit`.
3. Reports the AUC on held-out rows (which contain ids never seen in training).
4. Saves a `tf.train.Checkpoint`, restores it into a freshly built model and
   checks that the restored model predicts exactly what the trained one did.
5. Exports the trained model as two SavedModels and serves one held-out row from
   each in a fresh process (docs/serving.md): `model.export` keeps the tables with
   our ops (the serving process runs `import tensorflow_dynemb` first), and
   `de.export_static_saved_model` freezes them into stock TensorFlow ops (the serving
   process never imports tensorflow_dynemb). Both must predict what the trained
   model does for that row.

Exits with status 1 when the held-out AUC is below `--min-auc`, the restored
predictions differ, or a SavedModel serves another prediction, so it doubles as a
smoke test.

Output stays short when redirected (CI, a log file): `model.fit` prints one line per
epoch unless stdout is a terminal, where it draws its progress bar. The checkpoint and
SavedModels (tens to hundreds of MB) go to a temporary directory that is removed at
the end unless `--keep` is given; a `--workdir` of your own is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow import keras

import tensorflow_dynemb as de
from tensorflow_dynemb import _quiet_start
from tensorflow_dynemb.demo_data import (
    DEFAULT_VOCAB,
    FEATURES,
    FeatureSpec,
    feature_specs,
    generate_clicks,
    roc_auc,
)

# ----------------------------------------------------------------------------
# The embedding layer: the only place that knows which layer is used
# ----------------------------------------------------------------------------


def make_embedding(spec: FeatureSpec, dim: int, seed: int) -> keras.layers.Layer:
    """The embedding layer of one feature: int64 ids `[batch]` -> `[batch, dim]`."""
    # Initial rows seeded per layer: with the dynamic layer, an id the model has
    # never seen reads a row drawn from (seed, id), so the trained and the
    # restored model give unseen held-out ids the same row.
    initializer = keras.initializers.RandomNormal(0.0, 0.05, seed=seed)
    return de.keras.layers.Embedding(
        dim, key_dtype=tf.int64, value_dtype=tf.float32, initializer=initializer,
        name=f"{spec.name}_embedding")


def make_optimizer(learning_rate: float):
    """Adam, wrapped so that it can also update dynamic embedding tables."""
    return de.DynamicEmbeddingOptimizer(keras.optimizers.Adam(learning_rate))


def table_size(layer: keras.layers.Layer) -> int:
    """Rows the embedding layer's table holds now."""
    return int(layer.params.size())


# ----------------------------------------------------------------------------
# Model, training, checkpoint
# ----------------------------------------------------------------------------


def build_model(specs: Sequence[FeatureSpec], dim: int, seed: int) -> keras.Model:
    """CTR model: one embedding per feature, concatenated, then an MLP -> P(click)."""
    inputs = {s.name: keras.Input(shape=(), dtype="int64", name=s.name) for s in specs}
    embedded = [make_embedding(s, dim, seed + i)(inputs[s.name]) for i, s in enumerate(specs)]
    x = keras.layers.Concatenate()(embedded)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    click = keras.layers.Dense(1, activation="sigmoid", name="click")(x)
    return keras.Model(inputs, click, name="ctr_model")


def make_dataset(features: Dict[str, np.ndarray], labels: Optional[np.ndarray], batch_size: int):
    """Batches of (ids by feature, label), or of ids alone when `labels` is None.

    No shuffling: the rows are i.i.d. already.
    """
    ds = tf.data.Dataset.from_tensor_slices(features if labels is None else (features, labels))
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)


def embedding_layers(model: keras.Model) -> List[keras.layers.Layer]:
    """The model's embedding layers, in feature order."""
    return [layer for layer in model.layers if layer.name.endswith("_embedding")]


def save_and_restore(model: keras.Model, specs, args, workdir: str) -> Tuple[str, keras.Model]:
    """Writes a checkpoint of `model` and restores it into a freshly built model."""
    path = tf.train.Checkpoint(model=model).write(os.path.join(workdir, "ckpt", "ctr_model"))
    # The same definition, seeds included, as when restoring in production: an id
    # the model never trained on is not in the checkpoint, and it reads the row
    # its initializer draws from (seed, id) in both models.
    fresh = build_model(specs, args.dim, args.seed)
    status = tf.train.Checkpoint(model=fresh).read(path)
    # Every variable and table of the fresh model must come from the checkpoint.
    # The checkpoint also holds the optimizer's state (a compiled Keras model
    # tracks its optimizer), so training could resume from it; predicting does
    # not need it, hence expect_partial.
    status.assert_existing_objects_matched().expect_partial()
    return path, fresh


# ----------------------------------------------------------------------------
# SavedModels, served in fresh processes
# ----------------------------------------------------------------------------

# How long a serving process may take (it mostly imports TensorFlow).
SERVE_TIMEOUT_S = 300

# The program of a fresh process (`_quiet_start.py -c`, which has imported TensorFlow
# with its start-up lines held back): loads the SavedModel argv[1], serves the row
# argv[3] (JSON: ids by feature) through its "serving_default" signature and prints
# the prediction. argv[2] "ops" imports tensorflow_dynemb first (it registers the ops
# the tables use); "static" never does, and checks that.
_SERVE_PROGRAM = """
import json, sys
import tensorflow as tf
path, form, row = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if form == "ops":
    import tensorflow_dynemb
loaded = tf.saved_model.load(path)  # kept: its functions read the variables it holds
inputs = {name: tf.constant([ids], tf.int64) for name, ids in row.items()}
(output,) = loaded.signatures["serving_default"](**inputs).values()
if form == "static" and "tensorflow_dynemb" in sys.modules:
    sys.exit("the static SavedModel's process imported tensorflow_dynemb")
print(float(output.numpy().ravel()[0]))
"""


def row_with_unseen_ids(train: Dict[str, np.ndarray], test: Dict[str, np.ndarray]
                        ) -> Tuple[int, int]:
    """The first held-out row with an id training never saw (row 0 if none), and how
    many of its ids are unseen: the SavedModels must give such an id the row its
    initializer draws, as the trained model does (the static one recomputes it with
    stock ops)."""
    unseen = sum((~np.isin(ids, train[name])).astype(np.int64) for name, ids in test.items())
    index = int(np.argmax(unseen > 0))
    return index, int(unseen[index])


def export_saved_models(model: keras.Model, workdir: str) -> Dict[str, str]:
    """Exports `model` both ways; returns the directories by form ("ops", "static")."""
    exports = {
        "ops": os.path.join(workdir, "saved_model"),
        "static": os.path.join(workdir, "saved_model_static"),
    }
    if keras.Model.__module__.startswith("tf_keras"):
        # tf_keras' `model.export` cannot track the tables: save the model itself.
        tf.saved_model.save(model, exports["ops"])
    else:  # Keras 3: the SavedModel serves `model(inputs)` as "serve" / "serving_default"
        model.export(exports["ops"], verbose=False)
    de.export_static_saved_model(model, exports["static"])
    return exports


def serve_in_fresh_processes(exports: Dict[str, str], row: Dict[str, int]
                             ) -> Dict[str, Tuple[Optional[float], str]]:
    """Serves `row` from each SavedModel of `exports` in a new Python process (all at
    once: each spends most of its time importing TensorFlow).

    Returns:
      `{form: (prediction, "")}`, or `(None, error)` where the process failed.
    """
    # The package's directory, so that the "ops" process imports this very package
    # (also when it is not installed); the "static" process is not given it.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(de.__file__)))
    processes = {}
    for form, path in exports.items():
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if form == "ops":
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (package_root, env.get("PYTHONPATH")) if p)
        processes[form] = subprocess.Popen(
            [sys.executable, _quiet_start.__file__, "-c", _SERVE_PROGRAM, path, form,
             json.dumps(row)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    served = {}
    for form, process in processes.items():
        try:
            stdout, stderr = process.communicate(timeout=SERVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            served[form] = (None, f"no prediction within {SERVE_TIMEOUT_S} s")
            continue
        lines = stdout.strip().splitlines()
        if process.returncode != 0 or not lines:
            served[form] = (None, (stderr.strip().splitlines() or ["no output"])[-1])
        else:
            served[form] = (float(lines[-1]), "")
    return served


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tensorflow_dynemb.demo",
        description="Train, evaluate, checkpoint and restore a CTR model on dynamic "
                    "embeddings, then export it as SavedModels and serve them.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--data", choices=("synthetic", "movielens"), default="synthetic",
                   help="synthetic: the generated click log; movielens: MovieLens-100k ratings "
                        "(liked or not), beside a static-vocabulary Keras model "
                        "(tensorflow_dynemb/demo_movielens.py; needs pyarrow)")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the click log")
    p.add_argument("--vocab", type=int, default=DEFAULT_VOCAB,
                   help="possible ids of the largest feature (user_id); item_id and "
                        "advertiser_id vocabularies scale with it")
    p.add_argument("--features", type=int, default=len(FEATURES),
                   help=f"number of categorical features; past {len(FEATURES)}, generic ones are added")
    # One pass: CTR models memorise rare ids in a second epoch and the held-out
    # AUC drops (the "one-epoch phenomenon"); scale --rows instead.
    p.add_argument("--epochs", type=int, default=None,
                   help="passes over the training rows (default: 1; movielens: 3)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="rows per training step (default: 1024; movielens: 256)")
    p.add_argument("--dim", type=int, default=8, help="embedding dimension")
    p.add_argument("--learning-rate", type=float, default=0.002, help="Adam's learning rate")
    p.add_argument("--test-fraction", type=float, default=0.1, help="share of the rows held out for evaluation")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of the model")
    p.add_argument("--workdir", default=None,
                   help="where the checkpoint and the SavedModels go, kept at the end "
                        "(default: a new temporary directory, removed at the end unless --keep)")
    p.add_argument("--keep", action="store_true",
                   help="keep the temporary directory with the checkpoint and the SavedModels")
    p.add_argument("--min-auc", type=float, default=None,
                   help="exit with status 1 below this held-out AUC (default: 0.7; movielens: 0.72)")
    p.add_argument("--verbose", type=int, default=None, choices=(0, 1, 2),
                   help="model.fit verbosity: 1 progress bar, 2 one line per epoch, 0 silent "
                        "(default: 1 when stdout is a terminal, else 2)")
    args = p.parse_args(argv)
    for name, synthetic, movielens in (("epochs", 1, 3), ("batch_size", 1024, 256), ("min_auc", 0.7, 0.72)):
        if getattr(args, name) is None:
            setattr(args, name, movielens if args.data == "movielens" else synthetic)
    if args.verbose is None:
        # Redirected, Keras' progress bar is one line rewritten with "\r" at every
        # step: tens of KB without a line break.
        args.verbose = 1 if sys.stdout.isatty() else 2
    if args.rows < 100 or not 0.0 < args.test_fraction < 1.0 or args.features < 1:
        p.error("need --rows >= 100, 0 < --test-fraction < 1 and --features >= 1")
    return args


@contextlib.contextmanager
def demo_workdir(workdir: Optional[str], keep: bool) -> Iterator[Tuple[str, bool]]:
    """Yields `(directory, kept)`: `workdir` (created if needed, always kept), else a new
    temporary directory, removed on exit (also on failure) unless `keep`."""
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        yield workdir, True
        return
    path = tempfile.mkdtemp(prefix="dynemb_demo_")
    try:
        yield path, keep
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    # Under `python -m` TensorFlow is imported already; its runtime's start (cuInit's
    # error line on a machine without a GPU driver) is still held back.
    _quiet_start.start_tensorflow_quietly()
    with demo_workdir(args.workdir, args.keep) as (workdir, kept):
        if args.data == "movielens":
            from tensorflow_dynemb import demo_movielens

            return demo_movielens.run(args, workdir, kept)
        return run(args, workdir, kept)


def run(args: argparse.Namespace, workdir: str, kept: bool) -> int:
    """The demo in `workdir` (see the module docstring); returns the exit status."""
    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)

    print(f"==> Generating {args.rows:,} rows of clicks")
    specs = feature_specs(args.features, args.vocab)
    features, labels, probabilities = generate_clicks(args.rows, specs, args.seed)
    n_train = args.rows - max(1, round(args.rows * args.test_fraction))
    train = {k: v[:n_train] for k, v in features.items()}
    test = {k: v[n_train:] for k, v in features.items()}
    train_labels, test_labels = labels[:n_train], labels[n_train:]
    data_s = time.perf_counter() - start

    print(f"==> Training on {n_train:,} rows, evaluating on {args.rows - n_train:,} held-out rows")
    model = build_model(specs, args.dim, args.seed)
    model.compile(
        optimizer=make_optimizer(args.learning_rate),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc")],
        # The hash-table ops have no XLA kernels.
        jit_compile=False,
    )
    train_start = time.perf_counter()
    model.fit(
        make_dataset(train, train_labels, args.batch_size),
        validation_data=make_dataset(test, test_labels, args.batch_size),
        epochs=args.epochs,
        shuffle=False,  # the rows are i.i.d.; tf.data datasets are not shuffled by fit anyway
        verbose=args.verbose,
    )
    train_s = time.perf_counter() - train_start
    test_ds = make_dataset(test, None, args.batch_size)
    predictions = model.predict(test_ds, verbose=0).ravel()
    auc = roc_auc(test_labels, predictions)

    print("==> Checkpoint: save, restore into a fresh model, predict")
    ckpt_path, restored = save_and_restore(model, specs, args, workdir)
    restored_predictions = restored.predict(test_ds, verbose=0).ravel()
    max_diff = float(np.max(np.abs(restored_predictions - predictions)))

    print("==> SavedModels: export with our ops and static, serve a held-out row in fresh processes")
    export_start = time.perf_counter()
    index, unseen = row_with_unseen_ids(train, test)
    row = {name: int(ids[index]) for name, ids in test.items()}
    live = float(predictions[index])
    exports = export_saved_models(model, workdir)
    served = serve_in_fresh_processes(exports, row)
    export_s = time.perf_counter() - export_start
    total_s = time.perf_counter() - start

    # Summary.
    print("\n==> Summary")
    print(f"rows          {args.rows:,} ({n_train:,} train, {args.rows - n_train:,} held out), "
          f"click rate {labels.mean():.1%}")
    print(f"model         {len(specs)} features x embedding dim {args.dim}, MLP 64-32-1; "
          f"{args.epochs} epoch(s) of batch {args.batch_size}")
    print(f"  {'feature':<14} {'possible ids':>12} {'distinct in train':>18} {'table rows':>11}")
    for spec, layer in zip(specs, embedding_layers(model)):
        distinct = len(np.unique(train[spec.name]))
        print(f"  {spec.name:<14} {spec.vocab:>12,} {distinct:>18,} {table_size(layer):>11,}")
    print(f"held-out AUC  {auc:.4f}  (true click probabilities reach {roc_auc(test_labels, probabilities[n_train:]):.4f})")
    print(f"checkpoint    {os.path.relpath(ckpt_path, workdir)} "
          f"({_dir_bytes(os.path.dirname(ckpt_path)) / 2**20:.1f} MiB); "
          f"restored model's predictions: max |diff| {max_diff:.2g}")
    print(f"saved models  held-out row {index} ({unseen} of its {len(row)} ids unseen in "
          f"training): trained model predicts {live:.6f}")
    titles = {"ops": "with our ops", "static": "static (stock TF)"}
    for form, path in exports.items():
        prediction, error = served[form]
        outcome = error if prediction is None else (
            f"{prediction:.6f} (|diff| {abs(prediction - live):.2g})")
        print(f"  {titles[form]:<17} {os.path.relpath(path, workdir)} "
              f"({_dir_bytes(path) / 2**20:.1f} MiB); served in a fresh process: {outcome}")
    print(f"time          {total_s:.1f} s (data {data_s:.1f} s, fit {train_s:.1f} s, "
          f"export and serve {export_s:.1f} s)")
    if kept:
        print(f"outputs       {os.path.abspath(workdir)} ({_dir_bytes(workdir) / 2**20:.1f} MiB: "
              "ckpt/, saved_model/, saved_model_static/), kept")
    else:
        print(f"outputs       {workdir} ({_dir_bytes(workdir) / 2**20:.1f} MiB), removed at "
              "exit (--keep keeps them)")

    failures = []
    if not auc >= args.min_auc:
        failures.append(f"held-out AUC {auc:.4f} < --min-auc {args.min_auc}")
    # Same weights, same batches, same kernels: the predictions should be
    # bit-identical; the tolerance only forgives nondeterministic float sums.
    if not max_diff <= 1e-6:
        failures.append(f"restored predictions differ (max |diff| {max_diff:.3g})")
    failures += serving_failures(served, live, titles)
    return verdict(failures, f"held-out AUC {auc:.4f} >= {args.min_auc}, restored predictions "
                             "match, both SavedModels serve the trained model's prediction")


def serving_failures(served: Dict[str, Tuple[Optional[float], Optional[str]]], live: float,
                     titles: Dict[str, str]) -> List[str]:
    """What is wrong with the predictions `serve_in_fresh_processes` returned, against the
    trained model's prediction `live` of the same row."""
    failures = []
    # One row served alone, not in a batch of --batch-size: the kernels may sum in
    # another order, hence a looser tolerance.
    for form, (prediction, error) in served.items():
        if prediction is None:
            failures.append(f"serving the {titles[form]} SavedModel failed: {error}")
        elif not abs(prediction - live) <= 1e-5:
            failures.append(f"the {titles[form]} SavedModel serves {prediction:.6f}, "
                            f"the trained model predicts {live:.6f}")
    return failures


def verdict(failures: List[str], passed: str) -> int:
    """Prints the demo's last line and returns its exit status."""
    if failures:
        print("demo: FAILED: " + "; ".join(failures))
        return 1
    print(f"demo: PASSED ({passed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
