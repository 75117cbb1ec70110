"""Tests of the op-library loader (tensorflow_dynemb/_ops.py).

The version check and the error paths are tested on a copy of `_ops.py` loaded by
file path, so they run even when the op library is not built (importing the package
itself loads the library). The end-to-end mismatch test runs in a fresh process.
"""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

_SPEC = importlib.util.find_spec("tensorflow_dynemb")  # does not import the package
PKG_DIR = _SPEC.submodule_search_locations[0]
# Where the package is imported from: a source checkout (the tests' usual case) or not.
CHECKOUT = os.path.dirname(PKG_DIR)
IN_CHECKOUT = os.path.exists(os.path.join(CHECKOUT, "setup.py"))
PY = "/venv/bin/python"
PIP_REINSTALL = f"{PY} -m pip install --no-deps --force-reinstall --no-cache-dir --no-binary tensorflow-dynemb"


@pytest.fixture(scope="module")
def loader():
    spec = importlib.util.spec_from_file_location(
        "_dynemb_ops_under_test", os.path.join(PKG_DIR, "_ops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_command():
    """The rebuild command the loader should print for the package under test."""
    python = shlex.quote(sys.executable)
    if IN_CHECKOUT:
        # (After the build tools' install when pybind11 or setuptools are missing.)
        return f"cd {shlex.quote(CHECKOUT)} && {python} setup.py build_ext --inplace"
    return f"{python} -m pip install --no-deps --force-reinstall --no-cache-dir"


def assert_clear_error(err, built, installed):
    msg = str(err)
    assert f"built for TensorFlow: {built}" in msg
    assert f"installed TensorFlow: {installed}" in msg
    assert "rebuild it against the installed TensorFlow with:\n  " in msg
    assert msg.rstrip().endswith(expected_command())
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
    assert expected_command() in err
    assert "During handling of the above exception" not in err
    assert "undefined symbol" not in err


# ----------------------------------------------------------------------------------------
# The rebuild command for each kind of install
# ----------------------------------------------------------------------------------------


def test_advice_for_a_checkout_rebuilds_in_place(loader):
    # Editable installs build the library into the checkout: rebuild it there. What pip
    # recorded does not matter then.
    kind, command = loader.rebuild_advice(
        "/home/u/my src", {"url": "file:///elsewhere", "dir_info": {}}, PY, "0.1.0")
    assert command == f"cd '/home/u/my src' && {PY} setup.py build_ext --inplace"
    assert "source checkout (/home/u/my src" in kind


def test_advice_for_a_checkout_installs_missing_build_tools_first(loader):
    # pip builds editable installs with its own build requirements, in isolation: the
    # environment itself may lack what `setup.py build_ext` imports.
    _, command = loader.rebuild_advice("/src", None, PY, None, ("pybind11>=2.10",))
    assert command == (f"{PY} -m pip install 'pybind11>=2.10' && "
                       f"cd /src && {PY} setup.py build_ext --inplace")


@pytest.mark.parametrize("direct_url, source", [
    ({"url": "file:///home/u/tensorflow_dynemb", "dir_info": {}},  # pip install DIR
     "/home/u/tensorflow_dynemb"),
    ({"url": "file:///home/u/my%20src", "dir_info": {}}, "'/home/u/my src'"),
    ({"url": "file:///tmp/tensorflow_dynemb-0.1.0.tar.gz",  # pip install SDIST
      "archive_info": {"hashes": {"sha256": "0" * 64}}},
     "/tmp/tensorflow_dynemb-0.1.0.tar.gz"),
    ({"url": "https://example.com/tensorflow_dynemb-0.1.0.tar.gz", "archive_info": {}},
     "https://example.com/tensorflow_dynemb-0.1.0.tar.gz"),
    ({"url": "https://github.com/o/tensorflow_dynemb.git",  # pip install git+URL
      "vcs_info": {"vcs": "git", "commit_id": "4e20dd8"}},
     "git+https://github.com/o/tensorflow_dynemb.git@4e20dd8"),
    (None, "tensorflow-dynemb==0.1.0"),  # from an index: no direct_url.json
])
def test_advice_for_a_regular_install_reinstalls_from_its_source(loader, direct_url, source):
    kind, command = loader.rebuild_advice(None, direct_url, PY, "0.1.0")
    assert command == f"{PIP_REINSTALL} {source}"
    assert "-e" not in command.split()  # stays a regular install
    assert kind.startswith("a regular install (from ")


def test_advice_for_an_editable_install_outside_its_checkout(loader):
    # setuptools' strict editable mode: imported from a link tree, not the checkout.
    kind, command = loader.rebuild_advice(
        None, {"url": "file:///home/u/src", "dir_info": {"editable": True}}, PY, "0.1.0")
    assert command == f"{PY} -m pip install --no-deps --force-reinstall -e /home/u/src"
    assert kind == "an editable install of /home/u/src"


def test_dist_name_is_pyprojects(loader):
    # The name pip and importlib.metadata know the package by.
    with open(os.path.join(CHECKOUT, "pyproject.toml")) as f:
        name = re.search(r'^name = "([^"]+)"', f.read(), re.M)
    if name is None or not IN_CHECKOUT:
        pytest.skip("not run from a source checkout with pyproject.toml")
    assert loader.DIST_NAME == name.group(1)


@pytest.mark.parametrize("direct_url", [
    {"url": "file:///home/u/tensorflow_dynemb", "dir_info": {}},
    None,
], ids=["from-a-directory", "from-an-index"])
def test_mismatch_in_a_regular_install(tmp_path, direct_url):
    # A copy of the package in a site directory without setup.py beside it, with the
    # metadata pip writes, and a build for another TensorFlow: what a user of
    # `pip install .` sees after upgrading TensorFlow.
    site = tmp_path / "site-packages"
    shutil.copytree(PKG_DIR, site / "tensorflow_dynemb",
                    ignore=shutil.ignore_patterns("__pycache__", "_build_info.py"))
    (site / "tensorflow_dynemb" / "_build_info.py").write_text("TF_VERSION = '1.2.3'\n")
    dist_info = site / "tensorflow_dynemb-0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tensorflow-dynemb\nVersion: 0.1.0\n")
    if direct_url is not None:
        (dist_info / "direct_url.json").write_text(json.dumps(direct_url))
    code = "from tensorflow_dynemb import _ops; _ops.load_op_library()"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    source = "/home/u/tensorflow_dynemb" if direct_url else "tensorflow-dynemb==0.1.0"
    python = shlex.quote(sys.executable)
    assert (f"rebuild it against the installed TensorFlow with:\n  {python} -m pip install "
            f"--no-deps --force-reinstall --no-cache-dir --no-binary tensorflow-dynemb "
            f"{source}\n") in proc.stderr + "\n"
    assert "setup.py" not in proc.stderr


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
