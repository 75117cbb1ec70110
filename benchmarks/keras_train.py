"""End-to-end Keras training throughput: ours beside TFRA, same model, same data.

    python benchmarks/keras_train.py [--impls ours,tfra] [--layout per-feature|shared]
        [--rounds 3] [--warmup 20] [--steps 150] [--out benchmarks/results/keras_train_<tag>.json]

Model (Criteo-like): 26 categorical features, each an int64 id drawn with power-law
(Zipf-like, exponent 1.1) frequencies over 5,000,000 values and scattered over the
int64 range; dynamic embeddings of dim 16; the 26 rows concatenated into an MLP
64-32-1 (relu, relu, logit); binary cross-entropy; Adam(1e-3) wrapped in each library's
`DynamicEmbeddingOptimizer`; batch 4096; `model.fit` over a `tf.data` pipeline of
pre-generated batches (the same seeded batches for every implementation).

Layouts: `per-feature` (default): one embedding layer (table) per feature, as DLRM and
the demo do; `shared`: one layer over a `[batch, 26]` input, with the feature number
in the key's high bits.

Implementations (one fresh child process each, alternated `--rounds` times so that
both see the same load):
- `ours`: `tensorflow_dynemb.keras.layers.Embedding` + `de.DynamicEmbeddingOptimizer`.
- `ours-untracked`: `ours` with `de.HashTableCreator(track_changes=False)` tables:
  `--impls ours,ours-untracked` measures what change tracking (online learning's
  deltas, docs/online_learning.md) costs the training step.
- `tfra`: `tensorflow_recommenders_addons.dynamic_embedding.keras.layers.Embedding` +
  TFRA's `DynamicEmbeddingOptimizer` (needs TF 2.16 and `TF_USE_LEGACY_KERAS=1`; the
  script sets it for every child when TFRA is importable, so ours runs under tf_keras
  too in that comparison).

Throughput: examples/s over the steps after `--warmup` (from the end of the warm-up
step to the return of `fit`, which waits for the last step). Regimes: by default every
batch is new (the tables keep growing); `--steady` cycles the measured steps over the
warm-up's batches, so no key is new (later epochs). TF's default thread pools unless
`--threads` / `--inter-threads` are given. Results: a JSON file per (TF version, layout,
regime) in benchmarks/results, read by `benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import loadavg, median, print_result, spawn_child, tfra_available, write_record  # noqa: E402

FEATURES = 26
VOCAB = 5_000_000
ZIPF = 1.1
DIM = 16
BATCH = 4096


# ---------------------------------------------------------------------------------------
# Data (numpy only)
# ---------------------------------------------------------------------------------------


def power_law_ids(rng, n, vocab=VOCAB, s=ZIPF):
    """`n` ranks in [1, vocab] with P(rank k) ~ k^-s (continuous inverse CDF)."""
    import numpy as np

    u = rng.random(n)
    a = 1.0 - s
    ranks = np.floor(((vocab ** a - 1.0) * u + 1.0) ** (1.0 / a)).astype(np.int64)
    return np.clip(ranks, 1, vocab)


def make_batches(steps, seed=0, layout="per-feature"):
    """`ids [steps, BATCH, FEATURES]` int64 and `labels [steps, BATCH, 1]` float32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ranks = power_law_ids(rng, steps * BATCH * FEATURES).reshape(steps, BATCH, FEATURES)
    feature = np.arange(FEATURES, dtype=np.uint64)
    # Scatter ranks over the key space, differently per feature (a hash, as in real logs).
    with np.errstate(over="ignore"):
        mixed = (ranks.astype(np.uint64) + (feature << np.uint64(32))) * np.uint64(0x9E3779B97F4A7C15)
    ids = (mixed >> np.uint64(1)).astype(np.int64)
    if layout == "shared":  # feature number in the high bits: one table holds all
        ids = (ids & np.int64((1 << 56) - 1)) | (feature.astype(np.int64) << 56)
    labels = (rng.random((steps, BATCH, 1)) < 0.25).astype(np.float32)
    return ids, labels


# ---------------------------------------------------------------------------------------
# One implementation, in this process
# ---------------------------------------------------------------------------------------


def build_model(impl, layout):
    import tensorflow as tf

    if impl in ("ours", "ours-untracked"):
        import functools

        import tensorflow_dynemb as de

        layer_cls = de.keras.layers.Embedding
        if impl == "ours-untracked":  # tables without change tracking (online learning)
            layer_cls = functools.partial(
                layer_cls, kv_creator=de.HashTableCreator(track_changes=False))
        wrap = de.DynamicEmbeddingOptimizer
    else:
        import tensorflow_recommenders_addons.dynamic_embedding as tfra_de

        layer_cls = tfra_de.keras.layers.Embedding
        wrap = tfra_de.DynamicEmbeddingOptimizer
    keras = tf.keras
    init = keras.initializers.RandomNormal(0.0, 0.01)
    if layout == "shared":
        inputs = keras.Input(shape=(FEATURES,), dtype="int64", name="ids")
        rows = layer_cls(DIM, initializer=init, name="emb")(inputs)
        x = keras.layers.Flatten()(rows)
        model_inputs = inputs
    else:
        model_inputs = [keras.Input(shape=(1,), dtype="int64", name=f"f{i}") for i in range(FEATURES)]
        rows = [layer_cls(DIM, initializer=init, name=f"emb{i}")(x) for i, x in enumerate(model_inputs)]
        x = keras.layers.Flatten()(keras.layers.Concatenate(axis=1)(rows))
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    logits = keras.layers.Dense(1)(x)
    model = keras.Model(model_inputs, logits)
    model.compile(
        optimizer=wrap(keras.optimizers.Adam(1e-3)),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return model


def run_child(args):
    import numpy as np
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    if args.inter_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
    total = args.warmup + args.steps
    distinct = args.distinct_batches or total
    ids, labels = make_batches(distinct, seed=args.seed, layout=args.layout)
    if args.layout == "shared":
        features = ids
    else:
        features = tuple(np.ascontiguousarray(ids[:, :, i : i + 1]) for i in range(FEATURES))
    ds = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().prefetch(2)
    model = build_model(args.impl, args.layout)

    marks = {}

    class Timer(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == args.warmup - 1:
                marks["warm"] = time.perf_counter()

    t0 = time.perf_counter()
    history = model.fit(ds, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[Timer()])
    end = time.perf_counter()
    secs = end - marks["warm"]
    # Both libraries' Keras layers keep their table in `params`.
    sizes = [int(l.params.size()) for l in model.layers if hasattr(l, "params")]
    result = {
        "impl": args.impl,
        "layout": args.layout,
        "tf": tf.__version__,
        "keras": tf.keras.__name__ if hasattr(tf.keras, "__name__") else "",
        "legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS") == "1",
        "warmup_steps": args.warmup,
        "distinct_batches": distinct,
        "steps": args.steps,
        "batch": BATCH,
        "seconds": secs,
        "warmup_seconds": marks["warm"] - t0,
        "steps_per_s": args.steps / secs,
        "examples_per_s": args.steps * BATCH / secs,
        "final_loss": float(history.history["loss"][-1]),
        "table_keys": int(sum(sizes)),
        "cpu_seconds": time.process_time(),
    }
    print_result(result)


# ---------------------------------------------------------------------------------------
# Parent: alternate children, compare
# ---------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", default=None,
                   help="comma list of ours,tfra,ours-untracked (default: ours, and tfra if "
                        "installed); ours-untracked: tables made with track_changes=False, "
                        "to measure what change tracking costs (docs/online_learning.md)")
    p.add_argument("--layout", default="per-feature", choices=["per-feature", "shared"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--distinct-batches", type=int, default=0,
                   help="cycle over this many generated batches (0: warmup + steps, all fresh)")
    p.add_argument("--steady", action="store_true",
                   help="steady state: --distinct-batches = --warmup, so the measured steps "
                        "revisit ids the warm-up inserted (no table growth)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: TF's default)")
    p.add_argument("--inter-threads", type=int, default=0, help="inter-op threads (0: TF's default)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.steady:
        args.distinct_batches = args.warmup
    if args.child:
        args.impl = args.child
        run_child(args)
        return

    tfra = tfra_available()
    impls = args.impls.split(",") if args.impls else (["ours", "tfra"] if tfra else ["ours"])
    env = dict(os.environ)
    if tfra:  # TFRA's layers and optimizer need tf_keras: run every child under it
        env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    load_start = loadavg()
    runs = []
    for r in range(args.rounds):
        order = impls if r % 2 == 0 else list(reversed(impls))
        for impl in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", impl, "--layout", args.layout,
                   "--warmup", str(args.warmup), "--steps", str(args.steps), "--seed", str(args.seed),
                   "--distinct-batches", str(args.distinct_batches),
                   "--threads", str(args.threads), "--inter-threads", str(args.inter_threads)]
            res, error = spawn_child(cmd, env)
            if res is None:
                runs.append({"impl": impl, "round": r, "error": error})
                continue
            res["round"] = r
            res["load_after"] = loadavg()
            runs.append(res)
            print(f"round {r} {impl:5s}: {res['examples_per_s']:9.0f} examples/s "
                  f"({res['steps_per_s']:.2f} steps/s, loss {res['final_loss']:.4f}, "
                  f"{res['table_keys']} keys, load {res['load_after']})", flush=True)

    import tensorflow as tf

    summary = {}
    for impl in impls:
        rates = sorted(r["examples_per_s"] for r in runs if r["impl"] == impl and "error" not in r)
        if rates:
            summary[impl] = {"examples_per_s": rates, "median": median(rates)}
    def per_round(a, b):
        """Sorted per-round ratios of a's examples/s over b's (rounds where both ran)."""
        ratios = []
        for r in range(args.rounds):
            got = {x["impl"]: x for x in runs if x.get("round") == r and "error" not in x}
            if a in got and b in got:
                ratios.append(got[a]["examples_per_s"] / got[b]["examples_per_s"])
        return sorted(ratios)

    comparisons = [  # (a, b, summary keys, label, target, digits)
        ("ours", "tfra", ("ratio_ours_over_tfra", "ratio_median"), "ours / TFRA", 3.0, 2),
        ("ours", "ours-untracked", ("ratio_tracked_over_untracked", "tracked_ratio_median"),
         "change tracking on / off", 0.95, 3),
    ]
    for a, b, (key, median_key), label, target, digits in comparisons:
        if a not in impls or b not in impls:
            continue
        ratios = per_round(a, b)
        summary[key] = ratios
        if ratios:
            med = median(ratios)
            summary[median_key] = med
            print(f"{label} per round: {', '.join(f'{x:.{digits}f}' for x in ratios)}; "
                  f"median {med:.{digits}f} (target >= {target:g}): "
                  f"{'PASS' if med >= target else 'FAIL'}")
    for impl, s in summary.items():
        if isinstance(s, dict):
            print(f"{impl}: examples/s {', '.join(f'{x:.0f}' for x in s['examples_per_s'])}; median {s['median']:.0f}")
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results",
        # The change-tracking comparison apart: report.py reads keras_train_*.json.
        f"{'change_tracking' if 'ours-untracked' in impls else 'keras_train'}_tf{tf.__version__}"
        f"_{args.layout}{'_steady' if args.steady else ''}.json")
    write_record(
        out,
        "keras_train",
        tf.__version__,
        load_start,
        legacy_keras=env.get("TF_USE_LEGACY_KERAS") == "1",
        layout=args.layout,
        regime="steady" if args.steady else "growing",
        distinct_batches=args.distinct_batches or args.warmup + args.steps,
        runs=runs,
        summary=summary,
    )


if __name__ == "__main__":
    main()
