"""Loads the TF-free core extension `tensorflow_dynemb._core` for the core tests.

Importing the `tensorflow_dynemb` package imports TensorFlow, so the core tests
load the extension file directly (importlib's ExtensionFileLoader) and never
import the package. Where the extension comes from, in order:

1. `$DYNEMB_CORE_EXT`: the path of a built `_core*.so`.
2. A `_core*.so` beside the package (in-place `setup.py build_ext --inplace`,
   `pip install -e .`, or an installed wheel found without importing the
   package), if it is newer than every core and binding source in this checkout.
3. Otherwise it is compiled here with g++ from `cc/core` and `cc/bindings` into
   `build/core_ext/<hash of the sources>/`, so the tests always exercise the
   sources of this checkout. The build is cached across runs.

`load_core()` returns the module, or calls `pytest.skip` when there is no
extension and no compiler to build one.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
MODULE_NAME = "tensorflow_dynemb._core"
CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-pthread"]

_module: ModuleType | None = None


def core_sources() -> list[Path]:
    """The C++ sources of the core library (no GPU, tests or benchmarks)."""
    files = sorted(REPO.glob("cc/core/*.cc")) + sorted(REPO.glob("cc/core/cpu/*.cc"))
    return files


def _all_inputs() -> list[Path]:
    """Every file whose change makes a built extension (or test binary) stale."""
    found = []
    for pattern in ("cc/core/*.h", "cc/core/*.cc", "cc/core/cpu/*", "cc/bindings/*",
                    "cc/core/tests/*.h"):
        found += [p for p in REPO.glob(pattern) if p.is_file()]
    return sorted(found)


def _newest_input_mtime() -> float:
    return max((p.stat().st_mtime for p in _all_inputs()), default=0.0)


def _prebuilt_candidates(stem: str = "_core") -> list[Path]:
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    dirs = [REPO / "tensorflow_dynemb"]
    # find_spec on a top-level package locates it without executing it.
    spec = importlib.util.find_spec("tensorflow_dynemb")
    if spec is not None and spec.submodule_search_locations:
        dirs += [Path(d) for d in spec.submodule_search_locations]
    dirs += [Path(d) / "tensorflow_dynemb" for d in glob.glob(str(REPO / "build" / "lib*"))]
    found = []
    for d in dirs:
        for suffix in suffixes:
            p = d / f"{stem}{suffix}"
            if p.is_file() and p not in found:
                found.append(p)
    return found


def _pybind11_include() -> str | None:
    try:
        import pybind11  # noqa: PLC0415 (optional build dependency)
    except ImportError:
        return None
    return pybind11.get_include()


def _compile_objects(sources: list[Path], obj_dir: Path, extra: list[str],
                     cuda_flags: tuple[str, ...] = ()) -> list[Path]:
    """Compiles each source to an object file, in parallel (one per CPU).

    `.cu` sources are compiled with nvcc and `cuda_flags` (see core_gpu_ext.py)."""
    cxx = os.environ.get("CXX", "g++")

    def one(src: Path) -> Path:
        obj = obj_dir / (hashlib.sha1(str(src).encode()).hexdigest()[:12] + src.stem + ".o")
        if src.suffix == ".cu":
            cmd = [*cuda_flags, f"-I{REPO}", "-c", str(src), "-o", str(obj)]
        else:
            cmd = [cxx, *CXXFLAGS, f"-I{REPO}", *extra, "-c", str(src), "-o", str(obj)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {src} failed:\n{' '.join(cmd)}\n{proc.stderr}")
        return obj

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, sources))


def _source_hash(sources: list[Path], extra: str, inputs: list[Path]) -> str:
    h = hashlib.sha256(extra.encode())
    for p in inputs + sources:
        h.update(str(p.relative_to(REPO)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(sources: list[Path], name: str, shared: bool, flags: tuple[str, ...] = (),
          cuda_flags: tuple[str, ...] = (), link_flags: tuple[str, ...] = (),
          inputs: list[Path] | None = None) -> Path:
    """Builds `sources` into build/core_ext/<hash>/<name>, reusing a cached build.

    `flags` are extra compile and link flags (e.g. sanitizers); `cuda_flags` the
    nvcc command and flags for `.cu` sources; `link_flags` extra link flags;
    `inputs` the files whose change makes the build stale (default: the core's).
    """
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler (g++) to build the core extension")
    extra = list(flags)
    if shared:
        if _pybind11_include() is None:
            pytest.skip("pybind11 is not installed: cannot build the core extension")
        extra += [f"-I{_pybind11_include()}", f"-I{sysconfig.get_paths()['include']}"]
    key = " ".join(CXXFLAGS + extra + list(cuda_flags) + list(link_flags))
    out_dir = REPO / "build" / "core_ext" / _source_hash(
        sources, key, _all_inputs() if inputs is None else inputs)
    target = out_dir / name
    if target.is_file():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        objs = _compile_objects(sources, Path(tmp), extra, cuda_flags)
        tmp_target = Path(tmp) / name
        cmd = [os.environ.get("CXX", "g++"), *CXXFLAGS, *flags]
        cmd += ["-shared"] if shared else []
        cmd += [str(o) for o in objs] + list(link_flags) + ["-o", str(tmp_target)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"linking {name} failed:\n{' '.join(cmd)}\n{proc.stderr}")
        os.replace(tmp_target, target)  # atomic: concurrent test processes agree
    return target


def _load(path: Path, module_name: str = MODULE_NAME) -> ModuleType:
    # numpy first, which loads the system libstdc++. A module built by a g++
    # that links libstdc++ statically (the GPU machine's CXX=/opt/gcc/bin/g++)
    # and loaded before it made ml_dtypes, which the module imports, crash
    # (SIGSEGV in libstdc++) in a process that had not imported numpy yet.
    import numpy  # noqa: F401, PLC0415
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_file_location(module_name, str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def extension_path() -> Path:
    """The extension file the tests use (building it when needed)."""
    env = os.environ.get("DYNEMB_CORE_EXT")
    if env:
        return Path(env)
    newest = _newest_input_mtime()
    for candidate in _prebuilt_candidates():
        if candidate.stat().st_mtime >= newest:
            return candidate
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return build(core_sources() + [REPO / "cc/bindings/core_module.cc"], f"_core{suffix}", True)


def load_core() -> ModuleType:
    """The `tensorflow_dynemb._core` module, loaded without TensorFlow."""
    global _module
    if _module is None:
        _module = _load(extension_path())
    return _module


if __name__ == "__main__":  # prints the path, e.g. for benchmarks: python tests/core_ext.py
    print(extension_path())
    sys.exit(0)
