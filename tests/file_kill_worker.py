"""Saves a 3-shard de.Variable to a directory again and again, until it is killed
(tests/test_file_integrity.py kills it with SIGKILL at random moments).

    python tests/file_kill_worker.py DIRECTORY FIRST_GENERATION KEYS

Generation g holds KEYS keys, key k with the row [g, k, g, -k]: a load that mixed
two saves (or two shards of different saves) shows rows of two generations. Prints
"saved <g>" after each save returns.
"""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf

import tensorflow_dynemb as de


def main(directory: str, first: int, num_keys: int) -> None:
    var = de.Variable(tf.int64, tf.float32, dim=4, devices=["/CPU:0"] * 3, name="killed")
    keys = tf.range(num_keys, dtype=tf.int64)
    k = tf.cast(keys, tf.float32)
    for g in range(first, first + 1_000_000):
        gen = tf.fill([num_keys], float(g))
        var.upsert(keys, tf.stack([gen, k, gen, -k], axis=1))
        var.save_to_file_system(directory, chunk_rows=4096)
        print(f"saved {g}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
