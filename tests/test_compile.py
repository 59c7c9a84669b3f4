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


def test_pdl_launch_marshals_arguments(monkeypatch):
    """What ``_launch_pdl`` hands the driver, read back as the driver would: the grid and block
    padded to three dimensions, shared memory, stream, the one attribute (programmatic stream
    serialization, value 1), and each argument's value at its address, by its type."""
    import ctypes

    import numpy as np

    seen = {}

    class Lib:
        def cuLaunchKernelEx(self, cfg_ref, handle, params, extra):
            cfg = cfg_ref._obj
            attr = cfg.attrs.contents
            seen.update(grid=list(cfg.grid), block=list(cfg.block), smem=cfg.shared_mem, stream=cfg.stream,
                        n_attrs=cfg.num_attrs, attr=(attr.id, attr.value[0]), handle=handle,
                        args=[ctypes.c_uint64.from_address(params[0]).value,
                              ctypes.c_int32.from_address(params[1]).value,
                              ctypes.c_float.from_address(params[2]).value])
            return 0

    class Fn:
        ptr = 1234

    monkeypatch.setattr(kernels, "_driver", lambda: Lib())
    kernels._launch_pdl(Fn(), (7, 2), (128,), (np.uint64(2 ** 40 + 3), np.int32(-5), np.float32(0.25)), 4096, 99)
    assert seen == dict(grid=[7, 2, 1], block=[128, 1, 1], smem=4096, stream=99, n_attrs=1,
                        attr=(kernels._PROGRAMMATIC_STREAM_SERIALIZATION, 1), handle=1234,
                        args=[2 ** 40 + 3, -5, 0.25])
