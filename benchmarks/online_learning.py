"""Online learning (docs/online_learning.md): what a delta costs to write, to apply to
a served copy, and on disk, against the full export it replaces.

    python benchmarks/online_learning.py [--keys 10000000] [--dim 16] [--changed 0.01,0.1]
        [--shards 1] [--out benchmarks/results/online_learning_<keys>.json]

A `de.Variable` of `--keys` int64 keys (dim `--dim`, float32) is written as a base by a
`de.DeltaExporter`; then, per fraction in `--changed`, that fraction of the keys is
rewritten (nine in ten existing keys overwritten, one in ten removed and replaced by a
new key) and the exporter writes a delta, which a `de.serving.DeltaUpdater` applies to
a served copy that loaded the base. Printed per fraction: write and apply seconds,
bytes, the size bound of issue 28 (1.1 x (rows x row bytes + removed x key bytes) plus
a header per file) and the ratios to the base's write, apply and bytes (the reference:
what a full export costs, measured in the same process). Files go to a temporary
directory on local disk, synced as the exporter syncs by default.

Then (unless `--no-tracking-cost`) the write path's cost of change tracking, in this
process: `--tracking-rounds` rounds, alternating a `de.HashTable` made with
`track_changes=True` and one with False, each round inserting `--tracking-keys` new
keys and then overwriting them, in batches of 4096 rows (a training step's size); the
ratio of the medians is the cost on the table writes of training. The end-to-end
training-throughput cost is measured by `benchmarks/keras_train.py --impls
ours,ours-untracked` (the same model with `track_changes=False` tables), in child
processes and so noisier on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import loadavg, write_record  # noqa: E402

HEADER_BYTES = 256  # a file's header, its block heads and footer, at most (table_io.h)


def directory_bytes(path, names=None):
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
               if names is None or n in names)


def generation_files(path, sequence):
    """The data files generation `sequence` of the newest base names, with their rows."""
    manifest = [n for n in os.listdir(path) if n.endswith("-%08d.dynemb-delta" % sequence)]
    files = {}
    with open(os.path.join(path, manifest[0])) as f:
        for line in f:
            fields = line.split()
            if fields[0] == "file":
                files[fields[4]] = (fields[2], int(fields[6]))
    return files


def tracking_cost(args):
    """Seconds per round of writes into tables with and without change tracking."""
    import numpy as np
    import tensorflow as tf

    import tensorflow_dynemb as de

    from _harness import median

    batch = 4096
    keys = np.arange(args.tracking_keys, dtype=np.int64) * 2654435761
    values = np.random.default_rng(1).standard_normal((batch, args.dim), dtype=np.float32)
    batches = [tf.constant(keys[b:b + batch]) for b in range(0, len(keys), batch)]
    rows = [tf.constant(values[:len(k)]) for k in batches]
    seconds = {True: [], False: []}
    for round_ in range(args.tracking_rounds):
        for track in ((True, False) if round_ % 2 == 0 else (False, True)):
            table = de.HashTable(tf.int64, tf.float32, [0.0] * args.dim, track_changes=track)
            t0 = time.perf_counter()
            for _ in range(2):  # new keys, then overwrites
                for k, v in zip(batches, rows):
                    table.insert(k, v)
            seconds[track].append(time.perf_counter() - t0)
            del table
    on, off = median(seconds[True]), median(seconds[False])
    print(f"change tracking, table writes ({2 * len(keys)} rows in batches of {batch}, "
          f"{args.tracking_rounds} rounds): on {on:.3f} s, off {off:.3f} s per round; "
          f"throughput on / off = {off / on:.3f} (per round: "
          f"{', '.join(f'{b / a:.3f}' for a, b in zip(seconds[True], seconds[False]))})",
          flush=True)
    return {"seconds_on": seconds[True], "seconds_off": seconds[False],
            "throughput_on_over_off": off / on}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--changed", default="0.01,0.1")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--batch", type=int, default=1 << 20)
    p.add_argument("--dir", default=None, help="where the files go (default: a temporary dir)")
    p.add_argument("--out", default=None)
    p.add_argument("--no-tracking-cost", action="store_true")
    p.add_argument("--tracking-keys", type=int, default=1 << 20)
    p.add_argument("--tracking-rounds", type=int, default=5)
    args = p.parse_args()

    import numpy as np
    import tensorflow as tf

    import tensorflow_dynemb as de

    load_start = loadavg()
    root = tempfile.mkdtemp(prefix="dynemb_online_", dir=args.dir)
    directory = os.path.join(root, "deltas")
    rng = np.random.default_rng(0)
    devices = ["/CPU:0"] * args.shards

    def variable():
        return de.Variable(tf.int64, tf.float32, dim=args.dim, devices=devices, name="emb")

    def upsert(var, keys):
        for b in range(0, len(keys), args.batch):
            k = keys[b:b + args.batch]
            var.upsert(k, rng.standard_normal((len(k), args.dim), dtype=np.float32))

    try:
        live = variable()
        keys = np.arange(args.keys, dtype=np.int64) * 7919 + 13
        upsert(live, keys)
        exporter = de.DeltaExporter(live, directory)
        t0 = time.perf_counter()
        exporter.write()
        base_write = time.perf_counter() - t0
        base_bytes = directory_bytes(directory)
        served = variable()
        updater = de.serving.DeltaUpdater(served, directory)
        t0 = time.perf_counter()
        updater.apply()
        base_apply = time.perf_counter() - t0
        row_bytes = 8 + 4 * args.dim
        print(f"{args.keys} keys, dim {args.dim}, {args.shards} shard(s): base written in "
              f"{base_write:.2f} s, applied in {base_apply:.2f} s, {base_bytes / 1e6:.1f} MB "
              f"({base_bytes / args.keys:.1f} B/key)", flush=True)
        results = []
        next_key = int(keys[-1]) + 1
        present = keys
        for fraction in [float(x) for x in args.changed.split(",")]:
            n = int(args.keys * fraction)
            chosen = rng.choice(len(present), n, replace=False)
            removed = present[chosen[: n // 10]]
            overwritten = present[chosen[n // 10:]]
            added = np.arange(next_key, next_key + len(removed), dtype=np.int64)
            next_key += len(removed)
            live.remove(removed)
            upsert(live, np.concatenate([overwritten, added]))
            present = np.concatenate([np.delete(present, chosen[: n // 10]), added])
            t0 = time.perf_counter()
            sequence = exporter.write()
            write = time.perf_counter() - t0
            files = generation_files(directory, sequence)
            nbytes = directory_bytes(directory, files)
            rows = sum(r for role, r in files.values() if role == "rows")
            gone = sum(r for role, r in files.values() if role == "removed")
            bound = 1.1 * (rows * row_bytes + gone * 8) + HEADER_BYTES * len(files)
            t0 = time.perf_counter()
            applied = updater.apply()
            apply = time.perf_counter() - t0
            assert applied == 1 and rows == n and gone == len(removed), (applied, rows, gone)
            result = {
                "changed": fraction, "rows": rows, "removed": gone, "write_s": write,
                "apply_s": apply, "bytes": nbytes, "bound_bytes": bound,
                "write_over_base": write / base_write, "apply_over_base": apply / base_apply,
                "bytes_over_base": nbytes / base_bytes, "bytes_over_bound": nbytes / bound,
            }
            results.append(result)
            print(f"{fraction:>5.0%} changed: delta written in {write:.3f} s "
                  f"({write / base_write:.3f} x the base), applied in {apply:.3f} s "
                  f"({apply / base_apply:.3f} x), {nbytes / 1e6:.2f} MB "
                  f"({nbytes / base_bytes:.3f} x the base; {nbytes / bound:.3f} x the bound: "
                  f"{'PASS' if nbytes <= bound else 'FAIL'})", flush=True)
        sample = rng.choice(present, min(100_000, len(present)), replace=False)
        same = np.array_equal(live.lookup(sample).numpy(), served.lookup(sample).numpy())
        print(f"served copy equals the live variable on {len(sample)} keys: {same}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    tracking = None if args.no_tracking_cost else tracking_cost(args)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"online_learning_{args.keys}.json")
    write_record(out, "online_learning", tf.__version__, load_start, keys=args.keys,
                 dim=args.dim, shards=args.shards, base_write_s=base_write,
                 base_apply_s=base_apply, base_bytes=base_bytes, deltas=results,
                 served_equals_live=bool(same), tracking_cost=tracking)


if __name__ == "__main__":
    main()
