"""End-to-end Keras training throughput: ours beside TFRA, same model, same data.

    python benchmarks/keras_train.py [--impls ours,keras-vocab,keras-hashed,ceiling,tfra]
        [--layout per-feature|shared] [--steady] [--keras auto|keras3|tf_keras]
        [--rounds 3] [--warmup 20] [--steps 150] [--batch 4096]
        [--out benchmarks/results/keras_train_<tag>.json]

Model (Criteo-like): 26 categorical features, each an int64 id drawn with power-law
(Zipf-like, exponent 1.1) frequencies over 5,000,000 values and scattered over the
int64 range; dynamic embeddings of dim 16; the 26 rows concatenated into an MLP
64-32-1 (relu, relu, logit; `--mlp` sets the hidden widths); binary cross-entropy;
Adam(1e-3) (`--optimizer` picks another) wrapped in each library's
`DynamicEmbeddingOptimizer`; batch 4096 (`--batch`); `model.fit` over a `tf.data` pipeline of
pre-generated batches (the same seeded batches for every implementation).

Layouts: `per-feature` (default): one embedding layer (table) per feature, as DLRM and
the demo do; `shared`: one layer over a `[batch, 26]` input, with the feature number
in the key's high bits.

Implementations (one fresh child process each, alternated `--rounds` times so that
all see the same load; by default ours and the three Keras baselines, and TFRA when
it is installed):
- `ours`: `tensorflow_dynemb.keras.layers.Embedding` + `de.DynamicEmbeddingOptimizer`.
- `keras-vocab`: what a Keras user builds when the id set is known in advance:
  `IntegerLookup(vocabulary=<the exact ids the run will see>)` + `keras.layers.Embedding`.
- `keras-hashed`: the hashing trick: `Hashing(2**20)` + `Embedding(2**20, 16)`
  (collisions allowed); per-feature, the same 2**20-row budget split into 26 tables of
  `2**20 // 26` rows.
- `ceiling`: no embedding at all: the same model, loss, optimizer and input pipeline with
  fixed rows where the embedding rows were: one `[batch, 26, 16]` broadcast (shared
  layout), or one `[batch, 1, 16]` broadcast per feature joined by the same
  `Concatenate` as the per-feature model's (per-feature layout: that concat, 26 rows of
  64 bytes per example, is the model's cost, not the embedding's). The fixed rows
  receive the model's gradient as a trainable embedding's output does (the first dense
  layer's input-gradient `MatMul`, and per-feature the concat's `SplitV`, run in both
  steps; see `_fixed_rows_layer`). Ours / ceiling is the share of a step the embedding
  layer leaves to the rest of the model (target >= 0.85).
- `ours-untracked`: `ours` with `de.HashTableCreator(track_changes=False)` tables:
  `--impls ours,ours-untracked` measures what change tracking (online learning's
  deltas, docs/online_learning.md) costs the training step.
- `tfra`: `tensorflow_recommenders_addons.dynamic_embedding.keras.layers.Embedding` +
  TFRA's `DynamicEmbeddingOptimizer` (needs TF 2.16 and tf_keras: when tfra runs, every
  child runs under `TF_USE_LEGACY_KERAS=1`, ours too). `--keras tf_keras|keras3` picks
  the Keras of a run without TFRA.

The Keras baselines use plain `keras.optimizers.Adam(1e-3)`; ours and TFRA wrap it in
their `DynamicEmbeddingOptimizer`. The parent prints each round, then each ratio per
round (ours over each other implementation run) and its median. With `ceiling` in the
run it also prints each embedding's cost per id, per round and its median: the step time
minus the same round's free-embedding (`ceiling`) step time, divided by the ids in a
step (batch x 26), in ns, from the timed windows' mean step, from the p50 steps, and
from the process CPU time per timed step (which other jobs on a shared machine move
far less than the wall time).

Throughput: examples/s over the steps after `--warmup` (from the end of the warm-up
step to the end of the last step; `fit`'s teardown after it is recorded apart, as
`fit_teardown_seconds`). Regimes: by default every
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


def make_batches(steps, seed=0, layout="per-feature", batch=BATCH):
    """`ids [steps, batch, FEATURES]` int64 and `labels [steps, batch, 1]` float32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ranks = power_law_ids(rng, steps * batch * FEATURES).reshape(steps, batch, FEATURES)
    feature = np.arange(FEATURES, dtype=np.uint64)
    # Scatter ranks over the key space, differently per feature (a hash, as in real logs).
    with np.errstate(over="ignore"):
        mixed = (ranks.astype(np.uint64) + (feature << np.uint64(32))) * np.uint64(0x9E3779B97F4A7C15)
    ids = (mixed >> np.uint64(1)).astype(np.int64)
    if layout == "shared":  # feature number in the high bits: one table holds all
        ids = (ids & np.int64((1 << 56) - 1)) | (feature.astype(np.int64) << 56)
    labels = (rng.random((steps, batch, 1)) < 0.25).astype(np.float32)
    return ids, labels


# ---------------------------------------------------------------------------------------
# One implementation, in this process
# ---------------------------------------------------------------------------------------


KERAS_BASELINES = ("keras-vocab", "keras-hashed", "ceiling")
# The ratios a run prints and records, per round and their median (report.py tabulates
# them too): (a, b, (summary key, median key), label, target or None, digits).
COMPARISONS = (
    ("ours", "tfra", ("ratio_ours_over_tfra", "ratio_median"), "ours / TFRA", 3.0, 2),
    ("ours", "ours-untracked", ("ratio_tracked_over_untracked", "tracked_ratio_median"),
     "change tracking on / off", 0.95, 3),
    ("ours", "ceiling", ("ratio_ours_over_ceiling", "ceiling_ratio_median"),
     "ours / no-embedding ceiling", 0.85, 3),
    ("ours", "keras-vocab", ("ratio_ours_over_keras_vocab", "keras_vocab_ratio_median"),
     "ours / IntegerLookup+Embedding", None, 2),
    ("ours", "keras-hashed", ("ratio_ours_over_keras_hashed", "keras_hashed_ratio_median"),
     "ours / Hashing(2**20)+Embedding", None, 2),
)
HASH_BINS = 2 ** 20


def _embedding_layers(impl, vocabularies):
    """A function `make(name)` that returns a callable from int64 ids to `[..., DIM]`
    rows: one embedding (one feature's, or the shared one) of implementation `impl`.

    `vocabularies(name)` gives the exact ids the static-vocabulary baseline must know."""
    import tensorflow as tf

    keras = tf.keras
    init = keras.initializers.RandomNormal(0.0, 0.01)
    if impl == "ceiling":
        # A free embedding in the same model: per-feature, its rows still go through the
        # model's Concatenate (26 rows of 64 bytes per example, ~4 ms a step at batch
        # 4096: docs/benchmarks.md, "The per-feature ceiling"), the model's cost.
        fixed = _fixed_rows_layer()
        return lambda name: fixed(name=f"{name}_fixed")
    if impl in ("ours", "ours-untracked"):
        import tensorflow_dynemb as de

        kw = {}
        if impl == "ours-untracked":  # tables without change tracking (online learning)
            kw["kv_creator"] = de.HashTableCreator(track_changes=False)
        return lambda name: de.keras.layers.Embedding(DIM, initializer=init, name=name, **kw)
    if impl == "tfra":
        import tensorflow_recommenders_addons.dynamic_embedding as tfra_de

        return lambda name: tfra_de.keras.layers.Embedding(DIM, initializer=init, name=name)
    if impl == "keras-vocab":  # what a Keras user builds over a known id set
        def vocab_embedding(name):
            vocab = vocabularies(name)
            lookup = keras.layers.IntegerLookup(vocabulary=vocab, num_oov_indices=1, name=f"{name}_lookup")
            table = keras.layers.Embedding(len(vocab) + 1, DIM, embeddings_initializer=init, name=name)
            return lambda x: table(lookup(x))
        return vocab_embedding
    if impl == "keras-hashed":  # the hashing trick: a fixed table, collisions allowed
        def hashed_embedding(name):
            # One budget of HASH_BINS rows: the shared table's, or split among the
            # per-feature tables (26 tables of 2**20 rows would update 26x the rows
            # densely each step, and hold 26x the memory).
            bins = HASH_BINS if name == "emb" else HASH_BINS // FEATURES
            hashing = keras.layers.Hashing(bins, name=f"{name}_hash")
            table = keras.layers.Embedding(bins, DIM, embeddings_initializer=init, name=name)
            return lambda x: table(hashing(x))
        return hashed_embedding
    raise ValueError(f"impl: unknown implementation {impl!r}")


def _fixed_rows_layer():
    """The ceiling's stand-in for an embedding: fixed rows, `[batch, n, DIM]` for ids of
    shape `[batch, n]`, so the model, the loss and the input pipeline are the model's,
    and no embedding runs. The rows still receive the model's gradient, as any trainable
    embedding's output does: that gradient is the first dense layer's input-gradient
    `MatMul` (`[batch, 64] x [64, n * DIM]`, ~3 ms a step at batch 4096 on 2 cores), the
    model's cost, which a constant input would let TF prune from the ceiling's step
    alone (docs/benchmarks.md, "A ceiling that receives its gradient"). The rows' own
    gradient is one example's slice of it, so no reduction over the batch is added."""
    import numpy as np
    import tensorflow as tf

    class FixedRows(tf.keras.layers.Layer):
        def build(self, input_shape):
            rng = np.random.default_rng(0)
            self.n = int(input_shape[-1])
            init = rng.normal(0.0, 0.01, (self.n, DIM)).astype(np.float32)
            self.rows = self.add_weight(
                name="rows", shape=(self.n, DIM), initializer=lambda *a, **k: tf.constant(init),
                trainable=True,
            )

        def call(self, ids):
            n = self.n

            @tf.custom_gradient
            def broadcast(rows, batch):
                def grad(upstream):
                    return upstream[0], None

                return tf.broadcast_to(rows[None], tf.stack([batch, n, DIM])), grad

            return broadcast(tf.convert_to_tensor(self.rows), tf.shape(ids)[0])

    return FixedRows


OPTIMIZERS = ("adam", "adagrad", "adamax", "nadam", "rmsprop", "adadelta", "ftrl", "sgd-momentum")


def make_optimizer(name):
    """The inner optimizer `name` (Keras 3 or tf_keras, whichever tf.keras is)."""
    import tensorflow as tf

    opt = tf.keras.optimizers
    makers = {
        "adam": lambda: opt.Adam(1e-3),
        "adagrad": lambda: opt.Adagrad(1e-2),
        "adamax": lambda: opt.Adamax(1e-3),
        "nadam": lambda: opt.Nadam(1e-3),
        "rmsprop": lambda: opt.RMSprop(1e-3),
        "adadelta": lambda: opt.Adadelta(1.0),
        "ftrl": lambda: opt.Ftrl(1e-2),
        "sgd-momentum": lambda: opt.SGD(1e-2, momentum=0.9),
    }
    if name not in makers:
        raise ValueError(f"optimizer: expected one of {sorted(makers)}, got {name!r}")
    return makers[name]()


def build_model(impl, layout, vocabularies=None, mlp=(64, 32), optimizer="adam"):
    """The benchmark's model for `impl`; `vocabularies(name)` (keras-vocab only) gives the
    exact ids of embedding `name` (`emb` shared, `emb{i}` per feature); `mlp`: the
    hidden layers' widths; `optimizer`: a name of OPTIMIZERS."""
    import tensorflow as tf

    keras = tf.keras
    if layout == "shared":
        inputs = keras.Input(shape=(FEATURES,), dtype="int64", name="ids")
        model_inputs = inputs
    else:
        model_inputs = [keras.Input(shape=(1,), dtype="int64", name=f"f{i}") for i in range(FEATURES)]
    if layout == "shared":
        rows = _embedding_layers(impl, vocabularies)("emb")(inputs)
        x = keras.layers.Flatten()(rows)
    else:
        make = _embedding_layers(impl, vocabularies)
        rows = [make(f"emb{i}")(x) for i, x in enumerate(model_inputs)]
        x = keras.layers.Flatten()(keras.layers.Concatenate(axis=1)(rows))
    for width in mlp:
        x = keras.layers.Dense(width, activation="relu")(x)
    logits = keras.layers.Dense(1)(x)
    model = keras.Model(model_inputs, logits)
    optimizer = make_optimizer(optimizer)
    if impl in ("ours", "ours-untracked"):
        import tensorflow_dynemb as de

        optimizer = de.DynamicEmbeddingOptimizer(optimizer)
    elif impl == "tfra":
        import tensorflow_recommenders_addons.dynamic_embedding as tfra_de

        optimizer = tfra_de.DynamicEmbeddingOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def _widths(text):
    """`--mlp` "64,32" as (64, 32)."""
    return tuple(int(w) for w in text.split(",") if w)


def training_dataset(features, labels, repeat=True):
    """The input pipeline: the pre-generated batches, repeated, 2 prefetched, with
    tf.data's autotuning off. Autotuning's model thread sleeps between rounds of tuning
    (up to seconds), and destroying the iterator at the end of `fit` waits for it to
    wake: `fit` then returned 0-2 s after its last step, which made whole runs look half
    as fast (docs/benchmarks.md, "Two speeds"). It would also take CPU from the steps."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((features, labels))
    if repeat:
        ds = ds.repeat()
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.prefetch(2).with_options(options)


def _percentiles_ms(seconds):
    """{p10, p50, p90, max} of per-step durations, in milliseconds."""
    import numpy as np

    if len(seconds) == 0:
        return {}
    ms = np.asarray(seconds) * 1e3
    return {"p10": round(float(np.percentile(ms, 10)), 2), "p50": round(float(np.percentile(ms, 50)), 2),
            "p90": round(float(np.percentile(ms, 90)), 2), "max": round(float(ms.max()), 2)}


def run_child(args):
    import numpy as np
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    if args.inter_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_threads)
    total = args.warmup + args.steps
    distinct = args.distinct_batches or total
    ids, labels = make_batches(distinct, seed=args.seed, layout=args.layout, batch=args.batch)
    if args.layout == "shared":
        features = ids
    else:
        features = tuple(np.ascontiguousarray(ids[:, :, i : i + 1]) for i in range(FEATURES))
    ds = training_dataset(features, labels)

    def vocabularies(name):  # the exact ids embedding `name` sees (keras-vocab)
        column = ids if name == "emb" else ids[:, :, int(name[len("emb"):])]
        return np.unique(column)

    model = build_model(args.impl, args.layout, vocabularies, _widths(args.mlp), args.optimizer)

    marks = {}
    step_ends = []

    class Timer(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            cpu = time.process_time()
            if batch == args.warmup - 1:
                marks["warm"] = now
                marks["warm_cpu"] = cpu
            if batch >= args.warmup - 1:
                step_ends.append(now)
                marks["end_cpu"] = cpu

    t0 = time.perf_counter()
    history = model.fit(ds, epochs=1, steps_per_epoch=total, verbose=0, callbacks=[Timer()])
    returned = time.perf_counter()
    # The window ends with the last step (a step's call returns once its ops ran: CPU
    # execution is synchronous), not with `fit`, whose teardown is no training.
    secs = step_ends[-1] - marks["warm"]
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
        "batch": args.batch,
        "mlp": args.mlp,
        "optimizer": args.optimizer,
        "seconds": secs,
        "warmup_seconds": marks["warm"] - t0,
        "fit_teardown_seconds": returned - step_ends[-1],
        "steps_per_s": args.steps / secs,
        "examples_per_s": args.steps * args.batch / secs,
        "final_loss": float(history.history["loss"][-1]),
        "table_keys": int(sum(sizes)),
        "cpu_seconds": time.process_time(),
        # CPU time of the process (all threads) over the timed steps: on a shared machine
        # it moves far less with the load than the wall time does.
        "cpu_ms_per_step": (marks["end_cpu"] - marks["warm_cpu"]) * 1e3 / args.steps,
        # Per-step wall times (ms): a run uniformly slow vs. one with stalls.
        "step_ms_percentiles": _percentiles_ms(np.diff(step_ends)),
    }
    print_result(result)


# ---------------------------------------------------------------------------------------
# Parent: alternate children, compare
# ---------------------------------------------------------------------------------------


def ns_per_id(runs, impl, rounds, ids_per_step):
    """The embedding's cost per id of `impl`, per round: its step time minus the step
    time of the free embedding (`ceiling`: the same model, pipeline and batch with fixed
    rows) of the same round, divided by the ids in a step (batch x 26), in nanoseconds.
    `mean_step` from the timed windows (seconds / steps), `median_step` from the p50
    step times, `cpu` from the process CPU time per timed step (all threads: less
    sensitive to other jobs on the machine than wall time, but it counts work two
    threads did at once twice); rounds where either child failed are left out."""
    out = {"mean_step": [], "median_step": [], "cpu": []}
    for r in range(rounds):
        got = {x["impl"]: x for x in runs if x.get("round") == r and "error" not in x}
        if impl not in got or "ceiling" not in got:
            continue
        a, c = got[impl], got["ceiling"]
        out["mean_step"].append((1 / a["steps_per_s"] - 1 / c["steps_per_s"]) * 1e9 / ids_per_step)
        out["median_step"].append((a["step_ms_percentiles"]["p50"] - c["step_ms_percentiles"]["p50"])
                                  * 1e6 / ids_per_step)
        if "cpu_ms_per_step" in a and "cpu_ms_per_step" in c:
            out["cpu"].append((a["cpu_ms_per_step"] - c["cpu_ms_per_step"]) * 1e6 / ids_per_step)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impls", default=None,
                   help="comma list of ours,ours-untracked,tfra,keras-vocab,keras-hashed,ceiling "
                        "(default: ours and the three Keras baselines, and tfra if installed); "
                        "ours-untracked: tables made with track_changes=False, to measure what "
                        "change tracking costs (docs/online_learning.md)")
    p.add_argument("--keras", default="auto", choices=["auto", "keras3", "tf_keras"],
                   help="which Keras the children use (auto: tf_keras when tfra runs, else "
                        "TF's default, Keras 3 from TF 2.16 on)")
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
    p.add_argument("--batch", type=int, default=BATCH, help="examples per step")
    p.add_argument("--mlp", default="64,32", help="hidden layer widths of the MLP")
    p.add_argument("--optimizer", default="adam", choices=OPTIMIZERS,
                   help="the inner optimizer (every implementation uses the same)")
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
    default = ["ours", *KERAS_BASELINES] + (["tfra"] if tfra else [])
    impls = args.impls.split(",") if args.impls else default
    unknown = sorted(set(impls) - {"ours", "ours-untracked", "tfra", *KERAS_BASELINES})
    if unknown:
        p.error(f"--impls: unknown {', '.join(unknown)}; expected a comma list of ours, "
                f"ours-untracked, tfra, {', '.join(KERAS_BASELINES)}")
    env = dict(os.environ)
    # TFRA's layers and optimizer need tf_keras: with TFRA in the run, every child uses it.
    legacy = args.keras == "tf_keras" or (args.keras == "auto" and "tfra" in impls)
    if "tfra" in impls and not legacy:
        p.error("--keras keras3: TFRA 0.8.1 runs only under tf_keras")
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    elif args.keras == "keras3":
        env["TF_USE_LEGACY_KERAS"] = "0"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    load_start = loadavg()
    runs = []
    for r in range(args.rounds):
        order = impls if r % 2 == 0 else list(reversed(impls))
        for impl in order:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", impl, "--layout", args.layout,
                   "--warmup", str(args.warmup), "--steps", str(args.steps), "--seed", str(args.seed),
                   "--distinct-batches", str(args.distinct_batches),
                   "--mlp", args.mlp, "--optimizer", args.optimizer, "--batch", str(args.batch),
                   "--threads", str(args.threads), "--inter-threads", str(args.inter_threads)]
            res, error = spawn_child(cmd, env)
            if res is None:
                runs.append({"impl": impl, "round": r, "error": error})
                continue
            res["round"] = r
            res["load_after"] = loadavg()
            runs.append(res)
            print(f"round {r} {impl:12s}: {res['examples_per_s']:9.0f} examples/s "
                  f"({res['steps_per_s']:.2f} steps/s, loss {res['final_loss']:.4f}, "
                  f"{res['table_keys']} keys, step ms p10/p50/p90 "
                  f"{'/'.join(str(v) for k, v in res['step_ms_percentiles'].items() if k != 'max')}, "
                  f"load {res['load_after']})", flush=True)

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

    for a, b, (key, median_key), label, target, digits in COMPARISONS:
        if a not in impls or b not in impls:
            continue
        ratios = per_round(a, b)
        summary[key] = ratios
        if ratios:
            med = median(ratios)
            summary[median_key] = med
            verdict = "" if target is None else (
                f" (target >= {target:g}): {'PASS' if med >= target else 'FAIL'}"
                f"; every round: {'PASS' if min(ratios) >= target else 'FAIL'}")
            print(f"{label} per round: {', '.join(f'{x:.{digits}f}' for x in ratios)}; "
                  f"median {med:.{digits}f}{verdict}")
    ids_per_step = args.batch * FEATURES
    for impl in impls:
        if impl == "ceiling" or "ceiling" not in impls:
            continue
        cost = ns_per_id(runs, impl, args.rounds, ids_per_step)
        if cost["mean_step"]:
            summary[f"ns_per_id_{impl}"] = cost
            print(f"{impl}: ns per id against the free embedding (ceiling) per round, "
                  f"mean step: {', '.join(f'{x:.1f}' for x in cost['mean_step'])}; median "
                  f"{median(cost['mean_step']):.1f}; median step (p50): "
                  f"{', '.join(f'{x:.1f}' for x in cost['median_step'])}; median "
                  f"{median(cost['median_step']):.1f}; CPU time: "
                  f"{', '.join(f'{x:.1f}' for x in cost['cpu'])}; median "
                  f"{median(cost['cpu']) or float('nan'):.1f}")
    for impl, s in summary.items():
        if isinstance(s, dict) and "examples_per_s" in s:
            print(f"{impl}: examples/s {', '.join(f'{x:.0f}' for x in s['examples_per_s'])}; median {s['median']:.0f}")
    out = args.out or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results",
        # The change-tracking comparison apart: report.py reads keras_train_*.json.
        f"{'change_tracking' if 'ours-untracked' in impls else 'keras_train'}_tf{tf.__version__}"
        f"_{args.layout}{'_steady' if args.steady else ''}"
        f"{'' if args.optimizer == 'adam' else '_' + args.optimizer}"
        f"{'' if args.mlp == '64,32' else '_mlp' + args.mlp.replace(',', '-')}"
        f"{'' if args.batch == BATCH else f'_batch{args.batch}'}.json")
    write_record(
        out,
        "keras_train",
        tf.__version__,
        load_start,
        legacy_keras=env.get("TF_USE_LEGACY_KERAS") == "1",
        layout=args.layout,
        regime="steady" if args.steady else "growing",
        distinct_batches=args.distinct_batches or args.warmup + args.steps,
        mlp=args.mlp,
        optimizer=args.optimizer,
        batch=args.batch,
        runs=runs,
        summary=summary,
    )


if __name__ == "__main__":
    main()
