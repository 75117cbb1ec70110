#!/usr/bin/env python3
"""Throughput of the GPU core table (cc/core/gpu) on device-resident batches.

    python benchmarks/gpu_table_ops.py [--capacity 67108864] [--load-factor 0.5] \
        [--batch 1048576] [--dims 8,64] [--repeats 20] [--fill-batch 4194304] \
        [--hkv-load-factors 0.5,0.75] [--hkv-hit-rates 0.6,1.0] [--hybrid 0.1,0.5] \
        [--sections ours,hkv] [--quick] [--dry-run] \
        [--out benchmarks/results/gpu_table_ops.json]

Needs a CUDA GPU, the module `tensorflow_dynemb._core_gpu` (built with `DYNEMB_CUDA=1`,
or by tests/core_gpu_ext.py from this checkout when nvcc is installed) and CuPy or
PyTorch for device arrays. TensorFlow is not needed.

The setting is issue 8's (after HKV's benchmark): int64 keys, float32 values of dim 8
and 64, a table of `--capacity` slots (64M) filled to `--load-factor` (0.5), batches of
`--batch` keys (1M) already on the device. Per dim it measures keys/s of

* find: batches of keys present in the table (random, distinct within a batch);
* insert_or_assign, existing keys: the same batches written again (assign);
* insert_or_assign, new keys: batches of keys not in the table (a few batches, so the
  load factor stays near the target).

Each call goes through `Table.find_device` / `Table.insert_device` (raw device addresses,
no copies) on the array library's current stream (`stream=`), so that a key buffer the
library frees and hands out again is not read by a write still queued; a figure is the
number of keys over the wall time of `--repeats` calls between two synchronizations,
best of 3 passes after a warm-up call. Insert calls include what the GPU table does per
write batch (cc/core/gpu/gpu_table.h): a BatchSet of the distinct keys, and a host
synchronization only when the table may have to grow.

Fill: the table is filled with `--fill-batch` keys (4M) per insert_device call, from one
random value buffer, after a warm-up of the array library's kernels and of the table's on a
small table; the fill rate in the results excludes those one-time costs. (Before, dim 8's
fill, the first thing timed, recorded 0.07e9 keys/s against 0.79e9 at dim 64, which came
second: 0.46 s for 32M keys, where 32 inserts of 1M new keys take ~0.04 s at the measured
~0.9e9 keys/s. The ~0.4 s excess is, by all appearances, one-time work landing in the first
fill: CuPy compiling its first kernels (key generation, random rows) and the module's
kernels loading lazily -- which the warm-up now takes out of the timing.)

Second section, "hkv" (HKV's way of measuring, benchmark/merlin_hashtable_benchmark.cc.cu
`test_one_api`, as run beside ours by benchmarks/hkv/run_hkv.sh): one table per dim of
`--capacity` slots, filled to each of `--hkv-load-factors` (0.50, 0.75) in turn; per
measurement a warm-up call, then ONE call of `--batch` keys timed (host clock around the
call and a device synchronization), twice, best of the two (HKV's test_main takes the
max of two calls). Keys of a timed call: the first `hit_rate` share present (a random
sample of the stored keys), the rest absent (keys never inserted), as HKV's
create_keys_for_hitrate lays them out. Operations:

* find with 60% (HKV's default) and 100% of the keys present;
* insert_or_assign with 60% and 100% present (the absent 40% are new keys; each of the
  two timed calls brings its own, so both insert 40% new keys -- unlike HKV's second
  call, which meets the keys its first call inserted);
* assign (`Table.assign_device`: update present keys only) with 60% and 100% present,
  "missing" where the module has no assign_device;
* hybrid: find and insert_or_assign at dim 64, load 0.5, with `max_hbm_for_values` set so
  that `--hybrid` (10%, 50%) of the slot rows are in device memory and the rest in mapped
  pinned host memory (gpu_table.h: the first max_hbm_for_values / row-bytes slots).

Our table's load limit is 3/4 of its slots (it rehashes into twice the slots beyond), so
at load 0.75 the insert calls that bring new keys run first, from a fill short by the new
keys they bring, and the table is then topped up to the exact load for the others; every
result records the load before its call (`load_factor_actual`).

Every result carries the card, driver and CUDA versions (`device`).

Targets (issue 8, H200): find >= 3.0e9 keys/s, insert_or_assign >= 1.5e9 keys/s, at dim
8 and 64. HKV's A100 figures: find 2.47e9 / 1.98e9, insert_or_assign 1.09e9 / 0.83e9
keys/s at dim 8 / 64.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

TARGETS = {"find": 3.0e9, "insert_or_assign (existing keys)": 1.5e9}
GOLDEN = 0x9E3779B97F4A7C15  # odd: i -> i * GOLDEN is a bijection on 64-bit ids


class CupyArrays:
    name = "cupy"

    def __init__(self):
        import cupy  # noqa: PLC0415 (optional)
        self.cp = cupy

    def keys(self, ids):
        """Distinct 64-bit keys for distinct ids (spread over the whole range)."""
        cp = self.cp
        return (cp.asarray(ids, dtype=cp.uint64) * cp.uint64(GOLDEN)).view(cp.int64)

    def arange(self, start, n):
        return self.cp.arange(start, start + n, dtype=self.cp.uint64)

    def permutation(self, n, seed):
        return self.cp.random.RandomState(seed).permutation(n).astype(self.cp.uint64)

    def rows(self, n, dim):
        return self.cp.random.standard_normal((n, dim), dtype=self.cp.float32)

    def empty_rows(self, n, dim):
        return self.cp.empty((n, dim), self.cp.float32)

    def zeros_row(self, dim):
        return self.cp.zeros(dim, self.cp.float32)

    def flags(self, n):
        return self.cp.zeros(n, self.cp.bool_)

    def cat(self, a, b):
        return self.cp.concatenate([a, b])

    @staticmethod
    def ptr(a):
        return a.data.ptr

    def stream(self):
        """The current stream, for the table's *_device calls (`stream=`): they are then
        ordered with this library's kernels and its reuse of freed memory."""
        return self.cp.cuda.get_current_stream().ptr

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def release(self):
        self.cp.get_default_memory_pool().free_all_blocks()

    def device_info(self):
        rt = self.cp.cuda.runtime
        props = rt.getDeviceProperties(self.cp.cuda.Device().id)
        name = props["name"]
        return {"name": name.decode() if isinstance(name, bytes) else str(name),
                "cuda_runtime": rt.runtimeGetVersion(),
                "cuda_driver_api": rt.driverGetVersion(),
                "memory_bytes": int(props["totalGlobalMem"]),
                "cupy": self.cp.__version__}


class TorchArrays:
    name = "torch"

    def __init__(self):
        import torch  # noqa: PLC0415 (optional)
        self.torch = torch

    def keys(self, ids):
        # int64 multiplication wraps like uint64, so the bijection holds.
        return ids.to(self.torch.int64) * self.torch.tensor(GOLDEN - (1 << 64), device="cuda")

    def arange(self, start, n):
        return self.torch.arange(start, start + n, dtype=self.torch.int64, device="cuda")

    def permutation(self, n, seed):
        g = self.torch.Generator(device="cuda")
        g.manual_seed(seed)
        return self.torch.randperm(n, generator=g, device="cuda")

    def rows(self, n, dim):
        return self.torch.randn((n, dim), dtype=self.torch.float32, device="cuda")

    def empty_rows(self, n, dim):
        return self.torch.empty((n, dim), dtype=self.torch.float32, device="cuda")

    def zeros_row(self, dim):
        return self.torch.zeros(dim, dtype=self.torch.float32, device="cuda")

    def flags(self, n):
        return self.torch.zeros(n, dtype=self.torch.bool, device="cuda")

    def cat(self, a, b):
        return self.torch.cat([a, b])

    @staticmethod
    def ptr(a):
        return a.data_ptr()

    def stream(self):
        return self.torch.cuda.current_stream().cuda_stream

    def sync(self):
        self.torch.cuda.synchronize()

    def release(self):
        self.torch.cuda.empty_cache()

    def device_info(self):
        props = self.torch.cuda.get_device_properties(0)
        return {"name": props.name, "cuda_runtime": self.torch.version.cuda,
                "memory_bytes": int(props.total_memory), "torch": self.torch.__version__}


def device_arrays():
    for cls in (CupyArrays, TorchArrays):
        try:
            return cls()
        except ImportError:
            continue
    sys.exit("gpu_table_ops.py: needs CuPy or PyTorch for device arrays")


def load_module():
    import core_gpu_ext  # noqa: PLC0415 (tests/ helper; TF-free)
    return core_gpu_ext.load_core_gpu_or_exit("gpu_table_ops.py")


def rate(fn, calls, keys_per_call, arrays, passes=3):
    """Best keys/s over `passes` passes of `calls` calls (after one warm-up call)."""
    fn(0)
    arrays.sync()
    best = 0.0
    for _ in range(passes):
        start = time.perf_counter()
        for c in range(calls):
            fn(c)
        arrays.sync()
        best = max(best, calls * keys_per_call / (time.perf_counter() - start))
    return best


FILL_SEED = 12345


class Filler:
    """Fills a table with keys of consecutive ids, `fill_batch` keys per insert_device
    call, all from one buffer of random rows (the values' content does not matter)."""

    def __init__(self, arrays, dim, fill_batch):
        self.arrays = arrays
        self.fill_batch = fill_batch
        self.values = arrays.rows(fill_batch, dim)

    def fill(self, table, first_id, n):
        """Inserts ids [first_id, first_id + n); returns the seconds it took."""
        arrays = self.arrays
        arrays.sync()
        start = time.perf_counter()
        for b in range(0, n, self.fill_batch):
            m = min(self.fill_batch, n - b)
            keys = arrays.keys(arrays.arange(first_id + b, m))
            table.insert_device(arrays.ptr(keys), m, arrays.ptr(self.values),
                                stream=arrays.stream())
        arrays.sync()
        return time.perf_counter() - start


def warm_up(module, arrays, dim):
    """Runs every array-library kernel and table kernel the timed code uses once, on a
    small table, so that one-time costs (CuPy's kernel compilation, lazy loading of the
    module's kernels) are not timed."""
    table = module.Table("int64", "float32", dim, init_capacity=4096)
    ids = arrays.cat(arrays.permutation(256, seed=1)[:128], arrays.arange(1000, 128))
    keys = arrays.keys(ids)
    values = arrays.rows(256, dim)
    out = arrays.empty_rows(256, dim)
    exists = arrays.flags(256)
    table.insert_device(arrays.ptr(keys), 256, arrays.ptr(values), stream=arrays.stream())
    table.find_device(arrays.ptr(keys), 256, arrays.ptr(out), arrays.ptr(arrays.zeros_row(dim)),
                      arrays.ptr(exists), stream=arrays.stream())
    if hasattr(table, "assign_device"):
        table.assign_device(arrays.ptr(keys), 256, arrays.ptr(values), stream=arrays.stream())
    arrays.sync()
    del table


def bench_dim(module, arrays, dim, args):
    capacity, batch = args.capacity, args.batch
    stored = int(capacity * args.load_factor)
    # Slots are 4/3 of init_capacity (the load limit is 3/4), so this gives
    # `capacity` slots (rounded up to a power-of-two number of 128-slot buckets).
    table = module.Table("int64", "float32", dim, init_capacity=capacity * 3 // 4)
    slots_limit = table.capacity()
    default = arrays.zeros_row(dim)
    fill_s = Filler(arrays, dim, args.fill_batch).fill(table, 0, stored)
    checks = []
    if table.size() != stored:
        checks.append(f"size {table.size()} after filling {stored} keys")
    if table.capacity() != slots_limit:
        checks.append("the table grew: capacity too small for the fill")
    for c in checks:
        print(f"dim {dim}: CHECK FAILED: {c}")

    # Batches of present keys, distinct within a batch.
    num_batches = max(1, min(args.repeats, stored // batch))
    order = arrays.permutation(stored, seed=dim)
    present = [arrays.keys(order[i * batch:(i + 1) * batch]) for i in range(num_batches)]
    del order
    values = arrays.rows(batch, dim)
    out = arrays.empty_rows(batch, dim)

    def find(c):
        table.find_device(arrays.ptr(present[c % num_batches]), batch, arrays.ptr(out),
                          arrays.ptr(default), stream=arrays.stream())

    def assign(c):
        table.insert_device(arrays.ptr(present[c % num_batches]), batch, arrays.ptr(values),
                            stream=arrays.stream())

    result = {
        "dim": dim,
        "slots_limit": slots_limit,
        "stored": stored,
        "fill_keys_per_s": stored / fill_s,
        "fill_batch": args.fill_batch,
        "find": rate(find, args.repeats, batch, arrays),
        "insert_or_assign (existing keys)": rate(assign, args.repeats, batch, arrays),
    }
    # New keys: ids past the stored ones; 4 batches per pass keep the load near target.
    next_id = [stored]

    def insert_new(c):
        keys = arrays.keys(arrays.arange(next_id[0], batch))
        next_id[0] += batch
        table.insert_device(arrays.ptr(keys), batch, arrays.ptr(values), stream=arrays.stream())

    result["insert_or_assign (new keys)"] = rate(insert_new, 4, batch, arrays, passes=1)
    result["final_load"] = table.size() / (slots_limit * 4 / 3)
    if checks:
        result["checks_failed"] = checks
    table = present = values = out = None  # free the device memory before the next dim
    arrays.release()
    return result


# ---------------------------------------------------------------------------------------
# HKV's way: one timed call, best of two (benchmarks/hkv/side_by_side.cu runs HKV's own).

TIMED_CALLS = 2  # HKV's test_main: max of two test_one_api calls
NEW_KEY_IDS = 1 << 40  # ids of absent / new keys: never among the filled ids


def present_count(batch, hit_rate):
    return int(batch * hit_rate)  # HKV: static_cast<int>(key_num_per_op * hitrate)


def hkv_plan(args):
    """The tables and measurements of the HKV-way section (no GPU needed)."""
    hits = [float(h) for h in args.hkv_hit_rates.split(",") if h]
    lfs = [float(x) for x in args.hkv_load_factors.split(",") if x]
    ops = [(api, hit) for api in ("find", "insert_or_assign", "assign") for hit in hits]
    tables = [{"dim": int(d), "mode": "pure_hbm", "hbm_fraction": 1.0, "load_factors": lfs,
               "ops": ops} for d in args.dims.split(",") if d]
    for f in (float(x) for x in args.hybrid.split(",") if x and args.hybrid != "none"):
        tables.append({"dim": args.hybrid_dim, "mode": "hybrid", "hbm_fraction": f,
                       "load_factors": [args.hybrid_load_factor],
                       "ops": [(api, hit) for api in ("find", "insert_or_assign")
                               for hit in hits]})
    for t in tables:
        row_bytes = t["dim"] * 4
        t["slots"] = args.capacity
        t["hbm_rows"] = int(args.capacity * t["hbm_fraction"])
        t["max_hbm_for_values"] = -1 if t["mode"] == "pure_hbm" else t["hbm_rows"] * row_bytes
        # tag 1 + key 8 + score 8 + age 8 bytes per slot, then the value row
        t["device_bytes"] = args.capacity * 25 + t["hbm_rows"] * row_bytes
        t["host_bytes"] = (args.capacity - t["hbm_rows"]) * row_bytes
        t["keys_filled"] = int(args.capacity * max(t["load_factors"]))
        t["timed_calls"] = TIMED_CALLS * len(t["ops"]) * len(t["load_factors"])
    return tables


class PresentSampler:
    """Windows of a random permutation of the filled ids [0, n): distinct keys within a
    window; a new permutation when one is used up."""

    def __init__(self, arrays, n, seed):
        self.arrays, self.n, self.seed = arrays, n, seed
        self.perm, self.pos = None, 0

    def take(self, m):
        if self.perm is None or self.pos + m > self.n:
            self.perm = None
            self.perm = self.arrays.permutation(self.n, seed=self.seed)
            self.seed += 1
            self.pos = 0
        window = self.perm[self.pos:self.pos + m]
        self.pos += m
        return window


def hkv_table(module, arrays, args, spec, device):
    """Runs one table of hkv_plan: returns (table record, results)."""
    dim, batch = spec["dim"], args.batch
    kwargs = {}
    if spec["max_hbm_for_values"] >= 0:
        kwargs["max_hbm_for_values"] = spec["max_hbm_for_values"]
    arrays.sync()
    start = time.perf_counter()
    table = module.Table("int64", "float32", dim, init_capacity=args.capacity * 3 // 4, **kwargs)
    arrays.sync()
    record = {"dim": dim, "mode": spec["mode"], "hbm_fraction": spec["hbm_fraction"],
              "max_hbm_for_values": spec["max_hbm_for_values"],
              "init_s": time.perf_counter() - start}
    slots_limit = table.capacity()
    slots = slots_limit * 4 // 3
    record.update(slots=slots, slots_limit=slots_limit)
    filler = Filler(arrays, dim, args.fill_batch)
    values = arrays.rows(batch, dim)
    out = arrays.empty_rows(batch, dim)
    exists = arrays.flags(batch)
    default = arrays.zeros_row(dim)
    # The size is counted here (filled + new keys inserted) and checked against
    # table.size() after each step; a mismatch is recorded, not fatal.
    state = {"filled": 0, "size": 0, "next_new": NEW_KEY_IDS, "fill_s": 0.0, "fill_keys": 0}
    has_assign = hasattr(table, "assign_device")
    record["checks_failed"] = []

    def check(what):
        if table.size() != state["size"]:
            msg = f"{what}: table.size() {table.size()} != {state['size']} expected"
            record["checks_failed"].append(msg)
            print(f"    CHECK FAILED: {msg}")
            return msg
        return None

    def fill_to(size):
        n = size - state["size"]
        if n <= 0:
            return
        state["fill_s"] += filler.fill(table, state["filled"], n)
        state["filled"] += n
        state["size"] += n
        state["fill_keys"] += n
        check(f"fill to {size}")

    def new_ids(m):
        ids = arrays.arange(state["next_new"], m)
        state["next_new"] += m
        return ids

    def key_batch(sampler, hit):
        n_present = present_count(batch, hit)
        parts = []
        if n_present:
            parts.append(sampler.take(n_present))
        if batch - n_present:
            parts.append(new_ids(batch - n_present))
        ids = parts[0] if len(parts) == 1 else arrays.cat(parts[0], parts[1])
        return arrays.keys(ids)

    def call(api, keys):
        k = arrays.ptr(keys)
        if api == "find":
            table.find_device(k, batch, arrays.ptr(out), arrays.ptr(default), arrays.ptr(exists),
                              stream=arrays.stream())
        elif api == "insert_or_assign":
            table.insert_device(k, batch, arrays.ptr(values), stream=arrays.stream())
        else:
            table.assign_device(k, batch, arrays.ptr(values), stream=arrays.stream())

    def measure(api, hit, lf, sampler):
        result = {"api": api, "dim": dim, "load_factor": lf, "hit_rate": hit,
                  "mode": spec["mode"], "hbm_fraction": spec["hbm_fraction"],
                  "batch": batch, "slots": slots, "device": device}
        if api == "assign" and not has_assign:
            result.update(status="missing", keys_per_s=None)
            return result
        result["load_factor_actual"] = state["size"] / slots
        call(api, key_batch(sampler, 1.0))  # warm-up (present keys: the size stays)
        batches = [key_batch(sampler, hit) for _ in range(TIMED_CALLS)]
        rates = []
        for keys in batches:
            arrays.sync()
            t0 = time.perf_counter()
            call(api, keys)
            arrays.sync()
            rates.append(batch / (time.perf_counter() - t0))
        if api == "insert_or_assign":
            state["size"] += TIMED_CALLS * (batch - present_count(batch, hit))
        failed = check(f"{api} at {hit:.0%} present")
        result.update(status=failed or "ok", keys_per_s=max(rates), calls_keys_per_s=rates)
        return result

    results = []
    for i, lf in enumerate(spec["load_factors"]):
        target = int(slots * lf)
        adding = [op for op in spec["ops"] if op[0] == "insert_or_assign" and op[1] < 1.0]
        reserve = sum(TIMED_CALLS * (batch - present_count(batch, hit)) for _, hit in adding)
        if target - reserve < state["size"] or target > slots_limit:
            results.append({"api": "*", "dim": dim, "load_factor": lf, "mode": spec["mode"],
                            "status": f"skipped: size {state['size']} > {target - reserve}"})
            continue
        fill_to(target - reserve)
        sampler = PresentSampler(arrays, state["filled"], seed=1000 * dim + i)
        for api, hit in adding:
            results.append(measure(api, hit, lf, sampler))
        fill_to(target)
        sampler = PresentSampler(arrays, state["filled"], seed=2000 * dim + i)
        for api, hit in spec["ops"]:
            if (api, hit) not in adding:
                results.append(measure(api, hit, lf, sampler))
        del sampler
    if state["fill_s"] > 0:
        record["fill_keys_per_s"] = state["fill_keys"] / state["fill_s"]
    record["final_size"] = table.size()
    record["expected_size"] = state["size"]
    start = time.perf_counter()
    table = filler = values = out = exists = None  # free the device memory
    arrays.sync()
    arrays.release()
    record["free_s"] = time.perf_counter() - start
    return record, results


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, check=False)
        return out.stdout.strip()
    except OSError:
        return "unknown"


def device_info(arrays):
    info = {"nvidia_smi": gpu_name()}
    try:
        info.update(arrays.device_info())
    except Exception as e:  # noqa: BLE001 (informational only)
        info["error"] = repr(e)
    parts = [p.strip() for p in info["nvidia_smi"].split(",")]
    if len(parts) >= 2:
        info["driver"] = parts[1]
    return info


def fmt(x):
    return "   -  " if x is None else f"{x / 1e9:6.2f}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=64 * 2**20)
    parser.add_argument("--load-factor", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=2**20)
    parser.add_argument("--dims", default="8,64")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--fill-batch", type=int, default=4 * 2**20,
                        help="keys per insert_device call while filling (default 4M)")
    parser.add_argument("--sections", default="ours,hkv",
                        help="ours: the original measurements; hkv: HKV's way (default both)")
    parser.add_argument("--hkv-load-factors", default="0.5,0.75")
    parser.add_argument("--hkv-hit-rates", default="0.6,1.0",
                        help="shares of present keys in a timed call (HKV's default: 0.6)")
    parser.add_argument("--hybrid", default="0.1,0.5",
                        help="fractions of slot rows in device memory for the hybrid tables "
                             "('none': no hybrid)")
    parser.add_argument("--hybrid-dim", type=int, default=64)
    parser.add_argument("--hybrid-load-factor", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true",
                        help="--repeats 5, HKV way at load 0.5 only, hybrid at 50%% only")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (tables, memory, measurements); no GPU needed")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results",
                                                      "gpu_table_ops.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 5)
        args.hkv_load_factors = "0.5"
        args.hybrid = "0.5" if args.hybrid != "none" else "none"
    return args


def main(argv=None):
    args = parse_args(argv)
    sections = set(args.sections.split(","))
    plan = hkv_plan(args) if "hkv" in sections else []
    if args.dry_run:
        print(json.dumps({"args": vars(args), "sections": sorted(sections),
                          "hkv_tables": plan}, indent=2))
        gib = 2.0**30
        for t in plan:
            print(f"hkv table dim {t['dim']} {t['mode']} hbm {t['hbm_fraction']:.2f}: "
                  f"{t['device_bytes'] / gib:.1f} GiB device + {t['host_bytes'] / gib:.1f} GiB "
                  f"pinned host, fill {t['keys_filled']:,} keys, {t['timed_calls']} timed calls",
                  file=sys.stderr)
        return
    module = load_module()
    arrays = device_arrays()
    device = device_info(arrays)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "gpu": gpu_name(),
        "device": device,
        "host": platform.node(),
        "arrays": arrays.name,
        "args": vars(args),
        "results": [],
    }
    print(f"device: {json.dumps(device)}")
    total_start = time.perf_counter()
    verdicts = []
    for dim in sorted({int(d) for d in args.dims.split(",")} | {t["dim"] for t in plan}):
        warm_up(module, arrays, dim)
    if "ours" in sections:
        for dim in (int(d) for d in args.dims.split(",")):
            r = bench_dim(module, arrays, dim, args)
            r["device"] = device
            report["results"].append(r)
            print(f"dim {dim}: {r['stored']:,} keys stored "
                  f"(fill {r['fill_keys_per_s'] / 1e9:.2f} G/s)")
            for op in ("find", "insert_or_assign (existing keys)", "insert_or_assign (new keys)"):
                line = f"  {op:34s} {r[op] / 1e9:6.2f} G keys/s"
                if op in TARGETS:
                    ok = r[op] >= TARGETS[op]
                    verdicts.append((f"dim {dim} {op}", ok))
                    line += f"   target {TARGETS[op] / 1e9:.1f}: {'PASS' if ok else 'FAIL'}"
                print(line)
        report["ours_s"] = time.perf_counter() - total_start
    if plan:
        hkv_start = time.perf_counter()
        hkv = {"method": "HKV test_one_api: one call of --batch keys timed, best of 2",
               "tables": [], "results": []}
        report["hkv_way"] = hkv
        print("HKV way (one call timed, best of 2; G keys/s):")
        for spec in plan:
            record, results = hkv_table(module, arrays, args, spec, device)
            hkv["tables"].append(record)
            hkv["results"].extend(results)
            print(f"  dim {spec['dim']} {spec['mode']} hbm {spec['hbm_fraction']:.2f}: init "
                  f"{record['init_s']:.2f} s, fill "
                  f"{record.get('fill_keys_per_s', 0) / 1e9:.2f} G/s")
            for r in results:
                if "hit_rate" not in r:
                    print(f"    {r['status']}")
                    continue
                print(f"    {r['api']:17s} load {r['load_factor']:.2f} "
                      f"(actual {r.get('load_factor_actual', 0):.3f}) present "
                      f"{r['hit_rate'] * 100:3.0f}%  {fmt(r['keys_per_s'])}"
                      + ("" if r["status"] == "ok" else f"   {r['status']}"))
        report["hkv_way_s"] = time.perf_counter() - hkv_start
    report["total_s"] = time.perf_counter() - total_start
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out} ({report['total_s']:.1f} s)")
    if verdicts:
        print("targets: " + ", ".join(f"{name}: {'PASS' if ok else 'FAIL'}"
                                      for name, ok in verdicts))


if __name__ == "__main__":
    main()
