"""Every CUDA source compiles with nvcc, for A100 (sm_80) and H100/H200 (sm_90),
without warnings -- so the GPU code cannot rot on machines (CI) without a GPU.

Compiles each `.cu` under cc/ with `nvcc -c` into a temporary directory (sources
and architectures in parallel), and the GPU module's binding (host code) with the
C++ compiler. Skips where nvcc is not installed. Needs no GPU and no TensorFlow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_gpu_ext  # noqa: E402

REPO = core_gpu_ext.REPO
ARCHS = (("sm_90", ["-arch=sm_90"]),
         ("sm_80", ["-gencode", "arch=compute_80,code=sm_80"]))
CU_SOURCES = sorted(REPO.glob("cc/**/*.cu"))


def _nvcc() -> str:
    compiler = core_gpu_ext.nvcc()
    if compiler is None:
        pytest.skip("nvcc (CUDA toolkit) is not installed")
    return compiler


def _run(cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
    return cmd, subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)


def test_cuda_sources_exist():
    assert CU_SOURCES, "no .cu sources under cc/"


def test_every_cu_source_compiles(tmp_path):
    nvcc = _nvcc()
    jobs = []
    for src in CU_SOURCES:
        for arch, flags in ARCHS:
            obj = tmp_path / f"{src.stem}.{arch}.o"
            jobs.append([nvcc, "-std=c++17", "-O3", "-Xcompiler", "-fPIC,-Wall,-Wextra",
                         *flags, f"-I{REPO}", "-c", str(src), "-o", str(obj)])
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(_run, jobs))
    failures = [f"{' '.join(cmd)}\n{proc.stdout}{proc.stderr}" for cmd, proc in results
                if proc.returncode != 0 or "warning" in (proc.stdout + proc.stderr).lower()]
    assert not failures, "\n\n".join(failures)


def test_gpu_binding_compiles():
    """The host side of `_core_gpu` (cc/bindings_gpu), which includes the CPU
    module's bindings, compiles without CUDA headers (syntax check only)."""
    pybind11 = pytest.importorskip("pybind11")
    cxx = os.environ.get("CXX", "g++")
    cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", f"-I{REPO}",
           f"-I{pybind11.get_include()}", f"-I{sysconfig.get_paths()['include']}",
           str(REPO / "cc/bindings_gpu/core_gpu_module.cc")]
    _, proc = _run(cmd)
    assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr
