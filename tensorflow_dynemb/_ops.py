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
says which TensorFlow it was built for, which one is installed, and the command
that rebuilds it for this kind of install (``rebuild_advice``) -- instead of a
dlopen error about undefined C++ symbols.

``core()`` returns the pybind11 module ``tensorflow_dynemb._core`` (the hash
table core without TensorFlow), imported on first call.

``gpu_kernels_built()`` says whether the op library holds GPU kernels (a CUDA
build, docs/gpu.md), without loading it.
"""

from __future__ import annotations

import glob
import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import sys
import threading
import types
import urllib.parse
import urllib.request
from typing import Optional

import tensorflow as tf

__all__ = [
    "ops",
    "core",
    "load_op_library",
    "check_tf_version",
    "op_library_path",
    "gpu_kernels_built",
    "rebuild_advice",
]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_LIB_GLOB = "_dynemb_ops*.so"

# The distribution name (pyproject.toml's [project] name), for pip and importlib.metadata.
DIST_NAME = "tensorflow-dynemb"

_lock = threading.Lock()
_ops_module: Optional[types.ModuleType] = None


def _source_dir() -> Optional[str]:
    """The source checkout this package is imported from (editable installs), if any."""
    root = os.path.dirname(_PKG_DIR)
    return root if os.path.exists(os.path.join(root, "setup.py")) else None


def _direct_url() -> Optional[dict]:
    """What pip recorded about where it installed the distribution from (PEP 610's
    direct_url.json); None when it came from an index or is not installed."""
    try:
        text = importlib.metadata.distribution(DIST_NAME).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _installed_version() -> Optional[str]:
    try:
        return importlib.metadata.version(DIST_NAME)
    except importlib.metadata.PackageNotFoundError:
        return None


def _local_path(url: str) -> str:
    """A file:// URL as a path; other URLs as they are."""
    parsed = urllib.parse.urlparse(url)
    return urllib.request.url2pathname(parsed.path) if parsed.scheme == "file" else url


# What `setup.py build_ext` imports, by module, with the requirement that provides it
# (pyproject.toml's build-system requires). pip installs them only into its isolated
# build environment, so an editable install's environment may lack them.
_BUILD_TOOLS = (("setuptools", "setuptools>=64"), ("pybind11", "pybind11>=2.10"))


def _missing_build_tools() -> list[str]:
    return [req for module, req in _BUILD_TOOLS if importlib.util.find_spec(module) is None]


def rebuild_advice(source_dir: Optional[str], direct_url: Optional[dict], python: str,
                   version: Optional[str], missing_build_tools: tuple[str, ...] = ()
                   ) -> tuple[str, str]:
    """What kind of install this is, and the one command that rebuilds its op library.

    Each kind needs its own command: an in-place build does not reach a copy in
    site-packages, and reinstalling with `-e` would turn a regular install into an
    editable one tied to a checkout.

    Args:
      source_dir: the checkout the package is imported from (``_source_dir()``), or None.
      direct_url: the installed distribution's direct_url.json (``_direct_url()``), or None.
      python: the interpreter to run the command with (``sys.executable``).
      version: the installed distribution's version, or None.
      missing_build_tools: requirements the in-place build needs that this environment
        lacks (``_missing_build_tools()``); the command installs them first.

    Returns:
      (kind, command): e.g. ("a regular install (from /src)", "python -m pip install ...").
    """
    py = shlex.quote(python)
    if source_dir is not None:
        # `pip install -e .` (setuptools builds the library into the checkout) or a
        # checkout on sys.path: rebuilding in place is the fix, and the quickest.
        command = f"cd {shlex.quote(source_dir)} && {py} setup.py build_ext --inplace"
        if missing_build_tools:
            tools = " ".join(shlex.quote(req) for req in missing_build_tools)
            command = f"{py} -m pip install {tools} && {command}"
        return (f"a source checkout ({source_dir}: an editable install, or on sys.path)",
                command)
    info = direct_url or {}
    url = info.get("url")
    if url and info.get("dir_info", {}).get("editable"):
        # Editable, but imported from outside the checkout (setuptools' strict
        # editable mode links files from a build directory): reinstall it editable.
        src = _local_path(url)
        return (f"an editable install of {src}",
                f"{py} -m pip install --no-deps --force-reinstall -e {shlex.quote(src)}")
    if url and "vcs_info" in info:
        vcs = info["vcs_info"]
        source = f"{vcs.get('vcs', 'git')}+{url}"
        if vcs.get("commit_id"):
            source += f"@{vcs['commit_id']}"
        origin = source
    elif url:
        source = origin = _local_path(url)  # a source directory, an sdist file or URL
    else:
        source = f"{DIST_NAME}=={version}" if version else DIST_NAME
        origin = f"a package index: {source}"
    # --no-cache-dir: pip keeps the wheel it built from an index's sdist and reinstalls
    # that one ("Using cached ...whl"), built for the old TensorFlow; --no-binary does
    # not stop that (pip 23.2 and 26.3), it only refuses prebuilt wheels.
    return (f"a regular install (from {origin})",
            f"{py} -m pip install --no-deps --force-reinstall --no-cache-dir "
            f"--no-binary {DIST_NAME} {shlex.quote(source)}")


def _rebuild_advice() -> tuple[str, str]:
    src = _source_dir()
    if src is not None:
        return rebuild_advice(src, None, sys.executable, None, tuple(_missing_build_tools()))
    return rebuild_advice(None, _direct_url(), sys.executable, _installed_version())


def _error_message(problem: str, built_version: Optional[str], installed_version: str) -> str:
    kind, command = _rebuild_advice()
    return (
        f"tensorflow_dynemb cannot load its op library: {problem}\n"
        f"  built for TensorFlow: {built_version or 'unknown'}\n"
        f"  installed TensorFlow: {installed_version}\n"
        f"The op library only loads into the TensorFlow it was built against. This is\n"
        f"{kind}; rebuild it against the installed TensorFlow with:\n"
        f"  {command}"
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
        kind, command = _rebuild_advice()
        raise ImportError(
            f"tensorflow_dynemb._core (the pybind11 module over cc/core) cannot be imported: "
            f"{e}. This is {kind}; rebuild it with:\n  {command}") from None


def __getattr__(name: str):
    # PEP 562: `ops` is loaded on first access (also by `from ... import ops`).
    if name == "ops":
        module = load_op_library()
        globals()["ops"] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
