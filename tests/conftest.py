"""Test-session setup: three logical CPU devices, so that sharding tests can place
each shard of a variable on its own device. It must run before TensorFlow
initialises its devices, hence here, once, for the whole session. TensorFlow's C++
start-up lines (`I0000 ... oneDNN`, `E0000 ... failed call to cuInit`) are held back
meanwhile (shown only if the start fails): pytest's capture of this file's import
would print them after the test summary, as the log's last lines.

Without TensorFlow (e.g. a GPU machine that runs only the TF-free core tests
through tests/core_ext.py and tests/core_gpu_ext.py) there is nothing to set up.

Also: tests marked `slow` (compile checks, scale and stress tests: minutes on 2
cores) run only with `--run-slow` (or DYNEMB_TEST_SLOW=1), which CI (.ci/run) passes;
the summary ends with one line per skip reason; and a run leaves no temporary files:
it gets a TMPDIR of its own (see "Temporary files" below)."""

import importlib.util
import os
import shutil
import sys
import tempfile
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUM_LOGICAL_CPUS = 3


def _quiet_start():
    """tensorflow_dynemb/_quiet_start.py, loaded by path (importing it from the package
    would import TensorFlow first)."""
    path = os.path.join(ROOT, "tensorflow_dynemb", "_quiet_start.py")
    spec = importlib.util.spec_from_file_location("_dynemb_quiet_start", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


try:
    with _quiet_start().held_stderr():
        import tensorflow as tf

        _cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
        )
except ImportError:
    tf = None


def pytest_terminal_summary(terminalreporter):
    """One line per skip reason, with how many tests it skipped: pytest's own `-rs`
    summary lists every skip location, which on a machine without a GPU is dozens of
    lines saying the same thing. Then what the run left in temporary folders."""
    _report_temporary_files(terminalreporter)
    reasons = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reason = str(longrepr[2])
        else:
            reason = str(longrepr)
        reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skip reasons", sep="-")
        for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
            terminalreporter.write_line(f"{count:5d} skipped: {reason}")


def pytest_addoption(parser):
    parser.addoption(
        "--run-slow", action="store_true", default=os.environ.get("DYNEMB_TEST_SLOW") == "1",
        help="also run the tests marked slow (compile checks, scale and stress tests)",
    )


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow (compile checks, scale tests): run with --run-slow, as CI does")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


# -- Temporary files -------------------------------------------------------------------
#
# The run's processes (pytest's, its xdist workers and every process they start, which
# inherit the environment) create their temporary files in a TMPDIR of the run's own,
# next to pytest's basetemp (/tmp/pytest-of-<user>/tmpdir-pytest-<N>). Whatever is left
# there when the run ends (after xdist has stopped its workers) was left by this run:
# the run fails, naming it, and the folder is removed. Entries that appeared in the
# system's temporary folder meanwhile cannot be told apart from other processes' (on a
# shared machine), so they are only noted.

_LEFT_KEY = "left in TMPDIR"
# Removed by atexit handlers: autograph's generated modules (tensorflow/python/autograph/
# pyct/loader.py) and multiprocessing's folder.
_REMOVED_AT_EXIT = ("__autograph_generated_file", "pymp-")
_TMP_KEY = pytest.StashKey()
_REPORT_KEY = pytest.StashKey()


def _entries(folder):
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


@pytest.hookimpl(trylast=True)  # after pytest's tmpdir plugin has set up tmp_path_factory
def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: its TMPDIR is the controller's
        return
    system_tmp = tempfile.gettempdir()
    basetemp = config._tmp_path_factory.getbasetemp()  # what xdist uses too
    # Not inside basetemp, which pytest removes before the check (a run that passed,
    # tmp_path_retention_policy "failed"), and not named pytest-*, which pytest's clean-up
    # of older basetemps would take for one of them.
    run_tmp = basetemp.with_name("tmpdir-" + basetemp.name)
    shutil.rmtree(run_tmp, ignore_errors=True)
    run_tmp.mkdir()
    config.stash[_TMP_KEY] = (system_tmp, _entries(system_tmp), str(basetemp), str(run_tmp))
    os.environ["TMPDIR"] = str(run_tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


@pytest.fixture(scope="session", autouse=True)
def _remove_session_workdirs():
    """Removes the folders of tests/_tables_util.temp_workdir() when the session's tests
    end: an atexit clean-up would come after the check below in a run without xdist."""
    yield
    util = sys.modules.get("_tables_util")
    if util is not None:
        util.remove_temp_workdirs()


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session):
    # The innermost wrapper: this runs after xdist's workers have ended (their atexit
    # clean-ups done) and before the terminal summary.
    result = yield
    config = session.config
    if _TMP_KEY not in config.stash:
        return result
    system_tmp, before, basetemp, run_tmp = config.stash[_TMP_KEY]
    # What TensorFlow and multiprocessing remove at exit (atexit) is not counted: the
    # tests' own process has not ended yet (without xdist), and the processes a test
    # kills (cluster tasks, SIGKILL) never run their atexit handlers. The folder is
    # removed below, so none of it stays behind either way.
    left = [name for name in sorted(_entries(run_tmp)) if not name.startswith(_REMOVED_AT_EXIT)]
    shutil.rmtree(run_tmp, ignore_errors=True)
    own = {os.path.relpath(basetemp, system_tmp).split(os.sep)[0]}  # pytest-of-<user>
    appeared = sorted(_entries(system_tmp) - before - own)
    config.stash[_REPORT_KEY] = (left, appeared, run_tmp, system_tmp)
    if left and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


def _report_temporary_files(terminalreporter):
    left, appeared, run_tmp, system_tmp = terminalreporter.config.stash.get(
        _REPORT_KEY, ((), (), "", ""))
    if left:
        terminalreporter.section("temporary files left by this run", sep="-", red=True)
        terminalreporter.write_line(
            f"{len(left)} entries were left in the run's TMPDIR ({run_tmp}, now removed): a test "
            "or an example that creates temporary files must remove them (use tmp_path, "
            "tempfile.TemporaryDirectory or shutil.rmtree):"
        )
        for name in left:
            terminalreporter.write_line(f"  {name}")
        # Counted in the last line ("N passed, 2 left in TMPDIR"); the run fails.
        # (Objects with a __dict__, as plugins that read every report expect.)
        terminalreporter.stats.setdefault(_LEFT_KEY, []).extend(
            types.SimpleNamespace(entry=name) for name in left)
    if appeared:
        shown = ", ".join(appeared[:8]) + (", ..." if len(appeared) > 8 else "")
        terminalreporter.write_line(
            f"note: {len(appeared)} entries appeared in {system_tmp} during the run (this run's "
            f"processes write to their own TMPDIR: other processes', or written there by "
            f"name): {shown}"
        )
