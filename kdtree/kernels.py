"""Compile the CUDA sources in ``cuda/`` with CuPy and launch them on torch's stream.

Every kernel lives in its own ``cuda/<family>.cu`` as ``extern "C"`` functions; shapes that
must be compile-time constants come in as ``-D`` defines, so each specialisation is its own
module. We inline the project's own ``#include "x.cuh"`` headers before compiling, so the
source text that keys both our in-process cache and CuPy's on-disk cache changes whenever any
header changes.

Two compilers:

* ``nvrtc`` (default): ``cupy.RawModule(code=...)``; enough for ``mma.sync`` tensor-core code.
* ``nvcc``: ``nvcc -cubin`` for targets NVRTC-through-CuPy cannot build (``sm_90a`` for
  ``wgmma``), cached as ``~/.cache/kdtree/<sha>.cubin`` and loaded with
  ``cupy.RawModule(path=...)``.

Launches take raw device pointers of torch tensors (``ptr(t)``) and run on
``torch.cuda.current_stream()`` fetched at every launch, which is what makes them capturable
in a ``torch.cuda.graph``. Memory is always allocated by torch, never by CuPy.

``launch(..., pdl=True)`` asks for programmatic dependent launch on sm_90 (the driver's
``cuLaunchKernelEx`` through ctypes, attribute programmatic stream serialization): the kernel
may start while the one before it in the stream still runs, once every block of that one has
executed ``griddepcontrol.launch_dependents`` (or exited). Such a kernel must execute
``griddepcontrol.wait`` (``pdl_wait`` in ``cuda/pdl.cuh``) before it reads anything the kernel
before it writes, and before it writes any global memory at all: torch's allocator may have
handed it memory that the kernel before it still reads.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)


def cuda_dir() -> Path:
    """The folder holding the ``.cu`` sources: inside the wheel, or the checkout's ``cuda/``."""
    here = Path(__file__).resolve().parent
    for cand in (here / "cuda", here.parent / "cuda"):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"kdtree: no cuda/ sources next to {here}")


def sources() -> list[str]:
    """Names of every kernel family (``cuda/*.cu`` without the suffix)."""
    return sorted(p.stem for p in cuda_dir().glob("*.cu"))


def read_source(name: str) -> str:
    """Source of ``cuda/<name>.cu`` with the project's own quoted headers inlined (once each)."""
    root = cuda_dir()
    seen: set[str] = set()

    def expand(path: Path) -> str:
        def sub(m: re.Match) -> str:
            inc = m.group(1)
            if inc in seen:
                return ""
            seen.add(inc)
            return f"// ---- {inc} ----\n" + expand(root / inc) + f"\n// ---- end {inc} ----"

        return _INCLUDE.sub(sub, path.read_text())

    path = root / f"{name}.cu"
    if not path.exists():
        raise ValueError(f"kernel family {name!r} not found; have {sources()}")
    return expand(path)


def define_options(defines: dict | None) -> tuple[str, ...]:
    """``{"BLOCK": 256}`` -> ``("-DBLOCK=256",)``, sorted so equal dicts give equal keys."""
    return tuple(f"-D{k}={v}" for k, v in sorted((defines or {}).items()))


_COMMON = ("-std=c++17",)


def nvcc_compile(name: str, defines: dict | None = None, arch: str = "sm_90",
                 extra: tuple[str, ...] = ()) -> Path:
    """Compile ``cuda/<name>.cu`` to a cubin with nvcc (no GPU needed) and return its path.

    ``arch`` is ``sm_90`` or ``sm_90a`` (the latter for ``wgmma``). Results are cached on disk,
    keyed on the inlined source, options and arch; the cached file is what gets loaded.
    Raises ``RuntimeError`` with nvcc's output.
    """
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    src = read_source(name)
    opts = _COMMON + define_options(defines) + tuple(extra)
    key = hashlib.sha256("\0".join((src, arch, *opts)).encode()).hexdigest()[:24]
    cache = Path(os.environ.get("KDTREE_CACHE", Path.home() / ".cache" / "kdtree"))
    out = cache / f"{name}-{arch}-{key}.cubin"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / f"{name}.cu"
        cu.write_text(src)
        virt = arch.replace("sm_", "compute_")
        cmd = [nvcc, "-cubin", f"-gencode=arch={virt},code={arch}", "-O3", *opts,
               "-o", str(Path(tmp) / "k.cubin"), str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed for {name} {opts}:\n{res.stderr}")
        data = (Path(tmp) / "k.cubin").read_bytes()
    tmp_out = out.with_suffix(f".{os.getpid()}.tmp")
    tmp_out.write_bytes(data)
    tmp_out.replace(out)
    return out


def nvrtc_compile(name: str, defines: dict | None = None, arch: str = "compute_90") -> str:
    """Compile ``cuda/<name>.cu`` to PTX with NVRTC (CuPy's bindings; no GPU or driver needed).

    Raises ``RuntimeError`` with NVRTC's log on failure.
    """
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(read_source(name), f"{name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [f"-arch={arch}", *_COMMON, *define_options(defines)])
    except Exception as e:
        raise RuntimeError(f"NVRTC failed for {name}:\n{nvrtc.getProgramLog(prog)}") from e
    ptx = nvrtc.getPTX(prog)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


@functools.lru_cache(maxsize=None)
def _module(name: str, options: tuple[str, ...], compiler: str, arch: str, src_key: str):
    import cupy

    if compiler == "nvrtc":
        return cupy.RawModule(code=read_source(name), options=_COMMON + options)
    cubin = nvcc_compile(name, dict(o[2:].split("=", 1) for o in options), arch=arch)
    return cupy.RawModule(path=str(cubin))


def get_kernel(name: str, kernel: str, defines: dict | None = None, *,
               compiler: str = "nvrtc", device: int | None = None):
    """The ``cupy.RawKernel`` ``kernel`` of ``cuda/<name>.cu`` specialised by ``defines``.

    Compiled once per (inlined source, options, compiler, device capability) and cached for
    the process (a launch pays a dictionary look-up); CuPy also keeps NVRTC modules on disk.
    """
    if device is None:
        import torch

        device = torch.cuda.current_device()
    return _kernel(name, kernel, define_options(defines), compiler, device)


@functools.lru_cache(maxsize=None)
def _kernel(name: str, kernel: str, options: tuple[str, ...], compiler: str, device: int):
    import cupy

    with cupy.cuda.Device(device) as dev:
        major, minor = dev.compute_capability[:-1], dev.compute_capability[-1]
        arch = f"sm_{major}{minor}" + ("a" if compiler == "nvcc" and major == "9" else "")
        src_key = hashlib.sha256(read_source(name).encode()).hexdigest()
        return _module(name, options, compiler, arch, src_key).get_function(kernel)


def ptr(t) -> np.uint64:
    """A torch tensor's device pointer as a kernel argument."""
    return np.uint64(t.data_ptr())


_SMEM_LIMIT: dict[tuple[int, int], int] = {}  # (id(kernel), device) -> dynamic smem limit set


class _LaunchAttribute(ctypes.Structure):   # CUlaunchAttribute: id, pad to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):      # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6     # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_CTYPES = {np.uint64: ctypes.c_uint64, np.int32: ctypes.c_int32, np.float32: ctypes.c_float,
           np.int64: ctypes.c_int64, np.uint32: ctypes.c_uint32}


@functools.lru_cache(maxsize=None)
def _driver():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                     ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


@functools.lru_cache(maxsize=None)
def _pdl_capable(idx: int) -> bool:
    import torch

    return torch.cuda.get_device_capability(idx)[0] >= 9


@functools.lru_cache(maxsize=None)
def _pss_attribute() -> _LaunchAttribute:
    """The one launch attribute of a programmatic dependent launch (read by the driver during the
    call only, so one object serves every launch)."""
    attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    return attr


def _launch_pdl(fn, grid, block, args, shared_mem: int, stream: int) -> None:
    """``fn`` by ``cuLaunchKernelEx`` with programmatic stream serialization allowed. Built for
    little host time (an eager layer makes several launches): argument values by address, the
    attribute shared."""
    vals = [_CTYPES[type(a)](a) for a in args]
    params = (ctypes.c_void_p * len(vals))(*map(ctypes.addressof, vals))
    g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
    cfg = _LaunchConfig(g, b, shared_mem, stream, ctypes.pointer(_pss_attribute()), 1)
    lib = _driver()
    handle = getattr(fn, "kernel", fn).ptr   # RawKernel -> its Function on the current device
    err = lib.cuLaunchKernelEx(ctypes.byref(cfg), handle, params, None)
    if err:
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(err, ctypes.byref(msg))
        raise RuntimeError(f"cuLaunchKernelEx: {(msg.value or b'').decode()} (CUresult {err})")


def launch(fn, grid, block, args, *, shared_mem: int = 0, device=None, pdl: bool = False) -> None:
    """Launch ``fn`` on torch's current stream for ``device`` (fetched now, so graphs capture it).

    ``args`` are kernel arguments already converted (``ptr(t)``, ``np.int32(x)``...). The
    dynamic shared-memory limit is raised once per kernel and device, not queried per launch.
    ``pdl``: programmatic dependent launch where the device has it (sm_90 and later; the module
    docstring says what the kernel must do), a plain launch elsewhere.
    """
    import cupy
    import torch

    idx = torch.cuda.current_device() if device is None else torch.device(device).index
    if idx is None:
        idx = torch.cuda.current_device()
    with cupy.cuda.Device(idx):
        stream = cupy.cuda.Stream.from_external(torch.cuda.current_stream(idx))
        key = (id(fn), idx)
        if shared_mem > 48 * 1024 and _SMEM_LIMIT.get(key, 48 * 1024) < shared_mem:
            fn.max_dynamic_shared_size_bytes = shared_mem
            _SMEM_LIMIT[key] = shared_mem
        if pdl and _pdl_capable(idx):
            _launch_pdl(fn, grid, block, args, shared_mem, stream.ptr)
        else:
            fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=stream)


def cuda_available() -> bool:
    """True when torch sees a CUDA device and CuPy imports (the kernels can run)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import cupy  # noqa: F401
    except Exception:
        return False
    return True
