"""Builds and runs the plain C++ core test binary (cc/core/tests/core_test.cc).

With DYNEMB_CORE_SANITIZERS=1 it is also built and run under AddressSanitizer
+ UndefinedBehaviorSanitizer and under ThreadSanitizer (a few minutes).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_ext  # noqa: E402

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

SANITIZERS = {
    "none": ((), {}),
    "address": (("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-g"),
                {"ASAN_OPTIONS": "detect_leaks=1"}),
    # Export and Clear hold every shard lock at once, more than TSan's
    # deadlock detector can track.
    "thread": (("-fsanitize=thread", "-g"), {"TSAN_OPTIONS": "detect_deadlocks=0 halt_on_error=1"}),
}


def _run_core_tests(sanitizer, env):
    flags, sanitizer_env = SANITIZERS[sanitizer]
    sources = core_ext.core_sources() + [core_ext.REPO / "cc/core/tests/core_test.cc"]
    binary = core_ext.build(sources, f"core_test_{sanitizer}", shared=False, flags=flags)
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=900,
                          check=False, env={**os.environ, **sanitizer_env, **env})
    assert proc.returncode == 0, f"{binary} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "all core tests passed" in proc.stdout
    return proc.stdout


@pytest.mark.parametrize("sanitizer", list(SANITIZERS))
def test_core_cpp_binary(sanitizer):
    if sanitizer != "none" and os.environ.get("DYNEMB_CORE_SANITIZERS") != "1":
        pytest.skip("set DYNEMB_CORE_SANITIZERS=1 to run the core tests under sanitizers")
    _run_core_tests(sanitizer, {})


def test_huge_pages_can_be_turned_off():
    """DYNEMB_HUGE_PAGES=0 leaves the big arrays' mappings unadvised (docs/tables.md)."""
    out = _run_core_tests("none", {"DYNEMB_HUGE_PAGES": "0", "CORE_TEST_ONLY": "huge_page_advice"})
    assert "[  OK  ] huge_page_advice" in out


def test_running_out_of_memory_in_a_worker_thread_is_an_error():
    """Memory that runs out mid-batch, on the batch's worker threads, gives
    kResourceExhausted and a consistent table, not an abort
    (cc/core/tests/out_of_memory_test.cc replaces operator new to fail on cue)."""
    sources = core_ext.core_sources() + [core_ext.REPO / "cc/core/tests/out_of_memory_test.cc"]
    binary = core_ext.build(sources, "out_of_memory_test", shared=False)
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{binary} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "out of memory tests passed" in proc.stdout


def test_core_benchmark_builds():
    """cc/core/bench/core_bench.cc, whose figures docs/benchmarks.md quotes, still
    compiles against the core's API (it is run by hand: growing a table to 10M keys
    takes too long for the suite)."""
    sources = core_ext.core_sources() + [core_ext.REPO / "cc/core/bench/core_bench.cc"]
    binary = core_ext.build(sources, "core_bench", shared=False)
    assert binary.is_file()
