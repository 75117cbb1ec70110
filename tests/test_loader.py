"""Tests of the op-library loader (tensorflow_dynemb/_ops.py).

The version check and the error paths are tested on a copy of `_ops.py` loaded by
file path, so they run even when the op library is not built (importing the package
itself loads the library). The end-to-end mismatch test runs in a fresh process.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

_SPEC = importlib.util.find_spec("tensorflow_dynemb")  # does not import the package
PKG_DIR = _SPEC.submodule_search_locations[0]
REBUILD_COMMANDS = (
    "pip install --no-deps --force-reinstall -e .",
    "python setup.py build_ext --inplace",
)


@pytest.fixture(scope="module")
def loader():
    spec = importlib.util.spec_from_file_location(
        "_dynemb_ops_under_test", os.path.join(PKG_DIR, "_ops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_clear_error(err, built, installed):
    msg = str(err)
    assert f"built for TensorFlow: {built}" in msg
    assert f"installed TensorFlow: {installed}" in msg
    for command in REBUILD_COMMANDS:
        assert command in msg
    # One error, not a chain ending in a dlopen message.
    assert err.__cause__ is None
    assert err.__context__ is None or err.__suppress_context__


@pytest.mark.parametrize("built, installed", [
    ("2.21.0", "2.21.0"),
    ("2.16.2", "2.16.2"),
    ("2.17.0rc1", "2.17.0"),  # same major.minor.patch
])
def test_check_accepts_same_release(loader, built, installed):
    loader.check_tf_version(built, installed)


@pytest.mark.parametrize("built, installed", [
    ("2.16.2", "2.21.0"),
    ("2.21.0", "2.16.2"),
    ("2.21.0", "2.21.1"),
    ("2.21.0", "3.21.0"),
    ("garbage", "2.21.0"),
])
def test_check_rejects_other_release(loader, built, installed):
    with pytest.raises(ImportError) as info:
        loader.check_tf_version(built, installed)
    assert_clear_error(info.value, built, installed)


def test_check_without_build_info(loader):
    with pytest.raises(ImportError, match="_build_info.py is missing") as info:
        loader.check_tf_version(None, "2.21.0")
    assert_clear_error(info.value, "unknown", "2.21.0")


def test_missing_library(loader, tmp_path):
    with pytest.raises(ImportError, match="does not exist") as info:
        loader._load(str(tmp_path / "_dynemb_ops.so"), tf.__version__, tf.__version__)
    assert_clear_error(info.value, tf.__version__, tf.__version__)


def test_unloadable_library(loader, tmp_path):
    bogus = tmp_path / "_dynemb_ops.so"
    bogus.write_bytes(b"this is not a shared object\n")
    with pytest.raises(ImportError, match="loading .* failed") as info:
        loader._load(str(bogus), tf.__version__, tf.__version__)
    assert_clear_error(info.value, tf.__version__, tf.__version__)


def test_mismatch_in_fresh_process():
    # What a user sees after upgrading TensorFlow without rebuilding.
    code = textwrap.dedent("""
        import sys, types
        fake = types.ModuleType("tensorflow_dynemb._build_info")
        fake.TF_VERSION = "1.2.3"
        sys.modules["tensorflow_dynemb._build_info"] = fake
        import tensorflow_dynemb._ops as ops_module
        ops_module.load_op_library()
    """)
    pythonpath = [os.path.dirname(PKG_DIR)] + os.environ.get("PYTHONPATH", "").split(os.pathsep)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(p for p in pythonpath if p))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    err = proc.stderr
    assert "ImportError: tensorflow_dynemb cannot load its op library" in err
    assert "built for TensorFlow: 1.2.3" in err
    assert f"installed TensorFlow: {tf.__version__}" in err
    for command in REBUILD_COMMANDS:
        assert command in err
    assert "During handling of the above exception" not in err
    assert "undefined symbol" not in err


def test_built_library_loads():
    from tensorflow_dynemb import _build_info, _ops

    assert _build_info.TF_VERSION == tf.__version__
    ops = _ops.load_op_library()
    assert _ops.ops is ops
    for name in ("dynemb_hash_table", "dynemb_table_find", "dynemb_table_insert",
                 "dynemb_table_size", "dynemb_table_export"):
        assert callable(getattr(ops, name)), name


def test_core_module():
    from tensorflow_dynemb import _ops

    core = _ops.core()
    assert core.__name__ == "tensorflow_dynemb._core"
