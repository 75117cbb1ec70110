"""Cost of one `keras_train.py` training step of ours: wall time, CPU time and page faults.

    python benchmarks/step_cost.py [--layout per-feature|shared] [--steady]
        [--warmup 40] [--steps 40] [--optimizer adam|...] [--unfused] [--per-step]

Trains `keras_train.py`'s model (our layers, Adam or `--optimizer`, batch 4096) with `model.fit` in this
process and reads, after each step, the clock and `getrusage` (CPU seconds, system
seconds, minor page faults of the whole process). Prints the means over the steps after
`--warmup`. Growing regime (default): every batch is new, ~26k new keys per step;
`--steady`: the batches cycle over 20, so after the first 20 steps no key is new.
A diagnostic, not a target: page faults per step say how much of a step is first
touches of new memory, which cost 3-12 us each on the development VM. Of those, the
huge-page faults (the system's `thp_fault_alloc` count in /proc/vmstat, so other
processes' count too) are the large tables' new 2 MiB pages, which a VM whose host
takes freed memory back makes cost 4-5 ms each (`page_faults.py`; docs/benchmarks.md,
"Fresh memory on this VM"). `--per-step` also prints each timed step's figures, which
shows when the faults come: a growing table's shards take new row chunks together, so
its huge-page faults arrive in bursts a few steps long.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras_train  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", default="per-feature", choices=["per-feature", "shared"])
    p.add_argument("--steady", action="store_true")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--optimizer", default="adam", choices=keras_train.OPTIMIZERS)
    p.add_argument("--unfused", action="store_true",
                   help="take the unfused optimizer step (slot lookup, TF ops, upsert) even "
                        "where a fused one exists: the A/B of the fused rules")
    p.add_argument("--per-step", action="store_true",
                   help="print every timed step's wall, CPU and system ms and its page faults")
    args = p.parse_args()
    if args.unfused:
        from tensorflow_dynemb.training.applier import SparseApplier

        SparseApplier._fused_step = lambda self, state, dtype, values: None

    import numpy as np
    import tensorflow as tf

    total = args.warmup + args.steps
    ids, labels = keras_train.make_batches(20 if args.steady else total, layout=args.layout)
    if args.layout == "shared":
        features = ids
    else:
        features = tuple(np.ascontiguousarray(ids[:, :, i : i + 1]) for i in range(keras_train.FEATURES))
    ds = keras_train.training_dataset(features, labels)
    model = keras_train.build_model("ours", args.layout, optimizer=args.optimizer)
    marks = []

    class Probe(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            usage = resource.getrusage(resource.RUSAGE_SELF)
            marks.append((time.perf_counter(), usage.ru_utime + usage.ru_stime, usage.ru_stime,
                          usage.ru_minflt, huge_page_faults()))

    model.fit(ds, steps_per_epoch=total, epochs=1, verbose=0, callbacks=[Probe()])
    if args.per_step:
        for step in range(args.warmup, len(marks)):
            wall, cpu, system, faults, huge = (b - a for a, b in zip(marks[step - 1], marks[step]))
            print(f"step {step}: {wall * 1e3:.1f} ms, CPU {cpu * 1e3:.1f} ms (system {system * 1e3:.1f}), "
                  f"{faults} page faults, {huge} huge")
    first, last = marks[args.warmup - 1], marks[-1]
    steps = len(marks) - args.warmup
    wall, cpu, system, faults, huge = ((b - a) / steps for a, b in zip(first, last))
    regime = "steady" if args.steady else "growing"
    print(f"{args.layout} {regime}, {args.optimizer}{' unfused' if args.unfused else ''}, TF {tf.__version__} ({'tf_keras' if os.environ.get('TF_USE_LEGACY_KERAS') == '1' else 'Keras 3'}): "
          f"{wall * 1e3:.1f} ms/step, CPU {cpu * 1e3:.1f} ms/step (system {system * 1e3:.1f}), "
          f"{faults:.0f} page faults/step, {huge:.1f} of them huge pages")


def huge_page_faults() -> int:
    """The system's count of huge pages allocated at a fault so far (0 where the kernel
    does not say)."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == "thp_fault_alloc":
                    return int(value)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    main()
