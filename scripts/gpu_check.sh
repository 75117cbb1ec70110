#!/bin/bash
# Every GPU check in one run, for a machine with a GPU (TensorFlow not needed; nvcc,
# g++, numpy, pybind11, pytest, hypothesis and CuPy are):
#
#   bash scripts/gpu_check.sh [OUT_DIR]      # default OUT_DIR: build/gpu_check
#
# 1. HKV's own benchmark (benchmarks/hkv/run_hkv.sh over the snapshot in
#    build/hkv_snapshot, made by scripts/hkv_snapshot.sh where the network is; a binary
#    built elsewhere and carried in build/hkv_bench is reused) compiles in the
#    background while
# 2. tensorflow_dynemb._core_gpu builds from this checkout (tests/core_gpu_ext.py) and
# 3. the GPU tests run on it: the core conformance and eviction suites
#    (test_core_gpu.py, test_eviction_plan.py), ApplyRule / assign / the embedding step
#    against the CPU core (test_core_gpu_step.py), partition and keyed random
#    (test_core_gpu_keyed.py).
# 4. The benchmarks, one after the other on the quiet GPU: ours
#    (benchmarks/gpu_table_ops.py, both ways of measuring; benchmarks/gpu_train_step.py;
#    benchmarks/gpu_kernel_profile.py, per-kernel device time through PyTorch's
#    profiler; Nsight Compute's counters of a training step's kernels where ncu can
#    read them), then HKV's, then the side-by-side table (benchmarks/hkv/compare.py).
# Logs, JSON and compare.md go to OUT_DIR (about 17 files). About 3 minutes on a fresh
# H200 machine (170-200 s on 2026-11-28). Exit status: nonzero if the build, a test or a benchmark failed.
# Through the device tool, whose $OUT brings back at most 8 files, bundle them:
#   bash scripts/gpu_check.sh /tmp/gpu_check; tar -czf $OUT/gpu_check.tgz -C /tmp/gpu_check .
# (carry: build/hkv_snapshot, and build/hkv_bench to skip HKV's compile).
set -u
cd "$(dirname "$0")/.."
out=${1:-build/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
started=$(date +%s)
say() { echo "[gpu_check $(( $(date +%s) - started ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nvcc --version | tail -2 >> "$out/gpu.txt"

say "HKV benchmark: compiling in the background"
HKV_BUILD_ONLY=1 timeout 420 bash benchmarks/hkv/run_hkv.sh "$out" > "$out/hkv_compile.log" 2>&1 &
hkv_compile=$!

say "building _core_gpu"
if ! timeout 400 python3 tests/core_gpu_ext.py > "$out/build.log" 2>&1; then
  say "building _core_gpu failed"
  tail -40 "$out/build.log"
  exit 1
fi
export DYNEMB_CORE_GPU_EXT=$(tail -1 "$out/build.log")

say "tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short --maxfail=30 \
  --junitxml="$out/tests.xml" tests/test_core_gpu.py tests/test_eviction_plan.py \
  tests/test_core_gpu_step.py tests/test_core_gpu_keyed.py > "$out/tests.log" 2>&1
tests=$?
grep -E "^(FAILED|ERROR)" "$out/tests.log" | head -30
tail -3 "$out/tests.log"

say "waiting for HKV's compile"
wait $hkv_compile
hkv=$?
tail -2 "$out/hkv_compile.log"

say "ours: table ops"
timeout 240 python3 benchmarks/gpu_table_ops.py --out "$out/gpu_table_ops.json" \
  > "$out/bench.log" 2>&1
bench=$?
tail -25 "$out/bench.log"

say "ours: training step"
timeout 150 python3 benchmarks/gpu_train_step.py --out "$out/gpu_train_step.json" \
  > "$out/train_step.log" 2>&1
step=$?
tail -20 "$out/train_step.log"

say "ours: kernel profile"
timeout 150 python3 benchmarks/gpu_kernel_profile.py --out "$out/gpu_kernel_profile.json" \
  > "$out/kernel_profile.log" 2>&1
profile=$?
tail -80 "$out/kernel_profile.log"

# Hardware counters of a training step's kernels, where Nsight Compute can read them
# (it could on the H200 of 2026-11-28; docs/gpu.md): informative, not a check.
ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ]; then
  say "ncu: a training step's kernels"
  timeout 120 "$ncu_bin" -k 'regex:ApplyRuleKernel|ApplyLastRowsKernel|SegmentSumKernel|GatherRowsKernel|FindKernel|BatchSetKernel' \
    --launch-skip 40 --launch-count 10 --section SpeedOfLight --section Occupancy \
    --section MemoryWorkloadAnalysis python3 benchmarks/gpu_train_step.py --quick \
    > "$out/ncu_train_step.txt" 2>&1 || say "ncu failed or was cut (see ncu_train_step.txt)"
fi

say "HKV: run"
HKV_TIMEOUT=120 timeout 200 bash benchmarks/hkv/run_hkv.sh "$out" > "$out/hkv_run.log" 2>&1
hkv=$(( hkv != 0 || $? != 0 ))
tail -5 "$out/hkv_run.log"

python3 benchmarks/hkv/compare.py "$out" > "$out/compare.md" 2>&1
cat "$out/compare.md"
say "done: tests=$tests bench=$bench step=$step profile=$profile hkv=$hkv"
exit $(( tests != 0 || bench != 0 || step != 0 || profile != 0 || hkv != 0 ))
