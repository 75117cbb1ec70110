#!/usr/bin/env python3
"""Throughput and memory of `de.HashTable` next to references measured in the same process.

    python benchmarks/table_ops.py [--keys 1048576] [--dims 8,64] [--batch 65536] \
        [--growth-keys 10485760] [--threads N] [--thread-scaling [1,2]] [--lookup-only] \
        [--out benchmarks/results/table_ops_tf<version>.json]

For each dim (int64 keys: random 64-bit ids; float32 values of shape [dim]) it
measures keys/s of

* insert of new keys into an empty table, upsert of keys already present, and
  lookup of present keys in shuffled batches, for
    - ours: `de.HashTable(tf.int64, tf.float32, default_value=[0.] * dim)`,
    - `tf.lookup.experimental.DenseHashTable` (TF's open-addressing table),
    - TFRA 0.8.1's `tfra.dynamic_embedding.CuckooHashTable` (the table op behind
      `tfra.dynamic_embedding.Variable.upsert/lookup`) when TFRA is importable;
* lookup of ours against `tf.gather` of random rows from a dense `[N, dim]`
  `tf.Variable` (the lookup reference: an embedding table with no hashing at all),
  the two alternating call by call over `--lookup-passes` passes (default 20), every
  call timed on its own; the ratio is the median over call pairs of gather's time over
  ours', printed with its spread (per-call-pair and per-pass ratios: min, quartiles,
  max).

Every op runs in a `tf.function` called once per batch on pre-built tensors; the
timing loop never calls `.numpy()` (CPU eager function calls return when the
kernel is done). The insert, upsert and each table's own lookup figures are the best
of `--repeats` passes after a warm-up pass; each insert pass starts from a fresh
empty table. The cost of one call on an empty batch (the fixed per-batch cost of a
tf.function call) is printed too.

Then, for `de.HashTable` only:

* growth: `--growth-keys` new keys inserted into one unbounded table (dim 8 for
  the target; also dim 64), with the rate of every window of 1M (2**20) keys, the
  ratio rate(0 -> 1M) / rate(1M -> end), page faults and system CPU time;
* memory: the process's resident-set growth (VmRSS) over those inserts divided by
  the table size, at dim 8 and (when the memory is there) dim 64, beside the raw
  payload (8-byte key + 4 * dim bytes of values). When the pybind module
  `tensorflow_dynemb._core` is available, the core's own `memory_bytes()` for the
  same load is printed too. Each dim's growth/memory run happens in a fresh child
  process (same script, same flags): in a process that has already freed memory, a
  new table can reuse pages that were resident before it was created, and the RSS
  delta comes out too small.

* bounded: a `de.HkvHashTable` (LRU) of `max_capacity` = `--keys` at dim 8: insert of
  `--keys` new keys below max_capacity, then of `--keys` more into the full table, each
  of which evicts the entry of lowest score (`--no-bounded` skips it). No target: the
  ratio shows what eviction costs.

Targets (PASS/FAIL): lookup >= 0.8 x gather at every dim (the alternating
comparison's ratio); insert (new keys) and
upsert >= 10 x TFRA and >= DenseHashTable; growth ratio <= 2; bytes/key <= 1.3 x
payload. Results go to a JSON file (machine, TF version, load average, figures).

`--thread-scaling 1,2` re-runs the throughput part in one child process per
intra-op thread count (the thread count of a TF process is fixed once TF starts).

`--lookup-only` (e.g. with `--keys 10485760`, where rows no longer fit in the cache)
measures only the lookup target: one table of `--keys` keys per dim, filled once, and
lookups of all its keys alternating batch by batch with `tf.gather` of all rows of a
dense `[keys, dim]` variable (the same comparison, `--lookup-passes` passes), PASS/FAIL,
and a JSON record
(`benchmarks/results/table_ops_lookup_<keys>_tf<version>.json`) written through
`_harness`.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import loadavg, median, write_record  # noqa: E402

MIB = 1 << 20
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min
# DenseHashTable reserves two key values; the key sets below never contain them.
DHT_EMPTY_KEY = INT64_MAX
DHT_DELETED_KEY = INT64_MAX - 1


# -- machine ------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _proc_status_kb(field: str, path: str = "/proc/self/status") -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in {path}")


def rss_bytes(field: str = "VmRSS") -> int:
    """Resident memory of this process (VmRSS; RssAnon: its anonymous part, i.e. without
    mapped library files, whose pages the kernel may drop or fault in at any time)."""
    return _proc_status_kb(field) * 1024


def mem_available_bytes() -> int:
    return _proc_status_kb("MemAvailable", "/proc/meminfo") * 1024


_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL("libc.so.6")
    return _LIBC


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def malloc_free_bytes():
    """Bytes glibc malloc holds free in its arenas (mallinfo2's fordblks, all arenas):
    memory the process's RSS may include although nothing uses it. None without glibc
    2.33+."""
    try:
        mallinfo2 = _libc().mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().fordblks)


def release_freed_memory() -> None:
    """Collects garbage and hands freed heap pages back to the OS (glibc malloc_trim),
    so that the RSS measured before a table is created does not include pages a later
    allocation could silently reuse."""
    gc.collect()
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        pass


# -- inputs -------------------------------------------------------------------------------


def random_keys(n: int, seed: int) -> np.ndarray:
    """`n` distinct random 64-bit ids (shuffled), none of them DenseHashTable's
    reserved empty/deleted keys."""
    rng = np.random.default_rng(seed)
    keys = np.empty(0, np.int64)
    while keys.size < n:
        more = rng.integers(INT64_MIN, INT64_MAX, size=n - keys.size + 64, dtype=np.int64,
                            endpoint=True)
        keys = np.unique(np.concatenate([keys, more]))
        keys = keys[(keys != DHT_EMPTY_KEY) & (keys != DHT_DELETED_KEY)]
    return rng.permutation(keys)[:n]


def split(array: np.ndarray, batch: int):
    return [array[i:i + batch] for i in range(0, len(array), batch)]


# -- the tables under test -----------------------------------------------------------------


class Impl:
    """One table implementation: creates empty tables and their per-batch functions."""

    name = ""

    def __init__(self, tf, dim: int):
        self.tf = tf
        self.dim = dim
        self.key_spec = tf.TensorSpec([None], tf.int64)
        self.value_spec = tf.TensorSpec([None, dim], tf.float32)

    def new_table(self):
        raise NotImplementedError

    def functions(self, table):
        """(insert_fn(keys, values), lookup_fn(keys) -> values), traced and warmed
        with an empty batch (which changes nothing in the table)."""
        tf = self.tf

        @tf.function(input_signature=[self.key_spec, self.value_spec])
        def insert_fn(keys, values):
            # Not returned (an Operation); tf.function runs stateful ops regardless.
            table.insert(keys, values)

        @tf.function(input_signature=[self.key_spec])
        def lookup_fn(keys):
            return table.lookup(keys)

        empty_keys = tf.zeros([0], tf.int64)
        insert_fn(empty_keys, tf.zeros([0, self.dim], tf.float32))
        lookup_fn(empty_keys)
        return insert_fn, lookup_fn


class Ours(Impl):
    name = "ours"

    def __init__(self, tf, dim, de):
        super().__init__(tf, dim)
        self.de = de

    def new_table(self):
        return self.de.HashTable(self.tf.int64, self.tf.float32, default_value=[0.0] * self.dim)


class DenseHashTable(Impl):
    name = "DenseHashTable"

    def new_table(self):
        tf = self.tf
        return tf.lookup.experimental.DenseHashTable(
            key_dtype=tf.int64, value_dtype=tf.float32,
            default_value=tf.zeros([self.dim], tf.float32),
            empty_key=DHT_EMPTY_KEY, deleted_key=DHT_DELETED_KEY)


class Tfra(Impl):
    name = "TFRA"

    def __init__(self, tf, dim, tfra_de):
        super().__init__(tf, dim)
        self.tfra_de = tfra_de

    def new_table(self):
        # The CPU table behind tfra.dynamic_embedding.Variable (its default kv_creator).
        return self.tfra_de.CuckooHashTable(
            key_dtype=self.tf.int64, value_dtype=self.tf.float32,
            default_value=self.tf.zeros([self.dim], self.tf.float32), checkpoint=False)


# -- measurements --------------------------------------------------------------------------


def timed_pass(fn, batches) -> dict:
    """One call of `fn` per batch (each batch: a tuple of arguments): wall seconds, and
    the process's minor page faults and user/system CPU seconds (all threads) meanwhile."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    for args in batches:
        fn(*args)
    seconds = time.perf_counter() - start
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"s": seconds, "minflt": r1.ru_minflt - r0.ru_minflt,
            "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime}


def call_overhead(fn, args, calls: int = 300) -> float:
    """Seconds per call of `fn` on an empty batch (best of 3): the fixed cost of one
    tf.function call and op launch, paid once per batch by every implementation."""
    for _ in range(20):
        fn(*args)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def summarize(n: int, op: str, passes) -> dict:
    """keys/s of the fastest pass, all passes' seconds, and the fastest pass's
    page faults and CPU time."""
    best = min(passes, key=lambda p: p["s"])
    return {op: n / best["s"], f"{op}_s": [p["s"] for p in passes],
            f"{op}_best_pass": {k: v for k, v in best.items() if k != "s"}}


def bench_table(impl: Impl, key_batches, value_batches, query_batches, repeats: int):
    """keys/s of insert (new keys), upsert (present keys) and lookup (shuffled)."""
    n = sum(int(k.shape[0]) for k in key_batches)
    insert_args = list(zip(key_batches, value_batches))
    # Warm-up: one full insert into a throwaway table (page cache, allocator, code).
    table = impl.new_table()
    insert_fn = impl.functions(table)[0]
    timed_pass(insert_fn, insert_args)
    del table, insert_fn
    release_freed_memory()

    insert_passes = []
    for _ in range(repeats):
        table = impl.new_table()
        insert_fn, lookup_fn = impl.functions(table)
        insert_passes.append(timed_pass(insert_fn, insert_args))
        if len(insert_passes) < repeats:
            del table, insert_fn, lookup_fn
            release_freed_memory()
    size = int(table.size())
    if size != n:
        raise RuntimeError(f"{impl.name}: size {size} after inserting {n} distinct keys")
    upsert_passes = [timed_pass(insert_fn, insert_args) for _ in range(repeats)]
    lookup_args = [(q,) for q in query_batches]
    timed_pass(lookup_fn, lookup_args)  # warm-up
    lookup_passes = [timed_pass(lookup_fn, lookup_args) for _ in range(repeats)]
    # Spot check: the last batch's values came back.
    got = lookup_fn(key_batches[-1]).numpy()
    if not np.array_equal(got, value_batches[-1].numpy()):
        raise RuntimeError(f"{impl.name}: lookup returned wrong values")
    empty_keys = key_batches[0][:0]
    overhead = {"insert": call_overhead(insert_fn, (empty_keys, value_batches[0][:0])),
                "lookup": call_overhead(lookup_fn, (empty_keys,))}
    del table, insert_fn, lookup_fn
    release_freed_memory()
    result = summarize(n, "insert_new", insert_passes)
    result.update(summarize(n, "upsert", upsert_passes))
    result.update(summarize(n, "lookup", lookup_passes))
    result["empty_call_s"] = overhead
    return result


def bench_bounded(tf, de, n: int, batch: int, repeats: int, seed: int) -> dict:
    """keys/s of inserting n new keys into an LRU HkvHashTable of max_capacity n (dim 8),
    then n more new keys into the full table (each evicts one); a fresh table per pass."""
    dim = 8
    fill = [tf.constant(b) for b in split(random_keys(n, seed + 100), batch)]
    values = [tf.zeros([int(k.shape[0]), dim], tf.float32) for k in fill]
    fill_passes, evict_passes = [], []
    for r in range(repeats + 1):  # the first pass warms up
        table = de.HkvHashTable(tf.int64, tf.float32, [0.0] * dim, init_capacity=n,
                                max_capacity=n, checkpoint=False)
        insert_fn = Impl(tf, dim).functions(table)[0]
        more = [tf.constant(b) for b in split(random_keys(n, seed + 101 + r), batch)]
        fill_pass = timed_pass(insert_fn, list(zip(fill, values)))
        evict_pass = timed_pass(insert_fn, list(zip(more, values)))
        stats = {k: int(v.numpy()) for k, v in table.stats().items() if k != "load_factor"}
        if stats["size"] != n or stats["evictions"] != n:
            raise RuntimeError(f"HkvHashTable: size {stats['size']}, evictions "
                               f"{stats['evictions']} after 2 x {n} keys into {n}")
        if r > 0:
            fill_passes.append(fill_pass)
            evict_passes.append(evict_pass)
        del table, insert_fn, more
        release_freed_memory()
    result = summarize(n, "insert_below_max", fill_passes)
    result.update(summarize(n, "insert_full_evicting", evict_passes))
    return result


def make_gather(tf, n: int, dim: int, batch: int, seed: int):
    """(params, gather_fn, row batches): a dense [n, dim] float32 Variable (random
    normal, drawn by TF so no NumPy copy of it exists), a tf.function gathering rows of
    it, and every row index once in shuffled batches of `batch`."""
    rng = np.random.default_rng(seed)
    params = tf.Variable(tf.random.stateless_normal([n, dim], seed=[seed, dim]))
    rows = [(tf.constant(r),) for r in split(rng.permutation(n).astype(np.int64), batch)]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def gather_fn(idx):
        return tf.gather(params, idx)

    return params, gather_fn, rows


def bench_gather(tf, n: int, dim: int, batch: int, repeats: int, seed: int):
    """keys/s of tf.gather of random rows (the same batch size) from a [n, dim] Variable."""
    params, gather_fn, rows = make_gather(tf, n, dim, batch, seed)
    timed_pass(gather_fn, rows)  # warm-up (and trace)
    passes = [timed_pass(gather_fn, rows) for _ in range(repeats)]
    overhead = call_overhead(gather_fn, (rows[0][0][:0],))
    del params, gather_fn
    release_freed_memory()
    result = summarize(n, "lookup", passes)
    result["empty_call_s"] = {"lookup": overhead}
    return result


def alternate_calls(first_fn, first_batches, second_fn, second_batches, passes: int):
    """Calls `first_fn` and `second_fn` alternately, batch by batch (first, second, first,
    ...), for `passes` passes over the batches after one warm-up pass, timing every call on
    its own. A burst of another job's work (this machine is shared) then lands on both
    alike, and one slow call moves a median by nothing. Returns each side's per-call
    seconds (all passes, in call order) and per-pass sums."""
    for (a,), (b,) in zip(first_batches, second_batches):  # warm-up
        first_fn(a)
        second_fn(b)
    calls = ([], [])
    sums = ([], [])
    for _ in range(passes):
        s0 = s1 = 0.0
        for (a,), (b,) in zip(first_batches, second_batches):
            t0 = time.perf_counter()
            first_fn(a)
            t1 = time.perf_counter()
            second_fn(b)
            t2 = time.perf_counter()
            calls[0].append(t1 - t0)
            calls[1].append(t2 - t1)
            s0 += t1 - t0
            s1 += t2 - t1
        sums[0].append(s0)
        sums[1].append(s1)
    return calls, sums


def quartiles(xs):
    """(min, first quartile, median, third quartile, max) of `xs`."""
    q = np.percentile(np.asarray(xs, np.float64), [0, 25, 50, 75, 100])
    return tuple(float(v) for v in q)


def bench_lookup_vs_gather(tf, de, n: int, dim: int, batch: int, passes: int, seed: int):
    """The lookup target: lookup of all n keys of one full `de.HashTable` (shuffled
    batches) beside `tf.gather` of all n rows of a dense [n, dim] Variable (shuffled, same
    batch size), alternating call by call (`alternate_calls`) for `passes` passes.

    The ratio is the median over call pairs of gather's call time over ours' (the same
    keys per call): with batches of 65,536 keys a call takes 1-3 ms, so a whole pass at
    1M keys is only 16 calls, and a best-of-3 of such passes, each side measured on its
    own, moved between 0.45 and 1.57 x on this shared machine. A pair's two calls run
    back to back, so they see about the same load; under a load of 5 on 2 cores (one
    build, three processes, dims 8 and 64) the ratio of the two sides' median calls
    still moved between 0.39 and 0.82 where the pairs' median stayed within 0.69-0.72.
    Printed beside it: each side's median call
    (keys/s), the per-pass ratios (sum of gather's call times over ours') and the pair
    ratios, as (min, quartiles, max). The table is filled first (its insert rate is
    reported, no target)."""
    keys = random_keys(n, seed)
    key_batches = [tf.constant(b) for b in split(keys, batch)]
    rng = np.random.default_rng(seed + dim)
    # A pool of distinct value batches, cycled: no [n, dim] array of values is needed.
    pool = [tf.constant(rng.standard_normal((batch, dim), np.float32))
            for _ in range(min(16, len(key_batches)))]
    ours = Ours(tf, dim, de)
    table = ours.new_table()
    insert_fn, lookup_fn = ours.functions(table)
    fill_args = [(k, pool[i % len(pool)][:int(k.shape[0])]) for i, k in enumerate(key_batches)]
    fill = timed_pass(insert_fn, fill_args)
    size = int(table.size())
    if size != n:
        raise RuntimeError(f"size {size} after inserting {n} distinct keys")
    queries = [(tf.constant(b),) for b in split(rng.permutation(keys), batch)]
    del keys
    params, gather_fn, rows = make_gather(tf, n, dim, batch, seed)
    (ours_calls, gather_calls), (ours_sums, gather_sums) = alternate_calls(
        lookup_fn, queries, gather_fn, rows, passes)
    # Spot check: the last inserted batch reads back its values.
    if not np.array_equal(lookup_fn(fill_args[-1][0]).numpy(), fill_args[-1][1].numpy()):
        raise RuntimeError("lookup returned wrong values")
    del table, insert_fn, lookup_fn, params, gather_fn, rows, queries, fill_args, pool
    release_freed_memory()
    # Keys per call, in call order (the last batch of a pass may be short).
    sizes = [min(batch, n - i) for i in range(0, n, batch)] * passes
    ours_rates = [k / s for k, s in zip(sizes, ours_calls)]
    gather_rates = [k / s for k, s in zip(sizes, gather_calls)]
    pairs = quartiles([g / o for o, g in zip(ours_calls, gather_calls)])
    return {"keys": n, "dim": dim, "batch": batch, "passes": passes,
            "insert_new": n / fill["s"], "insert_new_pass": fill,
            "ours": {"lookup": median(ours_rates), "call_s": ours_calls},
            "gather": {"lookup": median(gather_rates), "call_s": gather_calls},
            "ratio": pairs[2],
            "pass_ratios": [g / o for o, g in zip(ours_sums, gather_sums)],
            "pair_ratio_quartiles": pairs}


def lookup_line(res) -> str:
    """One line of the lookup comparison: rates, ratio and its spread."""
    passes = quartiles(res["pass_ratios"])
    pairs = res["pair_ratio_quartiles"]
    return (f"{res['dim']:>4d} {mkeys(res['ours']['lookup']):>8s} "
            f"{mkeys(res['gather']['lookup']):>10s} {res['ratio']:>8.2f}   "
            f"{pairs[0]:.2f} [{pairs[1]:.2f} {pairs[2]:.2f} {pairs[3]:.2f}] {pairs[4]:.2f}   "
            f"{passes[0]:.2f} [{passes[1]:.2f} {passes[2]:.2f} {passes[3]:.2f}] {passes[4]:.2f}")


LOOKUP_HEADER = (f"{'dim':>4s} {'ours':>8s} {'tf.gather':>10s} {'ratio':>8s}   "
                 "per call pair: min [quartiles] max     per pass: min [quartiles] max\n"
                 "     (M keys/s of each side's median call; ratio: the median pair's "
                 "gather time / ours)")


def lookup_only(args, tf, de, dims) -> None:
    """`--lookup-only`: the lookup target (>= 0.8 x tf.gather) at `--keys` keys, each dim
    in turn; prints the figures and PASS/FAIL and writes the record through _harness."""
    load_start = loadavg()
    print(f"lookup vs tf.gather: {args.keys} keys, dims {args.dims}, batches of {args.batch}, "
          f"{args.threads} intra-op threads, {args.lookup_passes} passes, calls alternating; "
          f"load average {load_start}", flush=True)
    results, targets = {}, []
    for dim in dims:
        print(f"  dim {dim}: filling {args.keys} keys, then lookup / gather passes ...",
              flush=True)
        res = bench_lookup_vs_gather(tf, de, args.keys, dim, args.batch, args.lookup_passes,
                                     args.seed)
        results[f"dim{dim}"] = res
        ok = res["ratio"] >= 0.8
        targets.append({"target": f"dim{dim} lookup >= 0.8 x tf.gather at {args.keys} keys",
                        "value": res["ratio"], "limit": 0.8, "pass": ok})
    print(f"\n== lookup at {args.keys} keys: ours / tf.gather, calls alternating ==")
    print(LOOKUP_HEADER)
    for res in results.values():
        print(lookup_line(res))
    print("\n== targets ==")
    for t in targets:
        print(f"  {'PASS' if t['pass'] else 'FAIL'}  {t['target']}: {t['value']:.2f}")
    print(f"load average: {load_start} at the start, {loadavg()} at the end")
    if not args.no_out:
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                       f"table_ops_lookup_{args.keys}_tf{tf.__version__}.json")
        write_record(out, "table_ops_lookup", tf.__version__, load_start,
                     cpu_model=cpu_model(), intra_op_threads=args.threads, inter_op_threads=1,
                     keys=args.keys, batch=args.batch, passes=args.lookup_passes,
                     de_file=de.__file__, results=results, targets=targets)


def bench_growth(tf, ours: Ours, key_batches, value_pool, window: int):
    """Inserts every batch into one fresh table; returns rates per window of keys and
    the RSS growth. `key_batches` and `value_pool` are built before this is called, so
    the RSS delta is the table's (plus allocator slack)."""
    release_freed_memory()
    rss_before, anon_before = rss_bytes(), rss_bytes("RssAnon")
    table = ours.new_table()
    insert_fn = ours.functions(table)[0]
    times = []
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for i, keys in enumerate(key_batches):
        start = time.perf_counter()
        insert_fn(keys, value_pool[i % len(value_pool)])
        times.append(time.perf_counter() - start)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    size = int(table.size())
    rss_after, anon_after = rss_bytes(), rss_bytes("RssAnon")
    del table, insert_fn
    release_freed_memory()
    rss_after_free = rss_bytes()

    counts = np.array([int(k.shape[0]) for k in key_batches])
    ends = np.cumsum(counts)
    secs = np.array(times)
    windows = []
    start_keys = 0
    while start_keys < ends[-1]:
        stop = start_keys + window
        mask = (ends > start_keys) & (ends <= stop)
        if not mask.any():
            break
        keys_in = int(counts[mask].sum())
        windows.append({"from": start_keys, "to": int(ends[mask][-1]),
                        "rate": keys_in / float(secs[mask].sum())})
        start_keys = int(ends[mask][-1])
    first = ends <= window
    rest = ~first
    growth = {
        "keys": int(ends[-1]),
        "size": size,
        "windows": windows,
        "rate_first": float(counts[first].sum() / secs[first].sum()),
        "rate_rest": float(counts[rest].sum() / secs[rest].sum()) if rest.any() else None,
        "total_s": float(secs.sum()),
        "minflt": r1.ru_minflt - r0.ru_minflt,
        "user_s": r1.ru_utime - r0.ru_utime,
        "sys_s": r1.ru_stime - r0.ru_stime,
    }
    if growth["rate_rest"]:
        growth["ratio"] = growth["rate_first"] / growth["rate_rest"]
    # rss_after_free - rss_before (~0) shows that freed memory went back to the OS, so
    # the next measurement does not start on reusable resident pages.
    memory = {"rss_delta": rss_after - rss_before, "size": size,
              "rss_anon_delta": anon_after - anon_before,
              "rss_after_free_minus_before": rss_after_free - rss_before}
    return growth, memory


def core_memory(dim: int, keys: np.ndarray, batch: int, threads: int):
    """The pybind core's own `memory_bytes()` after inserting `keys` (or None)."""
    try:
        from tensorflow_dynemb import _core
    except ImportError:
        return None
    table = _core.Table("int64", "float32", dim=dim, num_threads=threads)
    values = np.ones((batch, dim), np.float32)
    for b in split(keys, batch):
        table.insert(b, values[:len(b)])
    result = {"memory_bytes": int(table.memory_bytes()), "size": int(table.size())}
    del table
    release_freed_memory()
    return result


# -- reporting ----------------------------------------------------------------------------


def mkeys(rate):
    return "n/a" if rate is None else f"{rate / 1e6:7.2f}"


def ratio_str(ours, ref):
    return "" if not ours or not ref else f" (ours/ref {ours / ref:5.2f}x)"


def print_dim(dim: int, res: dict):
    print(f"\n== dim {dim}: keys/s in millions (best of {res['repeats']}) ==")
    ours = res["ours"]
    print(f"{'op':18s} {'ours':>8s}   {'DenseHashTable':>30s}   {'TFRA CuckooHashTable':>30s}"
          f"   {'tf.gather':>30s}")
    for op in ("insert_new", "upsert", "lookup"):
        cells = []
        for ref in ("DenseHashTable", "TFRA", "gather"):
            r = res.get(ref)
            if r is None or op not in r:
                cells.append(f"{'-':>30s}")
            else:
                # gather's lookup is the alternating comparison's median call: its
                # ratio is printed below, not against ours' best pass alone.
                ratio = "" if ref == "gather" else ratio_str(ours[op], r[op])
                cells.append(f"{mkeys(r[op]) + ratio:>30s}")
        print(f"{op:18s} {mkeys(ours[op]):>8s}   " + "   ".join(cells))
    calls = []
    for name in ("ours", "DenseHashTable", "TFRA", "gather"):
        if res.get(name) and "empty_call_s" in res[name]:
            calls.append(name + " " + "/".join(
                f"{res[name]['empty_call_s'][k] * 1e6:.0f}" for k in ("insert", "lookup")
                if k in res[name]["empty_call_s"]))
    print("empty-batch call, microseconds (insert/lookup): " + ", ".join(calls))
    lvg = res["lookup_vs_gather"]
    print(f"lookup vs tf.gather, {lvg['passes']} passes, calls alternating (the target's "
          "figure; the table's lookup column is ours' best pass alone):")
    print(LOOKUP_HEADER)
    print(lookup_line(lvg))


def evaluate_targets(results: dict):
    targets = []

    def add(name, value, limit, ok, note=""):
        targets.append({"target": name, "value": value, "limit": limit,
                        "pass": bool(ok) if value is not None else None, "note": note})

    for dim_key, res in results["throughput"].items():
        ours = res["ours"]
        v = res["lookup_vs_gather"]["ratio"]
        add(f"{dim_key} lookup >= 0.8 x tf.gather (median call pair, alternating)", v, 0.8,
            v >= 0.8)
        for op in ("insert_new", "upsert"):
            t = res.get("TFRA")
            if t:
                v = ours[op] / t[op]
                add(f"{dim_key} {op} >= 10 x TFRA", v, 10.0, v >= 10.0)
            else:
                add(f"{dim_key} {op} >= 10 x TFRA", None, 10.0, None, "TFRA not installed")
            d = res.get("DenseHashTable")
            if d:
                v = ours[op] / d[op]
                add(f"{dim_key} {op} >= DenseHashTable", v, 1.0, v >= 1.0)
    growth = results.get("growth")
    if growth and growth.get("ratio") is not None:
        add("growth rate(0-1M) / rate(1M-end) <= 2", growth["ratio"], 2.0, growth["ratio"] <= 2.0)
    for dim_key, m in results.get("memory", {}).items():
        v = m["bytes_per_key"] / m["payload"]
        add(f"{dim_key} bytes/key <= 1.3 x payload", v, 1.3, v <= 1.3)
    return targets


def growth_child(args, tf, de, dim: int) -> dict:
    """The growth + memory measurement at `dim`, meant to run in a fresh process: a heap
    that has freed nothing yet cannot hand the table resident pages that were counted
    in the "before" RSS, which would make the RSS delta too small."""
    gkeys = random_keys(args.growth_keys, args.seed + 100)
    gkey_batches = [tf.constant(b) for b in split(gkeys, args.batch)]
    rng = np.random.default_rng(args.seed + 1000 + dim)
    # A pool of distinct value batches, cycled (all batches have the same size).
    pool = [tf.constant(rng.standard_normal((args.batch, dim), np.float32))
            for _ in range(min(16, len(gkey_batches)))]
    # Warm-up on a small throwaway table: loads the kernels, starts the thread pools.
    ours = Ours(tf, dim, de)
    table = ours.new_table()
    insert_fn, lookup_fn = ours.functions(table)
    warm = tf.constant(random_keys(args.batch, args.seed + 200))
    insert_fn(warm, pool[0])
    lookup_fn(warm)
    del table, insert_fn, lookup_fn, warm
    growth, mem = bench_growth(tf, ours, gkey_batches, pool, args.growth_window)
    payload = 8 + 4 * dim
    mem.update({"bytes_per_key": mem["rss_delta"] / mem["size"], "payload": payload,
                "floor_key_score_values": 16 + 4 * dim})
    del pool, gkey_batches
    release_freed_memory()
    core = core_memory(dim, gkeys, args.batch, args.threads)
    if core:
        mem["core_memory_bytes"] = core["memory_bytes"]
        mem["core_bytes_per_key"] = core["memory_bytes"] / core["size"]
    return {"growth": growth, "memory": mem}


def print_growth(dim: int, growth: dict, mem: dict, window: int):
    w_m = f"{window / MIB:g}M"
    print(f"dim {dim} insert rate per window of {window} keys (M keys/s):")
    for w in growth["windows"]:
        print(f"  {w['from'] / MIB:5.1f}M -> {w['to'] / MIB:5.1f}M: {mkeys(w['rate'])}")
    print(f"  0 -> {w_m} {mkeys(growth['rate_first'])}, {w_m} -> {growth['keys'] / MIB:g}M "
          f"{mkeys(growth['rate_rest'])}; ratio {growth.get('ratio', float('nan')):.2f}"
          + (" (target <= 2)" if dim == 8 else " (no target)")
          + f"; {growth['total_s']:.2f} s, {growth['minflt']} minor page faults, "
          f"{growth['sys_s']:.2f} s system CPU")
    payload = mem["payload"]
    line = (f"dim {dim}: RSS +{mem['rss_delta'] / MIB:.1f} MiB for {mem['size']} keys = "
            f"{mem['bytes_per_key']:.1f} B/key (RssAnon: "
            f"{mem['rss_anon_delta'] / mem['size']:.1f}); payload {payload} B "
            f"-> {mem['bytes_per_key'] / payload:.2f}x (target <= 1.3x; key+score+values "
            f"floor {16 + 4 * dim} B = {(16 + 4 * dim) / payload:.2f}x)")
    if "core_bytes_per_key" in mem:
        line += (f"; core memory_bytes() {mem['core_bytes_per_key']:.1f} B/key "
                 f"({mem['core_bytes_per_key'] / payload:.2f}x)")
    print(line, flush=True)


# -- main ---------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1 << 20, help="keys per throughput table")
    p.add_argument("--dims", default="8,64", help="comma-separated value dims")
    p.add_argument("--batch", type=int, default=65536, help="keys per op call")
    p.add_argument("--growth-keys", type=int, default=10 * (1 << 20),
                   help="keys inserted by the growth/memory run (0: skip it)")
    p.add_argument("--growth-window", type=int, default=1 << 20,
                   help="keys per reported growth window")
    p.add_argument("--memory-dims", default="8,64",
                   help="dims whose bytes/key is measured after --growth-keys inserts")
    p.add_argument("--threads", type=int, default=usable_cores(),
                   help="intra-op threads (default: all usable cores); inter-op is 1")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed passes of insert and upsert (and of each table's lookup "
                        "alone); the best counts")
    p.add_argument("--lookup-passes", type=int, default=20,
                   help="passes of the lookup-vs-tf.gather comparison (calls alternating; "
                        "the median pair's ratio counts)")
    p.add_argument("--no-tfra", action="store_true", help="skip TFRA even if installed")
    p.add_argument("--no-dense-hash-table", action="store_true", help="skip DenseHashTable")
    p.add_argument("--no-bounded", action="store_true",
                   help="skip the bounded (HkvHashTable, evicting) measurement")
    p.add_argument("--thread-scaling", nargs="?", const="1,2", default=None, metavar="LIST",
                   help="also run the throughput part at these intra-op thread counts "
                        "(one child process each; default list 1,2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lookup-only", action="store_true",
                   help="only the lookup-vs-tf.gather comparison at --keys keys (e.g. "
                        "10485760), batches interleaved; JSON table_ops_lookup_<keys>_tf<v>.json")
    p.add_argument("--growth-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None,
                   help="JSON results (default: benchmarks/results/table_ops_tf<version>.json)")
    p.add_argument("--no-out", action="store_true", help="write no JSON file")
    return p.parse_args(argv)


def run_child(args, extra, what):
    """Runs this script in a child process with the shared flags plus `extra`; returns
    the JSON it writes."""
    path = f"/tmp/table_ops_child_{os.getpid()}.json"
    cmd = [sys.executable, os.path.abspath(__file__), "--keys", str(args.keys),
           "--dims", args.dims, "--batch", str(args.batch),
           "--growth-keys", str(args.growth_keys), "--growth-window", str(args.growth_window),
           "--threads", str(args.threads), "--repeats", str(args.repeats),
           "--lookup-passes", str(args.lookup_passes),
           "--seed", str(args.seed), "--out", path] + list(extra)
    if args.no_tfra:
        cmd.append("--no-tfra")
    if args.no_dense_hash_table:
        cmd.append("--no-dense-hash-table")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise RuntimeError(f"child process ({what}) failed: {' '.join(cmd)}")
    with open(path) as f:
        child = json.load(f)
    os.remove(path)
    return child


def thread_scaling(args, counts):
    """Runs the throughput part once per thread count in a child process."""
    out = {}
    for threads in counts:
        print(f"\n-- thread scaling: {threads} intra-op thread(s) (child process) --", flush=True)
        child = run_child(args, ["--threads", str(threads), "--growth-keys", "0"],
                          f"{threads} threads")
        out[str(threads)] = child["throughput"]
    print("\n== thread scaling: keys/s in millions (ours; ref in brackets) ==")
    print(f"{'threads':>7s} {'dim':>4s} {'insert_new':>10s} {'upsert':>8s} {'lookup':>8s}"
          f" {'[gather]':>9s} {'[TFRA ins]':>10s} {'[DHT ins]':>9s}")
    for threads, per_dim in out.items():
        for dim_key, res in per_dim.items():
            o = res["ours"]
            extra = [res.get("gather", {}).get("lookup"), res.get("TFRA", {}).get("insert_new"),
                     res.get("DenseHashTable", {}).get("insert_new")]
            print(f"{threads:>7s} {dim_key[3:]:>4s} {mkeys(o['insert_new']):>10s} "
                  f"{mkeys(o['upsert']):>8s} {mkeys(o['lookup']):>8s} "
                  f"{mkeys(extra[0]):>9s} {mkeys(extra[1]):>10s} {mkeys(extra[2]):>9s}")
    return out


def main(argv=None):
    args = parse_args(argv)
    dims = [int(d) for d in args.dims.split(",") if d]
    memory_dims = [int(d) for d in args.memory_dims.split(",") if d]

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    # Must happen before TF runs any op (the thread pools are created once).
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    tf.get_logger().setLevel("ERROR")  # retracing notes from the per-table functions

    import tensorflow_dynemb as de

    if args.lookup_only:
        lookup_only(args, tf, de, dims)
        return

    if args.growth_child is not None:  # internal: one growth/memory measurement
        with open(args.out, "w") as f:
            json.dump(growth_child(args, tf, de, args.growth_child), f)
        return

    tfra_de, tfra_version, tfra_note = None, None, None
    if not args.no_tfra:
        try:
            import tensorflow_recommenders_addons as tfra
            tfra_de = tfra.dynamic_embedding
            tfra_version = getattr(tfra, "__version__", "unknown")
        except ImportError as e:  # not installed (TF 2.16 only) or built for another TF
            tfra_note = f"TFRA not installed ({e})"
            print(tfra_note)

    load_start = os.getloadavg()
    info = {
        "benchmark": "benchmarks/table_ops.py",
        "argv": sys.argv[1:] if argv is None else list(argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tf_version": tf.__version__,
        "tfra_version": tfra_version,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "mem_total_gib": round(_proc_status_kb("MemTotal", "/proc/meminfo") / MIB, 1),
        "intra_op_threads": args.threads,
        "inter_op_threads": 1,
        "keys": args.keys,
        "batch": args.batch,
        "repeats": args.repeats,
        "loadavg_start": load_start,
        "de_file": de.__file__,
    }
    print(f"tensorflow {tf.__version__}; tensorflow_dynemb from {os.path.dirname(de.__file__)}; "
          f"TFRA {tfra_version or 'not installed'}")
    print(f"CPU: {info['cpu_model']}, {info['cores']} cores ({info['usable_cores']} usable); "
          f"intra-op threads {args.threads}, inter-op 1; load average {load_start[0]:.2f} "
          f"{load_start[1]:.2f} {load_start[2]:.2f}")
    print(f"{args.keys} random int64 keys, float32 values, batches of {args.batch}, "
          f"best of {args.repeats} after a warm-up")

    results = {"info": info, "throughput": {}}
    if tfra_note:
        info["tfra_note"] = tfra_note

    # ---- throughput at each dim ----
    keys = random_keys(args.keys, args.seed)
    key_batches = [tf.constant(b) for b in split(keys, args.batch)]
    query_batches = [tf.constant(b) for b in split(np.random.default_rng(args.seed + 1)
                                                   .permutation(keys), args.batch)]
    for dim in dims:
        rng = np.random.default_rng(args.seed + dim)
        value_batches = [tf.constant(rng.standard_normal((int(k.shape[0]), dim), np.float32))
                         for k in key_batches]
        res = {"repeats": args.repeats}
        impls = [Ours(tf, dim, de)]
        if not args.no_dense_hash_table:
            impls.append(DenseHashTable(tf, dim))
        if tfra_de is not None:
            impls.append(Tfra(tf, dim, tfra_de))
        for impl in impls:
            print(f"  dim {dim}: {impl.name} ...", flush=True)
            res[impl.name] = bench_table(impl, key_batches, value_batches, query_batches,
                                         args.repeats)
        print(f"  dim {dim}: lookup and tf.gather, alternating ...", flush=True)
        res["lookup_vs_gather"] = bench_lookup_vs_gather(tf, de, args.keys, dim, args.batch,
                                                         args.lookup_passes, args.seed)
        res["gather"] = {"lookup": res["lookup_vs_gather"]["gather"]["lookup"]}
        results["throughput"][f"dim{dim}"] = res
        print_dim(dim, res)
        del value_batches
        release_freed_memory()

    # ---- bounded table: below max_capacity, then full (every insert evicts) ----
    if not args.no_bounded:
        print(f"  bounded: HkvHashTable, max_capacity {args.keys}, dim 8 ...", flush=True)
        bounded = bench_bounded(tf, de, args.keys, args.batch, args.repeats, args.seed)
        results["bounded"] = bounded
        print(f"\n== bounded HkvHashTable (LRU), max_capacity {args.keys}, dim 8: Mkeys/s ==\n"
              f"insert, below max_capacity  {mkeys(bounded['insert_below_max']):>8s}\n"
              f"insert into the full table  {mkeys(bounded['insert_full_evicting']):>8s}"
              f" ({bounded['insert_full_evicting'] / bounded['insert_below_max']:.2f}x the rate "
              "below max_capacity; each insert evicts the lowest score)")

    # ---- growth and memory (ours), one fresh child process per dim ----
    if args.growth_keys % args.batch:
        raise SystemExit("--growth-keys must be a multiple of --batch")
    if args.growth_keys > 0:
        print(f"\n== growth and memory: {args.growth_keys} new keys into one unbounded "
              f"de.HashTable (a fresh child process per dim) ==", flush=True)
        results["memory"], results["growth_by_dim"] = {}, {}
        for dim in sorted(set(memory_dims) | {8}):
            need = args.growth_keys * (16 + 4 * dim) * 2
            if dim != 8 and mem_available_bytes() < need:
                print(f"dim {dim}: skipped, needs ~{need / 2**30:.1f} GiB available")
                continue
            child = run_child(args, ["--growth-child", str(dim)], f"growth dim {dim}")
            growth, mem = child["growth"], child["memory"]
            results["memory"][f"dim{dim}"] = mem
            results["growth_by_dim"][f"dim{dim}"] = growth
            if dim == 8:
                results["growth"] = growth  # the one the target applies to
            print_growth(dim, growth, mem, args.growth_window)

    if args.thread_scaling:
        counts = [int(t) for t in args.thread_scaling.split(",") if t]
        results["thread_scaling"] = thread_scaling(args, counts)

    info["loadavg_end"] = os.getloadavg()
    results["targets"] = evaluate_targets(results)
    print("\n== targets ==")
    for t in results["targets"]:
        verdict = {True: "PASS", False: "FAIL", None: "SKIP"}[t["pass"]]
        value = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        print(f"  {verdict}  {t['target']}: {value} {t['note']}".rstrip())
    print(f"load average at end: {info['loadavg_end'][0]:.2f} {info['loadavg_end'][1]:.2f} "
          f"{info['loadavg_end'][2]:.2f}")

    if not args.no_out:
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                       f"table_ops_tf{tf.__version__}.json")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(results, f, indent=1, sort_keys=False, default=float)
            f.write("\n")
        print(f"results: {out}")


if __name__ == "__main__":
    main()
