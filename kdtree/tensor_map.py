"""Tensor maps (``CUtensorMap``) for the copy engine (TMA) of sm_90 kernels, encoded on the host.

A kernel that loads with ``cp.async.bulk.tensor`` takes a 128-byte tensor map by value (a
``__grid_constant__`` parameter). The driver encodes it (``cuTensorMapEncodeTiled``); neither
CuPy (14.2: no binding) nor torch exposes that call, so it is reached through ``ctypes`` in the
driver library every CUDA process here has loaded (``libcuda.so.1``), which needs no compiler and
no extra package. The map goes to the kernel as a one-element NumPy array of a 128-byte void
type: CuPy passes a size-one ``numpy.ndarray`` argument by value, copying its bytes into the
launch's parameter buffer (a structured NumPy *scalar* would not do: CuPy's scalar wrapper holds
at most 64 bytes).
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

MAP_BYTES = 128
_MAP_ALIGN = 64                       # cuTensorMapEncodeTiled wants the host object 64-byte aligned
_BF16 = 9                             # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
_INTERLEAVE_NONE = 0                  # CU_TENSOR_MAP_INTERLEAVE_NONE
_SWIZZLE_128B = 3                     # CU_TENSOR_MAP_SWIZZLE_128B
_L2_PROMOTION_256B = 3                # CU_TENSOR_MAP_L2_PROMOTION_L2_256B
_OOB_FILL_ZERO = 0                    # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: outside the tensor reads 0


@functools.lru_cache(maxsize=None)
def _driver_encode():
    """``cuTensorMapEncodeTiled`` of the CUDA driver, typed for ctypes."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError("tensor maps need the CUDA driver library libcuda.so.1") from e
    fn = lib.cuTensorMapEncodeTiled
    u32, p = ctypes.c_uint32, ctypes.c_void_p
    fn.argtypes = [p, ctypes.c_int, u32, p, p, p, p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _aligned_map_buffer() -> np.ndarray:
    """128 zero bytes at a 64-byte aligned address, as a one-element array of type ``V128``."""
    raw = np.zeros(MAP_BYTES + _MAP_ALIGN, dtype=np.uint8)
    skip = -raw.ctypes.data % _MAP_ALIGN
    return raw[skip:skip + MAP_BYTES].view(np.dtype((np.void, MAP_BYTES)))


def bf16_matrix_map(address: int, rows: int, cols: int, row_stride_bytes: int, box_rows: int, box_cols: int,
                    *, depth: int = 0, depth_stride_bytes: int = 0, encode=None) -> np.ndarray:
    """The tensor map of a row-major bf16 matrix for TMA loads of ``box_rows x box_cols`` boxes
    (or, with ``depth``, of ``depth`` such matrices, for boxes that stay within one of them).

    Boxes land in shared memory with the 128-byte swizzle (16-byte chunk c of box row r at chunk
    ``c ^ (r % 8)``: the K-major SW128 layout wgmma descriptors read); elements outside the
    matrix read as zero; L2 lines are fetched 256 bytes at a time.

    Parameters
    ----------
    address : int
        Device address of element (0, 0); a multiple of 16.
    rows, cols : int
        The matrix shape in elements (each at most 2^32).
    row_stride_bytes : int
        Bytes between consecutive rows; a multiple of 16.
    box_rows, box_cols : int
        The box: at most 256 rows, ``box_cols`` x 2 bytes at most 128 (the swizzle span) and a
        multiple of 16 bytes.
    depth, depth_stride_bytes : int, optional
        A third dimension (rank 3, boxes one matrix deep): ``depth`` matrices, the next one
        ``depth_stride_bytes`` on (a multiple of 16, at least ``rows`` x ``row_stride_bytes``).
        A box's rows past ``rows`` then fall outside the tensor (a bulk store skips them) instead of
        reaching into the next matrix. 0 (default): rank 2.
    encode : callable, optional
        Stand-in for the driver's ``cuTensorMapEncodeTiled`` (tests); called with the same
        arguments, it returns a CUresult (0 for success) and fills the map.

    Returns
    -------
    numpy.ndarray
        Shape (1,), one 128-byte void element: pass it as the kernel argument (by value).

    Raises
    ------
    ValueError
        A constraint above is not met, naming the argument.
    RuntimeError
        The driver refused the map (its CUresult in the message) or is not there.
    """
    if address % 16:
        raise ValueError(f"address: expected a multiple of 16, got {address:#x}")
    if not (0 < rows <= 1 << 32 and 0 < cols <= 1 << 32):
        raise ValueError(f"rows, cols: expected 1 .. 2^32, got {rows} x {cols}")
    if row_stride_bytes % 16 or row_stride_bytes < 2 * cols:
        raise ValueError(f"row_stride_bytes: expected a multiple of 16 of at least {2 * cols}, got {row_stride_bytes}")
    if not 0 < box_rows <= 256:
        raise ValueError(f"box_rows: expected 1 .. 256, got {box_rows}")
    if not (0 < 2 * box_cols <= 128 and (2 * box_cols) % 16 == 0):
        raise ValueError(f"box_cols: expected a multiple of 8 up to 64 (128-byte swizzle), got {box_cols}")
    if depth and (not 0 < depth <= 1 << 32 or depth_stride_bytes % 16 or depth_stride_bytes < rows * row_stride_bytes):
        raise ValueError(f"depth, depth_stride_bytes: expected 1 .. 2^32 matrices, a multiple of 16 bytes of at least "
                         f"{rows * row_stride_bytes} apart, got {depth} x {depth_stride_bytes}")
    rank = 3 if depth else 2
    out = _aligned_map_buffer()
    dims = (ctypes.c_uint64 * rank)(cols, rows, *(depth,) * (rank - 2))
    strides = (ctypes.c_uint64 * (rank - 1))(row_stride_bytes, *(depth_stride_bytes,) * (rank - 2))
    box = (ctypes.c_uint32 * rank)(box_cols, box_rows, *(1,) * (rank - 2))
    elem_strides = (ctypes.c_uint32 * rank)(*(1,) * rank)
    fn = encode or _driver_encode()
    res = fn(out.ctypes.data, _BF16, rank, address, ctypes.addressof(dims), ctypes.addressof(strides),
             ctypes.addressof(box), ctypes.addressof(elem_strides), _INTERLEAVE_NONE, _SWIZZLE_128B,
             _L2_PROMOTION_256B, _OOB_FILL_ZERO)
    if res != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {res}) for {depth or 1} x {rows} x {cols} bf16 "
                           f"at {address:#x}, row stride {row_stride_bytes} B, box {box_rows} x {box_cols}")
    return out
