"""Shared helpers for the table tests: data generators and a plain-dict model."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from typing import Any, Dict, Iterable, List, Optional

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _convert

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The dtypes the package supports, as lists for pytest parametrisation.
KEY_DTYPES = list(_convert.KEY_DTYPES)
VALUE_DTYPES = list(_convert.VALUE_DTYPES)
DIMS = [1, 7, 64, 300]

EDGE_KEYS = {
    tf.int32: [0, -1, -2, -3, np.iinfo(np.int32).min, np.iinfo(np.int32).max],
    tf.int64: [0, -1, -2, -3, np.iinfo(np.int64).min, np.iinfo(np.int64).max],
    tf.string: [b"", b"\x00", b"a\x00", b"0", b"-1", b"k" * 100, "\u00e9\u4e2d".encode()],
}


def dtype_id(dtype: tf.dtypes.DType) -> str:
    return dtype.name


def np_dtype(dtype: tf.dtypes.DType):
    return object if dtype == tf.string else dtype.as_numpy_dtype


def rng_for(*parts: Any) -> np.random.Generator:
    """A generator seeded from the test parameters (stable across runs)."""
    seed = zlib.crc32("|".join(str(p) for p in parts).encode())
    return np.random.default_rng(seed)


def make_keys(rng: np.random.Generator, key_dtype, n: int, edges: bool = True) -> np.ndarray:
    """`n` unique keys (the edge keys first when `edges`)."""
    chosen: List[Any] = list(EDGE_KEYS[key_dtype]) if edges else []
    seen = {norm_key(k) for k in chosen}
    while len(chosen) < n:
        if key_dtype == tf.string:
            length = int(rng.integers(1, 24))
            k = bytes(rng.integers(0, 256, length, dtype=np.uint8).tolist())
        else:
            info = np.iinfo(key_dtype.as_numpy_dtype)
            k = int(rng.integers(info.min, info.max, dtype=np.int64, endpoint=True))
        if k not in seen:
            seen.add(k)
            chosen.append(k)
    return as_key_array(chosen[:n], key_dtype)


def as_key_array(keys: Iterable[Any], key_dtype) -> np.ndarray:
    keys = list(keys)
    if key_dtype == tf.string:
        # dtype=object keeps embedded and trailing NUL bytes.
        out = np.empty(len(keys), dtype=object)
        out[:] = [bytes(k) for k in keys]
        return out
    return np.array(keys, dtype=key_dtype.as_numpy_dtype)


def make_values(rng: np.random.Generator, value_dtype, shape) -> np.ndarray:
    """Small integer-valued data: exact in every value dtype, also after a few sums."""
    shape = tuple(shape)
    if value_dtype == tf.bool:
        return rng.integers(0, 2, shape).astype(bool)
    bound = 3 if value_dtype == tf.int8 else 50
    ints = rng.integers(-bound, bound + 1, shape)
    return ints.astype(np.float32).astype(value_dtype.as_numpy_dtype)


def norm_key(k: Any) -> Any:
    if isinstance(k, (bytes, np.bytes_)):
        return bytes(k)
    if isinstance(k, str):
        return k.encode()
    return int(k)


def comparable(x: Any) -> np.ndarray:
    """NumPy array that assert_array_equal compares exactly (bfloat16/float16 -> f32)."""
    a = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    if a.dtype.kind in "fV" and a.dtype != np.float64:
        return a.astype(np.float32)
    return a


class DictModel:
    """The reference: a dict from key to value row, applied row by row."""

    def __init__(self, value_dtype, value_shape, default: np.ndarray):
        self.value_dtype = value_dtype
        self.value_shape = tuple(value_shape)
        self.default = np.asarray(default, dtype=value_dtype.as_numpy_dtype)
        self.data: Dict[Any, np.ndarray] = {}

    def insert(self, keys: np.ndarray, values: np.ndarray) -> None:
        keys = np.asarray(keys, dtype=object if keys.dtype == object else keys.dtype)
        flat_values = np.asarray(values).reshape((-1,) + self.value_shape)
        for k, v in zip(keys.reshape(-1), flat_values):
            self.data[norm_key(k)] = v.copy()

    def accum(self, keys: np.ndarray, deltas: np.ndarray, exists: np.ndarray) -> None:
        flat = np.asarray(deltas).reshape((-1,) + self.value_shape)
        for k, d, e in zip(keys.reshape(-1), flat, np.asarray(exists).reshape(-1)):
            k = norm_key(k)
            if e and k in self.data:
                if self.value_dtype == tf.bool:
                    self.data[k] = np.logical_or(self.data[k], d)
                else:
                    self.data[k] = (self.data[k] + d).astype(self.data[k].dtype)
            elif not e and k not in self.data:
                self.data[k] = d.copy()

    def remove(self, keys: np.ndarray) -> None:
        for k in keys.reshape(-1):
            self.data.pop(norm_key(k), None)

    def lookup(self, keys: np.ndarray, defaults: Optional[np.ndarray] = None):
        keys = np.asarray(keys)
        flat_keys = keys.reshape(-1)
        out = np.empty((len(flat_keys),) + self.value_shape, self.default.dtype)
        exists = np.zeros(len(flat_keys), bool)
        per_key = None
        if defaults is not None and np.ndim(defaults) > len(self.value_shape):
            per_key = np.asarray(defaults).reshape((-1,) + self.value_shape)
        for i, k in enumerate(flat_keys):
            k = norm_key(k)
            if k in self.data:
                out[i] = self.data[k]
                exists[i] = True
            elif per_key is not None:
                out[i] = per_key[i]
            else:
                out[i] = self.default if defaults is None else defaults
        return out.reshape(keys.shape + self.value_shape), exists.reshape(keys.shape)


def exported_dict(keys, values) -> Dict[Any, np.ndarray]:
    keys = keys.numpy() if hasattr(keys, "numpy") else keys
    values = comparable(values)
    assert len(keys) == len(values)
    result = {norm_key(k): v for k, v in zip(keys, values)}
    assert len(result) == len(keys), "export returned a key twice"
    return result


def assert_table_matches(table, model: DictModel) -> None:
    """Size, export and lookup of every model key agree with the model."""
    assert int(table.size()) == len(model.data)
    got = exported_dict(*table.export())
    assert set(got) == set(model.data)
    for k, v in model.data.items():
        np.testing.assert_array_equal(got[k], comparable(v), err_msg=f"key {k!r}")


def run_python(script: str, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """Runs `script` (a file path) in a fresh interpreter that can import the package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run(
        [sys.executable, script, *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{script} exited with {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\n"
            f"stderr:\n{proc.stderr[-8000:]}"
        )
    return proc


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables_worker.py")


def worker_results(mode: str, arg: str, worker: str = WORKER) -> Dict[str, Any]:
    """Runs a worker script (default tests/tables_worker.py) in a fresh process; its
    JSON result."""
    proc = run_python(worker, mode, arg)
    return json.loads(proc.stdout.strip().splitlines()[-1])


_WORKDIRS: List[str] = []


def temp_workdir() -> str:
    """A temporary directory removed when the test session ends (tests/conftest.py calls
    remove_temp_workdirs; atexit, should this module be used without it)."""
    workdir = tempfile.mkdtemp(prefix="dynemb_")
    _WORKDIRS.append(workdir)
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    return workdir


def remove_temp_workdirs() -> None:
    while _WORKDIRS:
        shutil.rmtree(_WORKDIRS.pop(), ignore_errors=True)


@functools.lru_cache(maxsize=None)
def graph_mode_results(worker: str = WORKER) -> Dict[str, Any]:
    """Every TF1 graph-mode scenario of `worker`, run once per test session in one
    subprocess."""
    return worker_results("graph", temp_workdir(), worker)


def scenario_result(results: Dict[str, Any], name: str) -> Dict[str, Any]:
    result = results[name]
    if isinstance(result, dict) and "error" in result:
        raise AssertionError(f"scenario {name} failed in the worker:\n{result['error']}")
    return result
