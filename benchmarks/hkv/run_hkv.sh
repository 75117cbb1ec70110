#!/usr/bin/env bash
# Build and run benchmarks/hkv/side_by_side.cu (HKV's own benchmark functions, our driver)
# against the HKV snapshot in build/hkv_snapshot (scripts/hkv_snapshot.sh), on GPU 0.
#
#   bash benchmarks/hkv/run_hkv.sh OUT_DIR [driver flags, e.g. --quick]
#
# Writes OUT_DIR/hkv.json (the HKV_RESULT lines, plus card/driver/CUDA), OUT_DIR/hkv.log
# (raw output) and OUT_DIR/hkv_build.log. Exits 0 with a "skipped" hkv.json when there is
# no snapshot or no nvcc. Environment:
#   HKV_SNAPSHOT  snapshot dir (default build/hkv_snapshot)
#   HKV_BUILD     where the binary goes (default build/hkv_bench); a binary there whose
#                 recorded source hash matches is reused, so the compile can be skipped
#                 by carrying this folder too
#   HKV_ARCH      default 90 (H100/H200);   NVCC  default nvcc
#   HKV_TIMEOUT   seconds for the run (default 90; results printed before a timeout are
#                 kept);  HKV_BUILD_ONLY=1  compile only (no run)
set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:?usage: run_hkv.sh OUT_DIR [driver flags]}"
shift
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SNAP="${HKV_SNAPSHOT:-$REPO_ROOT/build/hkv_snapshot}"
BUILD="${HKV_BUILD:-$REPO_ROOT/build/hkv_bench}"
ARCH="${HKV_ARCH:-90}"
NVCC="${NVCC:-nvcc}"
TIMEOUT="${HKV_TIMEOUT:-90}"
SRC="$REPO_ROOT/benchmarks/hkv/side_by_side.cu"
BIN="$BUILD/side_by_side"

skip() {
  echo "run_hkv.sh: skipped: $1"
  python3 - "$OUT/hkv.json" "$1" <<'PY'
import json, sys
json.dump({"skipped": sys.argv[2], "results": []}, open(sys.argv[1], "w"), indent=2)
PY
  exit 0
}

[ -f "$SNAP/include/merlin_hashtable.cuh" ] && [ -f "$SNAP/benchmark/merlin_hashtable_benchmark.cc.cu" ] \
  || skip "no snapshot at $SNAP, run scripts/hkv_snapshot.sh"
COMMIT="$(cat "$SNAP/COMMIT" 2>/dev/null || echo unknown)"

# Flags after HKV's CMakeLists.txt (Release: -O3, C++17, -gencode per sm) plus
# --expt-relaxed-constexpr (HKV's Bazel build uses it too).
FLAGS=(-std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr
       -gencode "arch=compute_${ARCH},code=sm_${ARCH}"
       -I "$SNAP/include" -I "$SNAP" -I "$SNAP/benchmark"
       "-DHKV_COMMIT=\"$COMMIT\"")
# What the binary depends on (paths relative to the checkout, so that a binary built
# elsewhere and carried here in $HKV_BUILD is reused).
hash_now="$( (cat "$SRC"; echo "${FLAGS[*]//$REPO_ROOT/.}";
              find "$SNAP/include" "$SNAP/benchmark" -type f | LC_ALL=C sort | xargs cat) \
            | sha256sum | cut -d' ' -f1)"

# A carried binary is reused when its sources match and it can start CUDA here (its
# static CUDA runtime needs a driver at least as new as the nvcc that built it).
if [ -x "$BIN" ] && [ "$(cat "$BIN.hash" 2>/dev/null)" = "$hash_now" ] \
   && "$BIN" --probe > "$OUT/hkv_probe.log" 2>&1; then
  echo "run_hkv.sh: reusing $BIN (source hash matches; $(cat "$OUT/hkv_probe.log"))"
  build_s=0
else
  command -v "$NVCC" >/dev/null || skip "no nvcc ($NVCC) to build HKV's benchmark"
  mkdir -p "$BUILD"
  echo "run_hkv.sh: compiling HKV $COMMIT side_by_side for sm_$ARCH ($("$NVCC" --version | tail -1))"
  t0=$(date +%s)
  if ! "$NVCC" "${FLAGS[@]}" -o "$BIN.tmp" "$SRC" >"$OUT/hkv_build.log" 2>&1; then
    tail -30 "$OUT/hkv_build.log"
    python3 - "$OUT/hkv.json" <<'PY'
import json, sys
json.dump({"error": "compile failed, see hkv_build.log", "results": []}, open(sys.argv[1], "w"), indent=2)
PY
    exit 1
  fi
  mv "$BIN.tmp" "$BIN"
  echo "$hash_now" > "$BIN.hash"
  build_s=$(( $(date +%s) - t0 ))
  echo "run_hkv.sh: compiled in ${build_s}s"
fi
[ "${HKV_BUILD_ONLY:-0}" = 1 ] && exit 0

echo "run_hkv.sh: running $BIN $* (timeout ${TIMEOUT}s)"
t0=$(date +%s)
timeout -k 10 "$TIMEOUT" "$BIN" "$@" 2>&1 | tee "$OUT/hkv.log"
rc=${PIPESTATUS[0]}
run_s=$(( $(date +%s) - t0 ))
echo "run_hkv.sh: exit $rc after ${run_s}s"

python3 - "$OUT/hkv.log" "$OUT/hkv.json" "$rc" "$build_s" "$run_s" "$COMMIT" "$*" <<'PY'
import json, subprocess, sys
log, out, rc, build_s, run_s, commit, flags = sys.argv[1:]
report = {"hkv_commit": commit, "exit_code": int(rc), "done": False, "timed_out": rc in ("124", "137"),
          "build_s": int(build_s), "run_s": int(run_s), "flags": flags,
          "source": "benchmarks/hkv/side_by_side.cu (HKV test_one_api)",
          "units": "keys_per_s = HKV's Billion-KV/s x 2^30", "results": [], "tables": [],
          "skipped": []}
for line in open(log, errors="replace"):
    tag, _, rest = line.strip().partition(" ")
    try:
        if tag == "HKV_RESULT":
            report["results"].append(json.loads(rest))
        elif tag == "HKV_DEVICE":
            report["device"] = json.loads(rest)
        elif tag == "HKV_TABLE":
            report["tables"].append(json.loads(rest))
        elif tag == "HKV_SKIP":
            report["skipped"].append(json.loads(rest))
        elif tag == "HKV_DONE":
            report["done"] = True
        elif tag == "HKV_ERROR":
            report["error"] = rest
    except ValueError:
        pass
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout
    report["nvidia_smi"] = smi.strip()
except OSError:
    pass
json.dump(report, open(out, "w"), indent=2)
print(f"run_hkv.sh: {len(report['results'])} results -> {out}")
PY
exit "$rc"
