"""Loads the GPU core extension `tensorflow_dynemb._core_gpu` without TensorFlow.

`_core_gpu` is the GPU table (cc/core/gpu) behind the Python surface of `_core`
(cc/bindings_gpu/core_gpu_module.cc), so the core conformance tests can drive it.
It must load where TensorFlow is not installed. Where it comes from, in order:

1. `$DYNEMB_CORE_GPU_EXT`: the path of a built `_core_gpu*.so`.
2. A `_core_gpu*.so` beside the package (`DYNEMB_CUDA=1 python setup.py build_ext
   --inplace` or an install), if it is newer than every core, GPU and binding source.
3. Otherwise it is compiled here (nvcc for cc/core/gpu/*.cu, g++ for the rest) into
   `build/core_ext/<hash of the sources>/`, cached across runs.

`load_core_gpu()` returns the module, or calls `pytest.skip` with the reason when
there is no GPU (checked first, with nvidia-smi, so machines without one never
build anything), no extension and no nvcc to build one, or CUDA reports no usable
device.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_ext  # noqa: E402

REPO = core_ext.REPO
MODULE_NAME = "tensorflow_dynemb._core_gpu"
# SASS for A100 (sm_80) and H100/H200 (sm_90), plus sm_90 PTX for newer GPUs.
NVCC_ARCH_FLAGS = ("-gencode", "arch=compute_80,code=sm_80",
                   "-gencode", "arch=compute_90,code=sm_90",
                   "-gencode", "arch=compute_90,code=compute_90")
# -fmad=false: no contraction of a * b + c into one rounding, so the rules
# (update_rules.h) and keyed random rows (partition.h) equal the CPU's bit for bit.
NVCC_FLAGS = ("-std=c++17", "-O3", "-fmad=false", "-Xcompiler", "-fPIC")

_module: ModuleType | None = None


def cuda_home() -> Path | None:
    """The CUDA toolkit: $CUDA_HOME, $CUDA_PATH, or the one holding nvcc."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    for candidate in (Path("/usr/local/cuda"),):
        if (candidate / "bin" / "nvcc").is_file():
            return candidate
    found = shutil.which("nvcc")
    if found:
        home = Path(found).resolve().parent.parent
        if (home / "include" / "cuda_runtime_api.h").is_file():
            return home
    return None


def nvcc() -> str | None:
    if os.environ.get("NVCC"):
        return os.environ["NVCC"]
    home = cuda_home()
    if home is not None and (home / "bin" / "nvcc").is_file():
        return str(home / "bin" / "nvcc")
    return shutil.which("nvcc")


def cuda_link_flags() -> list[str]:
    """Static cudart, so the module needs only the driver where it runs."""
    home = cuda_home()
    dirs = [] if home is None else [d for d in (home / "lib64",
                                                 *sorted(home.glob("targets/*/lib")))
                                    if d.is_dir()]
    return [f"-L{d}" for d in dirs] + ["-lcudart_static", "-ldl", "-lrt", "-lpthread"]


def gpu_sources() -> list[Path]:
    """Everything linked into `_core_gpu`."""
    return (core_ext.core_sources() + sorted(REPO.glob("cc/core/gpu/*.cc"))
            + sorted(REPO.glob("cc/core/gpu/*.cu"))
            + sorted(REPO.glob("cc/bindings_gpu/*.cc")))


def _inputs() -> list[Path]:
    found = []
    for pattern in ("cc/core/*.h", "cc/core/*.cc", "cc/core/cpu/*", "cc/core/gpu/*",
                    "cc/bindings/*", "cc/bindings_gpu/*"):
        found += [p for p in REPO.glob(pattern) if p.is_file()]
    return sorted(found)


def gpu_present() -> tuple[bool, str]:
    """Whether nvidia-smi lists a GPU (cheap, needs no CUDA toolkit)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False, "no GPU: nvidia-smi is not installed"
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"no GPU: nvidia-smi failed: {e}"
    if proc.returncode != 0 or "GPU" not in proc.stdout:
        return False, f"no GPU: nvidia-smi -L says {(proc.stdout + proc.stderr).strip()[:200]!r}"
    return True, ""


def build_extension() -> Path:
    """Builds `_core_gpu` from this checkout (cached by source hash)."""
    compiler = nvcc()
    if compiler is None:
        pytest.skip("no nvcc (CUDA toolkit) to build tensorflow_dynemb._core_gpu, and no built "
                    "extension (set DYNEMB_CORE_GPU_EXT or build with DYNEMB_CUDA=1)")
    home = cuda_home()
    include = [f"-I{home / 'include'}"] if home is not None else []
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return core_ext.build(gpu_sources(), f"_core_gpu{suffix}", True, flags=tuple(include),
                          cuda_flags=(compiler, *NVCC_FLAGS, *NVCC_ARCH_FLAGS),
                          link_flags=tuple(cuda_link_flags()), inputs=_inputs())


def extension_path() -> Path:
    env = os.environ.get("DYNEMB_CORE_GPU_EXT")
    if env:
        return Path(env)
    newest = max((p.stat().st_mtime for p in _inputs()), default=0.0)
    for candidate in core_ext._prebuilt_candidates("_core_gpu"):
        if candidate.stat().st_mtime >= newest:
            return candidate
    return build_extension()


def load_core_gpu() -> ModuleType:
    """The `tensorflow_dynemb._core_gpu` module, or pytest.skip with the reason."""
    global _module
    if _module is None:
        present, reason = gpu_present()
        if not present:
            pytest.skip(reason)
        _module = core_ext._load(extension_path(), MODULE_NAME)
    ok, reason = _module.gpu_available()
    if not ok:
        pytest.skip(f"no usable GPU: {reason}")
    return _module


def load_core_gpu_or_exit(script: str) -> ModuleType:
    """load_core_gpu() for a benchmark script: exits naming the reason where a test
    would skip."""
    try:
        return load_core_gpu()
    except BaseException as e:  # pytest.skip outside pytest: report the reason
        if type(e).__name__ == "Skipped":
            sys.exit(f"{script}: cannot run: {e}")
        raise


if __name__ == "__main__":  # builds (if needed) and prints the path: python tests/core_gpu_ext.py
    print(extension_path())
    sys.exit(0)
