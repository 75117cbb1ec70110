"""setup.py's object cache: keyed by what decides an object, not by where its inputs
were found, so that pip's isolated build (pybind11 in a new temporary folder each time)
and a later `setup.py build_ext --inplace` share objects (issue 38)."""

from __future__ import annotations

import json
import os
import sys
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup_py():
    """setup.py's functions, without running setup() (nor make_extensions, which needs
    pybind11)."""
    source = open(os.path.join(ROOT, "setup.py")).read()
    namespace = {"__file__": os.path.join(ROOT, "setup.py"), "__name__": "dynemb_setup"}
    cwd = os.getcwd()
    try:
        with mock.patch("setuptools.setup"):
            code = source.replace("setup(ext_modules=make_extensions(),", "setup(ext_modules=[],")
            exec(compile(code, "setup.py", "exec"), namespace)
    finally:
        os.chdir(cwd)  # setup.py changes to its folder
    return namespace


def headers(folder, text):
    os.makedirs(os.path.join(folder, "pybind11"), exist_ok=True)
    with open(os.path.join(folder, "pybind11", "pybind11.h"), "w") as f:
        f.write(text)
    return str(folder)


def command(pybind11_include, tf_include="/site/tensorflow/include"):
    return ["g++", "-O3", f"-I{ROOT}", f"-I{pybind11_include}", "-c",
            "-isystem", tf_include, "-D_GLIBCXX_USE_CXX11_ABI=1"]


def test_include_folders_are_keyed_by_content_not_path(setup_py, tmp_path):
    cache_key = setup_py["cache_key"]
    isolated = headers(tmp_path / "pip-build-env-abc" / "include", "// pybind11 3.1\n")
    venv = headers(tmp_path / "venv" / "include", "// pybind11 3.1\n")
    other = headers(tmp_path / "other" / "include", "// pybind11 3.2\n")
    named = {"/site/tensorflow/include": "tensorflow 2.21.0 v2.21.0-rc1"}
    key, checked, keyed = cache_key(command(isolated), named)
    assert cache_key(command(venv), named)[0] == key
    assert cache_key(command(other), named)[0] != key
    # TensorFlow's headers by its version: the same wherever it is installed.
    elsewhere = "/other/site/tensorflow/include"
    assert cache_key(command(venv, elsewhere),
                     {elsewhere: named["/site/tensorflow/include"]})[0] == key
    assert cache_key(command(venv), {"/site/tensorflow/include": "tensorflow 2.20.0"})[0] != key
    # The compiler's flags and identity count.
    assert cache_key(command(venv)[:1] + ["-O2"] + command(venv)[2:], named)[0] != key
    assert json.loads(key)[0].endswith(
        setup_py["subprocess"].run(["g++", "--version"], capture_output=True, text=True)
        .stdout.splitlines()[0])
    assert "pip-build-env" not in key and ROOT in key
    assert checked == (ROOT,) and keyed == (os.path.abspath(isolated), "/site/tensorflow/include")


def test_objects_stay_fresh_when_a_keyed_folder_is_gone(setup_py, tmp_path):
    up_to_date = setup_py["_deps_up_to_date"]
    gone = str(tmp_path / "pip-build-env-abc" / "include")  # removed after pip's build
    project_header = tmp_path / "project" / "table.h"
    project_header.parent.mkdir()
    project_header.write_text("// header\n")
    obj = tmp_path / "x.o"
    obj.write_bytes(b"")
    depfile = tmp_path / "x.o.d"
    depfile.write_text(f"{obj}: {project_header} \\\n {gone}/pybind11/pybind11.h\n")
    os.utime(project_header, (1000, 1000))
    checked = (str(project_header.parent),)
    assert up_to_date(str(obj), str(depfile), checked, (gone,))
    # A path-keyed folder's missing header, or a newer project header, is stale.
    assert not up_to_date(str(obj), str(depfile), checked + (gone,), ())
    os.utime(project_header)
    os.utime(obj, (1000, 1000))
    assert not up_to_date(str(obj), str(depfile), checked, (gone,))
