"""Build script for tensorflow_dynemb (metadata lives in pyproject.toml).

Two C++ extensions are built:

* ``tensorflow_dynemb/_dynemb_ops.so`` -- the TensorFlow op library, loaded with
  ``tf.load_op_library``. Sources: cc/core (minus tests/, bench/, gpu/),
  cc/kernels, cc/ops. Compiled with ``tf.sysconfig.get_compile_flags()`` and
  linked with ``tf.sysconfig.get_link_flags()`` of the TensorFlow installed in
  the *target* environment; it does not link libpython.
* ``tensorflow_dynemb._core`` -- a pybind11 module over cc/core alone (no
  TensorFlow), for tests and benchmarks of the core.
* ``tensorflow_dynemb._core_gpu`` -- only when CUDA is enabled: the same module
  surface over the GPU table (cc/core/gpu, cc/bindings_gpu); .cu sources are
  compiled with nvcc, cudart is linked statically. Enabled by DYNEMB_CUDA=1;
  DYNEMB_CUDA=0 disables it; unset, it is built when nvcc is on PATH and
  nvidia-smi lists a GPU. Without it nothing of the build changes.
  (Architectures: DYNEMB_CUDA_ARCHS, default "80;90": SASS for each, plus PTX
  of the last.)

The op library's GPU kernels (docs/gpu.md) -- DYNEMB_CUDA=1 builds them,
DYNEMB_CUDA=0 never; unset, they are built when nvcc is on PATH, the target
TensorFlow is a CUDA build (tf.sysconfig.get_build_info()["is_cuda_build"])
and nvidia-smi lists a GPU. Then the op library also holds cc/kernels/gpu/*.cc
(host code, compiled like the other kernels plus -DGOOGLE_CUDA=1 and the CUDA
headers) and cc/core/gpu (.cc, and .cu compiled by nvcc with TF's macros, so
both sides agree on the C++ ABI), and links cudart statically with its
symbols kept private (-Wl,--exclude-libs): the library needs no CUDA runtime
of a particular version beside TF's, only a driver recent enough for the
toolkit that built it. Without CUDA the op library is built exactly as
before: the same sources and the same flags.

Sources are globbed, so new .cc files are picked up without editing this file.
An extension whose sources are not written yet is skipped with a warning.

Usage:
    pip install -e ".[test]"               # editable install (build isolation is fine)
    pip install .                          # regular install
    python setup.py build_ext --inplace    # quick incremental rebuild for developers

Which TensorFlow: under PEP 517 build isolation pip runs this file in an
environment that only holds the build requirements (setuptools, wheel,
pybind11), so ``import tensorflow`` fails there. TensorFlow must NOT be a build
requirement: pip would install some other TF into the build environment and the
library would be built against the wrong headers/ABI. Instead we ask the target
environment's interpreter for its TF version and flags in a subprocess (see
query_tensorflow). With pip's default ("virtual") isolation the
backend runs under the target interpreter (sys.executable) with a PYTHONPATH /
sitecustomize overlay that hides the target's site-packages; removing
PYTHONPATH and PYTHONNOUSERSITE from the child's environment exposes them
again. With isolation modes that use a separate venv (pip's
``--use-feature=venv-isolation``, ``python -m build``), we fall back to the
interpreter of the parent process (the pip/build front end). Set
DYNEMB_TF_PYTHON=/path/to/python to choose explicitly; if nothing works, use
``pip install --no-build-isolation ...``.

Compilation: every .cc is compiled in parallel (DYNEMB_BUILD_JOBS, or
``build_ext -j N``, default: all CPUs) and incrementally: objects live in
build/dynemb-obj/<extension>-<hash of what decides their content>/ (see
cache_key: the compiler and its version, the flags, TensorFlow's version, and
every other include directory outside the project by the content of its files,
not by its path) and are rebuilt only when their source or a project header
they include (from gcc's -MMD dependency files) is newer. So pip's isolated
build, which finds pybind11 in a new temporary folder each time, and a later
``setup.py build_ext --inplace`` in the virtualenv share one cache, and
switching between virtualenvs or TF versions never reuses an object compiled
for another TF.
"""

from __future__ import annotations

import concurrent.futures
import glob
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext

try:  # setuptools >= 59 vendors distutils; keep working with either.
    from setuptools.errors import CompileError
except ImportError:  # pragma: no cover
    from distutils.errors import CompileError

HERE = os.path.dirname(os.path.abspath(__file__))
# setuptools wants source paths relative to the project root.
os.chdir(HERE)

PKG = "tensorflow_dynemb"
OPS_EXT = f"{PKG}._dynemb_ops"
CORE_EXT = f"{PKG}._core"
GPU_EXT = f"{PKG}._core_gpu"
# Incremental object cache (DYNEMB_OBJ_DIR overrides it; CI builds from scratch).
OBJ_ROOT = os.path.abspath(os.environ.get("DYNEMB_OBJ_DIR") or os.path.join("build", "dynemb-obj"))
# Flags common to both extensions. -g0 overrides the -g in Python's CFLAGS: TF
# kernel objects with debug info are huge and slow to link. -fno-math-errno: sqrt
# need not set errno (nothing reads it after math), which lets the optimizer rules'
# loops (cc/core/update_rules.h) vectorize; IEEE results are unchanged (BUILD too).
COMMON_CXX_FLAGS = ["-O3", "-fno-math-errno", "-fPIC", "-g0"]
# The op library exports nothing by name: TensorFlow finds its ops and kernels through
# the registrations its static initializers make when it is loaded. Hidden visibility
# makes the library's calls to its own functions direct (with default visibility each
# went through a PLT stub, 911 call sites, and could bind to another loaded library's
# instance of a same-named template) and its dynamic symbol table 113 entries instead
# of 910. The pybind11 modules get the same from Pybind11Extension.
OPS_VISIBILITY_FLAGS = ["-fvisibility=hidden", "-fvisibility-inlines-hidden"]
# The TensorFlow versions this package supports (keep in sync with pyproject.toml).
SUPPORTED_TF = ((2, 16), (2, 21))


# ----------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------

_CORE_EXCLUDED_DIRS = ("cc/core/tests/", "cc/core/bench/", "cc/core/gpu/", "cc/core/redis/")


def _glob(pattern: str) -> list[str]:
    return sorted(p.replace(os.sep, "/") for p in glob.glob(pattern, recursive=True))


def core_sources() -> list[str]:
    return [p for p in _glob("cc/core/**/*.cc") if not p.startswith(_CORE_EXCLUDED_DIRS)]


def header_files() -> list[str]:
    return _glob("cc/**/*.h")


def _warn(msg: str) -> None:
    print(f"\n*** tensorflow_dynemb setup.py: WARNING: {msg}\n", file=sys.stderr, flush=True)


def _gpu_listed() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0 and "GPU" in proc.stdout


def _cuda_flag() -> bool | None:
    """DYNEMB_CUDA as a bool; None when unset (auto-detect)."""
    flag = os.environ.get("DYNEMB_CUDA", "").strip().lower()
    if not flag:
        return None
    return flag not in ("0", "false", "no", "off")


def cuda_enabled() -> bool:
    """DYNEMB_CUDA=1/0 decides; unset: nvcc on PATH and a GPU listed by nvidia-smi."""
    flag = _cuda_flag()
    if flag is not None:
        return flag
    return shutil.which("nvcc") is not None and _gpu_listed()


def gpu_kernels_enabled(info: dict) -> bool:
    """Whether the op library gets its GPU kernels: DYNEMB_CUDA=1/0 decides; unset:
    nvcc on PATH, a CUDA build of the target TensorFlow (`info`, from
    query_tensorflow) and a GPU listed by nvidia-smi."""
    flag = _cuda_flag()
    if flag is not None:
        if flag and not info.get("is_cuda_build"):
            _warn(f"DYNEMB_CUDA=1 builds the GPU kernels, but TensorFlow {info['version']} is "
                  "not a CUDA build: it has no GPU devices to run them on.")
        return flag
    return shutil.which("nvcc") is not None and bool(info.get("is_cuda_build")) and _gpu_listed()


def cuda_home() -> str:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    nvcc = shutil.which("nvcc")
    if os.path.isfile("/usr/local/cuda/bin/nvcc") or nvcc is None:
        return "/usr/local/cuda"
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def nvcc_arch_flags() -> list[str]:
    archs = [a.strip() for a in os.environ.get("DYNEMB_CUDA_ARCHS", "80;90").split(";") if a.strip()]
    flags = []
    for a in archs:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    return flags + ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


def cuda_link_args() -> list[str]:
    """Static cudart of the toolkit that compiled the .cu objects, its symbols kept
    private to the linked library (TF loads a libcudart of its own CUDA version; ours
    must neither replace it nor be replaced by it)."""
    home = cuda_home()
    lib_dirs = [d for d in (os.path.join(home, "lib64"), *glob.glob(os.path.join(home, "targets", "*", "lib")))
                if os.path.isdir(d)]
    return ([f"-L{d}" for d in lib_dirs]
            + ["-lcudart_static", "-ldl", "-lrt", "-lpthread", "-Wl,--exclude-libs,libcudart_static.a"])


def gpu_kernel_sources() -> list[str]:
    """The host sources the op library adds when it has GPU kernels."""
    return _glob("cc/core/gpu/*.cc") + _glob("cc/kernels/gpu/*.cc")


# The Redis table (issue 37; cc/core/redis, cc/kernels/redis, cc/ops/redis) is built
# into the op library only where hiredis (header and library) is found: `apt-get
# install libhiredis-dev`, then rebuild. DYNEMB_REDIS=0 leaves it out; DYNEMB_REDIS=1
# makes a missing hiredis an error. Without it everything else builds, and
# de.RedisTable raises an error saying how to enable it.
_HIREDIS_PROBE = "#include <hiredis/hiredis.h>\nint main() { redisFree(nullptr); return 0; }\n"


def redis_sources() -> list[str]:
    return _glob("cc/core/redis/*.cc") + _glob("cc/kernels/redis/*.cc") + _glob("cc/ops/redis/*.cc")


def hiredis_link_flags() -> list[str] | None:
    """The link flags of hiredis when a test program including <hiredis/hiredis.h>
    compiles and links with them, else None (DYNEMB_REDIS=0: always None)."""
    flag = os.environ.get("DYNEMB_REDIS", "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return None
    candidates = [["-lhiredis"]]
    if shutil.which("pkg-config"):
        proc = subprocess.run(["pkg-config", "--cflags", "--libs", "hiredis"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.split():
            candidates.insert(0, proc.stdout.split())
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.cc")
        with open(src, "w") as f:
            f.write(_HIREDIS_PROBE)
        for flags in candidates:
            cmd = cxx + [src, "-o", os.path.join(tmp, "probe")] + flags
            if subprocess.run(cmd, capture_output=True).returncode == 0:
                return [f for f in flags if not f.startswith("-I")] or ["-lhiredis"]
    if flag:
        sys.exit("tensorflow_dynemb setup.py: DYNEMB_REDIS=1, but hiredis was not found "
                 "(apt-get install libhiredis-dev).")
    _warn("hiredis not found: the op library is built without de.RedisTable "
          "(apt-get install libhiredis-dev, then rebuild to enable it).")
    return None


def make_extensions() -> list[Extension]:
    core = core_sources()
    kernels = _glob("cc/kernels/*.cc")
    ops = _glob("cc/ops/*.cc")
    bindings = _glob("cc/bindings/*.cc")
    exts = []
    if not core:
        _warn("no cc/core/**/*.cc sources (building with the core headers only).")

    if ops and kernels:
        # TF compile/link flags are filled in by build_ext (they need TF, and
        # metadata-only commands such as egg_info/sdist must not import it).
        exts.append(
            Extension(
                OPS_EXT,
                sources=core + kernels + ops,
                include_dirs=[HERE],
                depends=header_files(),
                language="c++",
                extra_compile_args=list(COMMON_CXX_FLAGS),
            )
        )
    else:
        missing = [d for d, s in (("cc/ops", ops), ("cc/kernels", kernels)) if not s]
        _warn(f"skipping {OPS_EXT}: no .cc sources in {', '.join(missing)} yet.")

    if bindings:
        try:
            from pybind11.setup_helpers import Pybind11Extension
        except ImportError:
            sys.exit(
                "tensorflow_dynemb setup.py: pybind11 is required to build "
                f"{CORE_EXT}; run `pip install pybind11` (pip installs it "
                "automatically under build isolation)."
            )
        exts.append(
            Pybind11Extension(
                CORE_EXT,
                sources=core + bindings,
                include_dirs=[HERE],
                depends=header_files(),
                cxx_std=17,
                extra_compile_args=list(COMMON_CXX_FLAGS),
            )
        )
    else:
        _warn(f"skipping {CORE_EXT}: no cc/bindings/*.cc sources yet.")

    if bindings and cuda_enabled():
        from pybind11.setup_helpers import Pybind11Extension

        gpu = Pybind11Extension(
            GPU_EXT,
            sources=core + _glob("cc/core/gpu/*.cc") + _glob("cc/bindings_gpu/*.cc"),
            # The CUDA runtime API's headers: cc/bindings_gpu/keyed_bindings.cc stages
            # arrays through device memory itself.
            include_dirs=[HERE, os.path.join(cuda_home(), "include")],
            depends=header_files() + _glob("cc/**/*.cuh"),
            cxx_std=17,
            extra_compile_args=list(COMMON_CXX_FLAGS),
        )
        gpu.cuda_sources = _glob("cc/core/gpu/*.cu")  # compiled by BuildExt with nvcc
        exts.append(gpu)
    return exts


# ----------------------------------------------------------------------------
# Finding the target environment's TensorFlow
# ----------------------------------------------------------------------------

_TF_QUERY = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
print("@@DYNEMB_TF@@" + json.dumps({
    "version": tf.__version__,
    "git_version": tf.version.GIT_VERSION,
    "compile_flags": tf.sysconfig.get_compile_flags(),
    "link_flags": tf.sysconfig.get_link_flags(),
    "location": os.path.dirname(tf.__file__) if getattr(tf, "__file__", None) else "",
    "is_cuda_build": bool(tf.sysconfig.get_build_info().get("is_cuda_build", False)),
    "python": sys.executable,
}))
"""

# Variables pip's "virtual" build isolation sets to hide the target environment.
_ISOLATION_VARS = ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSTARTUP")


def _query_subprocess(python: str, strip_isolation: bool) -> tuple[dict | None, str]:
    """Asks `python` for its TensorFlow (in a subprocess: TF's import-time logging and
    state stay out of the build, and the child can escape pip's isolation overlay)."""
    env = dict(os.environ)
    if strip_isolation:
        env = {k: v for k, v in env.items() if k not in _ISOLATION_VARS}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    try:
        proc = subprocess.run(
            [python, "-c", _TF_QUERY],
            env=env,
            cwd=tempfile.gettempdir(),  # never import from the source tree
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{python}: {e}"
    for line in proc.stdout.splitlines():
        if line.startswith("@@DYNEMB_TF@@"):
            return json.loads(line[len("@@DYNEMB_TF@@"):]), ""
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return None, f"{python}{' (isolation variables removed)' if strip_isolation else ''}: {tail}"


def _parent_python() -> str | None:
    """The interpreter of the process that started this build (pip/build front end)."""
    try:
        ppid = os.getppid()
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode()
        if not argv0:
            return None
        if not os.path.isabs(argv0):
            with open(f"/proc/{ppid}/environ", "rb") as f:
                penv = dict(
                    kv.decode(errors="replace").split("=", 1)
                    for kv in f.read().split(b"\0")
                    if b"=" in kv
                )
            if os.sep in argv0:
                argv0 = os.path.join(os.readlink(f"/proc/{ppid}/cwd"), argv0)
            else:
                argv0 = shutil.which(argv0, path=penv.get("PATH")) or ""
        if argv0 and "python" in os.path.basename(argv0) and os.access(argv0, os.X_OK):
            return argv0
    except (OSError, ValueError):
        pass
    return None


_TF_INFO: dict | None = None


def query_tensorflow() -> dict:
    """Version and sysconfig flags of the TensorFlow in the target environment.

    Tried in order: $DYNEMB_TF_PYTHON; this interpreter as is (no isolation, or
    `setup.py build_ext`); this interpreter without pip's isolation variables
    (pip's default isolation); the parent process's interpreter (isolation in a
    separate venv: pip --use-feature=venv-isolation, python -m build).
    """
    global _TF_INFO
    if _TF_INFO is not None:
        return _TF_INFO
    explicit = os.environ.get("DYNEMB_TF_PYTHON")
    if explicit:
        attempts = [(explicit, False)]
    else:
        attempts = [(sys.executable, False), (sys.executable, True)]
        parent = _parent_python()
        # (Compare unresolved paths: venv interpreters are symlinks to one base binary.)
        if parent and os.path.abspath(parent) != os.path.abspath(sys.executable):
            attempts.append((parent, True))
    info, errors = None, []
    for python, strip in attempts:
        info, err = _query_subprocess(python, strip)
        if info is not None:
            break
        errors.append(err)
    if info is None:
        sys.exit(
            "tensorflow_dynemb setup.py: cannot find TensorFlow in the target environment.\n"
            "Install TensorFlow first (e.g. `pip install tensorflow==2.21.0`), then install this\n"
            "package into the same environment. If TensorFlow is installed and this still\n"
            "fails (a build front end that isolates the build in a separate venv, e.g. uv),\n"
            "use `pip install --no-build-isolation ...` or set DYNEMB_TF_PYTHON=/path/to/python.\n"
            "Tried:\n  " + "\n  ".join(errors)
        )
    major_minor = tuple(int(x) for x in info["version"].split(".")[:2])
    if not SUPPORTED_TF[0] <= major_minor <= SUPPORTED_TF[1]:
        _warn(f"TensorFlow {info['version']} is outside the supported range "
              f"{'.'.join(map(str, SUPPORTED_TF[0]))}-{'.'.join(map(str, SUPPORTED_TF[1]))}.")
    print(f"tensorflow_dynemb: building against TensorFlow {info['version']} at "
          f"{info['location']} (python: {info['python']})", flush=True)
    _TF_INFO = info
    return info


def tf_compile_flags(info: dict) -> list[str]:
    """TF's compile flags, with its include dir as -isystem (no warnings from TF headers)."""
    flags = []
    for flag in info["compile_flags"]:
        if flag.startswith("-I"):
            flags += ["-isystem", flag[2:]]
        else:
            flags.append(flag)
    return flags


# ----------------------------------------------------------------------------
# Parallel, incremental compilation
# ----------------------------------------------------------------------------

_print_lock = threading.Lock()


def _under(path: str, dirs) -> bool:
    return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in dirs)


def _deps_up_to_date(obj: str, depfile: str, checked_dirs=(HERE,), keyed_dirs=()) -> bool:
    """True if obj exists and no file listed in gcc's dependency file is newer.

    Only files under `checked_dirs` (the project, include directories keyed by path)
    and not under `keyed_dirs` are compared: the others come from include directories
    keyed by their content or name (cache_key), and may be gone (pip's isolated build
    environment is removed after the build) without the object being stale.
    """
    try:
        obj_mtime = os.stat(obj).st_mtime
        with open(depfile) as f:
            text = f.read().replace("\\\n", " ")
    except OSError:
        return False
    _, _, deps = text.partition(":")
    # The paths we deal with contain no spaces; `shlex` copes with escaped ones anyway.
    for dep in shlex.split(deps.replace("\\ ", "\0")):
        dep = os.path.abspath(dep.replace("\0", " "))
        if not _under(dep, checked_dirs) or _under(dep, keyed_dirs):
            continue
        try:
            if os.stat(dep).st_mtime > obj_mtime:
                return False
        except OSError:
            return False
    return True


def _objects_and_stale(sources: list[str], obj_dir: str, checked_dirs=(HERE,),
                       keyed_dirs=()) -> tuple[list[str], list[tuple[str, str]]]:
    """The object file of each source in obj_dir, and the (source, object) pairs to rebuild
    (see _deps_up_to_date)."""
    objects, todo = [], []
    for src in sources:
        obj = os.path.join(obj_dir, os.path.splitext(src)[0] + ".o")
        objects.append(obj)
        if not _deps_up_to_date(obj, obj + ".d", checked_dirs, keyed_dirs):
            todo.append((src, obj))
    return objects, todo


# An include directory with more files than this is keyed by its path, not its content.
_MAX_DIGEST_FILES = 5000
_DIR_DIGESTS: dict[str, str | None] = {}
_COMPILERS: dict[str, str] = {}


def _dir_digest(path: str) -> str | None:
    """sha256 of the files under `path` (relative names and contents); None when it
    does not exist or holds more than _MAX_DIGEST_FILES files."""
    if path not in _DIR_DIGESTS:
        files = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            files += [os.path.join(root, n) for n in sorted(names)]
            if len(files) > _MAX_DIGEST_FILES:
                break
        digest = None
        if os.path.isdir(path) and len(files) <= _MAX_DIGEST_FILES:
            h = hashlib.sha256()
            for f in files:
                h.update(os.path.relpath(f, path).encode() + b"\0")
                try:
                    with open(f, "rb") as fh:
                        h.update(hashlib.sha256(fh.read()).digest())
                except OSError:
                    h.update(b"unreadable")
            digest = h.hexdigest()[:16]
        _DIR_DIGESTS[path] = digest
    return _DIR_DIGESTS[path]


def _compiler_identity(exe: str) -> str:
    """Where `exe` resolves to and the first line of its `--version`."""
    if exe not in _COMPILERS:
        path = shutil.which(exe) or exe
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        _COMPILERS[exe] = f"{os.path.realpath(path)}: {(out.splitlines() or [''])[0]}"
    return _COMPILERS[exe]


_INCLUDE_FLAGS = ("-I", "-isystem", "-iquote", "-idirafter")


def cache_key(cmd: list[str], named_dirs: dict | None = None):
    """The object cache's key of compile command `cmd` (without source and output), and
    the `checked_dirs` and `keyed_dirs` of `_deps_up_to_date`.

    The key holds what decides an object's content, not where its inputs were found:
    the compiler (resolved, with its version), the flags in order, and each include
    directory by what it stands for. The project's root stays a path (its headers are
    compared by time); a directory in `named_dirs` (TensorFlow's include directory: its
    version) stands for that name; any other (pybind11's, Python's) for a digest of its
    files -- pip's isolated build finds pybind11 in a temporary folder that is new each
    time, and a key holding that path would never match the in-place build's (issue
    38). A directory too large to digest stays a path, its headers compared by time.
    """
    named = {os.path.abspath(k): v for k, v in (named_dirs or {}).items()}
    checked, keyed = [HERE], []
    key = [_compiler_identity(cmd[0])]
    i = 1
    while i < len(cmd):
        arg, i = cmd[i], i + 1
        flag = next((f for f in _INCLUDE_FLAGS if arg.startswith(f)), None)
        if flag is None:
            key.append(arg)
            continue
        path = arg[len(flag):]
        if not path and i < len(cmd):
            path, i = cmd[i], i + 1
        full = os.path.abspath(path)
        if full == HERE:
            ident = path
        elif full in named:
            ident = named[full]
            keyed.append(full)
        else:
            digest = _dir_digest(full)
            ident = f"<files {digest}>" if digest else path
            (keyed if digest else checked).append(full)
        key += [flag, ident]
    return json.dumps(key), tuple(checked), tuple(keyed)


def _prune_object_dirs(keep: str, name: str, max_dirs: int = 4) -> None:
    """Keeps the `max_dirs` most recently used object dirs of extension `name`."""
    dirs = [d for d in glob.glob(os.path.join(OBJ_ROOT, name + "-*")) if os.path.isdir(d)]
    dirs.sort(key=lambda d: os.stat(d).st_mtime, reverse=True)
    for d in dirs[max_dirs:]:
        if os.path.abspath(d) != os.path.abspath(keep):
            shutil.rmtree(d, ignore_errors=True)


def make_compile(compiler, ext_name: str, jobs: int, named_dirs: dict | None = None):
    """Returns a replacement for `compiler.compile` (unix compilers only); objects are
    cached by cache_key(command, named_dirs)."""

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                extra_preargs=None, extra_postargs=None, depends=None):
        del output_dir  # objects go to OBJ_ROOT/<ext>-<hash>/ instead
        macros, _, extra_postargs, pp_opts, _ = compiler._setup_compile(
            None, macros, include_dirs, sources, depends, extra_postargs)
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
        # Newer setuptools compile C++ with `compiler_so_cxx` (from $CXX); older
        # ones with `compiler_so` (gcc compiles .cc files as C++ either way).
        base_cmd = list(getattr(compiler, "compiler_so_cxx", None) or compiler.compiler_so) + cc_args
        key, checked_dirs, keyed_dirs = cache_key(base_cmd + list(extra_postargs), named_dirs)
        obj_dir = os.path.join(OBJ_ROOT, f"{ext_name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")
        os.makedirs(obj_dir, exist_ok=True)
        os.utime(obj_dir)  # mark as recently used
        with open(os.path.join(obj_dir, "command.json"), "w") as f:
            f.write(key)
        _prune_object_dirs(obj_dir, ext_name)

        objects, todo = _objects_and_stale(sources, obj_dir, checked_dirs, keyed_dirs)
        print(f"tensorflow_dynemb: {ext_name}: compiling {len(todo)} of {len(sources)} "
              f"sources with {jobs} jobs (objects in {obj_dir})", flush=True)
        if todo:
            print("  " + " ".join(shlex.quote(c) for c in base_cmd + ["<src>", "-o", "<obj>"]
                                  + extra_postargs), flush=True)

        failures = []
        stop = threading.Event()

        def compile_one(src, obj):
            if stop.is_set():
                return
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            tmp_obj, tmp_dep = f"{obj}.tmp{os.getpid()}", f"{obj}.d.tmp{os.getpid()}"
            cmd = base_cmd + [src, "-o", tmp_obj] + extra_postargs + [
                "-MMD", "-MF", tmp_dep, "-MT", obj]
            start = time.time()
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            with _print_lock:
                print(f"  [{time.time() - start:5.1f}s] {src}", flush=True)
                if proc.returncode != 0 or proc.stdout.strip():
                    if proc.returncode != 0:
                        print(" ".join(shlex.quote(c) for c in cmd))
                    print(proc.stdout, flush=True)
            if proc.returncode != 0:
                failures.append(src)
                stop.set()
                for p in (tmp_obj, tmp_dep):
                    if os.path.exists(p):
                        os.remove(p)
                return
            # Atomic renames: concurrent builds with the same flags share objects safely.
            os.replace(tmp_obj, obj)
            os.replace(tmp_dep, obj + ".d")

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for future in [pool.submit(compile_one, s, o) for s, o in todo]:
                future.result()
        if failures:
            raise CompileError(f"{ext_name}: compilation failed: {', '.join(failures)}")
        return objects

    return compile


# ----------------------------------------------------------------------------
# build_ext
# ----------------------------------------------------------------------------

def _write_if_changed(path: str, text: str) -> None:
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _copy_if_changed(src: str, dst: str) -> None:
    """Copies via rename, so a process that has `dst` loaded keeps a valid mapping."""
    try:
        with open(src, "rb") as a, open(dst, "rb") as b:
            if a.read() == b.read():
                return
    except OSError:
        pass
    tmp = f"{dst}.tmp{os.getpid()}"
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)
    print(f"tensorflow_dynemb: copied {src} -> {dst}", flush=True)


def _note_tf_binding(tf_version: str) -> None:
    """Says, at install time, that the library is tied to this TensorFlow and how to rebuild.

    pip shows a build's output only with -v (or when it fails), so most users never see
    this; the guard is the import-time check in tensorflow_dynemb/_ops.py, which names
    the command for the kind of install it finds.
    """
    _warn(
        f"the op library is built for TensorFlow {tf_version} and loads only into that version.\n"
        "After changing TensorFlow, rebuild it (`import tensorflow_dynemb` checks, and prints the\n"
        "exact command for your install):\n"
        "  editable install:  python setup.py build_ext --inplace   (in the source checkout;\n"
        "                       needs pybind11 in the environment)\n"
        "  regular install:   pip install --no-deps --force-reinstall --no-cache-dir \\\n"
        "                       --no-binary tensorflow-dynemb <source directory or sdist>"
    )


class BuildExt(_build_ext):
    """build_ext with TF flags from the target env, parallel incremental compiles."""

    def finalize_options(self):
        super().finalize_options()
        jobs = os.environ.get("DYNEMB_BUILD_JOBS")
        if self.parallel and self.parallel is not True:
            self._jobs = int(self.parallel)
        elif jobs:
            self._jobs = int(jobs)
        else:
            self._jobs = os.cpu_count() or 1
        self._build_info_text = None

    def get_ext_filename(self, fullname):
        # The op library is a plain shared object for tf.load_op_library, not a
        # Python extension module: no ABI tag in its name.
        # (distutils passes either the full or the last dotted name.)
        if fullname == OPS_EXT:
            return os.path.join(*OPS_EXT.split(".")) + ".so"
        if fullname == OPS_EXT.rsplit(".", 1)[1]:
            return fullname + ".so"
        return super().get_ext_filename(fullname)

    def build_extensions(self):
        # Parallelism is per source file (see make_compile), so build the
        # extensions one after the other even with -j.
        self.check_extensions_list(self.extensions)
        for ext in self.extensions:
            self.build_extension(ext)

    def _configure_ops_extension(self, ext):
        info = query_tensorflow()
        compile_flags = tf_compile_flags(info)
        ext.extra_compile_args = compile_flags + list(COMMON_CXX_FLAGS) + OPS_VISIBILITY_FLAGS
        ext.extra_link_args = list(info["link_flags"])
        hiredis = hiredis_link_flags()
        if hiredis is not None:
            ext.sources = list(ext.sources) + redis_sources()
            ext.extra_link_args += hiredis
        gpu_kernels = gpu_kernels_enabled(info)
        if gpu_kernels:
            print("tensorflow_dynemb: building the op library with its GPU kernels", flush=True)
            ext.sources = list(ext.sources) + gpu_kernel_sources()
            ext.extra_compile_args += ["-DGOOGLE_CUDA=1", "-isystem", os.path.join(cuda_home(), "include")]
            # The .cu objects share C++ types (Status, std::string) with the kernels:
            # compile them with TF's macros (_GLIBCXX_USE_CXX11_ABI among them).
            tf_macros = [f for f in info["compile_flags"] if f.startswith("-D")]
            ext.extra_objects = self._compile_cuda(ext, _glob("cc/core/gpu/*.cu"), tf_macros)
            # cudart before TF's libraries: libtensorflow_framework exports the CUDA
            # runtime API too (a stub that forwards to the libcudart TF loads, of TF's
            # CUDA version), and the linker binds each symbol to the first library
            # that has it. Ours must be the runtime of the toolkit that compiled the
            # .cu objects.
            ext.extra_link_args = cuda_link_args() + ext.extra_link_args
        build_info = (
            "# Generated by setup.py when the op library was built. Do not edit.\n"
            f"TF_VERSION = {info['version']!r}\n"
            f"TF_GIT_VERSION = {info['git_version']!r}\n"
            f"TF_LOCATION = {info['location']!r}\n"
            f"TF_COMPILE_FLAGS = {info['compile_flags']!r}\n"
            f"TF_LINK_FLAGS = {info['link_flags']!r}\n"
            f"COMPILE_FLAGS = {ext.extra_compile_args!r}\n"
            f"LINK_FLAGS = {ext.extra_link_args!r}\n"
            f"GPU_KERNELS = {gpu_kernels!r}\n"
            f"REDIS_TABLE = {hiredis is not None!r}\n"
        )
        return info, build_info

    def _compile_cuda(self, ext, sources, extra_flags=()):
        """Compiles `sources` (.cu) with nvcc (in parallel, incrementally, like
        make_compile); returns the objects."""
        home = cuda_home()
        nvcc = os.path.join(home, "bin", "nvcc")
        if not os.path.isfile(nvcc):
            nvcc = shutil.which("nvcc") or nvcc
        # -fmad=false: the GPU rules equal the CPU's bit for bit (tests/core_gpu_ext.py).
        base = [nvcc, "-std=c++17", "-O3", "-fmad=false", "-Xcompiler", "-fPIC", *nvcc_arch_flags(), f"-I{HERE}",
                *extra_flags]
        key = json.dumps(base)
        obj_dir = os.path.join(OBJ_ROOT, f"{ext.name}.cuda-{hashlib.sha256(key.encode()).hexdigest()[:12]}")
        os.makedirs(obj_dir, exist_ok=True)
        objects, todo = _objects_and_stale(sources, obj_dir)
        print(f"tensorflow_dynemb: {ext.name}: compiling {len(todo)} of {len(objects)} CUDA "
              f"sources with {self._jobs} jobs (objects in {obj_dir})", flush=True)

        def one(src, obj):
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            tmp = f"{obj}.tmp{os.getpid()}"
            cmd = base + ["-c", src, "-o", tmp, "-MD", "-MF", obj + ".d", "-MT", obj]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            with _print_lock:
                print(f"  [nvcc] {src}", flush=True)
                if proc.returncode != 0 or proc.stdout.strip():
                    print(" ".join(shlex.quote(c) for c in cmd) + "\n" + proc.stdout, flush=True)
            if proc.returncode != 0:
                return src
            os.replace(tmp, obj)
            return None

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self._jobs)) as pool:
            failures = [f for f in pool.map(lambda t: one(*t), todo) if f]
        if failures:
            raise CompileError(f"{ext.name}: nvcc failed: {', '.join(failures)}")
        return list(objects)

    def build_extension(self, ext):
        if ext.name == GPU_EXT:
            ext.extra_objects = self._compile_cuda(ext, ext.cuda_sources)
            ext.extra_link_args = cuda_link_args()
        named_dirs = {}
        if ext.name == OPS_EXT:
            info, self._build_info_text = self._configure_ops_extension(ext)
            # TF's headers are known by its version (digesting them would read ~20k files).
            tf_id = f"tensorflow {info['version']} {info['git_version']}"
            named_dirs = {f[2:]: tf_id for f in info["compile_flags"] if f.startswith("-I")}
        compiler = self.compiler
        if compiler.compiler_type != "unix":
            raise CompileError("tensorflow_dynemb builds on Linux (unix compilers) only")
        saved = compiler.compile, compiler.force, self.force
        compiler.compile = make_compile(compiler, ext.name, self._jobs, named_dirs)
        # Never skip an extension as "up to date" by mtime and always relink
        # (a few seconds): the objects decide what is really stale, and the
        # output may have been linked for another TF/virtualenv.
        compiler.force = self.force = True
        try:
            super().build_extension(ext)
        finally:
            compiler.compile, compiler.force, self.force = saved
        if ext.name == OPS_EXT:
            pkg_dir = os.path.dirname(self.get_ext_fullpath(ext.name))
            _write_if_changed(os.path.join(pkg_dir, "_build_info.py"), self._build_info_text)
            _note_tf_binding(info["version"])

    def copy_extensions_to_source(self):
        # --inplace and editable installs: replace in-source libraries only when
        # they changed, by rename (never truncate a .so another process has loaded).
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
            _copy_if_changed(regular_file, inplace_file)
            if ext.name == OPS_EXT and self._build_info_text is not None:
                _write_if_changed(os.path.join(os.path.dirname(inplace_file), "_build_info.py"),
                                  self._build_info_text)

    def get_outputs(self):
        outputs = super().get_outputs()
        if any(ext.name == OPS_EXT for ext in self.extensions) and not self.inplace:
            outputs.append(os.path.join(self.build_lib, PKG, "_build_info.py"))
        return outputs


setup(ext_modules=make_extensions(), cmdclass={"build_ext": BuildExt})
