#!/usr/bin/env python3
"""Scale: 100M keys at dim 8 in one process, into an unbounded table and a capped one.

    python benchmarks/scale.py [--keys 100000000] [--cap 20000000] [--dim 8]
        [--batch 1000000] [--parts unbounded,bounded] [--threads N]
        [--min-available-gib 2] [--out benchmarks/results/scale_tf<version>.json]

Two parts, each in a fresh child process (through `_harness`), each inserting the same
`--keys` distinct int64 keys in batches of `--batch` (one `insert` call per batch, in a
`tf.function`), float32 values of `--dim` (one tensor, reused by every batch):

* unbounded: into one `de.HashTable`;
* bounded: into one `de.HkvHashTable` of `max_capacity` `--cap` (LRU, default
  `init_capacity`): below `--cap` nothing is evicted, after that every new key evicts
  the lowest-scored entry (the oldest batch's keys).

Keys are a bijective 64-bit mix (splitmix64's finalizer) of a counter, made per batch
outside the timed call, so no array of all keys exists. Per batch ("window") it records
the seconds of the insert call, the process's VmRSS and RssAnon, page faults, CPU
time and the free memory malloc holds (`mallinfo2`, printed for the bounded part's
peak); `--print-every` windows are printed. At the end it times lookups of a sample of
`--lookup-keys` stored keys (batches of 65,536, best of 3) and checks what they return
(bounded: keys of the last `--cap` inserted are all present, the first batch's are gone).

Verdicts:

* flatness, per phase (unbounded: all windows; bounded: the windows below `--cap`, and
  the windows of the full, evicting table, separately): the 90th-percentile window time
  (the fastest of the slowest 10%) over the median of the phase's windows 2-11 (the
  first 10 after the first) must be <= `--flat-limit` (2). The slowest window is printed
  beside it (slot arrays double at 3/4 load, all 256 shards within a window or two, so
  a doubling of the table costs one or two slow windows, which p90 tolerates). Judged
  twice: on wall seconds, and on the process's CPU seconds (user + system, all threads)
  per 1M inserts, which other jobs' load on a shared machine changes far less;
* bounded size: `size() <= --cap` after every window;
* bounded memory: the RSS growth since before the table was created must stay inside
  the bound of `docs/tables.md` ("Memory of a bounded table"), computed by
  `bounded_memory_bound`: at the end after `malloc_trim` (the table's own memory), and
  at every window as it is (with freed blocks that malloc kept: batches' working
  buffers, old copies of eviction heaps that grew).

`--fault-probe GIB` only touches GIB GiB of fresh memory and prints the system time
per page fault: the cost every new page of a growing table pays on this machine.

Before each part the parent checks that the machine has the memory the part needs (with
`--min-available-gib` to spare); during a part the child stops early, and says so, if
`MemAvailable` falls below `--min-available-gib` (this VM has no swap: the alternative is
the OOM killer). Results go through `_harness.write_record`. `--keys 10000000 --cap
2000000` is a quick check (~1 minute).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import loadavg, median, print_result, spawn_child, write_record  # noqa: E402
from table_ops import (cpu_model, malloc_free_bytes, mem_available_bytes,  # noqa: E402
                       release_freed_memory, rss_bytes, usable_cores)

GIB = 1 << 30
LOOKUP_BATCH = 65536

# The CPU core's layout (cc/core/table.h, cc/core/cpu/): what the memory bound is made of.
NUM_SHARDS = 256
BIG_CHUNK_ROWS = 1024        # rows per chunk once a shard has 1,008 rows
ROWS_BEFORE_BIG_CHUNKS = 1008  # chunks of 16, 32, ..., 512 rows come first
HEAP_ENTRY_BYTES = 24        # (score, age, row index), padded
HEAP_ENTRIES_PER_KEY = 1.25  # built at the shard's size, grown by a quarter when full
DRIFT_SIGMAS = 5             # how far above cap / 256 a shard's size may wander
HKV_INIT_CAPACITY = 1 << 20  # de.HkvHashTable's default init_capacity (kept unless > cap)


# -- keys -----------------------------------------------------------------------------------


def mix_keys(counters: np.ndarray, seed: int, out=None, tmp=None) -> np.ndarray:
    """int64 keys of uint64 counters: splitmix64's finalizer (a bijection of uint64) of
    counter + a seed offset, so distinct counters give distinct keys. `out` and `tmp`
    (uint64 arrays of the counters' length, optional) receive the work, so a loop over
    batches allocates nothing that malloc would keep resident."""
    x = np.add(counters, np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF), out=out)
    t = np.empty_like(x) if tmp is None else tmp
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)):
        np.right_shift(x, np.uint64(shift), out=t)
        np.bitwise_xor(x, t, out=x)
        if mult is not None:
            np.multiply(x, np.uint64(mult), out=x)
    return x.view(np.int64)


class BatchKeys:
    """The keys of counters [start, stop) (at most `batch` of them), made in two buffers
    reused from batch to batch."""

    def __init__(self, batch: int, seed: int):
        self.seed = seed
        self.base = np.arange(batch, dtype=np.uint64)
        self.out = np.empty(batch, np.uint64)
        self.tmp = np.empty(batch, np.uint64)

    def __call__(self, start: int, stop: int) -> np.ndarray:
        n = stop - start
        counters = np.add(self.base[:n], np.uint64(start), out=self.out[:n])
        return mix_keys(counters, self.seed, out=self.out[:n], tmp=self.tmp[:n])


def batch_keys(start: int, stop: int, seed: int) -> np.ndarray:
    """The keys of counters [start, stop) (fresh arrays)."""
    return mix_keys(np.arange(start, stop, dtype=np.uint64), seed)


# -- memory model ---------------------------------------------------------------------------


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


def _slots_for(keys_per_shard: float, init_slots: int = 8) -> int:
    """A shard's slot count: the smallest power of two (>= its initial count) that keeps
    the load at or below 3/4."""
    slots = init_slots
    while keys_per_shard * 4 > slots * 3:
        slots *= 2
    return slots


def _chunked_rows(rows: float) -> int:
    """Rows a shard's slab holds for `rows` rows in use (chunks are not returned)."""
    rows = math.ceil(rows)
    if rows <= ROWS_BEFORE_BIG_CHUNKS:
        return ROWS_BEFORE_BIG_CHUNKS  # at most; small shards only matter for tiny tables
    return ROWS_BEFORE_BIG_CHUNKS + math.ceil((rows - ROWS_BEFORE_BIG_CHUNKS) / BIG_CHUNK_ROWS) \
        * BIG_CHUNK_ROWS


def unbounded_layout_bytes(keys: int, dim: int) -> int:
    """What a `de.HashTable` of `keys` int64 keys with float32 [dim] values should take:
    rows of key + score + values in 1,024-row chunks, and 8-byte slots, per shard of
    keys / 256 (an estimate, not a bound: shard sizes vary by ~sqrt(keys / 256))."""
    per_shard = keys / NUM_SHARDS
    row = _round8(16 + 4 * dim)
    return NUM_SHARDS * (row * _chunked_rows(per_shard) + 8 * _slots_for(per_shard))


def bounded_memory_bound(cap: int, dim: int, batch: int,
                         init_capacity: int = HKV_INIT_CAPACITY) -> int:
    """The bound of docs/tables.md on a full `de.HkvHashTable` of max_capacity `cap`,
    int64 keys and float32 [dim] values, fed batches of up to `batch` new keys, under LRU
    or LFU without explicit scores. Per shard (256), with
    m = (cap + batch) / 256 + 5 sqrt(cap / 256) the most keys a shard holds at once (keys
    are spread by their hash, so a shard's size wanders around cap / 256; and a batch's
    new keys go in shard by shard, each evicting the table-wide oldest entry, so the
    first shards of a batch hold their new keys before most of their victims are gone):
      rows:  (24 + 4 dim) bytes (key, score, age, values; rounded up to 8) x m, rounded
             up to the chunk;
             plus 8 bytes per row that may sit in the free list (m - cap / 256);
      slots: 8 bytes x the smallest power of two >= 4/3 m;
      heap:  24 bytes x (1.25 m + 16) (built with room for a quarter more entries than
             the shard holds, grown by a quarter if that fills).
    """
    per_shard = cap / NUM_SHARDS
    most = (cap + batch) / NUM_SHARDS + DRIFT_SIGMAS * math.sqrt(per_shard)
    row = _round8(24 + 4 * dim)
    init_slots = _slots_for(math.ceil(min(init_capacity, cap) / NUM_SHARDS))
    shard = (row * _chunked_rows(most) + 8 * (most - per_shard)
             + 8 * _slots_for(most, init_slots)
             + HEAP_ENTRY_BYTES * (HEAP_ENTRIES_PER_KEY * most + 16))
    return int(NUM_SHARDS * shard)


# -- child: one part ------------------------------------------------------------------------


def _log(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def run_part(args) -> dict:
    """One part (args.child: "unbounded" or "bounded") in this process."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.get_logger().setLevel("ERROR")
    import tensorflow_dynemb as de

    part, dim, batch = args.child, args.dim, args.batch
    bounded = part == "bounded"

    def new_table():
        if bounded:
            return de.HkvHashTable(tf.int64, tf.float32, [0.0] * dim,
                                   init_capacity=min(HKV_INIT_CAPACITY, args.cap),
                                   max_capacity=args.cap,
                                   evict_strategy=de.HkvEvictStrategy.LRU, checkpoint=False)
        return de.HashTable(tf.int64, tf.float32, [0.0] * dim, checkpoint=False)

    row = np.arange(dim, dtype=np.float32) + 0.5
    values = tf.constant(np.broadcast_to(row, (batch, dim)))

    # Warm-up on a small throwaway table: loads the kernels, starts the thread pools.
    warm = new_table()
    warm.insert(tf.constant(batch_keys(0, 4096, args.seed + 1)), values[:4096])
    warm.lookup(tf.constant(batch_keys(0, 4096, args.seed + 1)))
    del warm
    release_freed_memory()

    rss0, anon0, free0 = rss_bytes(), rss_bytes("RssAnon"), malloc_free_bytes()
    table = new_table()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64),
                                  tf.TensorSpec([None, dim], tf.float32)])
    def insert_fn(keys, vals):
        table.insert(keys, vals)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def lookup_fn(keys):
        return table.lookup(keys, return_exists=True)

    insert_fn(tf.zeros([0], tf.int64), tf.zeros([0, dim], tf.float32))  # trace
    lookup_fn(tf.zeros([0], tf.int64))

    make_keys = BatchKeys(batch, args.seed)
    windows, stopped = [], None
    guard = args.min_available_gib * GIB
    n_windows = math.ceil(args.keys / batch)
    for w in range(n_windows):
        lo, hi = w * batch, min(args.keys, (w + 1) * batch)
        avail = mem_available_bytes()
        if avail < guard:
            stopped = (f"stopped before window {w} ({lo} keys inserted): MemAvailable "
                       f"{avail / GIB:.2f} GiB < {args.min_available_gib} GiB")
            _log(args.progress, stopped)
            break
        keys = tf.constant(make_keys(lo, hi))
        vals = values if hi - lo == batch else values[:hi - lo]
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        insert_fn(keys, vals)
        seconds = time.perf_counter() - start
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        del keys
        rec = {"window": w, "inserted": hi, "s": seconds,
               "s_per_1m": seconds * 1e6 / (hi - lo),
               "cpu_s_per_1m": (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
               * 1e6 / (hi - lo),
               "user_s_per_1m": (r1.ru_utime - r0.ru_utime) * 1e6 / (hi - lo),
               "rss_delta": rss_bytes() - rss0, "rss_anon_delta": rss_bytes("RssAnon") - anon0,
               "malloc_free": malloc_free_bytes(),
               "minflt": r1.ru_minflt - r0.ru_minflt,
               "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
               "load": loadavg()}
        if bounded:
            stats = {k: int(v.numpy()) for k, v in table.stats().items() if k != "load_factor"}
            rec.update(size=stats["size"], evictions=stats["evictions"],
                       capacity=stats["capacity"])
        else:
            rec["size"] = int(table.size())
        rec["bytes_per_key"] = rec["rss_delta"] / max(rec["size"], 1)
        windows.append(rec)
        _log(args.progress, f"{part} window {w}: {hi} inserted, size {rec['size']}, "
                            f"{rec['s_per_1m']:.3f} s/1M, RSS +{rec['rss_delta'] / GIB:.2f} GiB, "
                            f"{rec['bytes_per_key']:.1f} B/key, load {rec['load']}")

    # What the table holds once the batches' freed working memory went back to the OS
    # (outside the timed calls; the per-window RSS above includes what malloc kept).
    release_freed_memory()
    rss_trimmed = rss_bytes() - rss0
    _log(args.progress, f"{part}: RSS +{rss_trimmed / GIB:.2f} GiB after malloc_trim")
    result = {"part": part, "tf": tf.__version__, "keys": args.keys,
              "cap": args.cap if bounded else 0, "dim": dim, "batch": batch,
              "threads": args.threads, "windows": windows, "stopped": stopped,
              "rss_delta_trimmed": rss_trimmed, "vm_hwm": rss_bytes("VmHWM"),
              "rss_start": rss0, "malloc_free_start": free0}
    inserted = windows[-1]["inserted"] if windows else 0
    if inserted:
        result["lookup"] = lookup_sample(tf, lookup_fn, args, inserted, row, bounded)
    return result


def lookup_sample(tf, lookup_fn, args, inserted: int, row: np.ndarray, bounded: bool) -> dict:
    """keys/s of looking up `--lookup-keys` stored keys (random counters; bounded: from
    the last `--cap` inserted, which LRU keeps), best of 3; checks what they return."""
    rng = np.random.default_rng(args.seed + 7)
    lo = max(0, inserted - args.cap) if bounded else 0
    n = min(args.lookup_keys, inserted - lo)
    counters = rng.integers(lo, inserted, size=n, dtype=np.uint64)  # repeats are fine
    keys = mix_keys(counters, args.seed)
    batches = [tf.constant(keys[i:i + LOOKUP_BATCH]) for i in range(0, n, LOOKUP_BATCH)]
    passes = []
    for _ in range(4):  # the first pass warms up
        start = time.perf_counter()
        for b in batches:
            lookup_fn(b)
        passes.append(time.perf_counter() - start)
    found, wrong = 0, 0
    for b in batches:
        vals, exists = lookup_fn(b)
        exists = exists.numpy()
        found += int(exists.sum())
        wrong += int((vals.numpy()[exists] != row).any(axis=1).sum())
    out = {"keys": n, "from_counter": lo, "s": passes[1:], "rate": n / min(passes[1:]),
           "found": found, "wrong_values": wrong}
    if bounded and lo > 0:  # the first batch was evicted long ago
        first = lookup_fn(tf.constant(batch_keys(0, min(args.batch, LOOKUP_BATCH), args.seed)))[1]
        out["first_batch_still_present"] = int(first.numpy().sum())
    return out


def fault_probe(gib: float, step: int = 256 << 20) -> list:
    """`--fault-probe GIB`: what a first touch of fresh memory costs on this machine, with
    no table involved: maps `gib` GiB of anonymous memory `step` bytes at a time (kept
    until the end), writes one byte per 4 KiB page, and prints the system CPU time and
    wall time per page fault of each step."""
    import mmap

    keep, out = [], []
    for i in range(int(gib * GIB) // step):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        m = mmap.mmap(-1, step, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for off in range(0, step, 4096):
            m[off] = 1
        wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        keep.append(m)
        faults = max(1, r1.ru_minflt - r0.ru_minflt)
        out.append({"touched_gib": (i + 1) * step / GIB, "faults": faults,
                    "sys_us_per_fault": (r1.ru_stime - r0.ru_stime) / faults * 1e6,
                    "wall_us_per_fault": wall / faults * 1e6, "load": loadavg()})
        print(f"{out[-1]['touched_gib']:6.2f} GiB: {faults} faults, system "
              f"{out[-1]['sys_us_per_fault']:5.1f} us/fault, wall "
              f"{out[-1]['wall_us_per_fault']:5.1f} us/fault, load {out[-1]['load']}",
              flush=True)
    return out


# -- parent: verdicts and report --------------------------------------------------------------


def flatness(windows, limit: float, field: str = "s_per_1m") -> dict:
    """p90 window time (the fastest of the slowest 10%) / median of windows 2-11 of the
    phase (the first 10 after the first); None where the phase has under 3 windows.
    `field`: "s_per_1m" (wall seconds) or "cpu_s_per_1m" (the process's CPU seconds, all
    threads: what other jobs' load changes least)."""
    t = [w[field] for w in windows]
    if len(t) < 3:
        return {"windows": len(t), "ratio": None, "pass": None}
    base = median(t[1:11])
    p90 = sorted(t[1:])[max(0, math.ceil(0.9 * len(t[1:])) - 1)]
    slowest = max(range(1, len(t)), key=lambda i: t[i])
    return {"windows": len(t), "baseline_s_per_1m": base, "p90_s_per_1m": p90,
            "ratio": p90 / base, "max_s_per_1m": t[slowest],
            "max_ratio": t[slowest] / base, "max_at_inserted": windows[slowest]["inserted"],
            "median_s_per_1m": median(t), "limit": limit, "pass": p90 / base <= limit}


def phases(res) -> dict:
    """Windows by phase: unbounded: "all"; bounded: "below_cap" (nothing evicted) and
    "full" (every key of the window evicted one); a window that crossed the cap is in
    neither."""
    ws = res["windows"]
    if res["part"] == "unbounded":
        return {"all": ws}
    below, full, before = [], [], 0
    for w in ws:
        n = w["inserted"] - (ws[w["window"] - 1]["inserted"] if w["window"] else 0)
        ev = w["evictions"] - before
        before = w["evictions"]
        if ev == 0:
            below.append(w)
        elif ev == n:
            full.append(w)
    return {"below_cap": below, "full": full}


def verdicts(res, args) -> list:
    out = []

    def add(name, value, limit, ok, note=""):
        out.append({"part": res["part"], "target": name, "value": value, "limit": limit,
                    "pass": ok, "note": note})

    ws = res["windows"]
    done = bool(ws) and ws[-1]["inserted"] == res["keys"] and not res["stopped"]
    add(f"all {res['keys']} keys inserted in one process", ws[-1]["inserted"] if ws else 0,
        res["keys"], done, res["stopped"] or "")
    for name, phase in phases(res).items():
        # user CPU alone: the table's own work, without the kernel's page faults (no
        # verdict; it tells a miss caused by first-touch faults from one of the table's)
        res.setdefault("flatness_user", {})[name] = flatness(phase, args.flat_limit,
                                                             "user_s_per_1m")
        for field, what in (("s_per_1m", "wall"), ("cpu_s_per_1m", "CPU")):
            f = flatness(phase, args.flat_limit, field)
            res.setdefault("flatness" if what == "wall" else "flatness_cpu", {})[name] = f
            if f["ratio"] is not None:
                add(f"flat: p90 / median(windows 2-11) of {what} s per 1M inserts, {name}",
                    f["ratio"], args.flat_limit, f["pass"],
                    f"slowest {f['max_ratio']:.2f}x at {f['max_at_inserted']:,} keys")
    if res["part"] == "unbounded":
        expect = unbounded_layout_bytes(ws[-1]["size"], res["dim"]) if ws else None
        res["layout_estimate_bytes"] = expect
    else:
        worst = max(w["size"] for w in ws) if ws else 0
        add(f"size <= max_capacity {res['cap']:,} after every window", worst, res["cap"],
            worst <= res["cap"])
        bound = bounded_memory_bound(res["cap"], res["dim"], res["batch"])
        res["memory_bound_bytes"] = bound
        if ws and ws[-1]["size"] >= res["cap"]:
            final = res["rss_delta_trimmed"]
            peak = max(w["rss_delta"] for w in ws)
            add("table: RSS growth at the end, after malloc_trim, <= documented bound (GiB)",
                final / GIB, bound / GIB, final <= bound,
                f"{final / res['cap']:.1f} B/key vs bound {bound / res['cap']:.1f} B/key")
            add("process: peak RSS growth of any window (freed batch buffers that malloc "
                "kept included) <= documented bound (GiB)", peak / GIB, bound / GIB,
                peak <= bound)
    lk = res.get("lookup")
    if lk:
        add("lookup sample: every key found, values right", lk["found"], lk["keys"],
            lk["found"] == lk["keys"] and lk["wrong_values"] == 0,
            f"{lk['wrong_values']} wrong rows")
        if "first_batch_still_present" in lk:
            add("the first batch's keys were evicted (LRU)",
                lk["first_batch_still_present"], 0, lk["first_batch_still_present"] == 0)
    return out


def print_part(res, every: int) -> None:
    bounded = res["part"] == "bounded"
    title = (f"HkvHashTable, max_capacity {res['cap']:,}, LRU" if bounded
             else "HashTable (unbounded)")
    print(f"\n== {res['part']}: {res['keys']:,} keys, dim {res['dim']}, {title}, batches of "
          f"{res['batch']:,} ==")
    print(f"{'inserted':>12s} {'size':>12s} {'s/1M':>7s} {'CPU s':>6s} {'RSS+ GiB':>9s} "
          f"{'B/key':>7s} {'faults':>8s} {'sys s':>6s} {'load':>5s}"
          + (f" {'evictions':>12s}" if bounded else ""))
    ws = res["windows"]
    for w in ws:
        if (w["window"] + 1) % every and w is not ws[-1] and w["window"]:
            continue
        print(f"{w['inserted']:>12,d} {w['size']:>12,d} {w['s_per_1m']:>7.3f} "
              f"{w['cpu_s_per_1m']:>6.3f} "
              f"{w['rss_delta'] / GIB:>9.2f} {w['bytes_per_key']:>7.1f} {w['minflt']:>8d} "
              f"{w['sys_s']:>6.2f} {w['load']:>5.2f}"
              + (f" {w['evictions']:>12,d}" if bounded else ""))
    total = sum(w["s"] for w in ws)
    print(f"{len(ws)} windows, {total:.1f} s of inserts; peak VmHWM {res['vm_hwm'] / GIB:.2f} GiB "
          f"(process), RSS at the start of the table {res['rss_start'] / GIB:.2f} GiB")
    flat = [(name, "wall", f) for name, f in res.get("flatness", {}).items()]
    flat += [(name, "CPU", f) for name, f in res.get("flatness_cpu", {}).items()]
    flat += [(name, "user CPU", f) for name, f in res.get("flatness_user", {}).items()]
    for name, what, f in flat:
        if f["ratio"] is None:
            continue
        print(f"  {name}: {f['windows']} windows, {what} s per 1M: median(2-11) "
              f"{f['baseline_s_per_1m']:.3f}, median {f['median_s_per_1m']:.3f}, p90 "
              f"{f['p90_s_per_1m']:.3f} ({f['ratio']:.2f}x), slowest {f['max_s_per_1m']:.3f} "
              f"({f['max_ratio']:.2f}x, at {f['max_at_inserted']:,} keys)")
    if bounded and "flatness" in res and res["flatness"]["full"]["ratio"] is not None:
        fb, ff = res["flatness"]["below_cap"], res["flatness"]["full"]
        if fb.get("median_s_per_1m"):
            print(f"  full (evicting) vs below max_capacity, median s per 1M: "
                  f"{ff['median_s_per_1m'] / fb['median_s_per_1m']:.2f}x (no target)")
    if ws and not bounded:
        est = res["layout_estimate_bytes"]
        print(f"  memory: RSS +{ws[-1]['rss_delta'] / GIB:.2f} GiB = "
              f"{ws[-1]['bytes_per_key']:.1f} B/key (RssAnon "
              f"{ws[-1]['rss_anon_delta'] / ws[-1]['size']:.1f}; after malloc_trim "
              f"{res['rss_delta_trimmed'] / ws[-1]['size']:.1f}); layout estimate "
              f"{est / ws[-1]['size']:.1f} B/key (rows + slots; payload {8 + 4 * res['dim']} B)")
    if ws and bounded:
        b = res["memory_bound_bytes"]
        print(f"  memory: RSS +{ws[-1]['rss_delta'] / GIB:.2f} GiB at the end, "
              f"+{res['rss_delta_trimmed'] / GIB:.2f} GiB after malloc_trim "
              f"({res['rss_delta_trimmed'] / res['cap']:.1f} B/key of max_capacity), peak +"
              f"{max(w['rss_delta'] for w in ws) / GIB:.2f} GiB; documented bound "
              f"{b / GIB:.2f} GiB ({b / res['cap']:.1f} B/key)")
        peak = max(ws, key=lambda w: w["rss_delta"])
        if peak.get("malloc_free") is not None and res.get("malloc_free_start") is not None:
            held = peak["malloc_free"] - res["malloc_free_start"]
            print(f"  at the peak ({peak['inserted']:,} keys inserted) malloc held "
                  f"{held / GIB:+.3f} GiB more free memory than at the start (mallinfo2)")
    lk = res.get("lookup")
    if lk:
        rates = ", ".join(f"{lk['keys'] / x / 1e6:.2f}" for x in lk["s"])
        print(f"  lookup of {lk['keys']:,} stored keys (batches of {LOOKUP_BATCH}): "
              f"{lk['rate'] / 1e6:.2f} M keys/s (best of 3: {rates}); "
              f"found {lk['found']:,}, wrong rows {lk['wrong_values']}"
              + (f"; first batch still present: {lk['first_batch_still_present']}"
                 if "first_batch_still_present" in lk else ""))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000_000, help="distinct keys inserted")
    p.add_argument("--cap", type=int, default=20_000_000, help="bounded part's max_capacity")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch", type=int, default=1_000_000, help="keys per insert call (a window)")
    p.add_argument("--parts", default="unbounded,bounded")
    p.add_argument("--threads", type=int, default=usable_cores(),
                   help="intra-op threads (default: all usable cores); inter-op is 1")
    p.add_argument("--lookup-keys", type=int, default=1 << 20)
    p.add_argument("--print-every", type=int, default=5, help="print every N-th window")
    p.add_argument("--flat-limit", type=float, default=2.0)
    p.add_argument("--min-available-gib", type=float, default=2.0,
                   help="memory to leave to the machine's other users")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=None,
                   help="JSON results (default: benchmarks/results/scale_tf<version>.json)")
    p.add_argument("--no-out", action="store_true")
    p.add_argument("--fault-probe", type=float, default=None, metavar="GIB",
                   help="only measure what first-touch page faults cost here (touches GIB "
                        "GiB of fresh memory; no table, no TensorFlow)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--progress", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def need_bytes(part: str, args) -> int:
    """What a part needs beyond the running process: the table, with a 1.25 margin, plus
    1 GiB for TensorFlow and the batches."""
    if part == "bounded":
        table = bounded_memory_bound(min(args.cap, args.keys), args.dim, args.batch)
    else:
        table = unbounded_layout_bytes(args.keys, args.dim)
    return int(table * 1.25) + GIB


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        print_result(run_part(args))
        return
    if args.fault_probe:
        fault_probe(args.fault_probe)
        return
    parts = [x for x in args.parts.split(",") if x]
    progress = f"/tmp/scale_progress_{os.getpid()}.log"
    load_start = loadavg()
    print(f"scale: {args.keys:,} keys, dim {args.dim}, batches of {args.batch:,}; parts "
          f"{', '.join(parts)}; {args.threads} intra-op threads; CPU {cpu_model()}; "
          f"MemAvailable {mem_available_bytes() / GIB:.1f} GiB; load average {load_start}")
    print(f"progress per window: tail -f {progress}", flush=True)
    results, all_verdicts, tf_version = {}, [], None
    for part in parts:
        need, avail = need_bytes(part, args), mem_available_bytes()
        if avail - need < args.min_available_gib * GIB:
            msg = (f"{part}: skipped, needs ~{need / GIB:.1f} GiB and {avail / GIB:.1f} GiB "
                   f"is available ({args.min_available_gib} GiB kept free)")
            print(msg)
            results[part] = {"skipped": msg}
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--child", part, "--progress", progress,
               "--keys", str(args.keys), "--cap", str(args.cap), "--dim", str(args.dim),
               "--batch", str(args.batch), "--threads", str(args.threads),
               "--lookup-keys", str(args.lookup_keys), "--seed", str(args.seed),
               "--min-available-gib", str(args.min_available_gib)]
        print(f"{part}: child process (needs ~{need / GIB:.1f} GiB, {avail / GIB:.1f} GiB "
              f"available) ...", flush=True)
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        res, error = spawn_child(cmd, env)
        if res is None:
            results[part] = {"error": error}
            all_verdicts.append({"part": part, "target": "child process finished",
                                 "value": None, "limit": None, "pass": False, "note": error[-300:]})
            continue
        tf_version = res["tf"]
        res["verdicts"] = verdicts(res, args)
        all_verdicts += res["verdicts"]
        results[part] = res
        print_part(res, args.print_every)

    print("\n== verdicts ==")
    for v in all_verdicts:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[v["pass"]]
        value, limit = (round(x, 2) if isinstance(x, float) else x
                        for x in (v["value"], v["limit"]))
        print(f"  {mark}  {v['part']}: {v['target']}: {value} (limit {limit})"
              + (f"; {v['note']}" if v.get("note") else ""))
    print(f"load average: {load_start} at the start, {loadavg()} at the end")
    if not args.no_out and tf_version:
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                       f"scale_tf{tf_version}.json")
        write_record(out, "scale", tf_version, load_start, cpu_model=cpu_model(),
                     mem_total_gib=round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                         / GIB, 1),
                     keys=args.keys, cap=args.cap, dim=args.dim, batch=args.batch,
                     threads=args.threads, parts=results, verdicts=all_verdicts)


if __name__ == "__main__":
    main()
