"""A server for tests/test_delta_serving.py: loads SavedModels exported with our ops
and keeps them current with de.serving.DeltaUpdater while threads serve them.

    python tests/delta_serving_worker.py WORKDIR

WORKDIR holds `keras_export` (Keras `model.export`), `saved_model`
(`tf.saved_model.save` with an `apply_deltas` signature), `rows` (a tf.Module whose
signature looks up a de.Variable of wide rows), the delta directories `deltas` (the
Keras model's) and `row_deltas`, and `ids.npy`. For each line "apply" read from
stdin it applies what is new (reader threads serving `rows` meanwhile) and prints a
JSON line: how many generations each model applied, the predictions of `ids.npy`,
and the rows the readers saw that were torn (a row of `rows` holds one value).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import numpy as np
import tensorflow as tf

import tensorflow_dynemb as de


def main(workdir: str) -> None:
    ids = tf.constant(np.load(os.path.join(workdir, "ids.npy")))
    exported = tf.saved_model.load(os.path.join(workdir, "keras_export"))
    saved = tf.saved_model.load(os.path.join(workdir, "saved_model"))
    rows = tf.saved_model.load(os.path.join(workdir, "rows"))
    deltas = os.path.join(workdir, "deltas")
    exported_updater = de.serving.DeltaUpdater(exported, deltas)
    rows_updater = de.serving.DeltaUpdater(rows, os.path.join(workdir, "row_deltas"))
    lookup = rows.signatures["serving_default"]
    row_keys = tf.range(2000, dtype=tf.int64)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "apply":
            break
        stop = threading.Event()
        torn, reads = [], [0]

        def read():
            while not stop.is_set():
                (values,) = lookup(keys=row_keys).values()
                values = values.numpy()
                torn.extend(np.nonzero((values != values[:, :1]).any(axis=1))[0].tolist())
                reads[0] += 1

        readers = [threading.Thread(target=read) for _ in range(3)]
        for reader in readers:
            reader.start()
        applied = {
            "rows": rows_updater.apply(),
            "keras_export": exported_updater.apply(),
            "saved_model": int(saved.signatures["apply_deltas"](
                directory=tf.constant(deltas))["applied"]),
        }
        stop.set()
        for reader in readers:
            reader.join()
        (served,) = saved.signatures["serving_default"](ids).values()
        print(json.dumps({
            "applied": applied,
            "keras_export": exported.serve(ids).numpy().tolist(),
            "saved_model": served.numpy().tolist(),
            "torn": len(torn),
            "reads": reads[0],
        }), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
