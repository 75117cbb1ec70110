# Sets up the virtualenv that scripts/test.sh and scripts/demo.sh run in.
# Source it from bash (it is not meant to be executed):
#
#   source "$ROOT/scripts/setup_env.sh"     # then "$PY" is the virtualenv's python
#
# First run (or after the settings below change): creates a virtualenv,
# installs TensorFlow and `pip install -e ".[test]"` (which compiles the op
# library against that TensorFlow): a 572 MB download, 2.3 GB in the virtualenv,
# about 7 minutes on 2 cores. Later runs reuse the virtualenv and only do an
# incremental `python setup.py build_ext --inplace`: it shares pip's object
# cache, so with nothing changed it compiles nothing (a few seconds, to link).
#
# Environment:
#   DYNEMB_VENV        virtualenv directory (default: .venv in the repository root)
#   DYNEMB_TF_VERSION  TensorFlow version to install (default: 2.21.0)
#   DYNEMB_PYTHON      interpreter used to create the virtualenv (default: python3; 3.10-3.12)
#   DYNEMB_BUILD_JOBS  parallel compiler processes (default: all CPUs)
#   DYNEMB_OBJ_DIR     object cache of the incremental build (default: build/dynemb-obj)
#
# Defines ROOT (the repository root), VENV and PY; leaves the shell in ROOT.
# Any failing step ends the sourcing script (set -euo pipefail).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="${DYNEMB_VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$ROOT/$VENV" ;; esac
TF_VERSION="${DYNEMB_TF_VERSION:-2.21.0}"
BASE_PYTHON="${DYNEMB_PYTHON:-python3}"
PY="$VENV/bin/python"
STAMP="$VENV/.dynemb-setup"
# In the tree's (git-ignored) build folder, not /tmp: nothing is left outside the checkout.
BUILD_LOCK="$ROOT/build/dynemb_build.lock"

log() { printf '\n==> %s\n' "$*" >&2; }

# Runs "$@" holding the shared build lock (other developers build in the same tree).
locked() {
  if command -v flock >/dev/null 2>&1; then
    mkdir -p "$(dirname "$BUILD_LOCK")"
    flock "$BUILD_LOCK" "$@"
  else
    "$@"
  fi
}

tf_requirements() {
  # tf_keras (Keras 2, used with TF_USE_LEGACY_KERAS=1) is released in step with
  # TensorFlow: the same major.minor.
  local tf_keras="tf_keras~=${TF_VERSION%.*}.0"
  # TensorFlow < 2.18 was built against numpy 1.x and breaks with numpy 2; so does
  # the newest pyarrow (26; the real-data tests, the movielens extra): 20 is checked.
  case "$TF_VERSION" in
    2.16.* | 2.17.*) echo "tensorflow==$TF_VERSION" "$tf_keras" "numpy<2" "pyarrow<21" ;;
    *) echo "tensorflow==$TF_VERSION" "$tf_keras" ;;
  esac
}

installed_tf() {
  "$PY" -c 'import importlib.metadata as m; print(m.version("tensorflow"))' 2>/dev/null || true
}

# What a finished set-up of this virtualenv looks like; any difference redoes it.
setup_key() {
  local build_files
  build_files="$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)"
  echo "root=$ROOT requirements=$(tf_requirements | tr ' ' ,) build=$build_files"
}

if [ ! -x "$PY" ]; then
  log "Creating virtualenv $VENV with $BASE_PYTHON"
  "$BASE_PYTHON" - <<'EOF'
import sys
if not ((3, 10) <= sys.version_info[:2] <= (3, 12)):
    sys.exit(f"tensorflow_dynemb supports Python 3.10-3.12, {sys.executable} is "
             f"{sys.version.split()[0]}; set DYNEMB_PYTHON to another interpreter.")
EOF
  "$BASE_PYTHON" -m venv "$VENV"
fi

if [ "$(cat "$STAMP" 2>/dev/null || true)" = "$(setup_key)" ] && [ "$(installed_tf)" = "$TF_VERSION" ]; then
  log "Reusing $VENV (TensorFlow $TF_VERSION); incremental rebuild"
  locked "$PY" setup.py -q build_ext --inplace
else
  rm -f "$STAMP"
  log "Installing $(tf_requirements) into $VENV"
  # shellcheck disable=SC2046  # word splitting of the requirement list is intended
  "$PY" -m pip install $(tf_requirements)
  # The same build tools pip's isolated build uses, for the incremental
  # `setup.py build_ext --inplace` of later runs.
  "$PY" -m pip install --upgrade "setuptools>=64" wheel "pybind11>=2.10"
  log "pip install -e \".[test]\" (compiles the op library against TensorFlow $TF_VERSION: a few minutes, output shown only on error)"
  locked "$PY" -m pip install -e ".[test]"
  setup_key >"$STAMP"
fi

log "$("$PY" -c 'import sys, importlib.metadata as m; print("Python", sys.version.split()[0] + ", TensorFlow", m.version("tensorflow") + ", numpy", m.version("numpy"))')"
