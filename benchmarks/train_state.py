"""Training state at scale: memory per key and checkpoint speed/size, ours beside TFRA.

    python benchmarks/train_state.py [--keys 10485760] [--dim 16] [--rounds 2]
        [--impls ours,tfra] [--no-floor] [--out benchmarks/results/train_state_tf<version>.json]

The state of an Adam-trained embedding of `--keys` keys: the parameter and Adam's two
slots (`m`, `v`), in each library's own layout, every variable holding the same keys.
Ours: the parameter `de.Variable(dim=16)` and the slot state `de.DynamicEmbeddingOptimizer`
makes for it (`tensorflow_dynemb/training/slots.py`: one `de.Variable` of dim 32 holding `[m | v]`
per key, checkpointed without scores). TFRA keeps each slot in a variable of the
parameter's class and table (made by its `create_slots`), so its state is three
`tfra.dynamic_embedding.get_variable`s (a `CuckooHashTable` on CPU). Every measurement
runs in a fresh child process; each round starts with the next library, so that every
one takes every place in the order.

- memory: bytes per key = (VmRSS after upserting the keys into the variables -
  VmRSS before) / keys, beside the raw payload (8-byte key + 3 x dim float32 = 200 B at
  dim 16). Keys and values are created before the "before" reading.
- checkpoint: `tf.train.Checkpoint(params=..., slots=...)` (TFRA: `params=..., m=...,
  v=...`) `.write(path)` of the filled variables, then `.read(path)` into empty
  variables of the same names in a
  fresh process (timed until their `size()` answers);
  keys/s = keys / seconds (each key carries its three rows), file size = the bytes of
  every file written, beside the payload. The restored sizes are checked. The save's
  peak memory beyond the state (VmHWM after the save - VmRSS before it, the peak reset
  first) says whether a save copies the state; the restore's peak (VmHWM after the
  restore - VmRSS before it) is the restored state plus what the restore held meanwhile
  (whole tensors, for a library that reads them before importing).
- Each child starts after `os.sync()`: a checkpoint of 10M keys is ~2 GB of dirty page
  cache, and once the machine's dirty pages pass ~10% of memory the kernel throttles the
  writer to the disk's speed (here 2.2 GB `dd` writes took 1.0 s with nothing dirty and
  3.9-6.6 s back to back), which would make a save's time depend on its predecessor.
- files (`--modes files`, ours only): the streaming file path instead of a checkpoint:
  each variable's `save_to_file_system(dir, file_name=name)` (every shard one file,
  checksummed, synced, committed by a manifest; `--file-sync 0`: unsynced, through the
  page cache), then `load_from_file_system` into
  empty variables in a fresh process (timed until their `size()` answers); keys/s and
  file bytes as for checkpoints. To compare two builds of the package, run this with
  each on PYTHONPATH in turn (the children inherit it).
- the writer's floor (`dense`, checkpoint mode only): dense `tf.Variable`s holding TFRA's
  bytes per key (an int64 key and a dim-wide float32 row for each of params, m and v),
  written and read through the same `tf.train.Checkpoint` calls. No table code runs, so
  it is what TF's checkpoint writer (`SaveV2`, one thread) and reader alone take for
  these bytes: a save or restore that hands TF whole tensors cannot be faster (the files
  must hold the bytes; the files target keeps them near the payload). The parent prints
  this floor's ratio to TFRA (the most such a save can reach) and ours to the floor.

Targets (issue): memory <= 0.5 x TFRA and <= 1.3 x payload; checkpoint throughput
>= 5 x TFRA (save and restore), files <= 1.1 x payload.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import loadavg, median, print_result, spawn_child, tfra_available, write_record  # noqa: E402



def _rss_bytes(field="VmRSS"):
    """This process's resident memory (`VmHWM`: its peak since `_reset_peak_rss`)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak_rss():
    """Restarts VmHWM from the current RSS (Linux clear_refs); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _make_vars(impl, dim, tag):
    """`{checkpoint name: variable}` of the training state, in the library's layout."""
    import tensorflow as tf

    if impl == "ours":
        import tensorflow_dynemb as de

        params = de.Variable(tf.int64, tf.float32, dim=dim, name=f"{tag}_params")
        optimizer = de.DynamicEmbeddingOptimizer(tf.keras.optimizers.Adam())
        # The slot state the first training step would create: Adam's m and v side by side.
        return {"params": params, "slots": optimizer._dynemb.state_of(params)}
    import tensorflow_recommenders_addons.dynamic_embedding as tfra_de

    return {
        s: tfra_de.get_variable(f"{tag}_{s}", key_dtype=tf.int64, value_dtype=tf.float32, dim=dim)
        for s in ("params", "m", "v")
    }


def _dense_vars(n, dim, keys=None, row=None):
    """The writer's floor: `{name: tf.Variable}` with TFRA's bytes per key, every row
    `row` tiled (zeros and key 0 when not given: a restore overwrites them)."""
    import tensorflow as tf

    keys = tf.zeros([n], tf.int64) if keys is None else keys
    rows = tf.zeros([n, dim]) if row is None else tf.tile(row, [-(-n // row.shape[0]), 1])[:n]
    variables = {}
    for s in ("params", "m", "v"):
        variables[f"{s}_keys"] = tf.Variable(keys, name=f"{s}_keys")
        variables[s] = tf.Variable(rows, name=s)
    return variables


def _sizes(variables):
    """Rows per variable (a table's size(); a dense variable's first dimension)."""
    return [int(var.size()) if hasattr(var, "size") else int(var.shape[0]) for var in variables.values()]


def run_child(args):
    import numpy as np
    import tensorflow as tf

    n, dim, batch = args.keys, args.dim, args.batch
    if args.mode == "restore":
        # The names (and, dense, the shapes) the checkpoint has.
        variables = _dense_vars(n, dim) if args.child == "dense" else _make_vars(args.child, dim, "state")
        rss0, peak_known = _rss_bytes(), _reset_peak_rss()
        t0 = time.perf_counter()
        tf.train.Checkpoint(**variables).read(os.path.join(args.ckpt_dir, "ckpt"))
        sizes = _sizes(variables)  # waits for the restore
        restore_s = time.perf_counter() - t0
        result = {
            "impl": args.child, "mode": "restore", "keys": n, "dim": dim, "tf": tf.__version__,
            "restore_seconds": restore_s, "restore_keys_per_s": n / restore_s,
            "restored_sizes": sizes, "restore_rss_delta_per_key": (_rss_bytes() - rss0) / n}
        if peak_known:  # the restored state plus whatever the restore held meanwhile
            result["restore_peak_bytes_per_key"] = (_rss_bytes("VmHWM") - rss0) / n
        print_result(result)
        return
    if args.mode == "files-restore":
        variables = _make_vars(args.child, dim, "state")
        rss0 = _rss_bytes()
        t0 = time.perf_counter()
        for name, var in variables.items():
            var.load_from_file_system(args.ckpt_dir, file_name=name)
        sizes = _sizes(variables)  # waits for the loads
        restore_s = time.perf_counter() - t0
        print_result({
            "impl": args.child, "mode": "files-restore", "keys": n, "dim": dim, "tf": tf.__version__,
            "restore_seconds": restore_s, "restore_keys_per_s": n / restore_s,
            "restored_sizes": sizes, "restore_rss_delta_per_key": (_rss_bytes() - rss0) / n})
        return
    rng = np.random.default_rng(0)
    keys = tf.constant(rng.integers(1, 2 ** 62, size=n, dtype=np.int64))
    values = tf.constant(rng.standard_normal((batch, dim), dtype=np.float32))
    if args.child == "dense":
        t0 = time.perf_counter()
        variables = _dense_vars(n, dim, keys, values)
        _write_checkpoint(args, variables, {"impl": "dense", "mode": args.mode, "keys": n, "dim": dim,
                                            "tf": tf.__version__, "fill_seconds": time.perf_counter() - t0,
                                            "sizes": _sizes(variables)})
        return
    variables = _make_vars(args.child, dim, "state")
    # Rows of each variable's width (ours: the slot state is 2 x dim wide).
    rows = {name: tf.tile(values, [1, var.dim // dim]) for name, var in variables.items()}
    # Touch every variable once (op library, kernels) before the baseline.
    for name, var in variables.items():
        var.upsert(keys[:1], rows[name][:1])
    result = {"impl": args.child, "mode": args.mode, "keys": n, "dim": dim, "tf": tf.__version__}
    rss0 = _rss_bytes()
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        k = keys[start : start + batch]
        for name, var in variables.items():
            var.upsert(k, rows[name][: tf.shape(k)[0]])
    fill_s = time.perf_counter() - t0
    rss1 = _rss_bytes()
    sizes = _sizes(variables)
    result.update(fill_seconds=fill_s, sizes=sizes)
    if args.mode == "memory":
        result.update(rss_before=rss0, rss_after=rss1, bytes_per_key=(rss1 - rss0) / sizes[0])
        print_result(result)
    elif args.mode == "files":
        _write_files(args, variables, result)
    else:
        _write_checkpoint(args, variables, result)


def _write_checkpoint(args, variables, result):
    """Times `tf.train.Checkpoint(**variables).write` into --ckpt-dir (which the parent
    hands to a fresh "restore" child) and prints `result` with the save's figures."""
    import tensorflow as tf

    n = args.keys
    ckpt = tf.train.Checkpoint(**variables)
    path = os.path.join(args.ckpt_dir, "ckpt")
    rss0, peak_known = _rss_bytes(), _reset_peak_rss()
    t0 = time.perf_counter()
    ckpt.write(path)
    save_s = time.perf_counter() - t0
    if peak_known:  # the memory a save needs beyond the state (an export's copy, buffers)
        result.update(save_peak_extra_bytes_per_key=(_rss_bytes("VmHWM") - rss0) / n)
    file_bytes = sum(
        os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(args.ckpt_dir) for f in files
    )
    result.update(save_seconds=save_s, save_keys_per_s=n / save_s, file_bytes=file_bytes,
                  file_bytes_per_key=file_bytes / n)
    print_result(result)


def _write_files(args, variables, result):
    """Times every variable's `save_to_file_system` into --ckpt-dir (the parent hands
    the directory to a fresh "files-restore" child) and prints `result`."""
    n = args.keys
    t0 = time.perf_counter()
    # --file-sync 0: page cache, unsynced, as saves were before generations (the
    # option does not exist in those builds: leave it at 1 there).
    sync = {} if args.file_sync else {"sync": False}
    for name, var in variables.items():
        var.save_to_file_system(args.ckpt_dir, file_name=name, **sync)
    save_s = time.perf_counter() - t0
    file_bytes = sum(
        os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(args.ckpt_dir) for f in files
    )
    result.update(save_seconds=save_s, save_keys_per_s=n / save_s, file_bytes=file_bytes,
                  file_bytes_per_key=file_bytes / n)
    print_result(result)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=10 * 1024 * 1024)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch", type=int, default=1 << 20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--impls", default=None)
    p.add_argument("--no-floor", dest="floor", action="store_false",
                   help="leave out the writer's floor (dense variables) in checkpoint mode")
    p.add_argument("--modes", default="memory,checkpoint")
    p.add_argument("--file-sync", type=int, default=1,
                   help="files mode: 0 saves unsynced, through the page cache (sync=False)")
    p.add_argument("--tmpdir", default=None, help="where checkpoints are written (default: $TMPDIR)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--mode", default="memory", help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        run_child(args)
        return

    tfra = tfra_available()
    impls = args.impls.split(",") if args.impls else (["ours", "tfra"] if tfra else ["ours"])
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    payload = 8 + 3 * args.dim * 4
    load_start = loadavg()
    runs = []
    for mode in args.modes.split(","):
        for r in range(args.rounds):
            mode_impls = impls + ["dense"] if mode == "checkpoint" and args.floor else impls
            if mode == "files":
                mode_impls = [i for i in mode_impls if i == "ours"]  # our file format only
            # Each round starts one later, so every child takes every place in turn: a
            # child's speed depends on what ran before it (memory the guest got back).
            shift = r % len(mode_impls)
            for impl in mode_impls[shift:] + mode_impls[:shift]:
                cmd = [sys.executable, os.path.abspath(__file__), "--child", impl,
                       "--keys", str(args.keys), "--dim", str(args.dim), "--batch", str(args.batch),
                       "--file-sync", str(args.file_sync)]
                ckpt_dir = tempfile.mkdtemp(prefix="dynemb_ckpt_", dir=args.tmpdir)
                # Every child starts with no dirty page cache: a save writes ~2 GB, and
                # the kernel throttles a writer to the disk's speed once the dirty pages
                # pass ~10% of memory, so a save right after another one's files (still
                # being written back) would time the disk instead of the library.
                os.sync()
                try:
                    res = spawn_child(cmd + ["--mode", mode, "--ckpt-dir", ckpt_dir], env)[0]
                    if res is not None and mode in ("checkpoint", "files"):
                        restore_mode = "restore" if mode == "checkpoint" else "files-restore"
                        restored = spawn_child(cmd + ["--mode", restore_mode, "--ckpt-dir", ckpt_dir], env)[0]
                        res = None if restored is None else {**res, **restored, "mode": mode}
                finally:
                    shutil.rmtree(ckpt_dir, ignore_errors=True)
                if res is None:
                    runs.append({"impl": impl, "mode": mode, "round": r, "error": True})
                    continue
                res.update(round=r, load_after=loadavg())
                runs.append(res)
                if mode == "memory":
                    print(f"{mode} round {r} {impl:5s}: {res['bytes_per_key']:.1f} B/key "
                          f"({res['bytes_per_key'] / payload:.2f}x payload {payload} B); "
                          f"fill {res['fill_seconds']:.1f} s", flush=True)
                elif mode == "files":
                    print(f"{mode} round {r} {impl:5s}: save {res['save_keys_per_s'] / 1e6:.2f} M keys/s "
                          f"({res['save_seconds']:.2f} s), load {res['restore_keys_per_s'] / 1e6:.2f} M keys/s "
                          f"({res['restore_seconds']:.2f} s), files {res['file_bytes_per_key']:.1f} B/key, "
                          f"restored {res['restored_sizes']}", flush=True)
                else:
                    print(f"{mode} round {r} {impl:5s}: save {res['save_keys_per_s'] / 1e6:.2f} M keys/s "
                          f"({res['save_seconds']:.2f} s, peak +{res.get('save_peak_extra_bytes_per_key', 0):.0f} B/key), restore {res['restore_keys_per_s'] / 1e6:.2f} M keys/s "
                          f"({res['restore_seconds']:.2f} s, peak {res.get('restore_peak_bytes_per_key', 0):.0f} B/key), files {res['file_bytes_per_key']:.1f} B/key "
                          f"({res['file_bytes_per_key'] / payload:.2f}x payload), restored {res['restored_sizes']}",
                          flush=True)

    import tensorflow as tf

    def ok(impl, mode):
        return [x for x in runs if x["impl"] == impl and x["mode"] == mode and "error" not in x]

    summary = {"payload_bytes_per_key": payload}
    for impl in impls + (["dense"] if args.floor else []):
        s = {}
        mem = ok(impl, "memory")
        if mem:
            s["bytes_per_key"] = sorted(x["bytes_per_key"] for x in mem)
        fl = ok(impl, "files")
        if fl:
            s["files_save_keys_per_s"] = sorted(x["save_keys_per_s"] for x in fl)
            s["files_load_keys_per_s"] = sorted(x["restore_keys_per_s"] for x in fl)
            s["files_bytes_per_key"] = sorted(x["file_bytes_per_key"] for x in fl)
        ck = ok(impl, "checkpoint")
        if ck:
            for field in ("save_keys_per_s", "restore_keys_per_s", "file_bytes_per_key",
                          "save_peak_extra_bytes_per_key", "restore_peak_bytes_per_key"):
                s[field] = sorted(x[field] for x in ck if field in x)
        summary[impl] = s
    verdicts = []

    def verdict(name, value, ok_):
        verdicts.append({"target": name, "value": value, "pass": bool(ok_)})
        print(f"{'PASS' if ok_ else 'FAIL'}  {name}: {value:.2f}")

    ours = summary.get("ours", {})
    if ours.get("bytes_per_key"):
        verdict("memory <= 1.3 x payload", median(ours["bytes_per_key"]) / payload,
                median(ours["bytes_per_key"]) <= 1.3 * payload)
    if ours.get("file_bytes_per_key"):
        verdict("checkpoint files <= 1.1 x payload", median(ours["file_bytes_per_key"]) / payload,
                median(ours["file_bytes_per_key"]) <= 1.1 * payload)
    ref = summary.get("tfra", {})
    if ours.get("bytes_per_key") and ref.get("bytes_per_key"):
        x = median(ours["bytes_per_key"]) / median(ref["bytes_per_key"])
        verdict("memory <= 0.5 x TFRA", x, x <= 0.5)
    def per_round_ratios(field, impl, reference):
        """`impl`'s figure over `reference`'s, per round (a round's children ran back to back)."""
        ratios = []
        for r in range(args.rounds):
            a = [x[field] for x in ok(impl, "checkpoint") if x["round"] == r]
            b = [x[field] for x in ok(reference, "checkpoint") if x["round"] == r]
            if a and b:
                ratios.append(a[0] / b[0])
        return sorted(ratios)

    def spread(ratios):
        return ", ".join(f"{v:.2f}" for v in ratios)

    floor = summary.get("dense", {})
    for field, label in (("save_keys_per_s", "save"), ("restore_keys_per_s", "restore")):
        if ours.get(field) and ref.get(field):
            ratios = per_round_ratios(field, "ours", "tfra")
            summary[f"{label}_ratio_per_round"] = ratios
            x = median(ratios)
            verdict(f"checkpoint {label} >= 5 x TFRA (per-round ratios {spread(ratios)})", x, x >= 5)
        if floor.get(field) and ref.get(field):
            # Not a target: the most any tf.train.Checkpoint save/restore of these bytes can reach.
            ratios = per_round_ratios(field, "dense", "tfra")
            summary[f"floor_{label}_ratio_per_round"] = ratios
            print(f"      writer's floor (dense variables, same bytes) / TFRA, {label}: "
                  f"{median(ratios):.2f} (per round {spread(ratios)})")
        if floor.get(field) and ours.get(field):
            ratios = per_round_ratios(field, "ours", "dense")
            summary[f"ours_to_floor_{label}_ratio_per_round"] = ratios
            print(f"      ours / writer's floor, {label}: {median(ratios):.2f} (per round {spread(ratios)})")
    summary["verdicts"] = verdicts
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"train_state_tf{tf.__version__}.json")
    write_record(out, "train_state", tf.__version__, load_start, runs=runs, summary=summary)


if __name__ == "__main__":
    main()
