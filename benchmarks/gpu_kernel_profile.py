#!/usr/bin/env python3
"""Where the GPU core's time goes: per-kernel device time of one operation, from
PyTorch's profiler (CUPTI sees every kernel in the process, ours included).

    python benchmarks/gpu_kernel_profile.py [--out OUT.json] [--quick]
    ncu --metrics gpu__time_duration.sum --print-summary per-kernel \
        python3 benchmarks/gpu_kernel_profile.py --plain     # the same calls, timed by ncu

Needs a CUDA GPU, PyTorch and `tensorflow_dynemb._core_gpu` (built by
tests/core_gpu_ext.py). Profiled, each after a warm-up call, on a table of 64M slots
filled to load 0.5 (HKV's benchmark setting, as benchmarks/gpu_table_ops.py's "HKV way"):

* insert (insert-or-assign) of 1M keys, 60% and 100% present, dims 8 and 64;
* assign and find of 1M keys, 60% present;
* the same at dim 64 with half the value rows in mapped host memory
  (`max_hbm_for_values`, HKV's hybrid mode), beside a plain kernel's gather and scatter
  of 1M random rows in mapped host memory: the PCIe ceiling for those rows;
* one embedding training step (benchmarks/gpu_train_step.py's setting, 2 tables
  instead of 10: the per-table work is the same).

For each: wall time of the call (synchronized, but under the profiler, whose own cost
dominates it: ~2.5 ms for a 0.14 ms find; rates come from benchmarks/gpu_table_ops.py),
the device time of each kernel and copy,
and how many host synchronizations the call made (cudaStreamSynchronize and
cudaMemcpy* calls, from the CPU side of the trace). This is the "profile first" step of
docs/benchmarks.md's prediction-and-outcome habit for issue 36.

--plain runs the same calls without PyTorch's profiler, for Nsight Compute (which
cannot share CUPTI with it; ncu locks the clocks, so its times are longer). ncu reads
hardware counters on some device machines and not others (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

CAPACITY = 1 << 26
BATCH = 1 << 20


PLAIN = False  # --plain: no profiler (under ncu)


def profile(torch, name, fn, results):
    """Runs fn once untimed, then once under the profiler; records the breakdown."""
    fn()
    torch.cuda.synchronize()
    if PLAIN:
        fn()
        torch.cuda.synchronize()
        return
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    device = defaultdict(float)
    host_syncs = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            device[e.name[:90]] += getattr(e, "device_time_total", None) or e.cuda_time_total
        elif e.name in ("cudaStreamSynchronize", "cudaMemcpy", "cudaMemcpyAsync",
                        "cudaDeviceSynchronize", "cudaEventSynchronize"):
            host_syncs += 1
    kernels = sorted(device.items(), key=lambda kv: -kv[1])
    total = sum(device.values())
    results.append({"what": name, "wall_us": wall * 1e6, "device_us": total,
                    "host_sync_calls": host_syncs,
                    "kernels_us": [[k, round(v, 1)] for k, v in kernels[:12]]})
    print(f"\n{name}: wall {wall * 1e6:.0f} us, device {total:.0f} us, "
          f"sync/copy calls {host_syncs}")
    for k, v in kernels[:12]:
        print(f"  {v:9.1f} us  {k}")


def table_section(torch, gpu, dim, results, quick, hbm_fraction=1.0):
    """Inserts, assigns and finds of 1M keys on a table of CAPACITY slots at load 0.5;
    hbm_fraction < 1: that fraction of the value rows in device memory, the rest in
    mapped host memory (max_hbm_for_values)."""
    from gpu_table_ops import TorchArrays  # noqa: PLC0415 (benchmarks/, on sys.path)

    keys_of = TorchArrays().keys  # distinct ids -> keys spread over 64 bits
    stream = torch.cuda.current_stream().cuda_stream
    kwargs = {}
    label = f"dim {dim}"
    if hbm_fraction < 1.0:
        kwargs["max_hbm_for_values"] = int(CAPACITY * hbm_fraction) * dim * 4
        label += f", {int(hbm_fraction * 100)}% of rows in HBM,"
    table = gpu.Table("int64", "float32", dim, init_capacity=CAPACITY * 3 // 4, **kwargs)
    stored = CAPACITY // 2 if not quick else CAPACITY // 16
    values = torch.randn((BATCH, dim), device="cuda")
    fill = 1 << 22
    fill_values = torch.zeros((fill, dim), device="cuda")
    for b in range(0, stored, fill):
        keys = keys_of(torch.arange(b, b + fill, device="cuda"))
        table.insert_device(keys.data_ptr(), fill, fill_values.data_ptr(), stream=stream)
    torch.cuda.synchronize()
    assert table.size() == stored, (table.size(), stored)
    del fill_values
    out = torch.empty((BATCH, dim), device="cuda")
    default = torch.zeros(dim, device="cuda")
    next_new = [1 << 40]

    def batch(hit):
        present = int(BATCH * hit)
        ids = [torch.randperm(stored, device="cuda")[:present]]
        if BATCH - present:
            ids.append(torch.arange(next_new[0], next_new[0] + BATCH - present, device="cuda"))
            next_new[0] += BATCH - present
        return keys_of(torch.cat(ids))

    for hit in (0.6, 1.0):
        prepared = [batch(hit), batch(hit)]  # one for the warm-up call, one profiled
        profile(torch, f"{label} insert {int(hit * 100)}% present",
                lambda: table.insert_device(prepared.pop().data_ptr(), BATCH,
                                            values.data_ptr(), stream=stream), results)
    for api in ("assign", "find"):
        prepared = [batch(0.6), batch(0.6)]
        if api == "assign":
            call = lambda: table.assign_device(prepared.pop().data_ptr(), BATCH,  # noqa: E731
                                               values.data_ptr(), stream=stream)
        else:
            call = lambda: table.find_device(prepared.pop().data_ptr(), BATCH,  # noqa: E731
                                             out.data_ptr(), default.data_ptr(), stream=stream)
        profile(torch, f"{label} {api} 60% present", call, results)


MAPPED_ROWS_KERNELS = r"""
extern "C" __global__ void gather(const float4* rows, const long long* idx, float4* out,
                                  long long n, int units) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n * units) out[i] = rows[idx[i / units] * units + i % units];
}
extern "C" __global__ void scatter(float4* rows, const long long* idx, const float4* in,
                                   long long n, int units) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n * units) rows[idx[i / units] * units + i % units] = in[i];
}
"""


def mapped_rows_section(results, dim=64, rows=1 << 23):
    """The ceiling for the hybrid table's host rows: 1M random rows of `dim` floats
    read from (gather) and written to (scatter) mapped pinned host memory by a plain
    kernel, one 16-byte unit per thread, a row's units by consecutive threads (so each
    row moves as whole lines). Compare with the hybrid table's find / insert above."""
    import cupy as cp  # noqa: PLC0415 (the device machine has it)

    rt = cp.cuda.runtime
    nbytes = rows * dim * 4
    host = rt.hostAlloc(nbytes, rt.hostAllocMapped | rt.hostAllocPortable)
    try:
        # Unified addressing: a mapped allocation's device address is its host address.
        device_view = cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(host, nbytes, None), 0)
        table = cp.ndarray((rows, dim), cp.float32, device_view)
        module = cp.RawModule(code=MAPPED_ROWS_KERNELS)
        units, n = dim // 4, BATCH
        idx = cp.random.randint(0, rows, size=n, dtype=cp.int64)
        buf = cp.zeros((n, dim), cp.float32)
        grid = ((n * units + 255) // 256,)
        for name in ("gather", "scatter"):
            kernel = module.get_function(name)
            args = (table, idx, buf, cp.int64(n), cp.int32(units))
            kernel(grid, (256,), args)  # warm-up
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            kernel(grid, (256,), args)
            end.record()
            end.synchronize()
            us = cp.cuda.get_elapsed_time(start, end) * 1e3
            gbs = n * dim * 4 / us / 1e3
            results.append({"what": f"mapped host rows, {name}", "device_us": us,
                            "keys_per_s": n / us * 1e6, "gbytes_per_s": gbs})
            print(f"\nmapped host rows, {name} of 1M random rows of {dim} floats: {us:.0f} us, "
                  f"{n / us / 1e3:.2f} G rows/s, {gbs:.1f} GB/s")
    finally:
        rt.freeHost(host)


def step_section(torch, gpu, results, quick):
    """gpu_train_step.py's step (its tables and arrays), over 2 tables."""
    import gpu_train_step  # noqa: PLC0415 (benchmarks/, on sys.path)

    ids_n = 105_000
    tables = gpu_train_step.build_tables(gpu, 2, 200_000 if quick else 1_680_000, 128, ids_n,
                                         35_000)
    profile(torch, "training step, 2 tables (dim 128, 105k ids, 35k distinct each)",
            lambda: gpu_train_step.run_step(tables, ids_n), results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="smaller tables")
    parser.add_argument("--plain", action="store_true",
                        help="no profiler: the same calls, for ncu to time")
    args = parser.parse_args()
    global PLAIN
    PLAIN = args.plain
    import torch  # noqa: PLC0415 (the device machine has it)

    import core_gpu_ext  # noqa: PLC0415
    gpu = core_gpu_ext.load_core_gpu_or_exit("gpu_kernel_profile.py")
    results = []
    try:
        for dim in (8, 64):
            table_section(torch, gpu, dim, results, args.quick)
            torch.cuda.empty_cache()  # the section's table is gone: give its memory back
        step_section(torch, gpu, results, args.quick)
        torch.cuda.empty_cache()
        table_section(torch, gpu, 64, results, args.quick, hbm_fraction=0.5)
        torch.cuda.empty_cache()
        if not PLAIN:
            mapped_rows_section(results)
    finally:  # what was measured is written even when a later section fails
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(0), "results": results}, f,
                          indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
