"""Starts TensorFlow with its C++ start-up lines held back, then runs a module or program.

    python path/to/tensorflow_dynemb/_quiet_start.py -m MODULE [ARGS...]    # as python -m
    python path/to/tensorflow_dynemb/_quiet_start.py -c PROGRAM [ARGS...]   # as python -c

`import tensorflow` writes lines such as `I0000 ... port.cc:153] oneDNN custom operations
are on` and `Could not find cuda drivers` straight to file descriptor 2, from C++, before
TF_CPP_MIN_LOG_LEVEL is read (two copies: TF's two shared libraries each log them), and
starting its runtime on a machine without a GPU driver adds `E0000 ... failed call to
cuInit`, which reads like a failure. The demo (scripts/demo.sh) and its serving processes
start TensorFlow here instead: descriptor 2 goes to a temporary file while TensorFlow is
imported and its runtime started, and that text is shown only if the start fails.
Everything after the start is shown as usual; C++ INFO and WARNING lines stay off
unless TF_CPP_MIN_LOG_LEVEL says otherwise (errors always show).

Standard library only, and run by path: importing it from the package would import
`tensorflow_dynemb`, hence TensorFlow, first. `start_tensorflow_quietly` can also be
called from code that has imported TensorFlow already (it then holds back the runtime's
start only).
"""

from __future__ import annotations

import os
import sys

# Run by path, Python put this file's folder first on sys.path, where the package's own
# `math/` and `keras/` would shadow the standard library's `math` (which `tempfile`
# imports) and Keras: take it off before importing anything else. main() puts there what
# `python -m` / `-c` would.
_RUN_BY_PATH = bool(sys.path) and os.path.abspath(sys.path[0]) == os.path.dirname(
    os.path.abspath(__file__))
if _RUN_BY_PATH:
    del sys.path[0]

import contextlib  # noqa: E402  (after the sys.path fix above)
import runpy  # noqa: E402
import tempfile  # noqa: E402

USAGE = "usage: _quiet_start.py (-m MODULE | -c PROGRAM) [ARGS...]"


@contextlib.contextmanager
def held_stderr():
    """File descriptor 2 goes to a temporary file inside the block; its text is written
    to stderr only if the block raises (then the exception propagates).

    tests/conftest.py holds TensorFlow's start-up lines back with it: pytest's capture
    would otherwise print them after the test summary, at the end of the log.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    held = tempfile.TemporaryFile()
    try:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            sys.stderr.flush()
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        held.close()


def start_tensorflow_quietly() -> None:
    """Imports TensorFlow and starts its runtime with file descriptor 2 held back.

    The runtime's start (listing its devices) is what calls cuInit. It fixes the
    process's devices, so logical devices must be configured before this is called.

    Raises:
      Whatever the import or the start raised, after writing the held-back text to
      stderr.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with held_stderr():
        import tensorflow as tf

        tf.config.list_logical_devices()


def main(argv) -> None:
    if len(argv) < 3 or argv[1] not in ("-m", "-c"):
        sys.exit(f"{USAGE}\ngot: {argv[1:]!r}")
    mode, target, args = argv[1], argv[2], argv[3:]
    if _RUN_BY_PATH:
        sys.path.insert(0, os.getcwd() if mode == "-m" else "")
    start_tensorflow_quietly()
    if mode == "-m":
        sys.argv = [target] + args
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c"] + args
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main(sys.argv)
