"""Every CUDA source compiles with nvcc, for A100 (sm_80) and H100/H200 (sm_90),
without warnings -- so the GPU code cannot rot on machines (CI) without a GPU.

Compiles each `.cu` under cc/ with `nvcc -c` into a temporary directory (both
architectures in one call, sources in parallel), the GPU module's binding (host code)
with the C++ compiler, and the op library's GPU kernels (cc/kernels/gpu, host code that
includes TensorFlow's headers) the way setup.py compiles them: the C++ compiler,
the installed TensorFlow's compile flags, -DGOOGLE_CUDA=1 and the CUDA headers.
Warnings fail a test, but only ours: TensorFlow's and CUDA's headers are
-isystem. Skips where nvcc (the CUDA toolkit) is not installed; only the GPU
kernel test needs TensorFlow. Needs no GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_gpu_ext  # noqa: E402

# Minutes of nvcc on 2 cores: run by CI (--run-slow), like the scale tests.
pytestmark = pytest.mark.slow

REPO = core_gpu_ext.REPO
# One nvcc call per source builds both: the host side is compiled once.
ARCH_FLAGS = ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_80,code=sm_80"]
CU_SOURCES = sorted(REPO.glob("cc/**/*.cu"))
GPU_KERNEL_SOURCES = sorted(REPO.glob("cc/kernels/gpu/*.cc"))


def _nvcc() -> str:
    compiler = core_gpu_ext.nvcc()
    if compiler is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    return compiler


def _run(cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
    return cmd, subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)


def test_cuda_sources_exist():
    assert CU_SOURCES, "no .cu sources under cc/"


@pytest.mark.once_in_ci  # nvcc only, no TensorFlow
def test_every_cu_source_compiles(tmp_path):
    nvcc = _nvcc()
    jobs = []
    for src in CU_SOURCES:
        obj = tmp_path / f"{src.stem}.o"
        jobs.append([nvcc, "-std=c++17", "-O3", "-fmad=false", "-Xcompiler", "-fPIC,-Wall,-Wextra",
                     *ARCH_FLAGS, f"-I{REPO}", "-c", str(src), "-o", str(obj)])
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(_run, jobs))
    failures = [f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}" for cmd, proc in results
                if proc.returncode != 0 or "warning" in (proc.stdout + proc.stderr).lower()]
    assert not failures, "\n\n".join(failures)


@pytest.mark.once_in_ci  # no TensorFlow
@pytest.mark.parametrize("source", sorted(REPO.glob("cc/bindings_gpu/*.cc")),
                         ids=lambda p: p.name)
def test_gpu_binding_compiles(source):
    """The host side of `_core_gpu` (cc/bindings_gpu: the CPU module's bindings compiled
    a second time, the device-address methods, the embedding step, partition and keyed
    random, which stage arrays through device memory) compiles with the CUDA runtime's
    headers, without warnings (syntax check only)."""
    _nvcc()  # the CUDA headers come with the toolkit
    pybind11 = pytest.importorskip("pybind11")
    include = [] if core_gpu_ext.cuda_home() is None else [
        "-isystem", str(core_gpu_ext.cuda_home() / "include")]
    cxx = os.environ.get("CXX", "g++")
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", f"-I{REPO}", *include,
           f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
           str(source)]
    _, proc = _run(cmd)
    assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr


def test_gpu_kernel_sources_exist():
    assert GPU_KERNEL_SOURCES, "no .cc sources under cc/kernels/gpu"


def test_gpu_kernels_compile_against_installed_tensorflow(tmp_path):
    """The TF GPU kernels compile against this TensorFlow's headers (run it under
    each supported TF: the stream and allocator APIs they use drift)."""
    _nvcc()  # the CUDA headers come with the toolkit
    tf = pytest.importorskip("tensorflow")
    include = [] if core_gpu_ext.cuda_home() is None else [
        "-isystem", str(core_gpu_ext.cuda_home() / "include")]
    tf_flags = []
    for flag in tf.sysconfig.get_compile_flags():
        tf_flags += ["-isystem", flag[2:]] if flag.startswith("-I") else [flag]
    cxx = os.environ.get("CXX", "g++")
    jobs = [[cxx, "-std=c++17", "-O3", "-fPIC", "-Wall", "-Wextra", *tf_flags,
             "-DGOOGLE_CUDA=1", *include, f"-I{REPO}", "-c", str(src),
             "-o", str(tmp_path / f"{src.stem}.o")] for src in GPU_KERNEL_SOURCES]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(_run, jobs))
    failures = [f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}" for cmd, proc in results
                if proc.returncode != 0 or "warning" in (proc.stdout + proc.stderr).lower()]
    assert not failures, "\n\n".join(failures)
