"""The core conformance and eviction suites, run against the GPU table.

Every test of test_core_conformance.py and test_core_eviction.py is collected here a
second time, with the `core` fixture replaced by the GPU module
`tensorflow_dynemb._core_gpu` (tests/core_gpu_ext.py): the same Python surface over
the CUDA table (cc/core/gpu). Everything skips, with the reason, where there is no
GPU. GPU tables take int32/int64 keys only, so the tests' string-key cases skip too
(a GPU table refuses string keys; that refusal is tested below).

These tests do not need TensorFlow.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_gpu_ext  # noqa: E402
from test_core_conformance import *  # noqa: E402,F401,F403 (the tests, collected again)
from test_core_eviction import *  # noqa: E402,F401,F403

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

STRING_KEYS_SKIP = "GPU tables take int32/int64 keys; string-keyed tables stay on the CPU"


class GpuCore:
    """The `_core_gpu` module, whose Table skips the test when asked for string keys."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)

    def Table(self, key_dtype, *args, **kwargs):  # noqa: N802 (the module's class name)
        if key_dtype == "string":
            pytest.skip(STRING_KEYS_SKIP)
        return self._module.Table(key_dtype, *args, **kwargs)


@pytest.fixture(scope="module")
def core():  # noqa: F811 (replaces the imported CPU fixture for every test in this module)
    return GpuCore(core_gpu_ext.load_core_gpu())


@pytest.fixture(scope="module")
def gpu():
    return core_gpu_ext.load_core_gpu()


def test_string_keys_are_refused(gpu):
    with pytest.raises(ValueError, match="string"):
        gpu.Table("string", "float32", 4)


@pytest.mark.parametrize("value_dtype", ["float32", "float16", "int8"])
def test_values_beyond_max_hbm_live_in_host_memory(gpu, value_dtype):
    """max_hbm_for_values: rows beyond the device budget are in mapped host memory;
    every operation must give the same results as with all rows on the device, also
    across a rehash (growth) and for accum, export and eviction."""
    rng = np.random.default_rng(3)
    dim = 8
    dtype = np.dtype(value_dtype)
    budgets = (-1, 0, 40 * dim * dtype.itemsize)  # all device, all host, a 40-row split
    tables = [gpu.Table("int64", value_dtype, dim, init_capacity=64, max_capacity=3000,
                        strategy="lfu", max_hbm_for_values=b) for b in budgets]
    keys = rng.integers(-(2**62), 2**62, size=5000).astype(np.int64)
    for step in range(10):
        batch = rng.choice(keys, size=700)
        values = rng.integers(-50, 50, size=(700, dim)).astype(dtype)
        exists = rng.random(700) < 0.5
        results = []
        for t in tables:
            evicted = t.insert_and_evict(batch, values) if step % 2 == 0 else \
                t.accum_and_evict(batch, values, exists)
            found = t.find(keys[:2000])
            results.append((sorted(zip(evicted[0].tolist(), evicted[2].tolist())),
                            found[0].tobytes(), found[1].tobytes(), t.size()))
        assert all(r == results[0] for r in results[1:]), f"step {step}"
    exports = [{int(k): (v.tobytes(), int(s)) for k, v, s in zip(*t.export())} for t in tables]
    assert exports[1] == exports[0] and exports[2] == exports[0]
    assert len(exports[0]) == tables[0].size() <= 3000


def test_device_pointer_methods(gpu):
    """find_device / insert_device on raw device addresses (the benchmark's path)."""
    cupy = pytest.importorskip("cupy")
    t = gpu.Table("int64", "float32", 4)
    keys = cupy.arange(1000, dtype=cupy.int64) * 7
    values = cupy.random.standard_normal((1000, 4), dtype=cupy.float32)
    t.insert_device(keys.data.ptr, 1000, values.data.ptr)
    out = cupy.empty((1000, 4), cupy.float32)
    exists = cupy.zeros(1000, cupy.bool_)
    default = cupy.full(4, -1, cupy.float32)
    probe = keys + 1 - (cupy.arange(1000) % 2)  # every other key is absent
    t.find_device(probe.data.ptr, 1000, out.data.ptr, default.data.ptr, exists.data.ptr)
    t.synchronize()
    present = cupy.asnumpy(exists)
    assert present.tolist() == [i % 2 == 1 for i in range(1000)]
    got = cupy.asnumpy(out)
    np.testing.assert_array_equal(got[present], cupy.asnumpy(values)[present])
    assert (got[~present] == -1).all()
    assert t.size() == 1000


def test_device_writes_on_the_callers_stream_read_their_keys_before_reuse(gpu):
    """insert_device(stream=...) runs on the caller's stream: a key buffer the caller
    frees right after the call (CuPy's pool hands it to the next batch) is read before
    it is rewritten. Batches of new keys that fit queue without a host sync, so on the
    table's own stream a later batch's keys could overwrite an earlier one's before
    its kernel ran: that lost keys (size 12.6M of 33.5M in the first H200 run)."""
    cupy = pytest.importorskip("cupy")
    dim, batch, batches = 4, 1 << 16, 48
    t = gpu.Table("int64", "float32", dim, init_capacity=batch * batches * 2)
    values = cupy.zeros((batch, dim), cupy.float32)
    stream = cupy.cuda.get_current_stream().ptr
    for b in range(batches):
        keys = cupy.arange(b * batch, (b + 1) * batch, dtype=cupy.int64) * 7 + 3
        t.insert_device(keys.data.ptr, batch, values.data.ptr, stream=stream)
        del keys  # back to the pool: the next batch's keys may take its memory
    cupy.cuda.get_current_stream().synchronize()
    assert t.size() == batch * batches
    probe = cupy.arange(batch * batches, dtype=cupy.int64) * 7 + 3
    out = cupy.empty((batch * batches, dim), cupy.float32)
    exists = cupy.zeros(batch * batches, cupy.bool_)
    default = cupy.full(dim, -1, cupy.float32)
    t.find_device(probe.data.ptr, batch * batches, out.data.ptr, default.data.ptr,
                  exists.data.ptr, stream=stream)
    cupy.cuda.get_current_stream().synchronize()
    assert bool(exists.all())
