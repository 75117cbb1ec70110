#!/usr/bin/env python3
"""A fixed GPU-core workload to run under Nsight Compute, which times each kernel:

    ncu --metrics gpu__time_duration.sum --print-summary per-kernel \
        python3 benchmarks/gpu_kernel_times.py

Per dim (8 and 64): a table of int64 keys filled with 4M keys in one call, then two
insert-or-assign calls and two finds of 1M of those keys. The summary splits an insert
into its kernels (the radix sort that groups duplicate keys, ApplyWritesKernel, ...);
docs/benchmarks.md ("GPU core") quotes it. ncu locks the clocks, so its times are longer
than benchmarks/gpu_table_ops.py's. Needs a GPU, CuPy and the module `_core_gpu` (built
by tests/core_gpu_ext.py when missing); TensorFlow is not needed.
"""

from __future__ import annotations

import os
import sys

import cupy as cp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
import core_gpu_ext  # noqa: E402

GOLDEN = 0x9E3779B97F4A7C15  # odd: i -> i * GOLDEN spreads ids over 64 bits, distinct


def main():
    module = core_gpu_ext.load_core_gpu()
    stored, batch = 4 * 2**20, 2**20
    for dim in (8, 64):
        table = module.Table("int64", "float32", dim, init_capacity=3 * stored)
        keys = (cp.arange(stored, dtype=cp.uint64) * cp.uint64(GOLDEN)).view(cp.int64)
        values = cp.random.standard_normal((stored, dim), dtype=cp.float32)
        table.insert_device(keys.data.ptr, stored, values.data.ptr)
        present = keys[cp.random.permutation(stored)[:batch]].copy()
        rows = values[:batch].copy()
        out = cp.empty((batch, dim), cp.float32)
        default = cp.zeros(dim, cp.float32)
        cp.cuda.Device().synchronize()
        for _ in range(2):
            table.insert_device(present.data.ptr, batch, rows.data.ptr)
        for _ in range(2):
            table.find_device(present.data.ptr, batch, out.data.ptr, default.data.ptr)
        cp.cuda.Device().synchronize()
        del table
    print("done")


if __name__ == "__main__":
    main()
