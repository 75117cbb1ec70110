"""A trainer that writes a delta after every step, until it is killed
(tests/test_delta_export.py kills it with SIGKILL at random moments).

    python tests/delta_kill_worker.py DIRECTORY FIRST_GENERATION KEYS

At generation g the 2-shard variable "killed" holds the keys k < KEYS with
(k + g) % 5 != 0, key k with the row [g', k] where g' is the last generation <= g
with g' = k (mod 4); the dense variable "step" holds g. Each step removes a fifth of
the keys, adds a fifth back and rewrites a quarter, then writes; it prints
"wrote <sequence> <g>" after each write returns.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

import tensorflow_dynemb as de


def rows_at(g, num_keys):
    k = np.arange(num_keys, dtype=np.int64)
    present = (k + g) % 5 != 0
    last = g - ((g - k) % 4)
    return k, present, np.stack([last, k], axis=1).astype(np.float32)


def main(directory: str, first: int, num_keys: int) -> None:
    module = tf.Module()
    module.emb = de.Variable(tf.int64, tf.float32, dim=2, devices=["/CPU:0"] * 2, name="killed")
    module.step = tf.Variable(float(first))
    keys, present, values = rows_at(first, num_keys)
    module.emb.upsert(keys[present], values[present])
    exporter = de.DeltaExporter(module, directory)
    for g in range(first, first + 1_000_000):
        if g > first:
            _, was, old = rows_at(g - 1, num_keys)
            changed = present & (~was | (old != values).any(axis=1))
            module.emb.remove(keys[was & ~present])
            module.emb.upsert(keys[changed], values[changed])
            module.step.assign(float(g))
        sequence = exporter.write()
        print(f"wrote {sequence} {g}", flush=True)
        keys, present, values = rows_at(g + 1, num_keys)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
