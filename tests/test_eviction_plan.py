"""Builds and runs the C++ test of the bounded GPU table's second-round replay
(cc/core/gpu/tests/eviction_plan_test.cc). The replay is host code, so this runs
without a GPU or nvcc; only g++ is needed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_ext  # noqa: E402

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

REPO = core_ext.REPO


def test_eviction_plan_binary():
    sources = [REPO / "cc/core/gpu/eviction_plan.cc", REPO / "cc/core/gpu/tests/eviction_plan_test.cc"]
    inputs = sorted(REPO.glob("cc/core/*.h")) + sorted(REPO.glob("cc/core/gpu/*.h"))
    binary = core_ext.build(sources, "eviction_plan_test", shared=False, inputs=inputs)
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{binary} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "all eviction plan tests passed" in proc.stdout
