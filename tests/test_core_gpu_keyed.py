"""Key partitioning and key-seeded random rows on the GPU (cc/core/gpu/keyed_gpu.h)
against the host functions the CPU kernels call (cc/core/partition.h), through
`tensorflow_dynemb._core_gpu` (cc/bindings_gpu/keyed_bindings.cc), whose
`partition`, `keyed_random`, `keyed_random_fill` run on the device and whose
`*_host` twins run partition.h on the CPU.

What must hold (keyed_gpu.h, docs/gpu.md):
  * shard ids and uniform rows (float32, float64): equal bit for bit;
  * normal / truncated-normal rows: float64 within 4 ulps (CUDA's log and cos are
    not glibc's), float32 equal in at least 99.999% of the values and within one
    ulp everywhere (the CPU's float32 rows use libmvec where it is available).

Everything skips, with the reason, where there is no GPU. Needs no TensorFlow.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_gpu_ext  # noqa: E402

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

INT32 = np.iinfo(np.int32)
INT64 = np.iinfo(np.int64)
DISTRIBUTIONS = ("uniform", "normal", "truncated_normal")


@pytest.fixture(scope="module")
def gpu():
    return core_gpu_ext.load_core_gpu()


def _keys(dtype, n=100_000, seed=0):
    """Random keys of `dtype` (both signs) plus the extremes and neighbours of 0."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    special = np.array([0, 1, -1, 2, -2, info.min, info.max, info.min + 1, info.max - 1], dtype)
    return np.concatenate([special, rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)])


def _bits(a):
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _within_draw_ulps(got, want, a, b, ulps):
    """float64 rows a + b * z: within `ulps` ulps of the scale |a| + b |z| (the
    draws z within a few ulps, the sum rounded once on each side; an ulp of the
    sum itself means nothing where it cancels to near 0)."""
    scale = np.abs(a) + b * np.abs((want - a) / b)
    return bool((np.abs(got - want) <= ulps * np.spacing(scale)).all())


def _ulps(x, y):
    """The distance in ulps between same-dtype float arrays (lexicographic order of
    the bit patterns; -0.0 and 0.0 are 0 apart)."""
    signed = np.int32 if x.dtype == np.float32 else np.int64
    lowest = np.iinfo(signed).min

    def ordered(a):
        i = a.view(signed).astype(np.int64)
        return np.where(i < 0, np.int64(lowest) - i, i)

    return np.abs(ordered(x) - ordered(y))


# ---------------------------------------------------------------------------
# Partition
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("num_shards", [1, 2, 7, 1000, 2**31 - 1])
def test_partition_equals_host(gpu, dtype, num_shards):
    keys = _keys(dtype)
    got = gpu.partition(keys, num_shards)
    want = gpu.partition_host(keys, num_shards)
    assert got.dtype == np.int32 and want.dtype == np.int32
    assert got.shape == keys.shape
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() < num_shards
    if num_shards == 1:
        assert not got.any()
    elif num_shards == 7:
        assert len(np.unique(got)) == 7


def test_partition_host_is_partition_h(gpu):
    """The host reference is the pinned hash: StableKeyHash(1) = 0xb456bcfc34c2cb2c
    (cc/core/tests/core_test.cc), StableKeyHash(0) = 0; int32 keys are widened."""
    for num_shards in (7, 1000, 2**31 - 1):
        want = (0xB456BCFC * num_shards) >> 32
        for dtype in (np.int32, np.int64):
            keys = np.array([1, 0], dtype)
            np.testing.assert_array_equal(gpu.partition(keys, num_shards), [want, 0])
            np.testing.assert_array_equal(gpu.partition_host(keys, num_shards), [want, 0])


def test_partition_int32_keys_route_as_int64(gpu):
    keys = _keys(np.int32, 50_000, seed=1)
    np.testing.assert_array_equal(gpu.partition(keys, 13), gpu.partition(keys.astype(np.int64), 13))


def test_partition_empty_shaped_and_large(gpu):
    for dtype in (np.int32, np.int64):
        empty = gpu.partition(np.zeros(0, dtype), 7)
        assert empty.shape == (0,) and empty.dtype == np.int32
        assert gpu.partition(np.zeros((0, 3), dtype), 7).shape == (0, 3)
    shaped = _keys(np.int64, 5_991, seed=2).reshape(100, 60)
    got = gpu.partition(shaped, 5)
    assert got.shape == (100, 60)
    np.testing.assert_array_equal(got, gpu.partition_host(shaped, 5))
    # More keys than the kernel's grid has threads (8192 blocks of 256): the
    # grid-stride loop covers the rest.
    many = np.arange(-2_500_000, 2_500_000, dtype=np.int64) * 7919
    np.testing.assert_array_equal(gpu.partition(many, 31), gpu.partition_host(many, 31))


# ---------------------------------------------------------------------------
# Keyed random rows
# ---------------------------------------------------------------------------

UNIFORM_BOUNDS = [
    (0.0, 1.0),
    (-0.05, 0.05),
    (-3.5, 7.25),
    (2.0, 2.0),  # b == a: no "below b" rule
    (2.0, 1.0),  # b < a
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("a,b", UNIFORM_BOUNDS)
def test_uniform_rows_bit_equal(gpu, dtype, key_dtype, a, b):
    keys = _keys(key_dtype, 20_000, seed=3)
    for dim, seed in ((1, 0), (16, 42), (33, -7)):
        got = gpu.keyed_random(keys, dim, seed, "uniform", a, b, dtype)
        want = gpu.keyed_random_host(keys, dim, seed, "uniform", a, b, dtype)
        assert got.dtype == dtype and got.shape == keys.shape + (dim,)
        np.testing.assert_array_equal(_bits(got), _bits(want))
        if b > a:
            assert (got >= dtype(a)).all() and (got < dtype(b)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_uniform_rows_stay_below_b(gpu, dtype):
    """[a, b) one ulp wide: half the draws round to b and are moved to the value
    below it (nextafter on the device): exercised, and still bit-equal."""
    a = 1.0
    b = float(np.nextafter(dtype(1.0), dtype(2.0)))
    keys = _keys(np.int64, 10_000, seed=4)
    got = gpu.keyed_random(keys, 8, 5, "uniform", a, b, dtype)
    want = gpu.keyed_random_host(keys, 8, 5, "uniform", a, b, dtype)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    assert (got == dtype(a)).all()


def test_uniform_rows_past_the_grid(gpu):
    """More elements (70,009 keys x 33 columns) than threads in the grid."""
    keys = _keys(np.int64, 70_000, seed=5)
    for dtype in (np.float32, np.float64):
        got = gpu.keyed_random(keys, 33, 9, "uniform", -1.0, 1.0, dtype)
        want = gpu.keyed_random_host(keys, 33, 9, "uniform", -1.0, 1.0, dtype)
        np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("dist", ["normal", "truncated_normal"])
def test_normal_rows_float64_within_4_ulps(gpu, dist):
    keys = _keys(np.int64, 62_500 - 9, seed=6)  # 62,500 keys x 16 = 1M values
    got = gpu.keyed_random(keys, 16, 11, dist, 0.0, 1.0, np.float64)
    want = gpu.keyed_random_host(keys, 16, 11, dist, 0.0, 1.0, np.float64)
    ulps = _ulps(got, want)
    print(f"{dist} float64: max {ulps.max()} ulps, {np.count_nonzero(ulps)} of {ulps.size} "
          f"values differ")
    assert ulps.max() <= 4
    if dist == "truncated_normal":
        assert (np.abs(got) <= 2.0).all()
    # With a mean and a stddev: the same draws, scaled and shifted.
    for a, b in ((0.5, 2.0), (-0.5, 0.5)):
        got = gpu.keyed_random(keys, 16, 11, dist, a, b, np.float64)
        want = gpu.keyed_random_host(keys, 16, 11, dist, a, b, np.float64)
        assert _within_draw_ulps(got, want, a, b, 6)


@pytest.mark.parametrize("dist", ["normal", "truncated_normal"])
@pytest.mark.parametrize("a,b", [(0.0, 1.0), (0.5, 2.0), (0.0, 0.05)])
def test_normal_rows_float32_almost_always_equal(gpu, dist, a, b):
    keys = _keys(np.int32, 62_500 - 9, seed=7)
    got = gpu.keyed_random(keys, 16, 13, dist, a, b, np.float32)
    want = gpu.keyed_random_host(keys, 16, 13, dist, a, b, np.float32)
    ulps = _ulps(got, want)
    differing = np.count_nonzero(ulps)
    print(f"{dist} float32 a={a} b={b}: {differing} of {ulps.size} values differ, "
          f"max {ulps.max()} ulps")
    assert ulps.max() <= 1
    assert differing <= ulps.size * 1e-5  # at least 99.999% equal
    if dist == "truncated_normal":
        assert (np.abs(got - np.float32(a)) <= np.float32(2 * b) * (1 + 1e-6)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_int32_keys_draw_int64_rows(gpu, dtype):
    keys = _keys(np.int32, 5_000, seed=8)
    for dist in DISTRIBUTIONS:
        np.testing.assert_array_equal(
            _bits(gpu.keyed_random(keys, 7, 3, dist, 0.0, 1.0, dtype)),
            _bits(gpu.keyed_random(keys.astype(np.int64), 7, 3, dist, 0.0, 1.0, dtype)))


def test_keyed_random_empty_and_shaped(gpu):
    rows = gpu.keyed_random(np.zeros(0, np.int64), 4, 1, "normal", 0.0, 1.0, np.float32)
    assert rows.shape == (0, 4) and rows.dtype == np.float32
    keys = _keys(np.int64, 291, seed=9).reshape(20, 15)
    got = gpu.keyed_random(keys, 3, 1, "uniform", 0.0, 1.0, np.float64)
    assert got.shape == (20, 15, 3)
    np.testing.assert_array_equal(
        got, gpu.keyed_random_host(keys, 3, 1, "uniform", 0.0, 1.0, np.float64))


# ---------------------------------------------------------------------------
# Fill
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_fill_replaces_only_missing_rows(gpu, dtype, key_dtype, dist):
    rng = np.random.default_rng(10)
    keys = _keys(key_dtype, 30_000, seed=10)
    dim = 12
    values = rng.standard_normal(keys.shape + (dim,)).astype(dtype) + dtype(100)
    exists = rng.random(keys.shape) < 0.5
    before = values.copy()
    got = gpu.keyed_random_fill(values, exists, keys, dim, 21, dist, -0.5, 0.5)
    np.testing.assert_array_equal(_bits(values), _bits(before))  # never in place
    assert got.dtype == dtype and got.shape == values.shape
    np.testing.assert_array_equal(_bits(got[exists]), _bits(values[exists]))
    drawn = gpu.keyed_random(keys, dim, 21, dist, -0.5, 0.5, dtype)
    np.testing.assert_array_equal(_bits(got[~exists]), _bits(drawn[~exists]))
    host = gpu.keyed_random_fill_host(values, exists, keys, dim, 21, dist, -0.5, 0.5)
    np.testing.assert_array_equal(_bits(host[exists]), _bits(values[exists]))
    if dist == "uniform":
        np.testing.assert_array_equal(_bits(got), _bits(host))
    elif dtype == np.float32:
        assert _ulps(got, host).max() <= 1
    else:
        assert _within_draw_ulps(got, host, -0.5, 0.5, 6)


def test_fill_all_and_none_exist(gpu):
    keys = _keys(np.int64, 1_000, seed=11)
    values = np.full(keys.shape + (5,), 7.0, np.float32)
    kept = gpu.keyed_random_fill(values, np.ones(keys.shape, bool), keys, 5, 1, "uniform", 0, 1)
    np.testing.assert_array_equal(kept, values)
    drawn = gpu.keyed_random_fill(values, np.zeros(keys.shape, bool), keys, 5, 1, "uniform", 0, 1)
    np.testing.assert_array_equal(
        _bits(drawn), _bits(gpu.keyed_random_host(keys, 5, 1, "uniform", 0, 1, np.float32)))
    empty = gpu.keyed_random_fill(np.zeros((0, 5), np.float64), np.zeros(0, bool),
                                  np.zeros(0, np.int32), 5, 1, "normal", 0, 1)
    assert empty.shape == (0, 5) and empty.dtype == np.float64


# ---------------------------------------------------------------------------
# Bad arguments
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["", "_host"])
def test_bad_arguments_raise_value_error(gpu, suffix):
    partition = getattr(gpu, "partition" + suffix)
    keyed_random = getattr(gpu, "keyed_random" + suffix)
    fill = getattr(gpu, "keyed_random_fill" + suffix)
    keys = np.arange(10, dtype=np.int64)
    values = np.zeros((10, 4), np.float32)
    exists = np.zeros(10, bool)
    with pytest.raises(ValueError, match=r"num_shards must be >= 1, got 0"):
        partition(keys, 0)
    with pytest.raises(ValueError, match=r"num_shards must be >= 1, got -3"):
        partition(keys, -3)
    with pytest.raises(ValueError, match=r"num_shards must be in \[1, 2147483647\], got 2147483648"):
        partition(keys, 2**31)
    with pytest.raises(ValueError, match=r"keys must be an int32 or int64 array, got dtype"):
        partition(keys.astype(np.float64), 3)
    with pytest.raises(ValueError, match=r"keys must be an int32 or int64 array, got dtype"):
        keyed_random(keys.astype(np.uint64), 4, 1, "normal", 0, 1, np.float32)
    for dim in (0, -2):
        with pytest.raises(ValueError, match=rf"dim must be >= 1, got {dim}"):
            keyed_random(keys, dim, 1, "normal", 0, 1, np.float32)
        with pytest.raises(ValueError, match=rf"dim must be >= 1, got {dim}"):
            fill(values, exists, keys, dim, 1, "normal", 0, 1)
    with pytest.raises(ValueError, match=r"distribution must be 'uniform', 'normal' or "
                                         r"'truncated_normal', got 'gamma'"):
        keyed_random(keys, 4, 1, "gamma", 0, 1, np.float32)
    with pytest.raises(ValueError, match=r"dtype must be float32 or float64, got dtype\('int32'\)"):
        keyed_random(keys, 4, 1, "normal", 0, 1, np.int32)
    with pytest.raises(ValueError, match=r"values must have shape keys.shape \+ \(dim,\) = "
                                         r"\(10, 4\), got \(10, 3\)"):
        fill(values[:, :3], exists, keys, 4, 1, "normal", 0, 1)
    with pytest.raises(ValueError, match=r"values' dtype must be float32 or float64"):
        fill(values.astype(np.float16), exists, keys, 4, 1, "normal", 0, 1)
    with pytest.raises(ValueError, match=r"exists must be a bool array, got dtype"):
        fill(values, exists.astype(np.int8), keys, 4, 1, "normal", 0, 1)
    with pytest.raises(ValueError, match=r"exists must have the shape of keys \(10,\), got \(9,\)"):
        fill(values, exists[:9], keys, 4, 1, "normal", 0, 1)


def test_device_errors_come_from_the_core(gpu):
    """The device functions' num_shards and dim checks are PartitionKeysGpu's and
    KeyedRandomRowsGpu's own (the binding passes those arguments through)."""
    keys = np.arange(3, dtype=np.int32)
    with pytest.raises(ValueError, match=r"^PartitionKeysGpu: num_shards must be >= 1, got 0$"):
        gpu.partition(keys, 0)
    with pytest.raises(ValueError, match=r"^KeyedRandomRowsGpu: dim must be >= 1, got 0$"):
        gpu.keyed_random(keys, 0, 1, "uniform", 0, 1, np.float64)
