"""Loads the tensorflow_dynemb op library (``_dynemb_ops.so``) once.

``ops`` is the module returned by ``tf.load_op_library``; its snake_case
functions are the generated op wrappers (``ops.dynemb_hash_table``,
``ops.dynemb_table_find``, ...). It is loaded on first access, so importing
this module never fails by itself:

    from tensorflow_dynemb._ops import ops      # loads the library (or raises)

A C++ op library only works with the exact TensorFlow it was compiled against.
Before loading, the version recorded at build time (``_build_info.TF_VERSION``,
written by setup.py) is compared with the installed ``tf.__version__``; on a
mismatch, a missing library, or a library that fails to load, one ImportError
says which TensorFlow it was built for, which one is installed, and how to
rebuild -- instead of a dlopen error about undefined C++ symbols.

``core()`` returns the pybind11 module ``tensorflow_dynemb._core`` (the hash
table core without TensorFlow), imported on first call.

``gpu_kernels_built()`` says whether the op library holds GPU kernels (a CUDA
build, docs/gpu.md), without loading it.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import threading
import types
from typing import Optional

import tensorflow as tf

__all__ = [
    "ops",
    "core",
    "load_op_library",
    "check_tf_version",
    "op_library_path",
    "gpu_kernels_built",
]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_LIB_GLOB = "_dynemb_ops*.so"

REBUILD_COMMANDS = (
    "pip install --no-deps --force-reinstall -e .",
    "python setup.py build_ext --inplace",
)

_lock = threading.Lock()
_ops_module: Optional[types.ModuleType] = None


def _source_dir() -> Optional[str]:
    """The source checkout this package is imported from (editable installs), if any."""
    root = os.path.dirname(_PKG_DIR)
    return root if os.path.exists(os.path.join(root, "setup.py")) else None


def _error_message(problem: str, built_version: Optional[str], installed_version: str) -> str:
    src = _source_dir()
    where = f"in {src}" if src else "in the tensorflow_dynemb source directory"
    return (
        f"tensorflow_dynemb cannot load its op library: {problem}\n"
        f"  built for TensorFlow: {built_version or 'unknown'}\n"
        f"  installed TensorFlow: {installed_version}\n"
        f"Rebuild it against the installed TensorFlow, {where}:\n"
        f"  {REBUILD_COMMANDS[0]}\n"
        f"or, for a quick in-place rebuild:\n"
        f"  {REBUILD_COMMANDS[1]}"
    )


def _release(version: str) -> Optional[tuple[int, int, int]]:
    """(major, minor, patch) of a version string such as '2.21.0' or '2.16.0rc1'."""
    m = re.match(r"\s*(\d+)\.(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def check_tf_version(built_version: Optional[str], installed_version: str) -> None:
    """Checks that the op library was built for the installed TensorFlow.

    Args:
      built_version: ``_build_info.TF_VERSION``, or None when unknown.
      installed_version: ``tf.__version__``.

    Raises:
      ImportError: if either version is unknown or their major.minor.patch differ.
    """
    if built_version is None:
        raise ImportError(_error_message(
            "tensorflow_dynemb/_build_info.py is missing (the package was not built by "
            "setup.py, or the build did not finish).", None, installed_version))
    built, installed = _release(built_version), _release(installed_version)
    if built is None or installed is None or built != installed:
        raise ImportError(_error_message(
            f"it was built for TensorFlow {built_version} but TensorFlow "
            f"{installed_version} is installed.", built_version, installed_version))


def op_library_path() -> Optional[str]:
    """Path of the op library next to this file, or None if it is not built."""
    exact = os.path.join(_PKG_DIR, "_dynemb_ops.so")
    if os.path.exists(exact):
        return exact
    found = sorted(glob.glob(os.path.join(_PKG_DIR, _LIB_GLOB)))
    return found[0] if found else None


def _build_info(name: str, default):
    """A value setup.py recorded in `_build_info.py` when it built the op library."""
    try:
        build_info = importlib.import_module("tensorflow_dynemb._build_info")
    except ImportError:
        return default
    return getattr(build_info, name, default)


def _built_tf_version() -> Optional[str]:
    return _build_info("TF_VERSION", None)


def gpu_kernels_built() -> bool:
    """Whether the op library was built with its GPU kernels (False when unknown)."""
    return bool(_build_info("GPU_KERNELS", False))


def _load(path: Optional[str], built_version: Optional[str],
          installed_version: str) -> types.ModuleType:
    """Checks the versions, then loads `path`; raises one ImportError on any failure."""
    check_tf_version(built_version, installed_version)
    if path is None or not os.path.exists(path):
        raise ImportError(_error_message(
            f"{os.path.join(_PKG_DIR, '_dynemb_ops.so')} does not exist (not built).",
            built_version, installed_version))
    try:
        return tf.load_op_library(path)
    except (tf.errors.NotFoundError, OSError) as e:
        # The loader's message is one line (e.g. "undefined symbol: _ZN10tensorflow..."):
        # keep it, shortened, for the rare case where the versions match but the build is
        # still broken; drop the traceback chain (`from None`).
        detail = str(getattr(e, "message", None) or e).strip().splitlines()
        detail = (detail[0] if detail else type(e).__name__)[:400]
        raise ImportError(_error_message(
            f"loading {path} failed ({detail}).", built_version, installed_version)) from None


def load_op_library() -> types.ModuleType:
    """Loads the op library (once per process) and returns the generated-ops module."""
    global _ops_module
    with _lock:
        if _ops_module is None:
            _ops_module = _load(op_library_path(), _built_tf_version(), tf.__version__)
        return _ops_module


def core() -> types.ModuleType:
    """The pybind11 module ``tensorflow_dynemb._core`` over cc/core (no TensorFlow)."""
    try:
        return importlib.import_module("tensorflow_dynemb._core")
    except ImportError as e:
        src = _source_dir()
        raise ImportError(
            f"tensorflow_dynemb._core (the pybind11 module over cc/core) cannot be imported: "
            f"{e}. Rebuild it{' in ' + src if src else ''} with "
            f"`{REBUILD_COMMANDS[0]}` or `{REBUILD_COMMANDS[1]}`.") from None


def __getattr__(name: str):
    # PEP 562: `ops` is loaded on first access (also by `from ... import ops`).
    if name == "ops":
        module = load_op_library()
        globals()["ops"] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
