"""Every cuda/*.cu compiles for sm_90 without a GPU: with nvcc, and with NVRTC through CuPy."""
import shutil

import pytest

from kdtree import kernels


def _have_nvcc():
    return shutil.which("nvcc") is not None or __import__("os").path.exists("/usr/local/cuda/bin/nvcc")


@pytest.mark.parametrize("name", kernels.sources())
def test_nvcc_compiles_for_sm90(name, tmp_path, monkeypatch):
    if not _have_nvcc():
        pytest.fail("nvcc not found: CI must have the CUDA compiler to check the kernels")
    monkeypatch.setenv("KDTREE_CACHE", str(tmp_path))
    cubin = kernels.nvcc_compile(name, arch="sm_90")
    assert cubin.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", kernels.sources())
def test_nvrtc_compiles_for_sm90(name):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    assert ".target sm_90" in kernels.nvrtc_compile(name, arch="compute_90")


def test_headers_are_inlined():
    for name in kernels.sources():
        assert '#include "' not in kernels.read_source(name)


def test_pdl_launch_structs_match_cuda_h():
    """The ctypes mirrors of CUlaunchConfig and CUlaunchAttribute have cuda.h's layout (x86-64):
    a wrong offset would hand the driver a garbage stream or attribute list."""
    import ctypes

    cfg, attr = kernels._LaunchConfig, kernels._LaunchAttribute
    assert ctypes.sizeof(attr) == 72 and attr.value.offset == 8
    assert (cfg.shared_mem.offset, cfg.stream.offset, cfg.attrs.offset, cfg.num_attrs.offset) == (24, 32, 40, 48)
    assert ctypes.sizeof(cfg) == 56
