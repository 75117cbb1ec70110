#!/usr/bin/env bash
# Sets up everything and runs the demo:   bash scripts/demo.sh [demo flags...]
#
# The same set-up as scripts/test.sh (scripts/setup_env.sh: a virtualenv with
# TensorFlow and `pip install -e ".[test]"` on the first run, an incremental
# rebuild later), then `python -m tensorflow_dynemb.demo "$@"`: a CTR model on
# dynamic embeddings trained on a synthetic click log, evaluated, checkpointed
# and restored, then exported as SavedModels (with our ops, and static) that
# fresh processes serve. `bash scripts/demo.sh --help` lists the flags (--rows, --vocab,
# --features, --epochs, --batch-size, --dim, --workdir, --keep, --seed, --min-auc, ...).
# Its outputs go to a temporary directory removed at the end, unless --keep.
#
# Environment: DYNEMB_VENV, DYNEMB_TF_VERSION, DYNEMB_PYTHON, DYNEMB_BUILD_JOBS,
# as for scripts/test.sh.
# Exits with the demo's status (non-zero when the held-out AUC is below --min-auc,
# or the restored model or a SavedModel predicts differently).
set -euo pipefail

CALLER_DIR="$PWD"
# Defines PY (the virtualenv's python) and changes to the repository root.
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"
# Back to the caller's directory, so that a relative --workdir means what it says.
cd "$CALLER_DIR"

# As `python -m tensorflow_dynemb.demo`, with TensorFlow's C++ start-up lines (and cuInit's
# error line on a machine without a GPU driver) held back: they are shown only if
# TensorFlow fails to start (tensorflow_dynemb/_quiet_start.py).
log "python -m tensorflow_dynemb.demo $*"
exec "$PY" "$ROOT/tensorflow_dynemb/_quiet_start.py" -m tensorflow_dynemb.demo "$@"
