#!/usr/bin/env python3
"""The embedding training step on the device (cc/core/gpu/embedding_step.h), timed.

    python benchmarks/gpu_train_step.py [--tables 10] [--rows 1680000] [--dim 128] \
        [--ids 105000] [--distinct 35000] [--steps 20] [--out OUT.json] [--quick]

Needs a CUDA GPU, CuPy and `tensorflow_dynemb._core_gpu` (built by tests/core_gpu_ext.py
from this checkout when nvcc is installed). TensorFlow is not needed.

The setting is NVIDIA dynamicemb's benchmark (NVIDIA/recsys-examples,
corelib/dynamicemb/benchmark), which reports one H100 training step at 2.19 ms: 10 tables
of 1.68M rows, dim 128, Adam, about 1.05M ids per step (350k distinct), i.e. ~480M ids/s;
FBGEMM's static table does it in 1.35 ms. Here every table holds all its 1.68M rows
beforehand (parameters and Adam slots), so a step finds every id; each table's batch is
`--ids` ids drawn uniformly from `--distinct` of its rows. A step is, for every table,
`forward_device` (dedup, find, gather; one host sync for the count of distinct ids) and
`backward_device` (segment sum, Adam on the slot table, write-back of the parameter
rows), with the gradients fixed; the figure is ids per second over `--steps` steps
between two synchronizations, best of 3 rounds after a warm-up step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

DYNAMICEMB_IDS_PER_S = 1.05e6 / 2.19e-3  # H100, their README
FBGEMM_IDS_PER_S = 1.05e6 / 1.35e-3


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              check=False, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


# Keras Adam's coefficients at step 1 (update_rules.h).
ADAM_COEFFICIENTS = (1e-3, 0.1, 0.001, 1e-7)


def build_tables(gpu, count, rows, dim, ids_n, distinct):
    """`count` (parameter table, Adam slot table, EmbeddingStep, ids, out, grads): each
    pair of tables holds its `rows` keys beforehand, and a step's `ids_n` ids are drawn
    uniformly from `distinct` of them. CuPy arrays; the step's work goes on CuPy's
    current stream, ordered with the arrays it reads."""
    import cupy as cp  # noqa: PLC0415 (the device machine has it)

    rng = cp.random.RandomState(1)
    stream = cp.cuda.get_current_stream().ptr
    tables = []
    for t in range(count):
        params = gpu.Table("int64", "float32", dim, init_capacity=rows)
        slots = gpu.Table("int64", "float32", 2 * dim, init_capacity=rows)
        keys = cp.arange(rows, dtype=cp.int64) * 2654435761 + t
        values = rng.standard_normal((rows, dim), dtype=cp.float32) * 0.05
        state = cp.zeros((rows, 2 * dim), cp.float32)
        params.insert_device(keys.data.ptr, rows, values.data.ptr, stream=stream)
        slots.insert_device(keys.data.ptr, rows, state.data.ptr, stream=stream)
        cp.cuda.get_current_stream().synchronize()
        del values, state
        hot = keys[rng.permutation(rows)[:distinct]]
        ids = hot[rng.randint(0, distinct, size=ids_n)]
        step = gpu.EmbeddingStep(params, slots, "keras_adam")
        out = cp.empty((ids_n, dim), cp.float32)
        grads = rng.standard_normal((ids_n, dim), dtype=cp.float32) * 0.01
        tables.append((params, slots, step, ids, out, grads))
    cp.get_default_memory_pool().free_all_blocks()
    return tables


def run_step(tables, ids_n):
    """One training step over every table of build_tables (queued, not synchronized)."""
    import cupy as cp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    stream = cp.cuda.get_current_stream().ptr
    coefficients = np.array(ADAM_COEFFICIENTS, np.float32)
    for _, _, step, ids, out, grads in tables:
        step.forward_device(ids.data.ptr, ids_n, out.data.ptr, stream=stream)
        step.backward_device(grads.data.ptr, coefficients, stream=stream)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--rows", type=int, default=1_680_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--ids", type=int, default=105_000, help="ids per table and step")
    parser.add_argument("--distinct", type=int, default=35_000,
                        help="rows per table that a step's ids are drawn from")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="3 tables, 5 steps")
    args = parser.parse_args()
    if args.quick:
        args.tables, args.steps = 3, 5

    import cupy as cp  # noqa: PLC0415 (the device machine has it)

    import core_gpu_ext  # noqa: PLC0415
    gpu = core_gpu_ext.load_core_gpu_or_exit("gpu_train_step.py")

    t0 = time.perf_counter()
    tables = build_tables(gpu, args.tables, args.rows, args.dim, args.ids, args.distinct)
    fill_s = time.perf_counter() - t0

    def one_step():
        run_step(tables, args.ids)

    def sync():
        cp.cuda.get_current_stream().synchronize()

    one_step()
    sync()
    distinct = sum(step.num_unique for _, _, step, *_ in tables)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            one_step()
        sync()
        best = min(best, (time.perf_counter() - t0) / args.steps)
    ids_per_step = args.tables * args.ids
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "gpu": gpu_name(),
        "args": vars(args),
        "fill_s": fill_s,
        "ids_per_step": ids_per_step,
        "distinct_per_step": distinct,
        "step_ms": best * 1e3,
        "ids_per_s": ids_per_step / best,
        "vs_dynamicemb_h100": ids_per_step / best / DYNAMICEMB_IDS_PER_S,
        "vs_fbgemm_h100": ids_per_step / best / FBGEMM_IDS_PER_S,
        "sizes": [int(p.size()) for p, *_ in tables],
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
