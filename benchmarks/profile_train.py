"""Op-level profile of the `keras_train.py` training step (TF profiler, host plane).

    python benchmarks/profile_train.py [--impl ours|tfra] [--layout per-feature|shared]
        [--warmup 10] [--steps 10] [--top 40] [--steady] [--batch 4096]

Trains `--warmup` steps, then records `--steps` steps with `tf.profiler` and prints the
time per op type summed over the TF executor's threads (so on 2 threads the total can
exceed wall time), per step, with the op count per step.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras_train  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", default="ours")
    p.add_argument("--layout", default="per-feature")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--batch", type=int, default=keras_train.BATCH, help="examples per step")
    p.add_argument("--steady", action="store_true",
                   help="the profiled steps revisit the warm-up's batches (no new keys)")
    args = p.parse_args()

    import numpy as np
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    tf.config.threading.set_inter_op_parallelism_threads(1)
    total = args.warmup + args.steps
    ids, labels = keras_train.make_batches(args.warmup if args.steady else total, layout=args.layout,
                                           batch=args.batch)
    if args.layout == "shared":
        feats = ids
    else:
        feats = tuple(np.ascontiguousarray(ids[:, :, i : i + 1]) for i in range(keras_train.FEATURES))
    ds = keras_train.training_dataset(feats, labels, repeat=args.steady)
    model = keras_train.build_model(args.impl, args.layout)
    warm = ds.take(args.warmup)
    model.fit(warm, epochs=1, verbose=0)
    rest = ds.take(args.steps) if args.steady else ds.skip(args.warmup)
    logdir = tempfile.mkdtemp(prefix="prof_")
    tf.profiler.experimental.start(logdir)
    t0 = time.perf_counter()
    model.fit(rest, epochs=1, verbose=0)
    wall = time.perf_counter() - t0
    tf.profiler.experimental.stop()
    path = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0]
    space = xplane_pb2.XSpace()
    space.ParseFromString(open(path, "rb").read())
    by_type = collections.Counter()
    count = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        meta = plane.event_metadata
        for line in plane.lines:
            for ev in line.events:
                name = meta[ev.metadata_id].name
                # TF op events are "name:Type"; keep the type.
                if ":" not in name:
                    continue
                op_type = name.rsplit(":", 1)[1]
                if not op_type or " " in op_type:
                    continue
                by_type[op_type] += ev.duration_ps / 1e6  # microseconds
                count[op_type] += 1
    steps = args.steps
    print(f"{args.impl} {args.layout}: {steps} steps in {wall:.2f} s = {wall / steps * 1e3:.1f} ms/step")
    tot = sum(by_type.values())
    print(f"op time summed over threads: {tot / steps / 1e3:.1f} ms/step; ops/step {sum(count.values()) / steps:.0f}")
    for op, us in by_type.most_common(args.top):
        print(f"  {op:40s} {us / steps / 1e3:8.2f} ms/step  {count[op] / steps:6.0f} ops/step  {us / count[op]:8.1f} us/op")


if __name__ == "__main__":
    main()
