#!/usr/bin/env bash
# Sets up everything and runs the test suite:   bash scripts/test.sh [pytest args...]
#
# First run (or after the settings below change): creates a virtualenv,
# installs TensorFlow and `pip install -e ".[test]"` (which compiles the op
# library against that TensorFlow; about 7 minutes on 2 cores). Later runs reuse
# the virtualenv and only do an incremental `python setup.py build_ext --inplace`
# (unchanged sources are not recompiled) before running pytest. The set-up is
# scripts/setup_env.sh, shared with scripts/demo.sh. The suite takes 13-25
# minutes on 2 cores (the machine decides); its output ends with pytest's summary, and it leaves no
# temporary files (tests/conftest.py: the run's own TMPDIR, checked at the end).
#
# Environment:
#   DYNEMB_VENV        virtualenv directory (default: .venv in the repository root)
#   DYNEMB_TF_VERSION  TensorFlow version to test against (default: 2.21.0)
#   DYNEMB_PYTHON      interpreter used to create the virtualenv (default: python3; 3.10-3.12)
#   DYNEMB_BUILD_JOBS  parallel compiler processes (default: all CPUs)
#   DYNEMB_TEST_WORKERS  pytest-xdist worker processes (default: auto, one per CPU;
#                      0 runs the tests in pytest's own process)
#
# The tests run in parallel (pytest-xdist), one test file per worker at a time
# (--dist loadfile: a module's fixtures, some of which start processes, run once).
# Tests marked slow (compile checks, scale tests) are skipped unless --run-slow is
# given (.ci/run gives it); the summary ends with one line per skip reason.
#
# Arguments go to pytest, after ours (so `-n 0` wins); `tests` is added unless they
# name test paths themselves (bash scripts/test.sh tests/test_loader.py -x).
# Exits with pytest's status (non-zero when a test fails, or when no test ran).
set -euo pipefail

# Defines PY (the virtualenv's python) and changes to the repository root.
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

# `tests` unless the arguments name test files/directories themselves.
targets=(tests)
for arg in "$@"; do
  case "$arg" in -*) continue ;; esac
  if [ -e "${arg%%::*}" ]; then targets=(); break; fi
done
workers="${DYNEMB_TEST_WORKERS:-auto}"
log "python -m pytest -q -n $workers --dist loadfile ${targets[*]-} $*"
exec "$PY" -m pytest -q -n "$workers" --dist loadfile ${targets[@]+"${targets[@]}"} "$@"
