"""The test session's check that a run leaves no temporary files (tests/conftest.py):
every process of the run writes its temporary files to a TMPDIR of the run's own;
whatever is left there when the run ends fails it, by name, and is removed. And the
log of a run ends with pytest's summary."""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

TESTS = '''
import os
import tempfile


def test_cleans_up():
    with tempfile.TemporaryDirectory(prefix="cleaned_") as folder:
        assert os.path.isdir(folder)


def test_leaks():
    folder = tempfile.mkdtemp(prefix="leaked_")
    assert folder.startswith(os.environ["TMPDIR"] + os.sep)
'''


def test_a_run_that_leaves_a_temporary_folder_fails_naming_it(tmp_path):
    (tmp_path / "test_tmp.py").write_text(TESTS)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run(
        # This folder's conftest.py as a plugin; one xdist worker, whose temporary files
        # must be seen too (it ends after the tests, with its atexit clean-ups).
        [sys.executable, "-m", "pytest", "-p", "conftest", "-q", "-n", "1",
         "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'base'}", "test_tmp.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=300,
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout
    assert any(line.strip().startswith("leaked_") for line in lines), result.stdout
    assert not any("cleaned_" in line for line in lines), result.stdout
    # The summary ends the log: TensorFlow's start-up lines (`E0000 ... cuInit` on a
    # machine without a GPU driver) are held back, not printed after it.
    assert "2 passed, 1 left in TMPDIR" in lines[-1], result.stdout
    # Removed, with the run's TMPDIR.
    assert not (tmp_path / "tmpdir-base").exists()
