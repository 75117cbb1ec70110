"""Test-session setup: three logical CPU devices, so that sharding tests can place
each shard of a variable on its own device. It must run before TensorFlow
initialises its devices, hence here, once, for the whole session.

Without TensorFlow (e.g. a GPU machine that runs only the TF-free core tests
through tests/core_ext.py and tests/core_gpu_ext.py) there is nothing to set up.

Also: tests marked `slow` (compile checks, scale and stress tests: minutes on 2
cores) run only with `--run-slow` (or DYNEMB_TEST_SLOW=1), which CI (.ci/run) passes;
and the summary ends with one line per skip reason."""

import os

import pytest

try:
    import tensorflow as tf
except ImportError:
    tf = None

NUM_LOGICAL_CPUS = 3

if tf is not None:
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
    )


def pytest_terminal_summary(terminalreporter):
    """One line per skip reason, with how many tests it skipped: pytest's own `-rs`
    summary lists every skip location, which on a machine without a GPU is dozens of
    lines saying the same thing."""
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
