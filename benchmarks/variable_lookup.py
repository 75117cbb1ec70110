#!/usr/bin/env python3
"""What sharding costs: `de.Variable.lookup` / `upsert` beside its own table and `tf.gather`.

    python benchmarks/variable_lookup.py [--keys 1048576] [--dims 8,64] [--batch 65536] \
        [--shards 1,2,4] [--repeats 3]

For each dim, with `--keys` random int64 ids already stored, it prints the keys/s of
lookup (shuffled present keys) and upsert (present keys) through

* `de.HashTable` directly (no routing),
* `de.Variable` with 1, 2, 4 shards (all on /CPU:0: the cost of partitioning with
  `default_partition_fn`, `tf.dynamic_partition` and `tf.dynamic_stitch`, not of
  extra devices),
* `de.embedding_lookup` on the 1-shard variable, and `tf.gather` from a dense
  `[keys, dim]` `tf.Variable` (the lookup reference),

each as a ratio to the table. Every op runs in a `tf.function` per batch; figures are
the best of `--repeats` passes after a warm-up pass (same method as table_ops.py,
whose helpers it uses).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table_ops import bench_gather, random_keys, split, timed_pass  # noqa: E402


def best_rate(fn, batches, n: int, repeats: int) -> float:
    timed_pass(fn, batches)  # warm-up (and trace)
    return n / min(timed_pass(fn, batches)["s"] for _ in range(repeats))


def bench_dim(tf, de, dim: int, args) -> dict:
    keys = random_keys(args.keys, seed=dim)
    values = np.random.default_rng(dim).standard_normal((args.keys, dim), dtype=np.float32)
    key_batches = [tf.constant(k) for k in split(keys, args.batch)]
    value_batches = [tf.constant(v) for v in split(values, args.batch)]
    queries = [(tf.constant(q),) for q in split(np.random.default_rng(1).permutation(keys), args.batch)]
    upserts = list(zip(key_batches, value_batches))
    key_spec = tf.TensorSpec([None], tf.int64)
    value_spec = tf.TensorSpec([None, dim], tf.float32)
    results = {}

    def measure(name, lookup, upsert):
        def upsert_only(k, v):
            upsert(k, v)  # the op, not returned: a tf.function returns tensors only

        upsert_fn = tf.function(upsert_only, input_signature=[key_spec, value_spec])
        lookup_fn = tf.function(lookup, input_signature=[key_spec])
        for k, v in upserts:
            upsert_fn(k, v)
        got = lookup_fn(key_batches[-1]).numpy()
        if not np.array_equal(got, value_batches[-1].numpy()):
            raise RuntimeError(f"{name}: lookup returned wrong values")
        results[name] = {
            "lookup": best_rate(lookup_fn, queries, args.keys, args.repeats),
            "upsert": best_rate(upsert_fn, upserts, args.keys, args.repeats),
        }

    table = de.HashTable(tf.int64, tf.float32, [0.0] * dim)
    measure("HashTable", table.lookup, table.insert)
    del table
    for shards in args.shards:
        var = de.Variable(tf.int64, tf.float32, dim=dim, devices=["/CPU:0"] * shards)
        measure(f"Variable x{shards}", var.lookup, var.upsert)
        if shards == 1:
            results["embedding_lookup x1"] = {
                "lookup": best_rate(
                    tf.function(lambda ids: de.embedding_lookup(var, ids), input_signature=[key_spec]),
                    queries, args.keys, args.repeats,
                )
            }
        del var
    results["tf.gather"] = {
        "lookup": bench_gather(tf, args.keys, dim, args.batch, args.repeats, seed=dim)["lookup"]
    }
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1 << 20)
    parser.add_argument("--dims", default="8,64")
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    args.shards = [int(s) for s in args.shards.split(",")]

    import tensorflow as tf
    import tensorflow_dynemb as de

    print(f"TF {tf.__version__}, {args.keys} keys, batches of {args.batch}")
    for dim in [int(d) for d in args.dims.split(",")]:
        results = bench_dim(tf, de, dim, args)
        base = results["HashTable"]
        print(f"\ndim {dim}: M keys/s (ratio to HashTable)")
        for name, rates in results.items():
            cells = [
                f"{op} {rate / 1e6:6.2f} ({rate / base[op]:.2f}x)" for op, rate in rates.items()
            ]
            print(f"  {name:22s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
