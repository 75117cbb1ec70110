"""The Bazel build (BUILD, WORKSPACE, bazel/): builds the op library with Bazel, offline,
and loads it into TensorFlow in a fresh process.

Skipped when `bazel` is not on PATH (.ci/run installs Debian's bazel-bootstrap where it
can). Slow: a full compile of the op library in a fresh Bazel output base, which is
deleted afterwards; `--batch` leaves no Bazel server behind. DYNEMB_BUILD_JOBS caps
Bazel's parallel jobs as it does setup.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
BAZEL = shutil.which("bazel")
BUILD_TIMEOUT_S = 3600

pytestmark = [
    pytest.mark.slow,
    # Minutes of compiling: CI builds with Bazel against its first TensorFlow only; the
    # pip build (setup.py), which most users take, is built against every TensorFlow.
    pytest.mark.once_in_ci,
    pytest.mark.skipif(BAZEL is None, reason="bazel is not on PATH (Debian: apt-get install "
                                             "bazel-bootstrap; .ci/run installs it)"),
]

# Runs in a fresh process: loads the library Bazel built, round-trips rows through a
# table with the raw generated ops, and prints the results and the op names as JSON.
_CHECK = textwrap.dedent("""
    import json, sys
    import tensorflow as tf

    ops = tf.load_op_library(sys.argv[1])
    table = ops.dynemb_hash_table(key_dtype=tf.int64, value_dtype=tf.float32,
                                  value_shape=[2], anonymous=True)
    ops.dynemb_table_insert(table, tf.constant([3, 7, 2**40], tf.int64),
                            tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]),
                            tf.zeros([0], tf.int64))  # no scores: the table assigns them
    values, exists = ops.dynemb_table_find(table, tf.constant([7, 5, 2**40, 3], tf.int64),
                                           tf.constant([-1.0, -2.0]))
    print(json.dumps({
        "values": values.numpy().tolist(),
        "exists": exists.numpy().tolist(),
        "size": int(ops.dynemb_table_size(table)),
        "op_names": sorted(name for name in dir(ops) if name.startswith("Dynemb")),
    }))
""")

_OP_NAMES = textwrap.dedent("""
    import json
    from tensorflow_dynemb import _ops
    print(json.dumps(sorted(name for name in dir(_ops.load_op_library()) if name.startswith("Dynemb"))))
""")


def _run(cmd, **kwargs):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited with {proc.returncode}\n"
        f"--- stdout (tail)\n{proc.stdout[-4000:]}\n--- stderr (tail)\n{proc.stderr[-8000:]}")
    return proc.stdout


def _bazel(output_user_root, *args):
    # --batch: no server outlives the command. The output root is the test's own, so the
    # build starts from nothing and leaves nothing behind.
    return _run([BAZEL, "--batch", f"--output_user_root={output_user_root}", *args],
                cwd=REPO_ROOT, timeout=BUILD_TIMEOUT_S)


def _fresh_python(code, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = _run([sys.executable, "-c", code, *args], env=env, cwd=REPO_ROOT, timeout=600)
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bazel_op_library(tmp_path_factory):
    """Builds //:_dynemb_ops.so with Bazel, offline; returns a copy of it."""
    tmp = tmp_path_factory.mktemp("bazel")
    root = tmp / "output_user_root"
    build_flags = [
        f"--repo_env=TF_PYTHON={sys.executable}",  # the TensorFlow this test runs with
        "--experimental_repository_disable_download",  # offline, whatever .bazelrc says
        "--symlink_prefix=/",  # no bazel-* symlinks in the source tree
    ]
    if os.environ.get("DYNEMB_BUILD_JOBS"):
        build_flags.append(f"--jobs={os.environ['DYNEMB_BUILD_JOBS']}")
    start = time.time()
    try:
        _bazel(root, "build", *build_flags, "//:_dynemb_ops.so")
        bin_dir = _bazel(root, "info", *build_flags, "bazel-bin").strip()
        print(f"bazel build //:_dynemb_ops.so: {time.time() - start:.0f} s")
        library = tmp / "_dynemb_ops.so"
        shutil.copy(os.path.join(bin_dir, "_dynemb_ops.so"), library)
    finally:
        # Bazel makes its output read-only; `clean --expunge` deletes it.
        subprocess.run([BAZEL, "--batch", f"--output_user_root={root}", "clean", "--expunge"],
                       cwd=REPO_ROOT, capture_output=True, timeout=600)
        shutil.rmtree(root, ignore_errors=True)
    return str(library)


@pytest.fixture(scope="module")
def loaded(bazel_op_library):
    """What the Bazel-built library does in a fresh process (_CHECK's output)."""
    return _fresh_python(_CHECK, bazel_op_library)


def test_bazel_op_library_round_trip(loaded):
    assert loaded["values"] == [[3.0, 4.0], [-1.0, -2.0], [5.0, 6.0], [1.0, 2.0]]
    assert loaded["exists"] == [True, False, True, True]
    assert loaded["size"] == 3


def test_bazel_op_library_has_the_ops_of_setup_py_build(loaded):
    # Both builds compile the same sources: the same ops, none missing from a glob.
    setup_py_ops = _fresh_python(_OP_NAMES)
    assert len(loaded["op_names"]) > 20
    # The Redis table is setup.py's only (it needs hiredis, which BUILD does not fetch).
    assert loaded["op_names"] == [op for op in setup_py_ops if op != "DynembRedisTable"]
