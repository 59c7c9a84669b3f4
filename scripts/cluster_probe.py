"""How many thread-block clusters of the pair kernel fit on the GPU at once (GPU host).

    PYTHONPATH=. python scripts/cluster_probe.py

The driver's ``cuOccupancyMaxActiveClusters`` for ``verify_fused_pair`` (256 threads, its dynamic
shared memory, one block per SM) at clusters of 1, 2, 4 and 8 blocks along the split axis: how many
blocks a launch of such clusters keeps resident, against the SM count. A split launch whose
clusters do not all fit in one wave runs a second one.
"""
from __future__ import annotations

import ctypes

import torch

from kdtree import attention
from kdtree.kernels import _LaunchAttribute, _LaunchConfig, _driver

_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION


def max_active_clusters(fn, size: int, smem: int) -> int:
    lib = _driver()
    lib.cuOccupancyMaxActiveClusters.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                  ctypes.POINTER(_LaunchConfig)]
    attr = _LaunchAttribute(id=_CLUSTER_DIMENSION)
    attr.value[0], attr.value[1], attr.value[2] = 1, size, 1
    cfg = _LaunchConfig((132, 8 * size, 1), (attention._FUSED_THREADS, 1, 1), smem, None, ctypes.pointer(attr), 1)
    n = ctypes.c_int(-1)
    err = lib.cuOccupancyMaxActiveClusters(ctypes.byref(n), fn.kernel.ptr, ctypes.byref(cfg))
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters: CUresult {err}")
    return n.value


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    fn = attention._kernel("verify_fused_pair", 0, attention._SRC_PAIR, "nvcc")
    fn.max_dynamic_shared_size_bytes = attention._PAIR_SMEM
    print(f"{torch.cuda.get_device_name(0)}: {sms} SMs, pair kernel {attention._PAIR_SMEM} B shared memory")
    print("| cluster size | clusters resident | blocks resident | of the SMs |")
    print("|---|---|---|---|")
    for size in (1, 2, 4, 8):
        c = max_active_clusters(fn, size, attention._PAIR_SMEM)
        print(f"| {size} | {c} | {c * size} | {c * size / sms:.3f} |")


if __name__ == "__main__":
    main()
