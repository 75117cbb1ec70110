#!/usr/bin/env python3
"""Side-by-side table of our GPU table and HKV, measured the same way on the same card.

    python benchmarks/hkv/compare.py OUT_DIR            # reads OUT_DIR/hkv.json and
                                                        # OUT_DIR/gpu_table_ops.json
    python benchmarks/hkv/compare.py --hkv A.json --ours B.json

hkv.json comes from benchmarks/hkv/run_hkv.sh (HKV's own test_one_api), gpu_table_ops.json
from benchmarks/gpu_table_ops.py (its "hkv_way" section: one 1M-key call timed, best of
two). Prints markdown: op, dim, load factor, % of the keys present, memory mode, ours and
HKV in G keys/s (1e9; HKV's own unit is 2^30 keys/s, converted), and ours / HKV.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"compare.py: cannot read {path}: {e}", file=sys.stderr)
        return None


def key(r):
    frac = 1.0 if r.get("mode", "pure_hbm") == "pure_hbm" else \
        r.get("hbm_fraction_requested", r.get("hbm_fraction"))
    return (r["api"], int(r["dim"]), round(float(r["load_factor"]), 2),
            round(float(r["hit_rate"]), 2), r.get("mode", "pure_hbm"), round(float(frac), 3))


def g(x):
    return "—" if x is None else f"{x / 1e9:.2f}"


def device_line(name, dev):
    if not dev:
        return f"* {name}: device unknown"
    bits = [str(dev.get("name", "?"))]
    if dev.get("driver"):
        bits.append(f"driver {dev['driver']}")
    for k in ("cuda_runtime", "cuda_driver_api"):
        if dev.get(k):
            bits.append(f"{k} {dev[k]}")
    return f"* {name}: " + ", ".join(bits)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?")
    parser.add_argument("--hkv")
    parser.add_argument("--ours")
    args = parser.parse_args(argv)
    if not (args.out_dir or (args.hkv and args.ours)):
        parser.error("give OUT_DIR or both --hkv and --ours")
    hkv = load(args.hkv or os.path.join(args.out_dir, "hkv.json")) or {}
    ours = load(args.ours or os.path.join(args.out_dir, "gpu_table_ops.json")) or {}

    theirs = {}
    for r in hkv.get("results", []):
        theirs[key(r)] = r
    mine = {}
    for r in (ours.get("hkv_way") or {}).get("results", []):
        if "hit_rate" in r:
            mine[key(r)] = r

    if hkv.get("skipped"):
        print(f"HKV: {hkv['skipped']}\n")
    hdev = dict(hkv.get("device") or {})
    if hkv.get("nvidia_smi") and "," in hkv["nvidia_smi"]:
        hdev["driver"] = hkv["nvidia_smi"].split(",")[1].strip()
    print(device_line("ours", ours.get("device")))
    print(device_line("HKV", hdev) + (f", HKV {hkv['hkv_commit'][:8]}"
                                       if hkv.get("hkv_commit") else ""))
    print()
    print("| op | dim | load | present | memory | ours | HKV | ours / HKV |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    order = {"find": 0, "insert_or_assign": 1, "assign": 2, "find_or_insert": 3}
    for k in sorted(set(theirs) | set(mine),
                    key=lambda k: (k[4] != "pure_hbm", -k[5], k[1], order.get(k[0], 9), k[2],
                                   k[3], k[0])):
        api, dim, lf, hit, mode, frac = k
        o, h = mine.get(k), theirs.get(k)
        ov = o.get("keys_per_s") if o else None
        hv = h.get("keys_per_s") if h else None
        if mode == "pure_hbm":
            memory = "HBM"
        else:
            eff = h.get("hbm_fraction") if h else None
            memory = f"{frac:.0%} rows in HBM"
            if eff is not None and abs(eff - frac) > 1e-3:
                memory += f" (HKV: {eff:.1%}, whole slices)"
        note = ""
        if o and o.get("status") not in (None, "ok"):
            note = f" ({o['status']})"
        if o and o.get("load_factor_actual") is not None and \
                abs(o["load_factor_actual"] - lf) > 0.005:
            note += f" (ours from load {o['load_factor_actual']:.3f})"
        ratio = f"{ov / hv:.2f}x" if ov and hv else "—"
        print(f"| {api}{note} | {dim} | {lf:.2f} | {hit:.0%} | {memory} | {g(ov)} | {g(hv)} "
              f"| {ratio} |")
    print()
    print("G keys/s = 1e9 keys/s; one call of "
          f"{(ours.get('args') or {}).get('batch', 1 << 20):,} keys timed, best of 2, on each "
          "side. HKV: its benchmark's test_one_api (benchmarks/hkv/side_by_side.cu); "
          "ours: benchmarks/gpu_table_ops.py, hkv_way section.")


if __name__ == "__main__":
    main()
