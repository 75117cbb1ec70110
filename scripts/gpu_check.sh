#!/bin/bash
# The GPU core's checks in one run, for a machine with a GPU (TensorFlow not needed;
# nvcc, g++, numpy, pybind11, pytest, hypothesis and CuPy or PyTorch are):
#
#   bash scripts/gpu_check.sh [OUT_DIR]      # default OUT_DIR: build/gpu_check
#
# Builds tensorflow_dynemb._core_gpu from this checkout (tests/core_gpu_ext.py), runs the
# conformance and eviction suites on it, then benchmarks/gpu_table_ops.py. Logs and the
# benchmark's JSON go to OUT_DIR. About 70 s on an H200 machine with 16 cores.
set -u
cd "$(dirname "$0")/.."
out=${1:-build/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ! python3 tests/core_gpu_ext.py > "$out/build.log" 2>&1; then
  echo "gpu_check: building _core_gpu failed; see $out/build.log"
  exit 1
fi
export DYNEMB_CORE_GPU_EXT=$(tail -1 "$out/build.log")
python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
  tests/test_core_gpu.py tests/test_eviction_plan.py > "$out/tests.log" 2>&1
tests=$?
tail -3 "$out/tests.log"
python3 benchmarks/gpu_table_ops.py --out "$out/gpu_table_ops.json" > "$out/bench.log" 2>&1
bench=$?
cat "$out/bench.log"
exit $(( tests != 0 || bench != 0 ))
