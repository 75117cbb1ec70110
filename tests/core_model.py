"""NumPy reference helpers shared by the core table tests.

Values are handled in a "model representation": the NumPy dtype of the value
type, except bfloat16, which is kept as uint16 bit patterns (so the tests do
not need ml_dtypes; the binding accepts uint16 bit patterns for bfloat16 and
its outputs are viewed back as uint16).
"""

from __future__ import annotations

import numpy as np

KEY_DTYPES = ("int32", "int64", "string")
VALUE_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool")
FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")

MODEL_DTYPE = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
    "int8": np.dtype(np.int8),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "bool": np.dtype(np.bool_),
}
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------
def key_pool(key_dtype: str) -> list:
    """A small pool of keys with every edge value, so batches repeat keys."""
    if key_dtype == "string":
        return [b"", b"a", b"b", b"\x00", b"\x00\x00", b"ab", b"a" * 300, "\u00e9",
                b"\xc3\xa9", b"\xff\xfe", b"0", b"-1", "key with spaces"]
    info = np.iinfo(np.int32 if key_dtype == "int32" else np.int64)
    pool = [0, -1, -2, -3, int(info.min), int(info.max), int(info.min) + 1, 1, 2, 7,
            1 << 16, 1 << 24, 3 << 24, -(1 << 20), 123456789, 0x7FFF0000]
    if key_dtype == "int64":
        pool += [1 << 32, -(1 << 32), (1 << 32) + 1, 1 << 62, 0x7FFFFFFF, 0x80000000]
    return pool


def model_key(key) -> object:
    """The dict key of a table key: str keys are stored as their UTF-8 bytes."""
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, np.bytes_)):
        return bytes(key)
    return int(key)


def key_array(keys: list, key_dtype: str, layout: str = "flat"):
    """Keys in one of the layouts the binding accepts.

    layout: "flat" (1-D array, or a list for strings), "column" ([n, 1]),
    "row" ([1, n]) or "list" (a Python list).
    """
    if layout == "list":
        return list(keys)
    if key_dtype == "string":
        arr = np.empty(len(keys), dtype=object)
        arr[:] = keys
        if layout == "flat":
            return list(keys)
    else:
        arr = np.array(keys, dtype=np.int32 if key_dtype == "int32" else np.int64)
    if layout == "column":
        return arr.reshape(-1, 1)
    if layout == "row":
        return arr.reshape(1, -1)
    return arr


def key_shape(keys) -> tuple:
    return tuple(keys.shape) if isinstance(keys, np.ndarray) else (len(keys),)


# ---------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------
def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Rounds float32 to bfloat16 (round to nearest even), as bit patterns."""
    f = np.asarray(values, np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FC0), rounded)


def random_rows(rng: np.random.Generator, n: int, dim: int, value_dtype: str,
                specials: bool = False) -> np.ndarray:
    """[n, dim] random values in the model representation.

    With `specials`, some elements are replaced by edge values (0, -0, inf, nan,
    the type's limits).
    """
    shape = (n, dim)
    if value_dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if value_dtype in ("int8", "int32", "int64"):
        info = np.iinfo(MODEL_DTYPE[value_dtype])
        if rng.random() < 0.5:  # small values, so accum adds up to small sums
            out = rng.integers(-100, 100, size=shape).astype(MODEL_DTYPE[value_dtype])
        else:  # anywhere in the range, so accum wraps around
            out = rng.integers(info.min, info.max, size=shape, endpoint=True,
                               dtype=MODEL_DTYPE[value_dtype])
        if specials and out.size:
            edge = np.array([0, -1, info.min, info.max], dtype=out.dtype)
            mask = rng.random(shape) < 0.1
            out[mask] = rng.choice(edge, size=int(mask.sum()))
        return out
    f = (rng.standard_normal(shape) * rng.choice([1.0, 100.0])).astype(np.float32)
    if specials and f.size:
        edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -65504.0], np.float32)
        mask = rng.random(shape) < 0.05
        f[mask] = rng.choice(edge, size=int(mask.sum()))
    if value_dtype == "bfloat16":
        return f32_to_bf16(f)
    if value_dtype == "float64":
        return f.astype(np.float64) * (1.0 + 1e-9)  # use float64 bits, not float32 ones
    return f.astype(MODEL_DTYPE[value_dtype])


def add_rows(a: np.ndarray, b: np.ndarray, value_dtype: str) -> np.ndarray:
    """a + b elementwise in the value type: one rounding per add for floats,
    two's-complement wrap for ints, logical or for bool."""
    if value_dtype == "bool":
        return np.logical_or(a, b)
    if value_dtype == "bfloat16":
        # Exact in float32 for all but far-apart exponents, where the single
        # float32 rounding cannot land on a bfloat16 tie: so this is the
        # correctly rounded bfloat16 sum.
        return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b))
    with np.errstate(over="ignore", invalid="ignore"):
        return (a + b).astype(a.dtype)


def to_model(values: np.ndarray, value_dtype: str) -> np.ndarray:
    """A table output array in the model representation (bfloat16 -> uint16 bits)."""
    values = np.asarray(values)
    if value_dtype == "bfloat16":
        assert values.dtype.itemsize == 2, values.dtype
        return values.view(np.uint16)
    assert values.dtype == MODEL_DTYPE[value_dtype], (values.dtype, value_dtype)
    return values


def _as_float(values: np.ndarray, value_dtype: str) -> np.ndarray:
    if value_dtype == "bfloat16":
        return bf16_to_f32(values)
    return values.astype(np.float64)


def mismatches(got: np.ndarray, want: np.ndarray, value_dtype: str) -> np.ndarray:
    """Boolean mask of elements that differ (bitwise, any NaN equal to any NaN)."""
    got = to_model(got, value_dtype)
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if value_dtype in FLOAT_DTYPES:
        gnan = np.isnan(_as_float(got, value_dtype))
        wnan = np.isnan(_as_float(want, value_dtype))
        bits = _BITS[got.dtype.itemsize]
        return (gnan != wnan) | (~gnan & (got.view(bits) != want.view(bits)))
    return got != want


def assert_rows_equal(got: np.ndarray, want: np.ndarray, value_dtype: str, what: str = "") -> None:
    bad = mismatches(got, want, value_dtype)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} {value_dtype} elements differ; first at "
            f"{idx}: got {to_model(got, value_dtype)[idx]!r}, expected {np.asarray(want)[idx]!r}")


def export_dict(table, value_dtype: str) -> dict:
    """{model key: (row in model representation, score)} from table.export()."""
    keys, values, scores = table.export()
    n = len(keys)
    assert values.shape == (n, table.dim), (values.shape, n, table.dim)
    assert scores.shape == (n,) and scores.dtype == np.uint64, (scores.shape, scores.dtype)
    values = to_model(values, value_dtype)
    out = {}
    for i in range(n):
        k = model_key(keys[i])
        assert k not in out, f"export returned key {k!r} twice"
        out[k] = (values[i], int(scores[i]))
    return out
